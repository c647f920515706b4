"""End-to-end: attack inputs from public SSRF / proxy-bypass corpora against the real proxy.

Table-driven and cheap: each row is one raw request (bytes exactly as written, so no
client normalises the attack away) to a real `egress-proxy` in the lab, and the
assertions are what a sandbox must never get: a connection to the loopback canary,
a request at an upstream it did not name, a credential on a request it steered, a
proxy token in a log. Sources of the rows: PayloadsAllTheThings "Server Side Request
Forgery" (IP encodings, URL parser confusion), the HTTP request smuggling corpora
(CL.TE, TE.CL, obs-fold), and proxy-auth edge cases of real clients.
Most rows passed when they were written; the ones that did not are marked `# was a defect`.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import socket
import ssl
import subprocess
import time
import uuid

import h2.config
import h2.connection
import h2.events
import pytest
from http_head import recv_head

from e2e.support.clients import status_and_reason
from e2e.support.lab import CANARY_PORT, EGRESS_PROXY, HOSTS, Lab, in_netns, raw_request

CANARY_SECRET = "atk-canary-" + secrets.token_hex(8)
TOKEN = "atk-tok:" + secrets.token_hex(8)  # a colon inside the token: only the first one separates
OTHER_TOKEN = "atk-tok-b-" + secrets.token_hex(8)

STAR_SPEC = """
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: "*"
"""
STRICT_SPEC = f"""
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: api.example.test
      transform: {{Authorization: "Bearer {CANARY_SECRET}"}}
    - domain: plain.test
    - domain: "*.example.test"
"""


@pytest.fixture(scope="module")
def star(lab: Lab):
    proxy = lab.start_proxy(STAR_SPEC)
    yield proxy
    proxy.stop()
    assert_no_secret_leaked(proxy)


@pytest.fixture(scope="module")
def strict(lab: Lab):
    dns_port = lab.free_port()
    proxy = lab.start_proxy(STRICT_SPEC, "--dns-listen", f"127.0.0.1:{dns_port}")
    proxy.dns_port = dns_port
    yield proxy
    proxy.stop()
    assert_no_secret_leaked(proxy)


@pytest.fixture(scope="module")
def gateway(lab: Lab):
    directory = lab.dir / f"atk-envs-{lab.free_port()}"
    directory.mkdir()
    (directory / "env-a.yaml").write_text(
        f'network:\n  proxyToken: "{TOKEN}"\n  allowCidrs: ["198.18.0.0/15"]\n  allowlist:\n    - domain: plain.test\n'
    )
    (directory / "env-b.yaml").write_text(
        f'network:\n  proxyToken: "{OTHER_TOKEN}"\n  allowCidrs: ["198.18.0.0/15"]\n  allowlist:\n    - domain: other.test\n'
    )
    proxy = lab.start_proxy(None, spec_dir=directory)
    yield proxy
    proxy.stop()
    assert_no_secret_leaked(proxy)


def assert_no_secret_leaked(proxy) -> None:
    everything = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    for value in (CANARY_SECRET, TOKEN, OTHER_TOKEN, base64.b64encode(f"env-a:{TOKEN}".encode()).decode()):
        assert value not in everything



def marked_path() -> str:
    return "/atk-" + uuid.uuid4().hex[:12]


def reached(lab: Lab, path: str) -> list[dict]:
    return [r for r in lab.upstream_requests() if r["path"].startswith(path)]


# -- IP-literal spellings of internal addresses (PayloadsAllTheThings SSRF bypass lists) --------

INTERNAL_SPELLINGS = [
    # dotted, short, decimal, octal, hex and mixed IPv4 forms (inet_aton reads them all)
    ("127.0.0.1", "loopback"), ("127.1", "loopback"), ("127.0.1", "loopback"), ("127.000.000.001", "loopback"),
    ("0177.0.0.01", "loopback"), ("00000177.0.0.1", "loopback"), ("017700000001", "loopback"),
    ("0x7f.0x0.0x0.0x1", "loopback"), ("0x7f.1", "loopback"), ("0x00007f.1", "loopback"),
    ("127.0x0.0.1", "loopback"), ("0X7F000001", "loopback"), ("2130706433", "loopback"),
    ("127.0.0.1.", "loopback"), ("127.1.", "loopback"), ("0x7f000001.", "loopback"),
    # "this host": 0, 0.0, 0.0.0, 0x0, 00, with a trailing dot
    ("0", "loopback"), ("0.0", "loopback"), ("0.0.0", "loopback"), ("0.0.0.0", "loopback"),
    ("0.0.0.0.", "loopback"), ("0x0", "loopback"), ("00", "loopback"),
    # IPv6 loopback/unspecified, zero-padded, with zone ids (raw and %25-encoded)
    ("[::1]", "loopback"), ("[0:0:0:0:0:0:0:1]", "loopback"), ("[0000::1]", "loopback"), ("[::0:1]", "loopback"),
    ("[::]", "loopback"), ("[::1%25eth0]", "loopback"), ("[::1%eth0]", "loopback"),
    # IPv4 carried in IPv6: mapped, compatible, NAT64, 6to4, Teredo (client 127.0.0.1 xor-ed)
    ("[::ffff:127.0.0.1]", "loopback"), ("[::ffff:7f00:1]", "loopback"), ("[0:0:0:0:0:ffff:127.0.0.1]", "loopback"),
    ("[::ffff:0.0.0.0]", "loopback"), ("[::127.0.0.1]", "loopback"), ("[64:ff9b::127.0.0.1]", "loopback"),
    ("[2002:7f00:1::]", "loopback"), ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", "loopback"),
    ("[2001::7f00:1]", "loopback"),
    # localhost names
    ("localhost", "loopback"), ("LOCALHOST", "loopback"), ("localhost.", "loopback"), ("foo.localhost", "loopback"),
    ("ip6-localhost", "loopback"),  # the lab's hosts file: ::1
    # cloud metadata and the other never-reachable or private ranges
    ("169.254.169.254", "forbidden_address"), ("0xa9fea9fe", "forbidden_address"), ("2852039166", "forbidden_address"),
    ("0251.0376.0251.0376", "forbidden_address"), ("[::ffff:169.254.169.254]", "forbidden_address"),
    ("[::ffff:a9fe:a9fe]", "forbidden_address"), ("[fe80::1%25lo]", "forbidden_address"),
    ("255.255.255.255", "forbidden_address"), ("4294967295", "forbidden_address"), ("0xffffffff", "forbidden_address"),
    ("224.0.0.1", "forbidden_address"), ("[ff02::1]", "forbidden_address"), ("10.0.0.1", "forbidden_address"),
    ("192.168.1.1", "forbidden_address"), ("172.16.0.1", "forbidden_address"), ("100.64.0.1", "forbidden_address"),
    ("[fd00::1]", "forbidden_address"), ("[fec0::1]", "forbidden_address"),
    # other clouds' metadata endpoints: AWS IPv6 IMDS, Alibaba, Oracle, Tencent, Rancher
    ("[fd00:ec2::254]", "forbidden_address"), ("100.100.100.200", "forbidden_address"),
    ("192.0.0.192", "forbidden_address"), ("169.254.0.23", "forbidden_address"), ("169.254.169.250", "forbidden_address"),
    # the proxy's own address, also wrapped in IPv6 forms
    ("198.18.0.1", "proxy_self"), ("[::ffff:198.18.0.1]", "proxy_self"), ("[64:ff9b::c612:1]", "proxy_self"),
    ("[2002:c612:1::]", "proxy_self"), ("[::c612:1]", "proxy_self"),
]  # fmt: skip


@pytest.mark.parametrize("spelling, reason", INTERNAL_SPELLINGS, ids=[s for s, _ in INTERNAL_SPELLINGS])
def test_internal_address_spellings_are_refused_under_star(lab, star, spelling, reason):
    """`*` allows every name, so only the address check stands between these and the canary."""
    before = len(lab.canary.hits)
    for request in (
        f"GET http://{spelling}:{CANARY_PORT}/ HTTP/1.1\r\nHost: {spelling}:{CANARY_PORT}\r\nConnection: close\r\n\r\n",
        f"CONNECT {spelling}:{CANARY_PORT} HTTP/1.1\r\nHost: {spelling}:{CANARY_PORT}\r\n\r\n",
    ):
        assert status_and_reason(raw_request(lab, star.port, request.encode())) == (403, reason), request
    assert len(lab.canary.hits) == before


# -- authorities no parser should read (unicode dots, encodings, userinfo, fragments) --------------

UNREADABLE_AUTHORITIES = [
    "127\u30020\u30020\u30021", "\uff11\uff12\uff17.\uff10.\uff10.\uff11", "\u2460\u2461\u2466.0.0.1",
    "127\uff0e0\uff0e0\uff0e1", "127.0.0.1%00", "%31%32%37.0.0.1", "127.0.0.1\t", "[::1].",
    "plain.test@127.0.0.1", "127.0.0.1#@plain.test", "plain.test\\@127.0.0.1", "plain.test:80@127.0.0.1",
]  # fmt: skip


@pytest.mark.parametrize("authority", UNREADABLE_AUTHORITIES)
def test_confusing_authorities_never_reach_loopback(lab, star, authority):
    before = len(lab.canary.hits)
    for request in (
        f"GET http://{authority}:{CANARY_PORT}/ HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n",
        f"CONNECT {authority}:{CANARY_PORT} HTTP/1.1\r\nHost: plain.test\r\n\r\n",
    ):
        status, _ = status_and_reason(raw_request(lab, star.port, request.encode("utf-8")))
        assert status in (400, 403), request
    assert len(lab.canary.hits) == before


@pytest.mark.parametrize(
    "request_line",
    ["CONNECT plain.test HTTP/1.1", "CONNECT plain.test:0 HTTP/1.1", "CONNECT plain.test:65536 HTTP/1.1",
     "CONNECT plain.test:443@127.0.0.1:7777 HTTP/1.1", "CONNECT user@plain.test:80 HTTP/1.1",
     "CONNECT http://127.0.0.1:7777 HTTP/1.1", "CONNECT [::1] HTTP/1.1", "connect 127.0.0.1:7777 HTTP/1.1",
     "GET ws://127.0.0.1:7777/ HTTP/1.1", "GET http:/127.0.0.1:7777/ HTTP/1.1", "GET http://plain.test:80:7777/ HTTP/1.1"],
)  # fmt: skip
def test_malformed_request_lines_are_400(lab, star, request_line):
    before = len(lab.canary.hits)
    answer = raw_request(lab, star.port, f"{request_line}\r\nHost: plain.test\r\n\r\n".encode())
    assert status_and_reason(answer)[0] == 400
    assert len(lab.canary.hits) == before


# -- Host header against the request target ---------------------------------------------------

HOST_HEADER_ATTACKS = [
    "Host: plain.test\r\nHost: other.test",  # duplicate Host: the upstream might read the second
    "Host: plain.test\r\nhost: 127.0.0.1:7777",
    "Host: plain.test:80@127.0.0.1",
    "Host: plain.test:7777",  # port mismatch
    "Host: plain.test:+80",
    "Host: ",
    "Host: plain.test,other.test",
    "Host: plain.test 127.0.0.1",
    "Host: [::1]",
    "Host: 127.0.0.1:7777",
    "Host: other.test",
]


@pytest.mark.parametrize("host_lines", HOST_HEADER_ATTACKS)
def test_host_header_disagreeing_with_the_target_is_refused(lab, strict, host_lines):
    path = marked_path()
    answer = raw_request(lab, strict.port, f"GET http://plain.test{path} HTTP/1.1\r\n{host_lines}\r\nConnection: close\r\n\r\n".encode())
    assert status_and_reason(answer) == (403, "host_mismatch")
    assert not reached(lab, path)


@pytest.mark.parametrize(
    "inner",
    ["GET http://other.test{path} HTTP/1.1\r\nHost: other.test", "GET {path} HTTP/1.1\r\nHost: other.test",
     "GET {path} HTTP/1.1\r\nHost: plain.test\r\nHost: other.test", "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:7777"],
)  # fmt: skip
def test_plain_http_in_a_tunnel_stays_in_it(lab, strict, inner):
    path = marked_path()
    request = f"CONNECT plain.test:80 HTTP/1.1\r\nHost: plain.test:80\r\n\r\n{inner.format(path=path)}\r\nConnection: close\r\n\r\n"
    answer = raw_request(lab, strict.port, request.encode())
    tunnel, _, inside = answer.partition(b"\r\n\r\n")
    assert tunnel.startswith(b"HTTP/1.1 200")
    assert status_and_reason(inside) == (403, "host_mismatch")
    assert not reached(lab, path)


# -- request smuggling: ambiguous framing never reaches an upstream ---------------------------------

SMUGGLING = {
    "CL.TE": "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n",
    "TE.CL": "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
    "CL.CL": "Content-Length: 0\r\nContent-Length: 44\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n",
    "TE-unknown": "Transfer-Encoding: xchunked\r\nContent-Length: 4\r\n\r\nabcd",
    "TE-space-before-colon": "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "TE-twice": "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n",
    "CL-signed": "Content-Length: +4\r\n\r\nabcd",
}


@pytest.mark.parametrize("framing", SMUGGLING.values(), ids=SMUGGLING.keys())
def test_ambiguous_framing_is_refused_before_any_upstream(lab, strict, framing):
    path = marked_path()
    answer = raw_request(lab, strict.port, f"POST http://plain.test{path} HTTP/1.1\r\nHost: plain.test\r\n{framing}".encode())
    assert status_and_reason(answer)[0] == 400
    assert not reached(lab, path) and not reached(lab, "/smuggled")


MITMPROXY_REFUSES = {
    "garbage-request-line": b"GARBAGE\r\n\r\n",
    "space-in-target": b"GET http://plain.test/a b HTTP/1.1\r\nHost: plain.test\r\n\r\n",
    "te-and-cl": b"POST http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
    "header-without-colon": b"GET http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\nNoColonHere\r\n\r\n",
    "head-over-64k": b"GET http://plain.test/ HTTP/1.1\r\nHost: plain.test\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MITMPROXY_REFUSES.values(), ids=MITMPROXY_REFUSES.keys())
def test_what_mitmproxy_refuses_itself_names_no_version_and_is_json(lab, strict, request_bytes):  # was a defect
    """A probe of the proxy learnt its exact version: mitmproxy's own error pages said `Server: mitmproxy 12.3.1`."""
    answer = raw_request(lab, strict.port, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")), answer[:300]
    assert b"mitmproxy" not in answer.lower() and b"server:" not in head.lower(), answer[:300]
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body)["error"] == "bad_request"


@pytest.mark.parametrize(
    "field",
    ["X-A: a\rHost: other.test", "X-A: a\rTransfer-Encoding: chunked", "X-A: a\x00b", "X-A: a\rAuthorization: Bearer mine",
     "X-A: a\r\n Host: other.test"],
    ids=["cr-host", "cr-transfer-encoding", "nul", "cr-authorization", "obs-fold"],
)
def test_cr_or_nul_inside_a_header_value_is_400_never_forwarded(lab, strict, field):  # was a defect
    """A bare CR stayed in the value and went upstream as is, where a server reading CR as a line end
    saw a second Host (or Transfer-Encoding) the proxy never checked, beside the injected credential."""
    path = marked_path()
    plain = f"GET http://plain.test{path}-plain HTTP/1.1\r\nHost: plain.test\r\n{field}\r\nConnection: close\r\n\r\n"
    answer = raw_request(lab, strict.port, plain.encode("latin-1"))
    assert status_and_reason(answer) == (400, "")
    assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {
        "error": "bad_request", "detail": "header 'X-A': value contains CR, LF or NUL (RFC 9110 section 5.5)"}  # fmt: skip
    # Through interception to the credential's host: the same, and no credential goes anywhere.
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", strict.port), timeout=10)
    sock.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    tls = ssl.create_default_context(cafile=str(strict.ca)).wrap_socket(sock, server_hostname="api.example.test")
    tls.sendall(f"GET {path}-tls HTTP/1.1\r\nHost: api.example.test\r\n{field}\r\nConnection: close\r\n\r\n".encode("latin-1"))
    data = b""
    while chunk := tls.recv(65536):
        data += chunk
    tls.close()
    assert status_and_reason(data) == (400, "")
    assert not reached(lab, path)


# -- HTTP/2 inside an intercepted tunnel: :authority and host -------------------------------------


def _h2_streams(lab: Lab, proxy, streams: list[list[tuple[str, str]]]) -> dict[int, tuple[int, str] | str]:
    """Open CONNECT api.example.test:443, speak h2 (raw frames, no client-side checks), return per stream
    (status, X-Egress-Denied) or the error that ended it."""
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=str(proxy.ca))
    ctx.set_alpn_protocols(["h2"])
    tls = ctx.wrap_socket(sock, server_hostname="api.example.test")
    assert tls.selected_alpn_protocol() == "h2"
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False)
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    for i, headers in enumerate(streams):
        conn.send_headers(1 + 2 * i, headers, end_stream=True)
    tls.sendall(conn.data_to_send())
    results: dict[int, tuple[int, str] | str] = {}
    try:
        while len(results) < len(streams):
            data = tls.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    got = {k.decode(): v.decode() for k, v in event.headers}
                    results[event.stream_id] = (int(got[":status"]), got.get("x-egress-denied", ""))
                elif isinstance(event, h2.events.StreamReset):
                    results[event.stream_id] = "reset"
                elif isinstance(event, h2.events.ConnectionTerminated):
                    return {**{1 + 2 * i: "terminated" for i in range(len(streams))}, **results}
            tls.sendall(conn.data_to_send())
    finally:
        tls.close()
    return results


def _h2_request(authority: str | None, *extra: tuple[str, str], path: str) -> list[tuple[str, str]]:
    headers = [(":method", "GET"), (":scheme", "https"), (":path", path)]
    return headers + ([(":authority", authority)] if authority is not None else []) + list(extra)


@pytest.mark.parametrize(
    "authority, extra",
    [("other.test", []), (None, [("host", "other.test")]), ("api.example.test:7777", []), ("127.0.0.1", []),
     ("api.example.test", [("host", "other.test")]), ("x@other.test", []),
     ("api.example.test", [("host", "api.example.test"), ("host", "other.test")]),
     ("api.example.test", [("x-a", "a\rhost: other.test")])],
    ids=["authority-other", "host-only-other", "authority-port", "authority-loopback", "host-differs",
         "authority-userinfo", "two-hosts", "cr-in-value"],
)  # fmt: skip
def test_h2_authority_and_host_must_be_the_tunnels(lab, strict, authority, extra):
    """Refused (403 host_mismatch, 400) or the stream/connection is torn down; never sent anywhere."""
    path = marked_path()
    result = _h2_streams(lab, strict, [_h2_request(authority, *extra, path=path)])
    assert result[1] in ((403, "host_mismatch"), (400, ""), "reset", "terminated"), result
    assert not reached(lab, path)


def test_h2_multiplexed_streams_each_checked_credential_only_on_its_own(lab, strict):
    path = marked_path()
    streams = [_h2_request("api.example.test", path=path + "-ok"), _h2_request("other.test", path=path + "-other"),
               _h2_request("a.example.test", path=path + "-a"), _h2_request("127.0.0.1:7777", path=path + "-lo")]  # fmt: skip
    result = _h2_streams(lab, strict, streams)
    assert result == {1: (200, ""), 3: (403, "host_mismatch"), 5: (403, "host_mismatch"), 7: (403, "host_mismatch")}
    hits = reached(lab, path)
    assert [h["path"] for h in hits] == [path + "-ok"]
    assert dict(hits[0]["headers"])["Authorization"] == f"Bearer {CANARY_SECRET}"
    assert hits[0]["local"] == HOSTS["api.example.test"]


def test_h2_content_length_without_the_body_is_refused_at_once(lab, strict):  # was a defect
    """HEADERS with END_STREAM and `content-length: 10` (RFC 9113 8.1.1: malformed): the h2 library checks
    DATA frames only, so it went upstream as an HTTP/1 request whose server waited for ten bytes that never
    came, holding the stream until the read timeout (120 s). A matching length (0) still goes through."""
    path = marked_path()
    start = time.monotonic()
    post = [(":method", "POST"), (":scheme", "https"), (":path", path), (":authority", "api.example.test")]
    result = _h2_streams(lab, strict, [[*post, ("content-length", "10")], [*post, ("content-length", "0")]])
    assert time.monotonic() - start < 5
    assert result == {1: (400, ""), 3: (200, "")}, result
    assert len(reached(lab, path)) == 1


# -- refusals of large uploads: answered at the head, the body goes nowhere --------------------------

UPLOAD = 200_000  # over mitmproxy's stream_large_bodies (64 KiB): the body would stream
# What an upload to a refused host may carry: requests written into the body must not be read as requests.
SMUGGLED_IN_BODY = b"GET http://plain.test/smuggled-in-body HTTP/1.1\r\nHost: plain.test\r\n\r\n"


def _upload_body() -> bytes:
    return (SMUGGLED_IN_BODY * (UPLOAD // len(SMUGGLED_IN_BODY) + 1))[:UPLOAD]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
@pytest.mark.parametrize("host, reason", [("other.test", "not_allowlisted"), ("127.0.0.1:7777", "loopback")])
def test_large_upload_to_a_refused_host_is_answered_at_once(lab, strict, framing, host, reason):  # was a defect
    """mitmproxy raised NotImplementedError (a refusal and a streamed body at once): no answer, the
    client hung, and the log got tracebacks holding the first 64 KiB of the body."""
    body = _upload_body()
    if framing == "chunked":
        head, payload = "Transfer-Encoding: chunked", f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    else:
        head, payload = f"Content-Length: {len(body)}", body
    before = len(strict.stdout() + strict.stderr())
    start = time.monotonic()
    answer = raw_request(lab, strict.port, f"POST http://{host}/up HTTP/1.1\r\nHost: {host}\r\n{head}\r\n\r\n".encode() + payload)
    assert time.monotonic() - start < 3
    assert status_and_reason(answer) == (403, reason)
    assert b"Connection: close" in answer.partition(b"\r\n\r\n")[0]
    assert not reached(lab, "/smuggled-in-body")
    log = (strict.stdout() + strict.stderr())[before:]
    assert "Traceback" not in log and "GET http://plain.test/smuggled" not in log, log[-2000:]


def test_large_upload_with_curl_gets_the_403(lab, strict, tmp_path):
    upload = tmp_path / "upload.bin"
    upload.write_bytes(_upload_body() * 5)  # 1 MB: curl sends `Expect: 100-continue` for it
    out = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", strict.url, "--data-binary", f"@{upload}", "-o", "/dev/null",
        "-w", "%{http_code}", "http://other.test/upload",
    )  # fmt: skip
    assert out.stdout == "403", out
    status, _ = status_and_reason(raw_request(lab, strict.port, b"GET http://plain.test/after HTTP/1.1\r\nHost: plain.test\r\n\r\n"))
    assert status == 200


def _answer_to_head(lab: Lab, port: int, head: bytes) -> tuple[bytes, float, socket.socket]:
    """Send only a request's head, as a client waiting for `100 Continue` does: the first answer's head."""
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", port), timeout=8)
    start = time.monotonic()
    sock.sendall(head)
    out = recv_head(sock)
    return out, time.monotonic() - start, sock


@pytest.mark.parametrize(
    "proxy, host, status, reason",
    [("strict", "other.test", 403, "not_allowlisted"), ("strict", "127.0.0.1:7777", 403, "loopback"),
     ("gateway", "plain.test", 407, "proxy_auth_required")],
)  # fmt: skip
def test_a_refused_expect_100_continue_request_gets_its_answer_not_100(lab, request, proxy, host, status, reason):  # was a defect
    """mitmproxy answered `100 Continue` to a refused request: the client sent its whole body to be refused."""
    port = request.getfixturevalue(proxy).port
    head = f"POST http://{host}/expect HTTP/1.1\r\nHost: {host}\r\nExpect: 100-continue\r\nContent-Length: 20\r\n\r\n"
    answer, took, sock = _answer_to_head(lab, port, head.encode())
    sock.close()
    assert took < 3 and status_and_reason(answer) == (status, reason), answer[:200]
    assert b"Connection: close" in answer.partition(b"\r\n\r\n")[0]


def test_an_allowed_expect_100_continue_request_still_gets_100_then_its_answer(lab, strict):
    path = marked_path()
    head = f"POST http://plain.test{path} HTTP/1.1\r\nHost: plain.test\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    answer, _, sock = _answer_to_head(lab, strict.port, head.encode())
    try:
        assert answer.startswith(b"HTTP/1.1 100"), answer[:200]
        sock.sendall(b"hello")
        rest = sock.recv(65536)
        assert rest.startswith(b"HTTP/1.1 200"), rest[:200]
    finally:
        sock.close()
    assert len(reached(lab, path)) == 1


def test_large_upload_without_proxy_credentials_gets_the_407(lab, gateway):
    answer = raw_request(
        lab, gateway.port,
        f"POST http://plain.test/up HTTP/1.1\r\nHost: plain.test\r\nContent-Length: {UPLOAD}\r\n\r\n".encode() + _upload_body(),
    )  # fmt: skip
    assert status_and_reason(answer) == (407, "proxy_auth_required")
    assert not reached(lab, "/smuggled-in-body")


def test_large_h2_upload_to_another_authority_in_a_tunnel_is_refused(lab, strict):
    """HTTP/2 inside an intercepted tunnel: the stream is answered at its head (403), before its body."""
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", strict.port), timeout=10)
    sock.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=str(strict.ca))
    ctx.set_alpn_protocols(["h2"])
    tls = ctx.wrap_socket(sock, server_hostname="api.example.test")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    path = marked_path()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "https"), (":path", path), (":authority", "other.test"),
                          ("content-length", str(UPLOAD))])  # fmt: skip
    for offset in range(0, 60_000, 15_000):  # within the initial window; the rest is never sent
        conn.send_data(1, _upload_body()[offset : offset + 15_000])
    tls.sendall(conn.data_to_send())
    status, denied, ended = 0, "", False
    try:
        while not ended:
            data = tls.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    got = {k.decode(): v.decode() for k, v in event.headers}
                    status, denied = int(got[":status"]), got.get("x-egress-denied", "")
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    ended = True
            tls.sendall(conn.data_to_send())
    finally:
        tls.close()
    assert (status, denied) == (403, "host_mismatch")
    assert not reached(lab, path)


# -- proxy authentication (--spec-dir) -------------------------------------------------------------


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


PROXY_AUTH_REFUSED = {
    "tab-separator": f"Proxy-Authorization: Basic\t{_basic('env-a', TOKEN)}",
    "valid-then-garbage": f"Proxy-Authorization: Basic {_basic('env-a', TOKEN)}\r\nProxy-Authorization: Basic zzz",
    "garbage-then-valid": f"Proxy-Authorization: Basic zzz\r\nProxy-Authorization: Basic {_basic('env-a', TOKEN)}",
    "two-environments": f"Proxy-Authorization: Basic {_basic('env-a', TOKEN)}\r\nProxy-Authorization: Basic {_basic('env-b', OTHER_TOKEN)}",
    "user-upper-case": f"Proxy-Authorization: Basic {_basic('ENV-A', TOKEN)}",
    "user-trailing-space": f"Proxy-Authorization: Basic {_basic('env-a ', TOKEN)}",
    "user-path": f"Proxy-Authorization: Basic {_basic('../env-a', TOKEN)}",
    "user-file-name": f"Proxy-Authorization: Basic {_basic('env-a.yaml', TOKEN)}",
    "user-nul": f"Proxy-Authorization: Basic {_basic('env-a' + chr(0), TOKEN)}",
    "token-newline": f"Proxy-Authorization: Basic {_basic('env-a', TOKEN + chr(10))}",
    "token-prefix": f"Proxy-Authorization: Basic {_basic('env-a', TOKEN[:-1])}",
    "token-only-first-part": f"Proxy-Authorization: Basic {_basic('env-a', TOKEN.split(':')[0])}",
    "obs-fold": f"Proxy-Authorization: Basic\r\n {_basic('env-a', TOKEN)}",
    "origin-authorization": f"Authorization: Basic {_basic('env-a', TOKEN)}",
    "huge": "Proxy-Authorization: Basic " + "A" * 60000,
}  # fmt: skip


@pytest.mark.parametrize("lines", PROXY_AUTH_REFUSED.values(), ids=PROXY_AUTH_REFUSED.keys())
def test_proxy_auth_edge_cases_are_refused(lab, gateway, lines):
    path = marked_path()
    answer = raw_request(lab, gateway.port, f"GET http://plain.test{path} HTTP/1.1\r\nHost: plain.test\r\n{lines}\r\n\r\n".encode())
    assert status_and_reason(answer) == (407, "proxy_auth_required")
    assert not reached(lab, path)


@pytest.mark.parametrize("scheme", ["Basic", "basic", "BASIC", "Basic "])
def test_proxy_auth_scheme_is_case_insensitive_and_token_may_hold_colons(lab, gateway, scheme):
    path = marked_path()
    header = f"Proxy-Authorization: {scheme} {_basic('env-a', TOKEN)}"
    answer = raw_request(lab, gateway.port, f"GET http://plain.test{path} HTTP/1.1\r\nHost: plain.test\r\n{header}\r\nConnection: close\r\n\r\n".encode())
    assert status_and_reason(answer) == (200, "")
    (hit,) = reached(lab, path)
    assert "proxy-authorization" not in {k.lower() for k, _ in hit["headers"]}


def test_tunnel_belongs_to_the_connects_environment_whatever_is_sent_inside(lab, gateway):
    """env-a's CONNECT; a request inside naming env-b (and env-b's host) stays env-a's: refused."""
    path = marked_path()
    inner = f"GET {path} HTTP/1.1\r\nHost: other.test\r\nProxy-Authorization: Basic {_basic('env-b', OTHER_TOKEN)}\r\nConnection: close\r\n\r\n"
    answer = raw_request(
        lab, gateway.port,
        f"CONNECT other.test:80 HTTP/1.1\r\nHost: other.test:80\r\nProxy-Authorization: Basic {_basic('env-a', TOKEN)}\r\n\r\n{inner}".encode(),
    )  # fmt: skip
    assert status_and_reason(answer) == (403, "not_allowlisted")
    assert not reached(lab, path)


# -- DNS listener: names that are not host names ----------------------------------------------------


def _dig(lab: Lab, proxy, name: str, *args: str) -> str:
    out = lab.exec("dig", "+tries=1", "+time=3", "-p", str(proxy.dns_port), "@127.0.0.1", name, *args)
    match = re.search(r"status: (\w+)", out.stdout)
    return match.group(1) if match else f"no answer: {out.stdout[-200:]}"


@pytest.mark.parametrize(
    "name",
    ["a\\010.example.test", "plain\\010.test", "a\\009.example.test", "a\\032.example.test", "a\\.b.example.test",
     "a\\000.example.test", "a\\013.example.test"],
)  # fmt: skip
def test_dns_label_with_a_control_character_or_dot_is_nxdomain_never_resolved(lab, strict, name):
    """`*.example.test` allows names under it; a label holding LF, TAB, NUL, CR or a dot is no host
    name, so it must not reach the proxy's resolver (LF did: `$` matched before it)."""  # was a defect
    before = len(strict.audit())
    assert _dig(lab, strict, name, "A") == "NXDOMAIN"
    (line,) = [e for e in strict.audit()[before:] if e.get("event") == "dns"]
    assert (line["decision"], line["reason"]) == ("blocked", "not_allowlisted")  # not resolve_failed: never asked


def test_dns_positive_control(lab, strict):
    out = lab.exec("dig", "+short", "+tries=1", "+time=3", "-p", str(strict.dns_port), "@127.0.0.1", "A.Example.TEST", "A")
    assert out.stdout.split() == [HOSTS["a.example.test"]]


# -- spec validation: header names ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Authorization\n", "Transfer-Encoding\n", "X-Key\r", "X Key", "X-Key:"])
def test_check_refuses_transform_header_names_that_are_not_tokens(tmp_path, name):  # "\n" was a defect
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"network": {"allowlist": [{"domain": "api.example.test", "transform": {name: "Bearer x"}}]}}))
    out = subprocess.run([EGRESS_PROXY, "check", "--spec", str(spec)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out.stdout
    (line,) = out.stdout.splitlines() + out.stderr.splitlines()
    assert "network.allowlist[0].transform" in line and "RFC 9110 token" in line
