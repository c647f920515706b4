"""HTTP/1 chunked bodies with trailer fields: refused like any malformed body, not a crash.

mitmproxy 12.3.1 reads a chunked body with h11 and, when the last chunk carries trailer
fields (`0\\r\\nX-T: 1\\r\\n\\r\\n`), raises `NotImplementedError("HTTP trailers are not
implemented yet.")` inside its HTTP/1 layer: the
client's connection then hangs without an answer until `--idle-timeout`, and every such
request writes a ~60-line traceback to the log (a sandbox can flood the operator's
logs). Trailers are rare over HTTP/1 (gRPC uses HTTP/2, whose trailers mitmproxy
handles); this turns the crash into what mitmproxy does for any other malformed body
(h11.ProtocolError): the connection is closed and the flow ends with a protocol error.
"""

from __future__ import annotations

from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp

TRAILERS_REFUSED = "HTTP/1 protocol error: trailer fields after a chunked body are not supported"


def install() -> None:
    original = _http1.Http1Connection.read_body

    def read_body(self, event):
        try:
            yield from original(self, event)
        except NotImplementedError:  # only raised there for trailers
            yield commands.CloseConnection(self.conn)
            yield ReceiveHttp(self.ReceiveProtocolError(self.stream_id, TRAILERS_REFUSED, code=self.ReceiveProtocolError.code))

    _http1.Http1Connection.read_body = read_body  # type: ignore[method-assign]
