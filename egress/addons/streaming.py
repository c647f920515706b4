"""Responses without a declared length go to the client as they arrive.

mitmproxy holds a body back until it is complete unless `stream_large_bodies` (64 KiB
here, egress/mitm/master.py) says otherwise. With a Content-Length that is decided at the
headers; without one (a chunked HTTP/1.1 response, an HTTP/2 stream without
content-length, a body read until the connection closes) only once 64 KiB have
arrived. A streaming API answer (the server-sent events of an LLM completion: a few
KiB spread over a minute) was therefore held back until it had ended: the client saw
nothing for the whole generation, and one with a read timeout (httpx: 5 s) gave up.

No addon of ours reads a body (credentials go into the request's headers), so such a
response streams from its headers on, chunk by chunk. Responses with a length keep
the threshold: up to 64 KiB they are written in one go, which is cheaper per request.
"""

from __future__ import annotations

from mitmproxy import http


class StreamUnsizedResponses:
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is not None and "content-length" not in response.headers:
            response.stream = True
