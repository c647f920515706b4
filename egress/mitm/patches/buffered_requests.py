"""A request body the proxy must read before the request is sent is buffered, whatever its size.

Re-signing an AWS request whose SDK sent no `x-amz-content-sha256` (Bedrock, STS, every
non-S3 service) means hashing the body before the headers go out. mitmproxy 12.3.1
streams a body over `stream_large_bodies` (64 KiB here): before `requestheaders` for a
declared length (an addon may set `request.stream = False` again), and, once that much
has arrived, in `HttpStream.state_consume_request_body` through `check_body_size`, which
sets `stream = True` and sends the headers at once. For a flow whose metadata holds
`BUFFER_REQUEST` (set by `egress.addons.credentials` only after checking that the
declared Content-Length is within `egress_sign_max_body`) that second check is skipped,
so the body is buffered and the `request` hook sees it. A deliberate patch.
"""

from __future__ import annotations

from mitmproxy.proxy.layers import http as http_layers

BUFFER_REQUEST = "egress.buffer_request"


def install() -> None:
    stream_class = http_layers.HttpStream
    original = stream_class.check_body_size

    def check_body_size(self, request: bool):
        if request and self.flow is not None and self.flow.metadata.get(BUFFER_REQUEST):
            return False
        return (yield from original(self, request))

    stream_class.check_body_size = check_body_size  # type: ignore[method-assign]
