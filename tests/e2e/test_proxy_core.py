"""End-to-end: the real `egress-proxy` with real clients against test hosts in a
network namespace (issue: proxy core). Every reason code except `no_sni`
(transparent mode) is produced here by a real request."""

from __future__ import annotations

import json
import socket
import ssl

import pytest
import requests

from e2e.support.clients import as_received, assert_denied, curl, httpx_client, upstream_hits
from e2e.support.lab import CANARY_PORT, HOSTS, TEST_CIDRS_DUAL, Lab, allowlist_spec, bearer, in_netns, raw_request

SECRET = "canary-secret-7f3a9c"  # must reach api.example.test only, and never a log
FILE_SECRET = "file-secret-51b2e0"

STRICT_SPEC = allowlist_spec(
    ("api.example.test", bearer("EGRESS_TEST_TOKEN")),
    ("telemetry.example.test", {"X-Api-Key": "${file:%(secret_file)s}"}),
    "*.example.test",
    "plain.test",
    "passthrough.test",
    "Mixed.Test.",
    "sneaky.test",
    "metadata.test",
    "v6only.test",
    cidrs=TEST_CIDRS_DUAL,
)
STAR_SPEC = """
{"type": "remote", "sources": [],
 "network": {"allowCidrs": ["198.18.0.0/15"],
             "allowlist": [{"domain": "api.example.test",
                            "transform": {"Authorization": "Bearer ${env:EGRESS_TEST_TOKEN}"}},
                           {"domain": "*"}]}}
"""


@pytest.fixture(scope="module")
def strict(lab: Lab):
    secret_file = lab.dir / "telemetry-key"
    secret_file.write_text(FILE_SECRET + "\n")
    proxy = lab.start_proxy(STRICT_SPEC % {"secret_file": secret_file}, env={"EGRESS_TEST_TOKEN": SECRET})
    yield proxy
    proxy.stop()
    assert_no_secret_leaked(proxy)


@pytest.fixture(scope="module")
def star(lab: Lab):
    proxy = lab.start_proxy(STAR_SPEC, env={"EGRESS_TEST_TOKEN": SECRET}, name="spec.json")
    yield proxy
    proxy.stop()
    assert_no_secret_leaked(proxy)


def assert_no_secret_leaked(proxy) -> None:
    outputs = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    assert SECRET not in outputs and FILE_SECRET not in outputs


# -- allowlist ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, reached",
    [
        ("https://a.example.test/", "a.example.test"),  # wildcard, passthrough
        ("https://deep.a.example.test/", "deep.a.example.test"),  # wildcard, any depth
        ("http://plain.test/x", "plain.test"),  # exact, plain HTTP
        ("https://A.EXAMPLE.TEST./", "a.example.test"),  # case and trailing dot
        ("https://mixed.test/", "mixed.test"),  # spec entry written as `Mixed.Test.`
    ],
)
def test_allowed_with_curl(lab, strict, url, reached):
    status, _, body = curl(lab, strict, url)
    assert status == 200, body
    assert json.loads(body)["local"] == HOSTS[reached]


@pytest.mark.parametrize(
    "host",
    ["example.test", "evilexample.test", "example.test.evil.test", "other.test"],
)
def test_not_allowlisted_and_suffix_confusion(lab, strict, host):
    before = len(upstream_hits(lab, HOSTS[host]))
    status, headers, body = curl(lab, strict, f"http://{host}/")
    assert_denied(status, headers, body, "not_allowlisted", host)
    # Over CONNECT the proxy answers the tunnel request itself.
    out = lab.exec("curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}", "-x", strict.url, f"https://{host}/")
    assert out.stdout == "403"
    assert len(upstream_hits(lab, HOSTS[host])) == before


def test_star_entry_allows_any_name(lab, star):
    status, _, body = curl(lab, star, "http://other.test/star")
    assert status == 200 and json.loads(body)["local"] == HOSTS["other.test"]


def test_requests_and_git_clients(lab, strict):
    with in_netns(lab.proxy_ns):
        r = requests.get(
            "https://a.example.test/requests",
            proxies={"https": strict.url, "http": strict.url},
            verify=str(lab.upstream_ca),  # passthrough: the upstream's own certificate
            timeout=10,
        )
    assert r.status_code == 200 and r.json()["path"] == "/requests"
    target = lab.dir / "clone"
    out = lab.exec(
        "git", "-c", f"http.proxy={strict.url}", "-c", f"http.sslCAInfo={strict.ca}",
        "clone", "-q", "https://api.example.test/static/repo.git", str(target),
        env={"PATH": "/usr/bin:/bin", "HOME": str(lab.dir), "GIT_TERMINAL_PROMPT": "0"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (target / "README").read_text() == "hello through the proxy\n"
    # git went through interception (api.example.test has a transform): credentials injected.
    git_hits = [r for r in upstream_hits(lab, HOSTS["api.example.test"]) if "repo.git" in r["path"]]
    assert git_hits and all(dict(r["headers"]).get("Authorization") == f"Bearer {SECRET}" for r in git_hits)


# -- loopback and forbidden addresses --------------------------------------------------

LOOPBACK_SPELLINGS = [
    ("127.0.0.2", "127.0.0.2"),
    ("127.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),
    ("[::1]", "::1"),
    ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
    ("0.0.0.0", "0.0.0.0"),
    ("LOCALHOST", "localhost"),
    ("localhost.", "localhost"),
    ("sneaky.test", "sneaky.test"),  # resolves to 127.0.0.1
    ("[::127.0.0.1]", "::7f00:1"),  # IPv4-compatible
    ("[64:ff9b::7f00:1]", "64:ff9b::7f00:1"),  # NAT64
    ("[2002:7f00:1::]", "2002:7f00:1::"),  # 6to4
]


@pytest.mark.parametrize("spelling, host", LOOPBACK_SPELLINGS)
def test_loopback_every_spelling_raw(lab, star, spelling, host):
    """The request line goes out byte for byte (curl would normalise numeric forms)."""
    before = len(lab.canary.hits)
    answer = raw_request(
        lab, star.port, f"GET http://{spelling}:{CANARY_PORT}/ HTTP/1.1\r\nHost: {spelling}:{CANARY_PORT}\r\n\r\n".encode()
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"X-Egress-Denied: loopback" in head
    assert json.loads(body) == {"error": "egress_denied", "reason": "loopback", "host": host}
    answer = raw_request(lab, star.port, f"CONNECT {spelling}:{CANARY_PORT} HTTP/1.1\r\nHost: {spelling}:{CANARY_PORT}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403") and b"X-Egress-Denied: loopback" in answer
    assert len(lab.canary.hits) == before


@pytest.mark.parametrize("spelling", ["127.0.0.2", "2130706433", "[::1]", "localhost"])
def test_loopback_with_curl(lab, star, spelling):
    before = len(lab.canary.hits)
    status, headers, _ = curl(lab, star, f"http://{spelling}:{CANARY_PORT}/")
    assert status == 403 and headers["x-egress-denied"] == "loopback"
    assert len(lab.canary.hits) == before


@pytest.mark.parametrize(
    "host",
    ["169.254.169.254", "metadata.test", "10.1.2.3", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::]", "[fe80::1]", "100.64.0.1"],
)
def test_forbidden_addresses(lab, star, strict, host):
    proxy = strict if host == "metadata.test" else star
    answer = raw_request(lab, proxy.port, f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403") and b"X-Egress-Denied: forbidden_address" in answer, answer[:300]


def test_name_with_forbidden_and_permitted_address(lab, strict):
    """mixed.test -> [127.0.0.1, 198.18.0.18]: the loopback address is dropped, not dialled."""
    before = len(lab.canary.hits)
    status, _, body = curl(lab, strict, "http://mixed.test:80/")
    assert status == 200 and json.loads(body)["local"] == HOSTS["mixed.test"]
    assert len(lab.canary.hits) == before


def test_resolve_failed(lab, star):
    status, headers, body = curl(lab, star, "http://does-not-exist.invalid/")
    assert_denied(status, headers, body, "resolve_failed", "does-not-exist.invalid")


def test_proxy_self(lab, star):
    """198.18.0.1 is the proxy's own namespace address; allowCidrs covers it, still refused."""
    for target in (f"http://198.18.0.1:{star.port}/", f"http://198.18.0.1:{star.metrics_port}/metrics"):
        status, headers, body = curl(lab, star, target)
        assert_denied(status, headers, body, "proxy_self", "198.18.0.1")


# -- credentials -------------------------------------------------------------------------


def test_transform_injected_and_client_header_replaced(lab, strict):
    with in_netns(lab.proxy_ns), httpx_client(lab, strict) as client:
        r = client.get("https://api.example.test/inject", headers={"Authorization": "Bearer sandbox-own"})
        other = client.get("https://telemetry.example.test/t", headers={"Authorization": "Bearer sandbox-own"})
    assert r.status_code == 200
    auth = [v for k, v in as_received(lab, r.json())["headers"] if k.lower() == "authorization"]
    # The echo the sandbox reads has the secret masked.
    assert SECRET not in r.text and "*" * len(SECRET) in r.text
    assert auth == [f"Bearer {SECRET}"]  # replaced, not duplicated
    # Same test, second upstream with another rule: gets its own key, never the first secret.
    seen = json.dumps(as_received(lab, other.json()))
    assert FILE_SECRET not in other.text  # masked in what the sandbox reads
    assert SECRET not in seen and FILE_SECRET in seen
    assert [v for k, v in as_received(lab, other.json())["headers"] if k.lower() == "authorization"] == ["Bearer sandbox-own"]
    for hit in lab.upstream_requests():
        if hit["local"] != HOSTS["api.example.test"]:
            assert SECRET not in json.dumps(hit)


def test_secret_never_reaches_passthrough_host(lab, strict):
    status, _, body = curl(lab, strict, "https://a.example.test/nosecret")
    assert status == 200 and SECRET not in body


def test_plaintext_credentials_blocked(lab, strict):
    before = len(upstream_hits(lab, HOSTS["api.example.test"]))
    status, headers, body = curl(lab, strict, "http://api.example.test/plain")
    assert_denied(status, headers, body, "plaintext_credentials", "api.example.test")
    # Plain HTTP inside a CONNECT tunnel is no better.
    answer = raw_request(
        lab, strict.port,
        b"CONNECT api.example.test:80 HTTP/1.1\r\nHost: api.example.test:80\r\n\r\n"
        b"GET /tunnelled HTTP/1.1\r\nHost: api.example.test:80\r\n\r\n",
    )  # fmt: skip
    assert b"X-Egress-Denied: plaintext_credentials" in answer
    assert len(upstream_hits(lab, HOSTS["api.example.test"])) == before


def test_upstream_certificate_must_verify(lab):
    """A proxy that cannot verify api.example.test (test CA not trusted) sends nothing there."""
    proxy = lab.start_proxy(STAR_SPEC, env={"EGRESS_TEST_TOKEN": SECRET}, upstream_ca=False, name="spec.json")
    try:
        before = len(upstream_hits(lab, HOSTS["api.example.test"]))
        status, _, body = curl(lab, proxy, "https://api.example.test/unverified")
        assert status == 502, body
        assert len(upstream_hits(lab, HOSTS["api.example.test"])) == before
    finally:
        proxy.stop()
    assert_no_secret_leaked(proxy)


# -- host agreement ------------------------------------------------------------------------


def _tls_in_tunnel(lab: Lab, proxy, connect_host: str, sni: str, cafile: str) -> ssl.SSLSocket:
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(f"CONNECT {connect_host}:443 HTTP/1.1\r\nHost: {connect_host}:443\r\n\r\n".encode())
    answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.check_hostname = False
    return ctx.wrap_socket(sock, server_hostname=sni)


@pytest.mark.parametrize("connect_host", ["api.example.test", "a.example.test"])
def test_connect_host_differs_from_sni(lab, strict, connect_host):
    """Intercepted (transform) and passthrough entries alike: the tunnel is closed."""
    before = len(lab.upstream_requests())
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        tls = _tls_in_tunnel(lab, strict, connect_host, "other.test", str(lab.upstream_ca))
        tls.sendall(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        if not tls.recv(1):
            raise ConnectionError("closed")
    assert len(lab.upstream_requests()) == before
    assert any(e["reason"] == "host_mismatch" for e in strict.audit())


def test_host_header_differs_from_connect_after_interception(lab, strict):
    before = len(lab.upstream_requests())
    tls = _tls_in_tunnel(lab, strict, "api.example.test", "api.example.test", str(strict.ca))
    tls.sendall(b"GET /smuggle HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := tls.recv(65536):
        data += chunk
    tls.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403") and b"X-Egress-Denied: host_mismatch" in head
    assert len(lab.upstream_requests()) == before


def test_absolute_uri_and_host_header_must_agree(lab, strict):
    answer = raw_request(lab, strict.port, b"GET http://plain.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
    assert b"X-Egress-Denied: host_mismatch" in answer


# -- protocols -----------------------------------------------------------------------------


def test_http1_through_interception_with_httpx(lab, strict):
    with in_netns(lab.proxy_ns), httpx_client(lab, strict) as client:
        r = client.get("https://api.example.test/proto")
    assert r.http_version == "HTTP/1.1"
    assert dict(as_received(lab, r.json())["headers"])["Authorization"] == f"Bearer {SECRET}"


def test_http2_through_interception_with_curl(lab, strict):
    # (httpx offers `http/1.1` before `h2` in a proxy tunnel, so curl is the h2 client here.)
    out = lab.exec(
        "curl", "-sS", "--http2", "-x", strict.url, "--cacert", str(strict.ca),
        "-w", "\\n%{http_version} %{http_code}", "https://api.example.test/curl-h2",
    )  # fmt: skip
    body, _, summary = out.stdout.rpartition("\n")
    assert summary == "2 200", out.stderr
    assert dict(as_received(lab, json.loads(body))["headers"])["Authorization"] == f"Bearer {SECRET}"


def test_websocket_upgrade_to_non_allowlisted_host(lab, strict):
    answer = raw_request(
        lab, strict.port,
        b"GET http://other.test/ws HTTP/1.1\r\nHost: other.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 403") and b"X-Egress-Denied: not_allowlisted" in answer


def test_ipv6_upstream(lab, strict):
    status, _, body = curl(lab, strict, "http://v6only.test/")
    assert status == 200 and json.loads(body)["local"] == HOSTS["v6only.test"]
