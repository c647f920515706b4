"""End-to-end: the injected credential reaches its entry's host only, and never comes back.

Third red-team pass, on `transform` entries. The upstream here is `raw_upstream.RawUpstream`
on the credential host's address (port 8443; the echo server holds 443): it records the
raw bytes the proxy sent and answers like a hostile-but-allowlisted server would — it
echoes the request it received, which is exactly what a server does for TRACE. So each
test can assert both what left the proxy (one credential, on the right request, to the
right host) and what the sandbox could read back (never the credential).
Rows that failed when written are marked `# was a defect`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import socket
import ssl
import time

import h2.config
import h2.connection
import h2.events
import pytest

from e2e.support.clients import client_ca_bundle, status_and_reason
from e2e.support.lab import HOSTS, Lab, in_netns
from e2e.support.raw_upstream import RawUpstream

SECRET = "cred-canary-" + secrets.token_hex(8)
PORT = 8443
API = f"api.example.test:{PORT}"
SPEC = f"""
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: api.example.test
      transform: {{Authorization: "Bearer {SECRET}"}}
    - domain: other.test
    - domain: plain.test
"""


def echo(head: bytes) -> bytes:
    """What a server with TRACE enabled answers (RFC 9110 §9.3.8), for every method."""
    body = head + b"\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: message/http\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.fixture(scope="module")
def proxy(lab: Lab):
    proxy = lab.start_proxy(SPEC)
    yield proxy
    proxy.stop()
    everything = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    assert SECRET not in everything  # audit log, mitmproxy's own log, metrics


@pytest.fixture
def upstream(lab: Lab):
    with RawUpstream(lab, HOSTS["api.example.test"], PORT, respond=echo) as server:
        yield server


def tunnel(lab: Lab, proxy, alpn: str = "http/1.1") -> ssl.SSLSocket:
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(f"CONNECT {API} HTTP/1.1\r\nHost: {API}\r\n\r\n".encode())
    answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    ctx = ssl.create_default_context(cafile=str(proxy.ca))
    ctx.set_alpn_protocols([alpn])
    return ctx.wrap_socket(sock, server_hostname="api.example.test")


def exchange(lab: Lab, proxy, data: bytes, wait: float = 3) -> bytes:
    """Send `data` inside an intercepted tunnel to the credential's host; all that comes back."""
    tls = tunnel(lab, proxy)
    tls.sendall(data)
    tls.settimeout(wait)
    out = b""
    try:
        while chunk := tls.recv(65536):
            out += chunk
    except (TimeoutError, OSError):
        pass
    finally:
        tls.close()
    return out



def credential_lines(raw: bytes) -> list[bytes]:
    return [line for line in raw.split(b"\r\n") if line.lower().startswith(b"authorization:")]


# -- TRACE: the server's answer is the request, credential included ------------------------------

ECHO_METHODS = ["TRACE", "TRACK", "trace", "Trace"]


@pytest.mark.parametrize("method", ECHO_METHODS)
def test_trace_to_a_transform_entry_is_refused(lab, proxy, upstream, method):  # was a defect
    """It went upstream with the credential, and the TRACE echo handed the secret to the sandbox."""
    answer = exchange(lab, proxy, f"{method} / HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n".encode())
    assert status_and_reason(answer) == (403, "trace_credentials")
    assert SECRET.encode() not in answer
    time.sleep(0.2)
    assert upstream.received == b""  # refused before the proxy dialled


def test_trace_with_curl_is_refused(lab, proxy, upstream):  # was a defect
    out = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", proxy.url, "--cacert", client_ca_bundle(lab, proxy),
        "-X", "TRACE", "-D", "-", f"https://{API}/", env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert "x-egress-denied: trace_credentials" in out.stdout.lower(), out.stdout + out.stderr  # curl speaks h2 here
    assert SECRET not in out.stdout
    assert upstream.received == b""


def test_trace_over_h2_is_refused(lab, proxy, upstream):  # was a defect
    result, _ = h2_exchange(lab, proxy, [h2_request("TRACE")])
    assert result[1] == (403, "trace_credentials")
    assert upstream.received == b""


def test_get_is_the_positive_control(lab, proxy, upstream):
    """Same tunnel, same server: a GET gets exactly one credential (and this server echoes it)."""
    answer = exchange(lab, proxy, f"GET /ok HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n".encode())
    assert status_and_reason(answer)[0] == 200
    assert credential_lines(upstream.received) == [f"Authorization: Bearer {SECRET}".encode()]


# -- HTTP/2 request lines: `:method` / `:path` go into the upstream's HTTP/1 request line ----------


def h2_request(method: str = "GET", path: str = "/x", *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [(":method", method), (":scheme", "https"), (":path", path), (":authority", API), *extra]


def h2_exchange(lab: Lab, proxy, streams: list[list[tuple[str, str]]]):
    """Raw h2 (no client-side checks) in an intercepted tunnel: per stream (status, X-Egress-Denied)
    or 'reset'/'terminated', and the response bodies."""
    tls = tunnel(lab, proxy, alpn="h2")
    assert tls.selected_alpn_protocol() == "h2"
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False)
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    for i, headers in enumerate(streams):
        conn.send_headers(1 + 2 * i, headers, end_stream=True)
    tls.sendall(conn.data_to_send())
    results: dict[int, object] = {}
    bodies: dict[int, bytes] = {}
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
                    bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    done.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    results[event.stream_id] = "reset"
                    done.add(event.stream_id)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    return {**{1 + 2 * i: "terminated" for i in range(len(streams))}, **results}, bodies
            tls.sendall(conn.data_to_send())
    finally:
        tls.close()
    return results, bodies


REQUEST_LINES = {
    # RFC 9112 §3.2.2: the server uses an absolute-form target's host and ignores Host
    "path-absolute-other-host": ("GET", "https://other.test/x"),
    "path-absolute-same-host": ("GET", f"https://{API}/x"),
    "path-absolute-http": ("GET", "http://other.test/x"),
    "path-authority-form": ("GET", "other.test:443"),
    "path-no-slash": ("GET", "x"),
    "path-with-space": ("GET", "/a HTTP/1.1"),
    "path-with-tab": ("GET", "/a\tb"),
    "path-star-not-options": ("GET", "*"),
    "method-with-space": ("GET /smuggled HTTP/1.1", "/a"),
    "method-with-slash": ("GET/", "/a"),
}


@pytest.mark.parametrize("method, path", REQUEST_LINES.values(), ids=REQUEST_LINES.keys())
def test_h2_request_line_values_a_server_would_read_differently_are_400(lab, proxy, upstream, method, path):  # was a defect
    """`:path https://other.test/x` went upstream as `GET https://other.test/x HTTP/1.1` with the
    credential: a host-routing server serves that for other.test. Spaces split the line."""
    result, bodies = h2_exchange(lab, proxy, [h2_request(method, path)])
    assert result[1] in ((400, ""), "reset", "terminated"), result
    if result[1] == (400, ""):
        assert json.loads(bodies[1])["error"] == "bad_request"
    time.sleep(0.2)
    assert upstream.received == b""


def test_h2_options_star_and_ordinary_paths_still_work(lab, proxy, upstream):
    streams = [h2_request("OPTIONS", "*"), h2_request("GET", "/a?b=c%20d&e=/f"), h2_request("GET", "//double/slash")]
    result, _ = h2_exchange(lab, proxy, streams)
    assert result == {1: (200, ""), 3: (200, ""), 5: (200, "")}
    assert len(credential_lines(upstream.received)) == 3


# -- where the credential goes: once, on the request the proxy checked ---------------------------

PLACEMENT = {
    "client-header-same-case": "Authorization: Bearer mine\r\n",
    "client-header-lower-case": "authorization: Bearer mine\r\n",
    "client-header-twice-other-cases": "AUTHORIZATION: Bearer mine\r\naUtHoRiZaTiOn: Basic bWluZTptaW5l\r\n",
    "client-header-empty": "Authorization:\r\n",
    "host-upper-case-trailing-dot": "X-Host-Test: 1\r\n",
    "expect-100-continue": "Expect: 100-continue\r\nContent-Length: 3\r\n",
}


@pytest.mark.parametrize("extra", PLACEMENT.values(), ids=PLACEMENT.keys())
def test_credential_is_sent_once_replacing_the_clients(lab, proxy, upstream, extra):
    host = "API.Example.Test.:8443" if "X-Host-Test" in extra else API
    body = "abc" if "Content-Length: 3" in extra else ""
    exchange(lab, proxy, f"POST /p HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n{body}".encode(), wait=2)
    assert credential_lines(upstream.received) == [f"Authorization: Bearer {SECRET}".encode()] or \
        [line.lower() for line in credential_lines(upstream.received)] == [f"authorization: bearer {SECRET}".lower().encode()]  # fmt: skip
    assert b"mine" not in upstream.received and b"bWluZTptaW5l" not in upstream.received


def test_pipelined_requests_each_get_one_credential_and_no_more_requests_appear(lab, proxy, upstream):
    """Two pipelined requests and a chunked body holding a third request line: the upstream sees
    two requests (the third stays body bytes), one credential each."""
    smuggled = "GET /smuggled HTTP/1.1\r\nHost: api.example.test\r\n\r\n"
    chunk = f"{len(smuggled):x}\r\n{smuggled}\r\n0\r\n\r\n"
    exchange(
        lab, proxy,
        f"POST /one HTTP/1.1\r\nHost: {API}\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"
        f"GET /two HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n".encode(),
        wait=2,
    )  # fmt: skip
    raw = upstream.received
    request_lines = [line for line in raw.split(b"\r\n") if line.endswith(b" HTTP/1.1") and b" /" in line]
    assert request_lines[0] == b"POST /one HTTP/1.1" and request_lines[-1] == b"GET /two HTTP/1.1"
    assert len(credential_lines(raw)) == 2


def test_websocket_credential_on_the_handshake_only(lab, proxy):
    def switch(head: bytes) -> bytes:
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        return b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"

    with RawUpstream(lab, HOSTS["api.example.test"], PORT, respond=switch) as upstream:
        tls = tunnel(lab, proxy)
        tls.sendall(
            f"GET /ws HTTP/1.1\r\nHost: {API}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )  # fmt: skip
        assert tls.recv(4096).startswith(b"HTTP/1.1 101")
        payload = b"Authorization: Bearer mine"  # a text frame, masked with a zero key so it is readable upstream
        tls.sendall(bytes([0x81, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
        deadline = time.monotonic() + 5
        while len(upstream.received) <= upstream.received.find(b"\r\n\r\n") + 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        tls.close()
    raw = upstream.received
    head, _, frames = raw.partition(b"\r\n\r\n")
    assert credential_lines(head) == [f"Authorization: Bearer {SECRET}".encode()]
    assert frames and SECRET.encode() not in frames


def test_redirect_to_another_host_does_not_carry_the_credential(lab, proxy):
    """curl -L follows a 302 from the credential's host to other.test (passthrough): nothing of the
    credential goes with it (the proxy injects per request, for the entry's host only)."""

    def redirect(head: bytes) -> bytes:
        return b"HTTP/1.1 302 Found\r\nLocation: https://other.test/after-redirect\r\nContent-Length: 0\r\n\r\n"

    with RawUpstream(lab, HOSTS["api.example.test"], PORT, respond=redirect):
        out = lab.exec(
            "curl", "-sS", "--max-time", "10", "-L", "--location-trusted", "-x", proxy.url,
            "--cacert", client_ca_bundle(lab, proxy), f"https://{API}/start", env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    assert json.loads(out.stdout)["path"] == "/after-redirect", out.stderr
    assert SECRET not in out.stdout
    hits = [r for r in lab.upstream_requests() if r["path"] == "/after-redirect"]
    assert hits and all(SECRET not in json.dumps(h) for h in hits)


def test_credential_applies_to_every_port_of_the_entrys_name_over_verified_tls(lab, proxy, upstream):
    """Documented scope (SECURITY.md): the entry names a host, not a port; port 8443 of the same
    name, verified against the name, gets the credential. Plain HTTP on any port does not."""
    exchange(lab, proxy, f"GET /port HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n".encode(), wait=2)
    assert len(credential_lines(upstream.received)) == 1


def test_chunked_body_with_trailers_is_closed_promptly_without_a_traceback(lab, proxy, upstream):  # was a defect
    """mitmproxy raised NotImplementedError for HTTP/1 trailers: the connection hung with no answer
    and each such request wrote a traceback to the log (log flooding by the sandbox)."""
    started = time.monotonic()
    answer = exchange(
        lab, proxy,
        f"POST /trailers HTTP/1.1\r\nHost: {API}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n".encode(),
        wait=8,
    )  # fmt: skip
    assert time.monotonic() - started < 5  # closed by the proxy, not by our wait
    assert SECRET.encode() not in answer
    time.sleep(0.3)
    assert b"/trailers" not in upstream.received  # the body never completed: nothing sent on
    assert "Traceback" not in proxy.stdout() + proxy.stderr()
    positive = exchange(lab, proxy, f"GET /after HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n".encode())
    assert status_and_reason(positive)[0] == 200


def test_alt_svc_pointing_elsewhere_does_not_carry_the_credential(lab, proxy):
    """A response's `Alt-Svc: h2="other.test:443"` and curl's alt-svc cache: a later request to the
    credential's host may go to the alternative (CONNECT other.test with the SNI of api.example.test:
    host_mismatch) or stay; either way other.test never sees the credential."""

    def alt_svc(head: bytes) -> bytes:
        return b'HTTP/1.1 200 OK\r\nAlt-Svc: h2="other.test:443"; ma=3600\r\nContent-Length: 2\r\n\r\nok'

    cache = proxy.dir / "alt-svc.txt"
    with RawUpstream(lab, HOSTS["api.example.test"], PORT, respond=alt_svc) as upstream:
        for _ in range(2):
            lab.exec(
                "curl", "-sS", "--max-time", "10", "--alt-svc", str(cache), "-x", proxy.url,
                "--cacert", client_ca_bundle(lab, proxy), f"https://{API}/alt", env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
    assert credential_lines(upstream.received)  # the first request did reach the credential's host
    for hit in lab.upstream_requests():
        if hit["local"] == HOSTS["other.test"]:
            assert SECRET not in json.dumps(hit)
