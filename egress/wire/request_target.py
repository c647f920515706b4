"""Request lines the proxy must not forward as they are (RFC 9110 §9.1, RFC 9112 §3.2).

HTTP/2 carries the method and target as `:method` and `:path` values, which may hold
any byte but CR, LF and NUL; mitmproxy writes them into an HTTP/1 request line for
an HTTP/1 upstream byte for byte. Without these checks:
- `:path https://other.test/x` inside an intercepted tunnel to a `transform` entry
  went upstream as `GET https://other.test/x HTTP/1.1` beside the injected credential.
  RFC 9112 §3.2.2: a server MUST then ignore Host and use the target's host, so a
  server or front end that routes by host (a shared reverse proxy, a CDN) hands the
  credential to another site. The proxy checked `:authority`, never that target.
- a space in `:method` or `:path` (`GET /a HTTP/1.1` as the path) makes a request line
  with more than three parts, which servers split in different ways.
HTTP/1 requests from clients are parsed into origin-form before this runs (mitmproxy
reads an absolute-form target into host and path), so for them these checks only
refuse what no client sends. Pure function; the guard answers 400 with the problem
(`egress.mitm.refusals.bad_request`).
"""

from __future__ import annotations

import re

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 §5.6.2
_SPACE_OR_CONTROL = re.compile(rb"[\x00-\x20\x7f]")


def request_target_problem(method: bytes, path: bytes) -> str | None:
    """Why this method and target cannot be forwarded, or None. Never shows either (hostile text)."""
    if not _TOKEN.fullmatch(method):
        return "method is not a token (RFC 9110 section 9.1)"
    if path == b"*":
        return None if method == b"OPTIONS" else "request target '*' is for OPTIONS only (RFC 9112 section 3.2.4)"
    if not path.startswith(b"/"):
        return "request target must be a path starting with '/' (origin-form, RFC 9112 section 3.2.1)"
    if _SPACE_OR_CONTROL.search(path):
        return "request target contains a space or control character (RFC 9112 section 3.2)"
    return None
