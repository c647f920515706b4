"""A refusal given at a request's head reaches the client, however large the request's body.

The proxy refuses at `requestheaders` (403, 407, 400, 429, fail-closed 403), before any
body. mitmproxy 12.3.1 decides at the same moment to stream a body over
`stream_large_bodies` (64 KiB here; a chunked body once that much has arrived), and
`HttpStream.start_request_stream` then raises `NotImplementedError("Can't set a response
and enable streaming at the same time.")`. Found trying uploads as a sandbox would: a
200 KB POST to a host the allowlist does not name got no answer at all (the client
hung until its own timeout), and each one wrote two tracebacks to the proxy's log with
the first 64 KiB of the body in them: a sandbox could fill the operator's logs with
whatever it wanted to upload.

Here the answer goes out at once instead: the `responseheaders` and `response` hooks
run as for any answer an addon sets, the rest of the body is read and dropped (never
buffered, never sent anywhere), and over HTTP/1 the connection is closed once the body
has ended (`Connection: close`), so nothing of it can be read as a next request.
`--header-timeout` bounds a client that keeps sending. A deliberate patch, installed once.

`NoContinueForRefusals` sends the same early answer to a request that asked
`Expect: 100-continue`: mitmproxy answers `100 Continue` right after `requestheaders`,
refused or not, so the client sent its whole body only to be refused at its end. A
refused request gets its final answer instead of the `100` (RFC 9110 §10.1.1), and the
client keeps the body.
"""

from __future__ import annotations

import time

from mitmproxy import http
from mitmproxy.proxy.layers import http as http_layers

_installed = False


def install_early_answers() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    stream_class = http_layers.HttpStream
    original = stream_class.start_request_stream

    def start_request_stream(self):
        if self.flow.response is None:
            yield from original(self)
            return
        response = self.flow.response
        if not (self.flow.request.is_http2 or self.flow.request.is_http3):
            response.headers["Connection"] = "close"
        response.timestamp_start = time.time()
        yield http_layers.HttpResponseHeadersHook(self.flow)
        if (yield from self.check_killed(True)):
            return
        # What is left of the body: consumed silently (the stream is dropped below, and
        # mitmproxy ignores data for a dropped stream).
        self.client_state = self.state_errored
        yield from self.send_response()
        yield from self.flow_done()

    stream_class.start_request_stream = start_request_stream  # type: ignore[method-assign]


class NoContinueForRefusals:
    """Runs after every addon that may refuse at `requestheaders` (added last)."""

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is None or flow.request.headers.get("expect", "").lower() != "100-continue":
            return
        # Without the header mitmproxy sends no `100`; streaming sends the answer at once
        # (start_request_stream above) and drops whatever body still comes.
        del flow.request.headers["expect"]
        flow.request.stream = True
