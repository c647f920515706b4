"""StreamResetLimit: an HTTP/2 client that cancels stream after stream is closed (rapid reset).

CVE-2023-44487: a client sends HEADERS and RST_STREAM for stream after stream. A reset
stream does not count against MAX_CONCURRENT_STREAMS, so the client is bounded only by
its bandwidth. mitmproxy 12.3.1 does not even see most of these resets: when HEADERS
(with END_STREAM) and RST_STREAM arrive in one read, hyper-h2 reports the stream ended
and already closed, mitmproxy forgets it, ignores the reset, and carries the request
on — our checks, an audit line and a real upstream request each. Measured before this
limit (one connection, 6 s, shared 2-core machine): 62,000-71,000 streams accepted,
proxy RSS 77 -> 170-200 MB (not given back), every stream then sent upstream over the
next ~30 s, and a second client's requests slowed from ~20 ms to 1-2 s meanwhile.

The count is taken where the reset arrives, in mitmproxy's client-facing HTTP/2 layer
(`Http2Server.handle_h2_event`, wrapped like `limits.install_head_limit` wraps the
HTTP/1 reader): more than `egress_max_h2_resets` client resets within 10 s on one
connection ends it with GOAWAY(ENHANCE_YOUR_CALM), a log line and
`egress_connections_closed_total{reason="h2_resets"}`. Browsers and gRPC clients cancel
a handful of streams; the attack needs thousands. More than 1,000 PING or SETTINGS
frames within 10 s is closed the same way (`reason="h2_control_flood"`).
"""

from __future__ import annotations

import logging
import time
from collections import deque

import h2.errors
import h2.events
from mitmproxy import ctx, exceptions
from mitmproxy.proxy.layers.http import _http2

from egress.ops import metrics

logger = logging.getLogger(__name__)

CLOSED = metrics.CONNECTIONS_CLOSED
WINDOW_SECONDS = 10
# PING and SETTINGS floods (CVE-2019-9512, CVE-2019-9515): hyper-h2 answers each one, so
# a client that never stops sending them keeps the proxy busy writing acknowledgements
# (measured: a second client's request took 1.2-1.8 s while one connection sent 400,000
# in a few seconds). Clients send a few per connection; a fixed bound is enough.
MAX_CONTROL_FRAMES = 1000
CONTROL_EVENTS = (h2.events.PingReceived, h2.events.RemoteSettingsChanged)


class _Limit:
    max_resets = 200
    installed = False


class StreamResetLimit:
    def load(self, loader) -> None:
        loader.add_option(
            "egress_max_h2_resets", int, _Limit.max_resets,
            "HTTP/2 streams one client connection may reset within 10 s; one more closes the "
            "connection with GOAWAY (rapid reset, CVE-2023-44487). 0 disables.",
        )  # fmt: skip
        install_reset_limit()

    def configure(self, updated: set[str]) -> None:
        if "egress_max_h2_resets" in updated:
            if ctx.options.egress_max_h2_resets < 0:
                raise exceptions.OptionsError("egress_max_h2_resets must be 0 (off) or more")
            _Limit.max_resets = ctx.options.egress_max_h2_resets


def too_many_resets(times: deque[float], now: float, limit: int) -> bool:
    """Record an event at `now`; whether more than `limit` fall within the window (`times` stays bounded)."""
    times.append(now)
    while times[0] <= now - WINDOW_SECONDS or len(times) > limit + 1:
        times.popleft()
    return len(times) > limit


def install_reset_limit() -> None:
    if _Limit.installed:
        return
    _Limit.installed = True
    original = _http2.Http2Server.handle_h2_event

    def handle_h2_event(self, event):
        if isinstance(event, h2.events.StreamReset):
            kind, limit, what = "h2_resets", _Limit.max_resets, "HTTP/2 streams reset"
        elif isinstance(event, CONTROL_EVENTS):
            kind, limit, what = "h2_control_flood", MAX_CONTROL_FRAMES, "HTTP/2 PING/SETTINGS frames"
        else:
            return (yield from original(self, event))
        times = self.__dict__.setdefault(f"_egress_{kind}", deque())
        if limit and too_many_resets(times, time.monotonic(), limit):
            CLOSED.labels(kind).inc()
            message = f"more than {limit} {what} within {WINDOW_SECONDS}s ({kind})"
            logger.warning("closed connection from %s: %s", self.conn.peername[0] if self.conn.peername else "?", message)
            yield from self.protocol_error(f"egress: {message}", h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            return True
        return (yield from original(self, event))

    _http2.Http2Server.handle_h2_event = handle_h2_event  # type: ignore[method-assign]
