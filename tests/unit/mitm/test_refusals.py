"""egress.mitm.refusals: the exact bytes of every answer the proxy gives in place of a destination's.

The wire form is what mitmproxy's HTTP/1 writer (`assemble_response`) sends for the
response. Pinned byte for byte: status line, header names, order and values, body.
A change here changes the public contract (SPEC §3 and §7, docs/decisions.md), so it must be
deliberate. The end-to-end versions (real proxy, real clients) are in
tests/e2e/test_proxy_core.py, test_gateway.py, test_passthrough.py,
test_reliability.py, test_parent_proxy.py and test_attack_ssrf_and_smuggling.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy.net.http.http1 import assemble_response

import egress
from egress.mitm import refusals
from egress.net import upstream
from egress.policy import decisions as policy


def wire(response) -> bytes:
    return assemble_response(response)


def test_denied():
    assert wire(refusals.denied("not_allowlisted", "other.test")) == (
        b"HTTP/1.1 403 Forbidden\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Egress-Denied: not_allowlisted\r\n"
        b"content-length: 77\r\n"
        b"\r\n"
        b'{"error": "egress_denied", "reason": "not_allowlisted", "host": "other.test"}'
    )


@pytest.mark.parametrize("reason", policy.REASONS)
def test_denied_carries_every_reason_code_in_header_and_body(reason):
    response = refusals.denied(reason, "api.example.com")
    assert response.status_code == 403
    assert response.headers["X-Egress-Denied"] == reason
    body = json.loads(response.content)
    assert body == {"error": "egress_denied", "reason": reason, "host": "api.example.com"}
    assert list(body) == ["error", "reason", "host"]


@pytest.mark.parametrize(
    "status, line",
    [(403, b"HTTP/1.1 403 Forbidden\r\n"), (502, b"HTTP/1.1 502 Bad Gateway\r\n")],
)
def test_internal_error(status, line):
    assert wire(refusals.internal_error(status, "plain.test")) == line + (
        b"Content-Type: application/json\r\n"
        b"X-Egress-Denied: internal_error\r\n"
        b"Connection: close\r\n"
        b"content-length: 76\r\n"
        b"\r\n"
        b'{"error": "egress_denied", "reason": "internal_error", "host": "plain.test"}'
    )


@pytest.mark.parametrize("close, connection", [(True, b"Connection: close\r\n"), (False, b"")])
def test_proxy_auth_required(close, connection):
    assert wire(refusals.proxy_auth_required("plain.test", close)) == (
        b"HTTP/1.1 407 Proxy Authentication Required\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Egress-Denied: proxy_auth_required\r\n"
        b'Proxy-Authenticate: Basic realm="egress"\r\n'
        + connection
        + b"content-length: 81\r\n"
        b"\r\n"
        b'{"error": "egress_denied", "reason": "proxy_auth_required", "host": "plain.test"}'
    )


def test_connection_limit():
    assert wire(refusals.connection_limit("plain.test")) == (
        b"HTTP/1.1 429 Too Many Requests\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Egress-Denied: connection_limit\r\n"
        b"Connection: close\r\n"
        b"content-length: 78\r\n"
        b"\r\n"
        b'{"error": "egress_denied", "reason": "connection_limit", "host": "plain.test"}'
    )


@pytest.mark.parametrize(
    "reason, line",
    [
        (upstream.UPSTREAM_REFUSED, b"HTTP/1.1 502 Bad Gateway\r\n"),
        (upstream.UPSTREAM_UNREACHABLE, b"HTTP/1.1 502 Bad Gateway\r\n"),
        (upstream.UPSTREAM_TIMEOUT, b"HTTP/1.1 504 Gateway Time-out\r\n"),
    ],
)
def test_upstream_failed(reason, line):
    body = b'{"error": "upstream_failed", "reason": "%s", "host": "api.example.test"}' % reason.encode()
    assert wire(refusals.upstream_failed(reason, "api.example.test")) == line + (
        b"Content-Type: application/json\r\n"
        b"X-Egress-Error: " + reason.encode() + b"\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"\r\n" + body
    )


def test_upstream_failed_covers_every_dial_reason():
    assert set(upstream.STATUS) == set(upstream.REASONS)
    for reason in upstream.REASONS:
        assert refusals.upstream_failed(reason, "h.test").headers["X-Egress-Error"] == reason


def test_read_timeout():
    assert refusals.read_timeout("stall.fault.test") == (
        b"HTTP/1.1 504 Gateway Timeout\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Egress-Error: read_timeout\r\n"
        b"Content-Length: 81\r\n"
        b"Connection: close\r\n"
        b"\r\n"
        b'{"error": "upstream_error", "reason": "read_timeout", "host": "stall.fault.test"}'
    )


def test_bad_request():
    assert wire(refusals.bad_request("header 'X-A': why")) == (
        b"HTTP/1.1 400 Bad Request\r\n"
        b"Content-Type: application/json\r\n"
        b"content-length: 55\r\n"
        b"\r\n"
        b'{"error": "bad_request", "detail": "header \'X-A\': why"}'
    )


def test_head_too_large():
    assert refusals.head_too_large() == (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"Content-Type: application/json\r\n"
        b"content-length: 69\r\n"
        b"Connection: close\r\n"
        b"\r\n"
        b'{"error": "bad_request", "detail": "request header fields too large"}'
    )


@pytest.mark.parametrize("reason", upstream.REASONS)
def test_a_failed_connect_mitmproxy_reports_is_the_connects_answer(reason):
    message = refusals.connect_failure_message(reason, "plain.test")
    assert refusals.mitmproxy_error(502, message) == wire(refusals.upstream_failed(reason, "plain.test")).replace(
        b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1
    )


@pytest.mark.parametrize(
    "status, message, error",
    [
        (400, "Bad HTTP request line: b'GARBAGE'", "bad_request"),
        (413, "request body exceeds limit", "bad_request"),
        (502, "server closed connection", "upstream_error"),
        # not the exact text connect_failure_message writes: a detail like any other
        (502, "upstream_refused: could not connect to a b", "upstream_error"),
        (502, "[Errno 111] Connect call failed ('198.18.0.16', 9)", "upstream_error"),
    ],
)
def test_what_mitmproxy_refuses_itself_is_json_without_its_version(status, message, error):
    answer = refusals.mitmproxy_error(status, message)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode())
    assert b"Connection: close" in head and b"Content-Type: application/json" in head
    assert b"mitmproxy" not in answer.lower() and b"server:" not in head.lower()
    assert json.loads(body) == {"error": error, "detail": message}


def test_the_detail_is_bounded():
    body = refusals.mitmproxy_error(400, "x" * 10_000).partition(b"\r\n\r\n")[2]
    assert json.loads(body)["detail"] == "x" * refusals.MAX_DETAIL


def test_error_pages_replace_mitmproxys_own():
    from mitmproxy.proxy.layers.http import _http1, _http2

    from egress.mitm.patches.error_pages import SERVER
    from egress.mitm.patches.error_pages import install as install_error_pages

    install_error_pages()
    assert _http1.make_error_response(400, "x") == refusals.mitmproxy_error(400, "x")
    assert _http2.version.MITMPROXY == SERVER


HOSTILE_HOST = 'a"b\r\n<script>X-Injected: 1'


def _bodies(host: str) -> list[bytes]:
    return [
        refusals.denied(policy.NOT_ALLOWLISTED, host).content,
        refusals.internal_error(403, host).content,
        refusals.proxy_auth_required(host, close=True).content,
        refusals.connection_limit(host).content,
        refusals.upstream_failed(upstream.UPSTREAM_REFUSED, host).content,
        refusals.read_timeout(host).partition(b"\r\n\r\n")[2],
    ]


def test_a_hostile_host_is_escaped_json_and_never_reaches_a_header():
    for body in _bodies(HOSTILE_HOST):
        assert json.loads(body)["host"] == HOSTILE_HOST
        assert b"\r" not in body and b"\n" not in body and b"<script>" in body  # escaped as JSON, not dropped
    assert b"X-Injected" not in refusals.read_timeout(HOSTILE_HOST).partition(b"\r\n\r\n")[0]
    for response in (refusals.denied(policy.NOT_ALLOWLISTED, HOSTILE_HOST), refusals.connection_limit(HOSTILE_HOST)):
        assert HOSTILE_HOST not in str(response.headers)


def test_the_host_is_bounded_to_255_characters():
    long = "a" * 300 + ".test"
    for body in _bodies(long):
        assert json.loads(body)["host"] == long[:255]


def test_bodies_hold_only_the_documented_fields():
    for body in _bodies("h.test"):
        assert list(json.loads(body)) == ["error", "reason", "host"]
    assert list(json.loads(refusals.bad_request("p").content)) == ["error", "detail"]


def test_no_other_module_builds_an_answer():
    """Every answer the proxy gives a client comes from egress.mitm.refusals (mitmproxy's own
    pages aside; egress/hooks is another program, the hook dispatch server, with its own)."""
    package = Path(egress.__file__).parent
    builders = ("Response.make(", "make_error_response(", '"X-Egress-', '"egress_denied"', '"upstream_failed"', '"bad_request"')
    elsewhere = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "refusals.py" and path.relative_to(package).parts[0] != "hooks"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(b in line for b in builders)
    ]
    assert elsewhere == []
