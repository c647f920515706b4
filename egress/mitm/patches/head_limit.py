"""HTTP/1 request and response heads bounded in size.

mitmproxy 12.3.1 reads HTTP/1 heads without a size limit (`_http1.py`: "FIXME: protect
against header size DoS"). This wraps `Http1Server.read_headers` and
`Http1Client.read_headers`: a client's head over `egress_max_header_bytes` gets 431
and the connection is closed; an upstream's gets 502.
"""

from __future__ import annotations

import logging
import re

from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import ErrorCode, ResponseProtocolError

from egress.mitm import refusals


class _Settings:
    max_bytes = 65536  # egress_max_header_bytes, set by the ConnectionLimits addon


settings = _Settings()


_HEAD_END = re.compile(rb"\n\r?\n")  # h11's blank line, which ends a head


def _head_over_limit(buffered: bytes | bytearray, limit: int) -> bool:
    """True when more than `limit` bytes wait and no head ends within the first `limit` of
    them. A head that arrived complete in one read counts too: checking only a head still
    incomplete would let a 70 KB head sent at once through."""
    return len(buffered) > limit and _HEAD_END.search(bytes(buffered), 0, limit) is None


def install() -> None:
    """Bound the HTTP/1 heads mitmproxy reads (it has buffered what arrived when this runs)."""
    server_read, client_read = _http1.Http1Server.read_headers, _http1.Http1Client.read_headers

    def server_read_headers(self, event):
        if isinstance(event, events.DataReceived) and _head_over_limit(self.buf, settings.max_bytes):
            yield commands.Log(f"request head over {settings.max_bytes} bytes: 431", logging.INFO)
            yield commands.SendData(self.conn, refusals.head_too_large())
            yield commands.CloseConnection(self.conn)
            self.state = self.done
            return
        yield from server_read(self, event)

    def client_read_headers(self, event):
        if isinstance(event, events.DataReceived) and self.stream_id and _head_over_limit(self.buf, settings.max_bytes):
            yield commands.CloseConnection(self.conn)
            yield ReceiveHttp(
                ResponseProtocolError(
                    self.stream_id, f"response head over {settings.max_bytes} bytes", ErrorCode.GENERIC_SERVER_ERROR
                )
            )
            self.state = self.done
            return
        yield from client_read(self, event)

    # Deliberate patches of mitmproxy 12.3.1 (see the module docstring).
    _http1.Http1Server.read_headers = server_read_headers  # type: ignore[method-assign]
    _http1.Http1Client.read_headers = client_read_headers  # type: ignore[method-assign]
