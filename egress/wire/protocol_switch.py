"""Protocol switches (HTTP/1.1 `Upgrade`, status 101) the proxy can follow, and the ones it cannot.

Pure functions over headers. After a `101 Switching Protocols` mitmproxy hands the
connection to a WebSocket layer when it recognises the handshake, and otherwise — any
other protocol, or a WebSocket handshake it does not parse (a version other than 13)
— to a raw TCP layer. From then on the proxy sees no requests on that connection, so
none is checked: `Upgrade: h2c` to a server that speaks h2c ("h2c smuggling", Bishop
Fox 2020) let the sandbox send HTTP/2 requests for any host on that server, past the
Host check that keeps a connection on its destination.

So only a WebSocket handshake mitmproxy follows is let through: any other `Upgrade`
request header is removed before the request goes upstream (the server then answers
as HTTP/1.1, which every client must accept, RFC 9110 §7.8), and a 101 that mitmproxy
would not follow as a WebSocket is refused (the connection is closed).
"""

from __future__ import annotations

from mitmproxy.http import Headers

WEBSOCKET = "websocket"
WEBSOCKET_VERSION = "13"  # RFC 6455; what mitmproxy's WebSocket layer (wsproto) speaks
# Request headers that only mean something for an upgrade the proxy does not follow.
_UPGRADE_ONLY = ("Upgrade", "HTTP2-Settings")


def followable_request(headers: Headers) -> bool:
    """The request asks for no switch, or for a WebSocket handshake mitmproxy follows."""
    upgrade = headers.get_all("Upgrade")
    if not upgrade:
        return True
    return [value.strip().lower() for value in upgrade] == [WEBSOCKET] and _websocket_version(headers)


def strip_unfollowable_upgrade(headers: Headers) -> bool:
    """Remove an `Upgrade` the proxy could not follow; True if something was removed."""
    if followable_request(headers):
        return False
    for name in _UPGRADE_ONLY:
        headers.pop(name, None)
    return True


def followable_switch(request: Headers, status_code: int, response: Headers, websocket_enabled: bool) -> bool:
    """A response that is no switch, or one mitmproxy continues as WebSocket (its own test,
    `proxy/layers/http/__init__.py`: `send_response`)."""
    if status_code != 101:
        return True
    return (
        websocket_enabled
        # Exactly mitmproxy's comparison (no stripping): a value it would not take for
        # WebSocket must not pass here either.
        and response.get("Upgrade", "").lower() == WEBSOCKET
        and _websocket_version(request)
    )


def _websocket_version(headers: Headers) -> bool:
    return headers.get_all("Sec-WebSocket-Version") == [WEBSOCKET_VERSION]
