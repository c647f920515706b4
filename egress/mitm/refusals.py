"""Every answer the proxy gives a client in place of the destination's.

One place, so the public shape (SPEC §3, §7; README "What it enforces", "Tunnels")
is written once and reviewed once:

| function              | status  | headers                                       | body `error`      |
|-----------------------|---------|-----------------------------------------------|-------------------|
| `denied`              | 403     | `X-Egress-Denied: <reason>`                   | `egress_denied`   |
| `request_not_allowed`| 403     | `X-Egress-Denied: request_not_allowed`        | `egress_denied`   |
| `internal_error`      | 403/502 | `X-Egress-Denied: internal_error`, close      | `egress_denied`   |
| `proxy_auth_required` | 407     | `X-Egress-Denied`, `Proxy-Authenticate`       | `egress_denied`   |
| `connection_limit`    | 429     | `X-Egress-Denied: connection_limit`, close    | `egress_denied`   |
| `upstream_failed`     | 502/504 | `X-Egress-Error: <reason>`                    | `upstream_failed` |
| `credential_unavailable` | 502  | `X-Egress-Error: credential_unavailable`      | `credential_unavailable` |
| `read_timeout`        | 504     | `X-Egress-Error: read_timeout`, close (bytes) | `upstream_error`  |
| `bad_request`         | 400     | -                                             | `bad_request`     |
| `head_too_large`      | 431     | close (bytes)                                 | `bad_request`     |
| `mitmproxy_error`     | 4xx/5xx | close (bytes): what mitmproxy refuses itself  | `bad_request`, `upstream_error` |
|   ... connect failed  | 502/504 | `X-Egress-Error: <reason>`, close (bytes)     | `upstream_failed` |

Bodies are JSON built with `json.dumps` (so a hostile host name is escaped, never
markup) and hold only a constant error, a reason code, the destination host the
client itself named (at most 255 characters) or a problem that names a header but
never its value: nothing the proxy knows that the client does not (injected
credentials, proxy tokens, parent-proxy credentials) can reach one.

Pure functions: they build the answer; the addons decide when to send it.
"""

from __future__ import annotations

import json
import re

from mitmproxy import http
from mitmproxy.net.http import http1

from egress.net import upstream
from egress.policy import decisions as policy
from egress.policy.reasons import CONNECTION_LIMIT, CREDENTIAL_UNAVAILABLE, READ_TIMEOUT, REQUEST_NOT_ALLOWED
from egress.wire import proxy_auth

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


MAX_METHOD = 64


def request_not_allowed(host: str, method: str, path: str, problem: str) -> http.Response:
    """The entry's request rules (SPEC §8) refused this method and path. The body names
    them as the proxy read them: the method (a token, checked before), the normalised path
    (or, when it could not be normalised, the path with every byte outside visible ASCII
    percent-encoded and why); never the query."""
    body: dict[str, str] = {
        "error": "egress_denied", "reason": REQUEST_NOT_ALLOWED, "host": host[:MAX_HOST],
        "method": method[:MAX_METHOD], "path": path[:MAX_HOST],
    }  # fmt: skip
    if problem:
        body["detail"] = problem
    return _json(403, json.dumps(body).encode(), {"X-Egress-Denied": REQUEST_NOT_ALLOWED})


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
    """A CONNECT whose checked address could not be dialled (`egress.net.upstream` reasons)."""
    return _json(upstream.STATUS[reason], _body("upstream_failed", reason, host), {"X-Egress-Error": reason})


def credential_unavailable(credential: str, host: str) -> http.Response:
    """A credential source gave no token (SPEC §8): the request is not sent without it.
    `credential` is the source's name from the spec, never anything it holds."""
    body = json.dumps({"error": CREDENTIAL_UNAVAILABLE, "credential": credential, "host": host[:MAX_HOST]}).encode()
    return _json(502, body, {"X-Egress-Error": CREDENTIAL_UNAVAILABLE})


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
    """A request refused before any destination decision (`egress.wire.fields`)."""
    return _json(400, json.dumps({"error": "bad_request", "detail": problem}).encode(), {})


def head_too_large() -> bytes:
    """431 for an HTTP/1 request head over egress_max_header_bytes, shaped like the other
    malformed requests mitmproxy refuses itself."""
    return mitmproxy_error(431, "request header fields too large")


MAX_DETAIL = 300
_CONNECT_FAILED = re.compile(r"(upstream_refused|upstream_unreachable|upstream_timeout): could not connect to (\S*)")


def connect_failure_message(reason: str, host: str) -> str:
    """How `egress.addons.tunnel` reports a failed upstream connect to mitmproxy, which
    hands the text to `mitmproxy_error` as the message of its 502: it names the host the
    client asked for, never the address the proxy dialled."""
    return f"{reason}: could not connect to {host[:MAX_HOST]}"


def mitmproxy_error(status: int, message: str = "") -> bytes:
    """What mitmproxy's HTTP/1 layer sends for a request it cannot serve (installed by
    `egress.mitm.patches.error_pages` in place of its HTML page): a failed connect as a CONNECT's, the
    rest JSON with mitmproxy's text as the detail (the client's own request line or an
    upstream's malformed answer; never a header the proxy added)."""
    if (failed := _CONNECT_FAILED.fullmatch(message)) is not None:
        response = upstream_failed(failed[1], failed[2])
    else:
        error = "bad_request" if status < 500 else "upstream_error"
        body = json.dumps({"error": error, "detail": message[:MAX_DETAIL]}).encode()
        response = _json(status, body, {})
    response.headers["Connection"] = "close"  # mitmproxy closes the connection after it
    return http1.assemble_response(response)
