"""End-to-end: second red-team pass on the gateway's proof of environment, with real clients.

Every client a sandbox may run (curl, requests, httpx, git, pip, node's undici) is given
a proxy URL `http://ENV:TOKEN@gateway`, once with the right token and once with a wrong
one. The token holds the characters that must be percent-encoded in a URL (`@ : / # ? %`
and others): each client must decode them before it encodes the Basic credential, and
the gateway must then accept exactly the configured token — no second decoding, no
normalisation — and answer a wrong one with a 407 the client reports.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import ssl
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import requests
from http_head import recv_head

from e2e.support.lab import Lab, in_netns

ROOT = Path(__file__).resolve().parents[2]
UNDICI = ROOT / ".tools" / "node_modules" / "undici"  # scripts/fetch-undici.sh
# Visible ASCII, with every character a URL's userinfo must percent-encode.
TOKEN = "t0k@:/#?%[]+=&$!'()*,;~" + secrets.token_hex(8)
WRONG = TOKEN[:-1] + ("0" if TOKEN[-1] != "0" else "1")
CANARY = "gw-canary-" + secrets.token_hex(8)
TOKEN_B = "tok-b-" + secrets.token_hex(8)
CANARY_B = "gw-canary-b-" + secrets.token_hex(8)
SPEC = {"network": {
    "proxyToken": TOKEN, "allowCidrs": ["198.18.0.0/15"],
    "allowlist": [{"domain": "api.example.test", "transform": {"Authorization": f"Bearer {CANARY}"}},
                  {"domain": "plain.test"}, {"domain": "passthrough.test"}],
}}  # fmt: skip


@pytest.fixture(scope="module")
def gateway(lab: Lab):
    directory = lab.dir / f"rt2-envs-{lab.free_port()}"
    directory.mkdir()
    (directory / "env-a.json").write_text(json.dumps(SPEC))
    spec_b = json.loads(json.dumps(SPEC).replace(CANARY, CANARY_B).replace(json.dumps(TOKEN)[1:-1], TOKEN_B))
    (directory / "env-b.json").write_text(json.dumps(spec_b))
    proxy = lab.start_proxy(None, spec_dir=directory)
    bundle = proxy.dir / "clients-ca.pem"
    bundle.write_text(proxy.ca.read_text() + lab.upstream_ca.read_text())
    proxy.bundle = bundle
    yield proxy
    proxy.stop()
    everything = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    for value in (TOKEN, WRONG, quote(TOKEN, safe=""), CANARY, TOKEN_B, CANARY_B, base64.b64encode(f"env-a:{TOKEN}".encode()).decode()):
        assert value not in everything


def proxy_url(proxy, token: str) -> str:
    return f"http://env-a:{quote(token, safe='')}@127.0.0.1:{proxy.port}"


def marked_path() -> str:
    return "/rt2gw-" + uuid.uuid4().hex[:12]


def reached(lab: Lab, path: str) -> list[dict]:
    return [r for r in lab.upstream_requests() if r["path"].startswith(path)]


CLIENT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "GIT_TERMINAL_PROMPT": "0"}


def run_curl(lab, proxy, token, url) -> tuple[str, str]:
    out = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", proxy_url(proxy, token), "--cacert", str(proxy.bundle),
        "-o", "/dev/null", "-w", "%{http_code} %{http_connect}", url, env=CLIENT_ENV,
    )  # fmt: skip
    return out.stdout, out.stderr


def run_requests(lab, proxy, token, url) -> tuple[str, str]:
    with in_netns(lab.proxy_ns):
        try:
            r = requests.get(url, proxies={"http": proxy_url(proxy, token), "https": proxy_url(proxy, token)},
                             verify=str(proxy.bundle), timeout=10)  # fmt: skip
        except requests.exceptions.ProxyError as exc:
            return "", str(exc)
    return str(r.status_code), ""


def run_httpx(lab, proxy, token, url) -> tuple[str, str]:
    with in_netns(lab.proxy_ns):
        context = ssl.create_default_context(cafile=str(proxy.bundle))
        try:
            with httpx.Client(proxy=proxy_url(proxy, token), verify=context, trust_env=False, timeout=10) as client:
                return str(client.get(url).status_code), ""
        except httpx.ProxyError as exc:
            return "", str(exc)


def run_git(lab, proxy, token, url) -> tuple[str, str]:
    out = lab.exec(
        "git", "-c", f"http.proxy={proxy_url(proxy, token)}", "-c", f"http.sslCAInfo={proxy.bundle}",
        "ls-remote", url, env=CLIENT_ENV,
    )  # fmt: skip
    return ("ok" if out.returncode == 0 else ""), out.stderr


def run_pip(lab, proxy, token, url) -> tuple[str, str]:
    target = proxy.dir / f"pip-{uuid.uuid4().hex[:8]}"
    out = lab.exec(
        str(ROOT / ".venv" / "bin" / "pip"), "download", "-vv", "--isolated", "--no-deps", "--retries", "0", "--timeout", "10",
        "--proxy", proxy_url(proxy, token), "--cert", str(proxy.bundle), "--index-url", url, "-d", str(target),
        "no-such-package-rt2", env=CLIENT_ENV, timeout=60,
    )  # fmt: skip
    return out.stdout, out.stderr


_UNDICI = """
const { ProxyAgent, fetch } = require(process.argv[1]);
const agent = new ProxyAgent({ uri: process.argv[2], requestTls: { ca: require("fs").readFileSync(process.argv[3]) } });
fetch(process.argv[4], { dispatcher: agent }).then(
  (r) => console.log(String(r.status)),
  (e) => console.log("error " + (e.cause ? e.cause.message : e.message)),
);
"""


def run_undici(lab, proxy, token, url) -> tuple[str, str]:
    if not UNDICI.is_dir():
        pytest.fail("undici is not installed: run scripts/fetch-undici.sh")
    out = lab.exec("node", "-e", _UNDICI, str(UNDICI), proxy_url(proxy, token), str(proxy.bundle), url, env=CLIENT_ENV)
    return out.stdout.strip(), out.stderr


_UNDICI_ENV = """
const { EnvHttpProxyAgent, fetch } = require(process.argv[1]);
const agent = new EnvHttpProxyAgent({ requestTls: { ca: require("fs").readFileSync(process.argv[2]) } });
fetch(process.argv[3], { dispatcher: agent }).then(
  (r) => console.log(String(r.status)),
  (e) => console.log("error " + (e.cause ? e.cause.message : e.message)),
);
"""


def run_undici_env(lab, proxy, token, url) -> tuple[str, str]:
    """EnvHttpProxyAgent: the proxy URL from HTTPS_PROXY / HTTP_PROXY, as a sandbox's environment sets it."""
    if not UNDICI.is_dir():
        pytest.fail("undici is not installed: run scripts/fetch-undici.sh")
    env = {**CLIENT_ENV, "HTTPS_PROXY": proxy_url(proxy, token), "HTTP_PROXY": proxy_url(proxy, token)}
    out = lab.exec("node", "-e", _UNDICI_ENV, str(UNDICI), str(proxy.bundle), url, env=env)
    return out.stdout.strip(), out.stderr


# client -> (url through the gateway, what it says when it worked, what it says on a 407).
# undici 6 reports any non-200 answer to its CONNECT as "Request was cancelled." (its own
# wording, the status is not passed on); pip shows the 407 at -vv.
CLIENTS = {
    "curl-https": (run_curl, "https://api.example.test{path}", "200 200", "407"),
    "curl-http": (run_curl, "http://plain.test{path}", "200 000", "407"),
    "requests-https": (run_requests, "https://api.example.test{path}", "200", "407"),
    "requests-http": (run_requests, "http://plain.test{path}", "200", "407"),
    "httpx-https": (run_httpx, "https://api.example.test{path}", "200", "407"),
    # Not `repo.git`: test_proxy_core counts every repo.git request to api.example.test as its own.
    "git-https": (run_git, "https://api.example.test{path}/rt2.git", "ok", "407"),
    "pip-https": (run_pip, "https://passthrough.test{path}/simple/", None, "407 Proxy Authentication Required"),
    "undici-https": (run_undici, "https://api.example.test{path}", "200", "error Request was cancelled."),
    "undici-http": (run_undici, "http://plain.test{path}", "200", "error Request was cancelled."),
    "undici-env-https": (run_undici_env, "https://api.example.test{path}", "200", "error Request was cancelled."),
}


@pytest.mark.parametrize("client", CLIENTS.values(), ids=CLIENTS.keys())
def test_real_client_with_the_right_token_in_the_url(lab, gateway, client):
    run, url, worked, _ = client
    path = marked_path()
    said, err = run(lab, gateway, TOKEN, url.format(path=path))
    hits = reached(lab, path)
    assert hits, (said, err[-1500:])
    if worked is not None:
        assert said == worked, (said, err[-1500:])
    for hit in hits:
        assert "proxy-authorization" not in {k.lower() for k, _ in hit["headers"]}


@pytest.mark.parametrize("client", CLIENTS.values(), ids=CLIENTS.keys())
def test_real_client_with_a_wrong_token_gets_407(lab, gateway, client):
    run, url, _, refused = client
    path = marked_path()
    said, err = run(lab, gateway, WRONG, url.format(path=path))
    assert not reached(lab, path)
    assert refused in said + err, (said, err[-1500:])


def basic(user: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def test_proxy_authorization_inside_an_intercepted_tunnel_neither_switches_nor_leaks(lab, gateway):
    """env-a's CONNECT; inside the intercepted TLS, requests carrying env-b's (valid) credentials,
    a wrong token, or none: all stay env-a's (env-a's secret injected), and the header never
    reaches the upstream."""
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    sock.sendall(f"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n"
                 f"Proxy-Authorization: {basic('env-a', TOKEN)}\r\n\r\n".encode())  # fmt: skip
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    tls = ssl.create_default_context(cafile=str(gateway.ca)).wrap_socket(sock, server_hostname="api.example.test")
    paths = []
    try:
        for extra in (f"Proxy-Authorization: {basic('env-b', TOKEN_B)}\r\n", f"proxy-authorization: {basic('env-a', WRONG)}\r\n", ""):
            path = marked_path()
            paths.append(path)
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: api.example.test\r\n{extra}\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(65536)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(next(v for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")) if k.lower() == b"content-length"))
            body = head.partition(b"\r\n\r\n")[2]
            while len(body) < length:
                body += tls.recv(65536)
    finally:
        tls.close()
    for path in paths:
        (hit,) = reached(lab, path)
        headers = {k.lower(): v for k, v in hit["headers"]}
        assert headers["authorization"] == f"Bearer {CANARY}"
        assert "proxy-authorization" not in headers


@pytest.mark.parametrize("connect_to", ["other.test:443", "plain.test:9"], ids=["refused-403", "dead-502"])
@pytest.mark.parametrize("later", ["env-b", "none", "wrong"])
def test_requests_after_an_unanswered_connect_are_still_proven(lab, gateway, connect_to, later):  # was a defect
    """env-a's CONNECT is refused (403) or its upstream is dead (502) and the client connection
    stays open: a later plain request on it with other, no or wrong credentials is a switch of
    credentials like any other (407, closed), not a request "in the tunnel" (there is none)."""
    path = marked_path()
    credentials = {"env-b": f"Proxy-Authorization: {basic('env-b', TOKEN_B)}\r\n", "none": "",
                   "wrong": f"Proxy-Authorization: {basic('env-a', WRONG)}\r\n"}[later]  # fmt: skip
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        sock.sendall(f"CONNECT {connect_to} HTTP/1.1\r\nHost: {connect_to}\r\nProxy-Authorization: {basic('env-a', TOKEN)}\r\n\r\n".encode())
        first = read_response(sock)
        assert first.split(b" ", 2)[1] in (b"403", b"502"), first
        sock.sendall(f"GET http://plain.test{path} HTTP/1.1\r\nHost: plain.test\r\n{credentials}\r\n".encode())
        second = read_response(sock)
    finally:
        sock.close()
    assert second.startswith(b"HTTP/1.1 407"), second
    assert not reached(lab, path)


def read_response(sock: socket.socket) -> bytes:
    data = b""
    sock.settimeout(5)
    try:
        data = recv_head(sock)
        if b"\r\n\r\n" not in data:
            return data  # EOF before a whole head
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")) if k.lower() == b"content-length"), 0)
        while len(body) < length:
            body += sock.recv(65536)
        return head + b"\r\n\r\n" + body
    except (TimeoutError, ConnectionResetError):
        return data


MALFORMED_CREDENTIAL_LINES = {
    "no-colon": "Proxy-Authorization Basic {b64}",
    "space-before-colon": "Proxy-Authorization : Basic {b64}",
    "nul-in-value": "Proxy-Authorization: Basic {b64}\x00",
    "cr-in-value": "Proxy-Authorization: Basic {b64}\rX: y",
    "request-line": "GET http://plain.test/{b64} HTTP/1.1",
}


@pytest.mark.parametrize("line", MALFORMED_CREDENTIAL_LINES.values(), ids=MALFORMED_CREDENTIAL_LINES.keys())
def test_a_malformed_credential_line_is_never_logged(lab, gateway, line):
    """A client that sends its credential in a line the proxy cannot parse gets an error, and the
    credential (base64 or decoded) appears in no log line (the gateway fixture checks at the end too)."""
    b64 = base64.b64encode(f"env-a:{TOKEN}".encode()).decode()
    path = marked_path()
    request = f"GET http://plain.test{path} HTTP/1.1\r\nHost: plain.test\r\n{line.format(b64=b64)}\r\n\r\n"
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        sock.sendall(request.encode("latin-1"))
        answer = read_response(sock)
    finally:
        sock.close()
    assert answer.split(b" ", 2)[1] in (b"400", b"407"), answer
    assert not reached(lab, path)
    logs = gateway.stdout() + gateway.stderr()
    assert b64 not in logs and TOKEN not in logs


@pytest.mark.parametrize("userinfo", ["env-a:{token}@", "env-a:{quoted}@", "{b64}@"], ids=["raw", "quoted", "base64"])
def test_credentials_in_the_request_url_prove_nothing_and_are_never_logged(lab, gateway, userinfo):
    """`GET http://env-a:TOKEN@plain.test/` (a client that put the proxy URL's credentials into the
    target URL): no proof of environment (407), nothing upstream, no log line holds the token."""
    b64 = base64.b64encode(f"env-a:{TOKEN}".encode()).decode()
    path = marked_path()
    info = userinfo.format(token=TOKEN, quoted=quote(TOKEN, safe=""), b64=b64)
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        sock.sendall(f"GET http://{info}plain.test{path} HTTP/1.1\r\nHost: plain.test\r\n\r\n".encode("latin-1"))
        answer = read_response(sock)
    finally:
        sock.close()
    assert answer.split(b" ", 2)[1] in (b"400", b"407"), answer
    assert not reached(lab, path)
    logs = gateway.stdout() + gateway.stderr()
    assert TOKEN not in logs and quote(TOKEN, safe="") not in logs and b64 not in logs
