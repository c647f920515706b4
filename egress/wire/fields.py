"""Header fields the proxy must not forward as they are (RFC 9110 §5.5).

mitmproxy's HTTP/1 reader splits header lines on CRLF/LF only, so a bare CR (or a
NUL) stays inside a field value and would be written upstream byte for byte. Many
servers end a header line at a bare CR: `X-A: a<CR>Host: other.test` then carries a
second Host header (past the proxy's Host check, beside an injected credential),
and `X-A: a<CR>Transfer-Encoding: chunked` reframes the request behind the proxy.
RFC 9110 §5.5: a recipient of CR, LF or NUL in a field value MUST reject the
message or replace them with SP before forwarding. We reject: a client that sends
them is not a client we need to keep working.

The Host header and HTTP/2 `:authority` must also be ASCII (RFC 9110 §7.2: a
uri-host, whose reg-name is ASCII; an internationalised name travels as its `xn--`
A-label, RFC 5890). The proxy compares names after IDNA mapping (NFKC), so
`Host: paßthrough.test` or `Host: plain.test<U+200B>` matched `passthrough.test` /
`plain.test` and went upstream byte for byte, where a server or CDN that routes on the
raw value, or maps it by IDNA2008 (`ß` stays `ß`: `xn--pathrough-...`), reads another
host than the one checked (domain fronting past the Host check).
A CONNECT target too: mitmproxy reads its port with a Unicode `\\d`, so
`CONNECT plain.test:<U+0668><U+0660>` (Arabic-Indic "80") opened a tunnel to port 80.

An HTTP/2 request's `content-length` must equal the DATA it carries (RFC 9113 §8.1.1).
The h2 library checks DATA frames against it, but not a HEADERS frame that ends the
stream: `content-length: 10` with no body went upstream as an HTTP/1 request whose
server then waited for ten bytes, holding the client's stream until the read timeout.

Pure functions; the guard answers 400 with the problem (`egress.mitm.refusals.bad_request`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_FORBIDDEN_IN_VALUE = re.compile(rb"[\r\n\x00]")


def field_value_problem(fields: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why these (name, value) fields cannot be forwarded, or None. Never shows a value (it may be a credential)."""
    for name, value in fields:
        if _FORBIDDEN_IN_VALUE.search(value):
            shown = name.decode("latin-1")
            return f"header {shown!r}: value contains CR, LF or NUL (RFC 9110 section 5.5)"
    return None


def host_field_problem(fields: Iterable[tuple[bytes, bytes]], authority: bytes) -> str | None:
    """Why the request's Host header or `:authority` cannot be checked and forwarded, or None."""
    for name, value in fields:
        if name.lower() == b"host" and not value.isascii():
            return f"header 'Host': {_NOT_ASCII}"
    if not authority.isascii():
        return f"':authority': {_NOT_ASCII}"
    return None


def connect_target_problem(authority: bytes) -> str | None:
    """Why a CONNECT target cannot be read as an ASCII host:port, or None."""
    if not authority.isascii():
        return f"CONNECT target: not ASCII; a port is ASCII digits, {_XN_FORM}"
    return None


_XN_FORM = "an internationalised name is sent as its xn-- form (RFC 9110 section 7.2, RFC 5890)"
_NOT_ASCII = f"not ASCII; {_XN_FORM}"


def declared_length_problem(declared: str | None, received: int) -> str | None:
    """Why a complete HTTP/2 or /3 body disagrees with its `content-length`, or None."""
    if declared is None:
        return None
    if not declared.isascii() or not declared.isdigit() or int(declared) != received:
        return f"header 'content-length' does not match the {received}-byte body (RFC 9113 section 8.1.1)"
    return None
