"""End-to-end: request rules (SPEC §8) with real clients against a real nginx.

The upstream is nginx in the lab's upstream namespace (`e2e.support.nginx_upstream`): `git
http-backend` over HTTPS for `git clone` / `fetch` / `push`, and a catch-all that records
what nginx routed on. Every path trick is sent through the real proxy by curl or a raw
socket, and checked against what nginx itself received: a request the proxy lets through
is routed by nginx on exactly the path the rule matched; a refused one never reaches it.
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import ssl
import time
from pathlib import Path
from urllib.parse import unquote_to_bytes

import h2.config
import h2.connection
import h2.events
import pytest

from e2e.support.clients import client_ca_bundle, curl, status_and_reason
from e2e.support.lab import HOSTS, Lab, in_netns, raw_request
from e2e.support.nginx_upstream import NginxUpstream, head, refs
from e2e.support.transparent_lab import Sandbox
from egress.policy import request_rules as rr

HTTPS, HTTP = 9443, 9080
PUSH_TOKEN = "push-" + secrets.token_hex(8)
GIT_HOST, API_HOST, DOCS_HOST = "a.example.test", "api.example.test", "example.test"
API = f"{API_HOST}:{HTTPS}"

SPEC = f"""
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: {GIT_HOST}
      requests: git-read
    - domain: {API_HOST}
      requests:
        - methods: [GET, HEAD]
        - {{methods: [POST], paths: ["/repos/acme/*/issues", "/graphql"]}}
    - domain: {DOCS_HOST}
      requests: read-only
"""
# The push credential injected on every request to the git host: it must enable no push.
CREDENTIAL_SPEC = f"""
network:
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: {GIT_HOST}
      transform: {{Authorization: "Bearer {PUSH_TOKEN}"}}
      requests: git-read
"""
# The same credential without rules: the control that shows it does enable a push.
CONTROL_SPEC = f"""
network:
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: {GIT_HOST}
      transform: {{Authorization: "Bearer {PUSH_TOKEN}"}}
"""
REPORT_SPEC = f"""
network:
  mode: report
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: {DOCS_HOST}
      requests: read-only
"""


@pytest.fixture(scope="module")
def nginx(lab: Lab):
    addresses = sorted({HOSTS[GIT_HOST], HOSTS[API_HOST], HOSTS[DOCS_HOST]})
    with NginxUpstream(lab, "nginx-rules", addresses, HTTPS, HTTP, PUSH_TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(lab: Lab, nginx):
    proxy = lab.start_proxy(SPEC)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def credential_proxy(lab: Lab, nginx):
    proxy = lab.start_proxy(CREDENTIAL_SPEC)
    yield proxy
    proxy.stop()
    assert PUSH_TOKEN not in proxy.stdout() + proxy.stderr()


# -- git ---------------------------------------------------------------------------------------


def git(lab: Lab, proxy, *args: str, cwd: Path | None = None, version: str = "HTTP/2", timeout: float = 60):
    home = proxy.dir / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    config = ["-c", f"http.proxy={proxy.url}", "-c", f"http.sslCAInfo={client_ca_bundle(lab, proxy)}",
              "-c", f"http.version={version}"]  # fmt: skip
    where = ["-C", str(cwd)] if cwd else []
    return lab.exec("git", *config, *where, *args, env=env, timeout=timeout)


def git_url(name: str) -> str:
    return f"https://{GIT_HOST}:{HTTPS}/git/{name}"


def commit_locally(lab: Lab, proxy, clone: Path, text: str) -> None:
    (clone / "README").write_text(text)
    out = git(lab, proxy, "commit", "-q", "-am", text, cwd=clone)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("version", ["HTTP/2", "HTTP/1.1"])
def test_clone_and_fetch_work_through_git_read(lab, proxy, nginx, version):
    bare = nginx.make_repo(f"clone-{version[-1]}.git")
    dest = proxy.dir / f"clone-{version[-1]}"
    mark = nginx.mark()
    out = git(lab, proxy, "clone", "-q", git_url(bare.name), str(dest), version=version)
    assert out.returncode == 0, out.stderr
    assert (dest / "README").read_text().endswith("hello through the proxy\n")
    new_head = nginx.add_commit(bare, "second commit\n")
    out = git(lab, proxy, "fetch", "-q", "origin", cwd=dest, version=version)
    assert out.returncode == 0, out.stderr
    assert git(lab, proxy, "rev-parse", "origin/main", cwd=dest).stdout.strip() == new_head
    seen = nginx.since(mark)
    assert {(r["method"], r["uri"].rsplit("/", 1)[-1]) for r in seen} >= {("GET", "refs"), ("POST", "git-upload-pack")}
    assert all(r["status"] == "200" for r in seen), seen
    assert {r["protocol"] for r in seen} == {"HTTP/2.0" if version == "HTTP/2" else version}  # what went upstream
    lines = [a for a in proxy.audit() if a["host"] == GIT_HOST and a["event"] == "request"]
    assert {a["request_rule"] for a in lines} == {"git-read/refs", "git-read/upload-pack"}
    assert all(a["decision"] == "allowed" for a in lines)


def test_dumb_http_clone_works_through_git_read(lab, proxy, nginx):
    """Without `service` the ref list is the dumb protocol's (static files)."""
    bare = nginx.make_repo("dumb.git")
    mark = nginx.mark()
    out = lab.exec(
        "curl", "-sS", "-x", proxy.url, "--cacert", client_ca_bundle(lab, proxy),
        f"{git_url(bare.name)}/info/refs", f"{git_url(bare.name)}/HEAD", "-o", "/dev/null", "-o", "/dev/null",
        "-w", "%{http_code}\\n",
    )  # fmt: skip
    assert out.stdout.split() == ["200", "200"], out.stderr
    assert [r["request_uri"] for r in nginx.since(mark, expect=2)] == ["/git/dumb.git/info/refs", "/git/dumb.git/HEAD"]


def push_refused(lab, proxy, nginx, name: str) -> None:
    bare = nginx.make_repo(name)
    dest = proxy.dir / f"push-{name}"
    out = git(lab, proxy, "clone", "-q", git_url(name), str(dest))
    assert out.returncode == 0, out.stderr
    commit_locally(lab, proxy, dest, "exfiltrated\n")
    before = refs(bare)
    mark = nginx.mark()
    started = time.monotonic()
    out = git(lab, proxy, "push", "origin", "main", cwd=dest)
    elapsed = time.monotonic() - started
    assert out.returncode != 0
    assert "403" in out.stderr, out.stderr
    assert elapsed < 5  # refused at once, not after a timeout
    assert refs(bare) == before  # checked on the server: the repository is unchanged
    assert all("receive-pack" not in r["request_uri"] for r in nginx.since(mark))  # never reached nginx
    refused = [a for a in proxy.audit() if a["reason"] == "request_not_allowed"]
    assert refused[-1]["path"] == f"/git/{name}/info/refs"
    assert (refused[-1]["decision"], refused[-1]["host"], refused[-1]["rule"]) == ("blocked", GIT_HOST, GIT_HOST)


def test_push_is_refused_and_the_repository_unchanged(lab, proxy, nginx):
    push_refused(lab, proxy, nginx, "push.git")


def test_the_push_credential_enables_no_push(lab, credential_proxy, nginx):
    mark = nginx.mark()
    push_refused(lab, credential_proxy, nginx, "push-credential.git")
    # The clone got the credential (every request that passed), the push never did.
    seen = nginx.since(mark)
    assert seen and all(r["authorization"] == f"Bearer {PUSH_TOKEN}" for r in seen)


def test_control_the_same_credential_without_rules_does_push(lab, nginx):
    """Without `requests` the injected credential pushes: the rule is what stops it above."""
    control = lab.start_proxy(CONTROL_SPEC)
    try:
        bare = nginx.make_repo("control.git")
        dest = control.dir / "control"
        assert git(lab, control, "clone", "-q", git_url("control.git"), str(dest)).returncode == 0
        commit_locally(lab, control, dest, "pushed\n")
        out = git(lab, control, "push", "-q", "origin", "main", cwd=dest)
        assert out.returncode == 0, out.stderr
        assert head(bare) == git(lab, control, "rev-parse", "HEAD", cwd=dest).stdout.strip()
    finally:
        control.stop()


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/git/push.git/info/refs?service=git-receive-pack"),
        ("GET", "/git/push.git/info/refs?service=git-upload-pack&service=git-receive-pack"),
        ("POST", "/git/push.git/git-receive-pack"),
        ("POST", "/git/push.git/git-upload-pack/../git-receive-pack"),
        ("POST", "/git/push.git/git-upload-pack%2F..%2Fgit-receive-pack"),
        ("POST", "/git/push.git/info/lfs/locks"),
        ("PUT", "/git/push.git/info/lfs/objects/0123"),
    ],
)
def test_every_push_shaped_request_is_refused(lab, proxy, nginx, method, target):
    mark = nginx.mark()
    answer = tls_exchange(lab, proxy, GIT_HOST, f"{method} {target} HTTP/1.1\r\nHost: {GIT_HOST}:{HTTPS}\r\n"
                          "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
    assert status_and_reason(answer) == (403, "request_not_allowed")
    assert nginx.since(mark) == []


def lfs_batch(lab, proxy, operation: str, framing: str = "length") -> bytes:
    body = json.dumps({"operation": operation, "transfers": ["basic"], "objects": [{"oid": "0" * 64, "size": 1}]}).encode()
    head = (f"POST /git/push.git/info/lfs/objects/batch HTTP/1.1\r\nHost: {GIT_HOST}:{HTTPS}\r\n"
            "Content-Type: application/vnd.git-lfs+json\r\nConnection: close\r\n")  # fmt: skip
    if framing == "length":
        data = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    else:
        data = f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return tls_exchange(lab, proxy, GIT_HOST, data)


@pytest.mark.parametrize("which", ["proxy", "credential_proxy"])
def test_lfs_batch_download_passes_upload_never_reaches_the_server(lab, nginx, request, which):
    proxy = request.getfixturevalue(which)
    mark = nginx.mark()
    assert status_and_reason(lfs_batch(lab, proxy, "download"))[1] == ""  # nginx's answer, whatever it is
    seen = nginx.since(mark, expect=1)
    assert [(r["method"], r["uri"]) for r in seen] == [("POST", "/git/push.git/info/lfs/objects/batch")]
    mark = nginx.mark()
    answer = lfs_batch(lab, proxy, "upload")
    assert status_and_reason(answer) == (403, "request_not_allowed")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["detail"] == "the LFS batch does not ask for operation 'download'"
    # Chunked: the proxy would stream it past 64 KiB before it could read it, so it is refused at once.
    answer = lfs_batch(lab, proxy, "download", framing="chunked")
    assert status_and_reason(answer) == (403, "request_not_allowed")
    assert "Content-Length" in json.loads(answer.partition(b"\r\n\r\n")[2])["detail"]
    time.sleep(0.3)
    assert nginx.since(mark) == []
    body_lines = [a for a in proxy.audit() if a["event"] == "request_body"]
    assert (body_lines[-1]["decision"], body_lines[-1]["reason"], body_lines[-1]["request_rule"]) == (
        "blocked", "request_not_allowed", "")


def test_lfs_batch_over_http2(lab, proxy, nginx):
    def batch(operation: str, length: bool) -> tuple[list[tuple[str, str]], bytes]:
        body = json.dumps({"operation": operation, "objects": []}).encode()
        headers = [(":method", "POST"), (":scheme", "https"), (":path", "/git/push.git/info/lfs/objects/batch"),
                   (":authority", f"{GIT_HOST}:{HTTPS}"), ("content-type", "application/vnd.git-lfs+json")]  # fmt: skip
        return ([*headers, ("content-length", str(len(body)))] if length else headers), body

    cases = [batch("download", True), batch("upload", True), batch("download", False)]
    mark = nginx.mark()
    results = h2_exchange(lab, proxy, GIT_HOST, [h for h, _ in cases], [b for _, b in cases])
    assert results[3] == results[5] == (403, "request_not_allowed")
    assert results[1] != (403, "request_not_allowed") and isinstance(results[1], tuple)
    assert [(r["method"], r["protocol"]) for r in nginx.since(mark, expect=1)] == [("POST", "HTTP/2.0")]


# -- path tricks against the SPEC example ------------------------------------------------------

# (method, path as sent, what nginx routes on if it passes, or None: refused by the proxy)
PATH_TRICKS = [
    ("POST", "/repos/acme/x/issues", "/repos/acme/x/issues"),
    ("POST", "/repos/acme/x/./issues", "/repos/acme/x/issues"),
    ("POST", "/repos/acme/%78/issues", "/repos/acme/x/issues"),
    ("POST", "/repos//acme/x/issues", "/repos/acme/x/issues"),  # nginx merges slashes, as the rule did
    ("POST", "/repos/acme/x/issues?state=../../admin", "/repos/acme/x/issues"),  # the query is not the path
    ("POST", "/graphql", "/graphql"),
    ("GET", "/anything/../at/all", "/at/all"),
    ("POST", "/repos/acme/x/../../other/y/issues", None),
    ("POST", "/repos/acme/x/%2e%2e/%2e%2e/other/y/issues", None),
    ("POST", "/repos/acme/x/%2E%2E/%2E%2E/other/y/issues", None),
    ("POST", "/repos/acme/x%2F..%2F..%2Fother%2Fy/issues", None),
    ("POST", "/repos/acme/x%2f..%2f..%2fother%2fy/issues", None),
    ("POST", "/repos/acme//issues", None),  # merged: /repos/acme/issues
    ("POST", "/repos/acme/x;/issues", None),
    ("POST", "/repos/acme/..;/other/issues", None),
    ("POST", "/repos/acme/x/%C0%AE%C0%AE/%C0%AE%C0%AE/other/issues", None),  # overlong '.'
    ("POST", "/repos/acme/x%C0%AFissues", None),  # overlong '/'
    ("POST", "/repos/acme/x%5C..%5C..%5Cother/issues", None),
    ("POST", "/repos/acme/x%00/issues", None),
    ("POST", "/repos/acme/x%252F..%252Fother/issues", None),
    ("POST", "/repos/acme/x//../issues", None),  # nginx and RFC 3986 disagree here
    ("POST", "/repos/acme/x/issues/", None),
    ("POST", "/graphql%3F", None),
    ("DELETE", "/repos/acme/x/issues", None),
    ("PUT", "/graphql", None),
]


@pytest.mark.parametrize("version", ["--http2", "--http1.1"])
@pytest.mark.parametrize(("method", "path", "routed"), PATH_TRICKS)
def test_path_tricks_with_curl(lab, proxy, nginx, method, path, routed, version):
    mark = nginx.mark()
    status, headers, body = curl(lab, proxy, f"https://{API}{path}", "--path-as-is", "-X", method, "--data-binary", "x", version)
    seen = nginx.since(mark, expect=0 if routed is None else 1)
    if routed is None:
        assert (status, headers.get("x-egress-denied")) == (403, "request_not_allowed"), body
        assert json.loads(body)["method"] == method
        assert seen == []
    else:
        assert status == 200, body
        assert [(r["method"], r["request_uri"], r["uri"]) for r in seen] == [(method, path, routed)]
        assert seen[0]["protocol"] == ("HTTP/2.0" if version == "--http2" else "HTTP/1.1")
        assert json.loads(body) == {"uri": routed}


RAW_TRICKS = [
    ("POST", "/repos/acme/x/issues", True),
    ("POST", "/repos/acme/x\\..\\..\\other\\y/issues", False),
    ("POST", "/repos/acme/x/issues#/graphql", False),
    ("post", "/repos/acme/x/issues", False),  # methods are case-sensitive
    ("Post", "/graphql", False),
    ("get", "/anything", False),
    ("POST", "/repos/acme/caf\xc3\xa9/issues", True),  # raw UTF-8: the same as its escape
    ("POST", "/repos/acme/caf\xe9/issues", False),  # raw Latin-1: not UTF-8
    # absolute-form: the path checked is the URI's
    ("POST", f"https://{API}/repos/acme/x/issues", True),
    ("POST", f"https://{API}/repos/acme/x/../../other/y/issues", False),
]


@pytest.mark.parametrize(("method", "target", "passes"), RAW_TRICKS)
def test_path_tricks_with_a_raw_socket(lab, proxy, nginx, method, target, passes):
    mark = nginx.mark()
    request = f"{method} {target} HTTP/1.1\r\nHost: {API}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
    answer = tls_exchange(lab, proxy, API_HOST, request.encode("latin-1"))
    seen = nginx.since(mark, expect=1 if passes else 0)
    if passes:
        assert status_and_reason(answer)[0] == 200, answer
        assert len(seen) == 1 and seen[0]["method"] == method
    else:
        assert status_and_reason(answer) == (403, "request_not_allowed"), answer
        assert seen == []


_PIECES = ["/", "//", "a", "b", ".", "..", "%2e", "%2E", "%2e%2e", "%41", "%3A", "%3a", "%C3%A9", "~", "*", ":", "@",
           "!", "%20", "%2F", "%5C", "%25", "%00", "%C0%AE", "\\", ";", "%", "%zz", "?q=/..", "%EF%BC%8F"]  # fmt: skip


def test_random_paths_are_read_as_nginx_reads_them(lab, proxy, nginx):
    """300 random paths (seeded) under `GET` (any path): every one the proxy passes is routed
    by nginx on exactly the path the proxy normalised; every other never reaches nginx."""
    rng = random.Random(23)
    targets = ["/" + "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 8))) for _ in range(300)]
    mismatches = []
    tls = None
    for target in targets:
        try:
            expected = unquote_to_bytes(rr.normalize_path(target.encode())[0]).decode()
        except rr.PathError:
            expected = None
        mark = nginx.mark()
        if tls is None:
            tls = tls_tunnel(lab, proxy, API_HOST)
        tls.sendall(f"GET {target} HTTP/1.1\r\nHost: {API}\r\n\r\n".encode())
        answer, closed = read_response(tls)
        if closed:
            tls.close()
            tls = None
        status, reason = status_and_reason(answer)
        seen = nginx.since(mark, expect=0 if expected is None else 1)
        if expected is None:
            ok = (status, reason) == (403, "request_not_allowed") and seen == []
        else:
            ok = status == 200 and [r["uri"] for r in seen] == [expected]
        if not ok:
            mismatches.append((target, expected, status, reason, seen))
    if tls is not None:
        tls.close()
    assert mismatches == []
    assert sum(1 for t in targets if _passes(t)) > 50  # the sample is not all refusals


def _passes(target: str) -> bool:
    try:
        rr.normalize_path(target.encode())
    except rr.PathError:
        return False
    return True


def read_response(tls: ssl.SSLSocket) -> tuple[bytes, bool]:
    """One HTTP/1.1 response (Content-Length framed) and whether the connection is closed."""
    out = b""
    tls.settimeout(5)
    while True:
        head, sep, body = out.partition(b"\r\n\r\n")
        if sep:
            fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in head.split(b"\r\n")[1:])}
            if len(body) >= int(fields.get(b"content-length", b"0")):
                return out, fields.get(b"connection", b"").lower() == b"close"
        try:
            chunk = tls.recv(65536)
        except (TimeoutError, OSError):
            return out, True
        if not chunk:
            return out, True
        out += chunk


def test_refusal_body_names_method_and_path_never_raw(lab, proxy, nginx):
    answer = tls_exchange(lab, proxy, API_HOST, (
        f"POST /repos/x\"<b>\xc3\xa9/../%2F?token=secret HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n").encode("latin-1"))  # fmt: skip
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body == {
        "error": "egress_denied", "reason": "request_not_allowed", "host": API_HOST, "method": "POST",
        "path": '/repos/x"<b>%C3%A9/../%2F', "detail": "an encoded '/' (%2F) in the path",
    }  # fmt: skip
    assert b"secret" not in answer


def test_plain_http_is_held_to_the_rules(lab, proxy, nginx):
    mark = nginx.mark()
    base = f"http://{API_HOST}:{HTTP}"
    allowed = raw_request(lab, proxy.port, f"POST {base}/repos/acme/x/issues HTTP/1.1\r\nHost: {API_HOST}:{HTTP}\r\n"
                          "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
    refused = raw_request(lab, proxy.port, f"POST {base}/repos/acme/x/../../other/y/issues HTTP/1.1\r\n"
                          f"Host: {API_HOST}:{HTTP}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
    assert status_and_reason(allowed)[0] == 200
    assert status_and_reason(refused) == (403, "request_not_allowed")
    assert [r["uri"] for r in nginx.since(mark, expect=1)] == ["/repos/acme/x/issues"]


H2_CASES = [
    ("POST", "/repos/acme/x/issues", (200, "")),
    ("POST", "/repos/acme/x/../../other/y/issues", (403, "request_not_allowed")),
    ("POST", "/repos/acme/x%2F../issues", (403, "request_not_allowed")),
    ("post", "/graphql", (403, "request_not_allowed")),
    # absolute-form `:path` whose path disagrees with the rule's reading: never forwarded
    ("POST", f"https://{API}/repos/acme/x/issues", (400, "")),
    ("GET", f"https://{API_HOST}:{HTTPS}/anything", (400, "")),
]


def test_http2_method_and_path(lab, proxy, nginx):
    mark = nginx.mark()
    streams = [[(":method", m), (":scheme", "https"), (":path", p), (":authority", API)] for m, p, _ in H2_CASES]
    results = h2_exchange(lab, proxy, API_HOST, streams)
    assert [results.get(1 + 2 * i) for i in range(len(H2_CASES))] == [want for _, _, want in H2_CASES]
    assert [(r["method"], r["uri"], r["protocol"]) for r in nginx.since(mark, expect=1)] == [("POST", "/repos/acme/x/issues", "HTTP/2.0")]


# -- read-only ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_read_only_refuses_writes(lab, proxy, nginx, method):
    mark = nginx.mark()
    status, headers, body = curl(lab, proxy, f"https://{DOCS_HOST}:{HTTPS}/docs", "-X", method, "--data-binary", "x")
    assert (status, headers.get("x-egress-denied")) == (403, "request_not_allowed")
    assert json.loads(body) == {"error": "egress_denied", "reason": "request_not_allowed", "host": DOCS_HOST,
                                "method": method, "path": "/docs"}  # fmt: skip
    assert nginx.since(mark) == []


def test_read_only_get_with_a_body_passes_as_get(lab, proxy, nginx):
    mark = nginx.mark()
    status, _, _ = curl(lab, proxy, f"https://{DOCS_HOST}:{HTTPS}/docs", "-X", "GET", "--data-binary", "payload")
    assert status == 200
    assert [(r["method"], r["uri"]) for r in nginx.since(mark, expect=1)] == [("GET", "/docs")]


WEBSOCKET = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"


@pytest.mark.parametrize("method", ["POST", "PUT", "GET"])
def test_read_only_refuses_websocket_upgrades(lab, proxy, nginx, method):
    """Non-GET handshakes are refused by method; a GET one too: a WebSocket carries data both ways."""
    mark = nginx.mark()
    answer = tls_exchange(lab, proxy, DOCS_HOST, f"{method} /ws HTTP/1.1\r\nHost: {DOCS_HOST}:{HTTPS}\r\n{WEBSOCKET}\r\n".encode())
    assert status_and_reason(answer) == (403, "request_not_allowed")
    plain = raw_request(lab, proxy.port, f"{method} http://{DOCS_HOST}:{HTTP}/ws HTTP/1.1\r\nHost: {DOCS_HOST}:{HTTP}\r\n"
                        f"{WEBSOCKET}\r\n".encode())  # fmt: skip
    assert status_and_reason(plain) == (403, "request_not_allowed")
    assert nginx.since(mark) == []


def test_bytes_that_are_not_http_in_a_ruled_tunnel_are_refused(lab, proxy, nginx):
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    try:
        target = f"{DOCS_HOST}:{HTTPS}"
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(b"\x00\x01 not http, not tls\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(4096) == b""  # closed, nothing relayed
    finally:
        sock.close()
    time.sleep(0.2)
    line = [a for a in proxy.audit() if a["event"] == "tunnel" and a["method"] == "TCP"][-1]
    assert (line["decision"], line["reason"], line["host"]) == ("blocked", "request_not_allowed", DOCS_HOST)


def test_refusals_are_counted(lab, proxy, nginx):
    curl(lab, proxy, f"https://{DOCS_HOST}:{HTTPS}/count", "-X", "DELETE")
    _, metrics = proxy.get_ops("/metrics")
    counted = [line for line in metrics.splitlines() if line.startswith("egress_requests_total{")
               and 'reason="request_not_allowed"' in line and f'rule="{DOCS_HOST}"' in line]  # fmt: skip
    assert counted and 'decision="blocked"' in counted[0] and float(counted[0].rsplit(" ", 1)[1]) >= 1


def test_report_mode_reports_and_lets_through(lab, nginx):
    report = lab.start_proxy(REPORT_SPEC)
    try:
        mark = nginx.mark()
        status, headers, _ = curl(lab, report, f"https://{DOCS_HOST}:{HTTPS}/docs", "-X", "POST")
        assert status == 200 and "x-egress-denied" not in headers
        assert [r["method"] for r in nginx.since(mark, expect=1)] == ["POST"]
        line = [a for a in report.audit() if a["event"] == "request"][-1]
        assert (line["decision"], line["reason"], line["path"]) == ("reported", "request_not_allowed", "/docs")
    finally:
        report.stop()


# -- reload ------------------------------------------------------------------------------------


def test_rules_added_by_a_reload_apply_to_new_connections(lab, nginx):
    """An entry that gains `requests` is intercepted and held to them from the next connection on."""
    base = f'network:\n  allowCidrs: ["198.18.0.0/15"]\n  allowlist:\n    - domain: {DOCS_HOST}\n'
    proxy = lab.start_proxy(base)
    try:
        url = f"https://{DOCS_HOST}:{HTTPS}/reload"
        assert curl(lab, proxy, url, "-X", "POST")[0] == 200  # passed through, the upstream's own TLS
        proxy.spec_path.write_text(base + "      requests: read-only\n")
        deadline = time.monotonic() + 5
        while curl(lab, proxy, url, "-X", "POST")[0] != 403 and time.monotonic() < deadline:
            time.sleep(0.2)
        status, headers, _ = curl(lab, proxy, url, "-X", "POST")
        assert (status, headers.get("x-egress-denied")) == (403, "request_not_allowed")
        assert curl(lab, proxy, url)[0] == 200  # GET still passes, now intercepted
    finally:
        proxy.stop()


# -- one gateway, several environments (--spec-dir) ---------------------------------------------


def test_each_environment_has_its_own_rules(lab, nginx):
    """Two environments allow the same host, one `read-only`, one without rules."""
    tokens = {"ro": "tok-ro-" + secrets.token_hex(6), "rw": "tok-rw-" + secrets.token_hex(6)}
    directory = lab.dir / "rules-environments"
    directory.mkdir()
    for name, token in tokens.items():
        rules = "\n      requests: read-only" if name == "ro" else ""
        (directory / f"{name}.yaml").write_text(
            f"network:\n  proxyToken: {token}\n  allowCidrs: [\"198.18.0.0/15\"]\n"
            f"  allowlist:\n    - domain: {DOCS_HOST}{rules}\n"
        )
    gateway = lab.start_proxy(None, spec_dir=directory)
    try:
        url = f"https://{DOCS_HOST}:{HTTPS}/env"
        answers = {}
        for name, token in tokens.items():
            status, headers, _ = curl(lab, gateway, url, "-X", "POST", "--proxy-user", f"{name}:{token}")
            answers[name] = (status, headers.get("x-egress-denied"))
        # `rw` has no rules: its tunnel to the host is passed through (the upstream's own TLS).
        assert answers == {"ro": (403, "request_not_allowed"), "rw": (200, None)}
        line = [a for a in gateway.audit() if a["reason"] == "request_not_allowed"][-1]
        assert (line["environment"], line["method"], line["path"]) == ("ro", "POST", "/env")
    finally:
        gateway.stop()


# -- transparent mode --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox(lab: Lab, nginx):
    box = Sandbox(lab)
    try:
        box.start()
        proxy = box.start_proxy(SPEC)
        applied = box.redirect_rules("--proxy-port", str(proxy.port), "--proxy-uid", "0", "--apply")
        assert applied.returncode == 0, applied.stderr
        yield box
    finally:
        box.stop()


@pytest.mark.parametrize(
    ("url", "method", "passes"),
    [
        (f"https://{DOCS_HOST}:{HTTPS}/docs", "GET", True),
        (f"https://{DOCS_HOST}:{HTTPS}/docs", "POST", False),
        (f"https://{API_HOST}:{HTTPS}/repos/acme/x/issues", "POST", True),
        (f"https://{API_HOST}:{HTTPS}/repos/acme/x/../../other/y/issues", "POST", False),
        (f"http://{API_HOST}:{HTTP}/repos/acme/x/issues", "POST", True),
        (f"http://{API_HOST}:{HTTP}/repos/acme/x/%2e%2e/%2e%2e/other/y/issues", "POST", False),
        (f"http://{DOCS_HOST}:{HTTP}/docs", "DELETE", False),
    ],
)
def test_transparent_mode_is_held_to_the_rules(sandbox, nginx, url, method, passes):
    """No proxy settings at all: TLS by its SNI, plain HTTP by its Host header, then the rules."""
    mark = nginx.mark()
    status, headers, _ = sandbox.curl(url, "--path-as-is", "-X", method)
    if passes:
        assert status == 200
        assert len(nginx.since(mark, expect=1)) == 1
    else:
        assert (status, headers.get("x-egress-denied")) == (403, "request_not_allowed")
        assert nginx.since(mark) == []


# -- raw clients -------------------------------------------------------------------------------


def tls_tunnel(lab: Lab, proxy, host: str, alpn: str = "http/1.1") -> ssl.SSLSocket:
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    target = f"{host}:{HTTPS}"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    ctx = ssl.create_default_context(cafile=str(proxy.ca))
    ctx.set_alpn_protocols([alpn])
    return ctx.wrap_socket(sock, server_hostname=host)


def tls_exchange(lab: Lab, proxy, host: str, data: bytes, wait: float = 5) -> bytes:
    tls = tls_tunnel(lab, proxy, host)
    tls.sendall(data)
    tls.settimeout(wait)
    out = b""
    try:
        while chunk := tls.recv(65536):
            out += chunk
            head, sep, body = out.partition(b"\r\n\r\n")
            length = [int(v) for k, _, v in (x.partition(b":") for x in head.split(b"\r\n")) if k.lower() == b"content-length"]
            if sep and length and len(body) >= length[0]:
                break
    except (TimeoutError, OSError):
        pass
    finally:
        tls.close()
    return out



def h2_exchange(
    lab: Lab, proxy, host: str, streams: list[list[tuple[str, str]]], bodies: list[bytes] | None = None
) -> dict[int, object]:
    """Raw h2 (no client-side checks): per stream (status, X-Egress-Denied) or 'reset'."""
    tls = tls_tunnel(lab, proxy, host, alpn="h2")
    assert tls.selected_alpn_protocol() == "h2"
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False)
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    for i, headers in enumerate(streams):
        body = bodies[i] if bodies else b""
        conn.send_headers(1 + 2 * i, headers, end_stream=not body)
        if body:
            conn.send_data(1 + 2 * i, body, end_stream=True)
    tls.sendall(conn.data_to_send())
    results: dict[int, object] = {}
    done: set[int] = set()
    tls.settimeout(5)
    try:
        while len(done) < len(streams):
            data = tls.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    got = {k.decode(): v.decode() for k, v in event.headers}
                    results[event.stream_id] = (int(got[":status"]), got.get("x-egress-denied", ""))
                elif isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    done.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    results[event.stream_id] = "reset"
                    done.add(event.stream_id)
            tls.sendall(conn.data_to_send())
    finally:
        tls.close()
    return results
