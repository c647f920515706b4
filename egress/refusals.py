"""Every answer the proxy gives a client in place of the destination's.

One place, so the public shape (SPEC §3, §7; README "What it enforces", "Tunnels")
is written once and reviewed once:

| function              | status  | headers                                       | body `error`      |
|-----------------------|---------|-----------------------------------------------|-------------------|
| `denied`              | 403     | `X-Egress-Denied: <reason>`                   | `egress_denied`   |
| `internal_error`      | 403/502 | `X-Egress-Denied: internal_error`, close      | `egress_denied`   |
| `proxy_auth_required` | 407     | `X-Egress-Denied`, `Proxy-Authenticate`       | `egress_denied`   |
| `connection_limit`    | 429     | `X-Egress-Denied: connection_limit`, close    | `egress_denied`   |
| `upstream_failed`     | 502/504 | `X-Egress-Error: <reason>`                    | `upstream_failed` |
| `read_timeout`        | 504     | `X-Egress-Error: read_timeout`, close (bytes) | `upstream_error`  |
| `bad_request`         | 400     | -                                             | `bad_request`     |
| `head_too_large`      | 431     | mitmproxy's own error page (bytes)            | -                 |

Bodies are JSON built with `json.dumps` (so a hostile host name is escaped, never
markup) and hold only a constant error, a reason code, the destination host the
client itself named (at most 255 characters) or a problem that names a header but
never its value: nothing the proxy knows that the client does not (injected
credentials, proxy tokens, parent-proxy credentials) can reach one.

Pure functions: they build the answer; the addons decide when to send it.
"""

from __future__ import annotations

import json

from mitmproxy import http
from mitmproxy.proxy.layers.http import _http1

from egress import policy, proxy_auth, upstream

CONNECTION_LIMIT = "connection_limit"  # 429: --max-connections-per-environment reached
READ_TIMEOUT = "read_timeout"  # 504: the upstream did not start its answer within --read-timeout
MAX_HOST = 255


def _body(error: str, reason: str, host: str) -> bytes:
    return json.dumps({"error": error, "reason": reason, "host": host[:MAX_HOST]}).encode()


def _json(status: int, body: bytes, headers: dict[str, str]) -> http.Response:
    # mitmproxy appends `content-length` after these (unless it is one of them).
    return http.Response.make(status, body, {"Content-Type": "application/json", **headers})


def _deny(status: int, reason: str, host: str, extra: dict[str, str] | None = None) -> http.Response:
    return _json(status, _body("egress_denied", reason, host), {"X-Egress-Denied": reason, **(extra or {})})


def denied(reason: str, host: str) -> http.Response:
    """A destination decision refused (SPEC §3 reason codes)."""
    return _deny(403, reason, host)


def internal_error(status: int, host: str) -> http.Response:
    """Fail closed (`egress.addons.failsafe`): 403 for a request-phase hook, 502 for a
    response-phase one; the connection is closed after it."""
    return _deny(status, policy.INTERNAL_ERROR, host, {"Connection": "close"})


def proxy_auth_required(host: str, close: bool) -> http.Response:
    """No proof of environment (--spec-dir); `close` for wrong credentials or a switch."""
    extra = {"Proxy-Authenticate": f'Basic realm="{proxy_auth.REALM}"'}
    if close:
        extra["Connection"] = "close"
    return _deny(407, policy.PROXY_AUTH_REQUIRED, host, extra)


def connection_limit(host: str) -> http.Response:
    """The client's environment has --max-connections-per-environment connections open."""
    return _deny(429, CONNECTION_LIMIT, host, {"Connection": "close"})


def upstream_failed(reason: str, host: str) -> http.Response:
    """A CONNECT whose checked address could not be dialled (`egress.upstream` reasons)."""
    return _json(upstream.STATUS[reason], _body("upstream_failed", reason, host), {"X-Egress-Error": reason})


def read_timeout(host: str) -> bytes:
    """504 on the wire, fed to mitmproxy as if the plain-HTTP/1 upstream had sent it (so
    it takes the normal response path); `Connection: close` drops that upstream."""
    body = _body("upstream_error", READ_TIMEOUT, host)
    head = (
        "HTTP/1.1 504 Gateway Timeout\r\n"
        "Content-Type: application/json\r\n"
        f"X-Egress-Error: {READ_TIMEOUT}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def bad_request(problem: str) -> http.Response:
    """A request refused before any destination decision (`egress.fields`)."""
    return _json(400, json.dumps({"error": "bad_request", "detail": problem}).encode(), {})


def head_too_large() -> bytes:
    """431 for an HTTP/1 request head over egress_max_header_bytes: mitmproxy's own error
    page, as for the other malformed requests mitmproxy refuses itself."""
    return _http1.make_error_response(431, "request header fields too large")
