"""Which protocol switches the proxy lets happen (egress.wire.protocol_switch), table-driven: only a
WebSocket handshake that mitmproxy's own WebSocket layer follows; anything else would turn the
connection into raw TCP that no check sees (h2c smuggling)."""

from __future__ import annotations

import pytest
from mitmproxy.http import Headers

from egress.wire.protocol_switch import followable_request, followable_switch, strip_unfollowable_upgrade


def headers(*fields: tuple[str, str]) -> Headers:
    return Headers([(k.encode(), v.encode()) for k, v in fields])


WS13 = (("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"))

REQUESTS = [
    ((), True),
    ((("Connection", "keep-alive"),), True),
    (WS13, True),
    ((("Upgrade", "WebSocket"), ("Sec-WebSocket-Version", "13")), True),
    ((("Upgrade", "h2c"), ("HTTP2-Settings", "AAMAAABkAAQCAAAAAAIAAAAA")), False),
    ((("Upgrade", "websocket"), ("Sec-WebSocket-Version", "12")), False),
    ((("Upgrade", "websocket"),), False),
    ((("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Version", "13")), False),
    ((("Upgrade", "websocket, h2c"), ("Sec-WebSocket-Version", "13")), False),
    ((("Upgrade", "websocket"), ("Upgrade", "h2c"), ("Sec-WebSocket-Version", "13")), False),
    ((("Upgrade", "TLS/1.0"),), False),  # RFC 2817
    ((("Upgrade", "HTTP/2.0"),), False),
    ((("Upgrade", ""),), False),
]


@pytest.mark.parametrize("fields, expected", REQUESTS, ids=[repr(f)[:60] for f, _ in REQUESTS])
def test_followable_request(fields, expected):
    assert followable_request(headers(*fields)) is expected


def test_strip_removes_upgrade_and_http2_settings_only():
    h = headers(("Host", "a.test"), ("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"), ("HTTP2-Settings", "x"))
    assert strip_unfollowable_upgrade(h) is True
    assert list(h.keys()) == ["Host", "Connection"]
    kept = headers(*WS13)
    assert strip_unfollowable_upgrade(kept) is False and kept.get("Upgrade") == "websocket"


RESPONSES = [
    (200, (), True, True),
    (101, (("Upgrade", "websocket"),), True, True),
    (101, (("Upgrade", "WebSocket"),), True, True),
    (101, (("Upgrade", "websocket"),), False, False),  # mitmproxy's websocket option off: raw TCP
    (101, (("Upgrade", "h2c"),), True, False),
    (101, (("Upgrade", " websocket"),), True, False),  # mitmproxy does not strip: it would not follow
    (101, (("Upgrade", "websocket"), ("Upgrade", "websocket")), True, False),
    (101, (), True, False),
]


@pytest.mark.parametrize("status, fields, enabled, expected", RESPONSES)
def test_followable_switch(status, fields, enabled, expected):
    assert followable_switch(headers(*WS13), status, headers(*fields), enabled) is expected


def test_switch_after_a_request_mitmproxy_would_not_follow_is_refused():
    request = headers(("Upgrade", "websocket"), ("Sec-WebSocket-Version", "12"))
    assert followable_switch(request, 101, headers(("Upgrade", "websocket")), True) is False
