"""HTTP/2 floods closed where they arrive: rapid reset (CVE-2023-44487) and PING/SETTINGS floods.

Wraps mitmproxy 12.3.1's client-facing `Http2Server.handle_h2_event`: more than
`egress_max_h2_resets` client resets, or more than `MAX_CONTROL_FRAMES` PING/SETTINGS
frames, within `WINDOW_SECONDS` on one connection end it with GOAWAY(ENHANCE_YOUR_CALM).
Why the limits exist and how they were measured: egress/addons/stream_resets.py.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import h2.errors
import h2.events
from mitmproxy.proxy.layers.http import _http2

from egress.ops import metrics

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 10
# PING and SETTINGS floods (CVE-2019-9512, CVE-2019-9515): hyper-h2 answers each one, so
# a client that never stops sending them keeps the proxy busy writing acknowledgements
# (measured: a second client's request took 1.2-1.8 s while one connection sent 400,000
# in a few seconds). Clients send a few per connection; a fixed bound is enough.
MAX_CONTROL_FRAMES = 1000
CONTROL_EVENTS = (h2.events.PingReceived, h2.events.RemoteSettingsChanged)


class _Settings:
    max_resets = 200  # egress_max_h2_resets, set by the StreamResetLimit addon


settings = _Settings()


def too_many_resets(times: deque[float], now: float, limit: int) -> bool:
    """Record an event at `now`; whether more than `limit` fall within the window (`times` stays bounded)."""
    times.append(now)
    while times[0] <= now - WINDOW_SECONDS or len(times) > limit + 1:
        times.popleft()
    return len(times) > limit


def install() -> None:
    original = _http2.Http2Server.handle_h2_event

    def handle_h2_event(self, event):
        if isinstance(event, h2.events.StreamReset):
            kind, limit, what = "h2_resets", settings.max_resets, "HTTP/2 streams reset"
        elif isinstance(event, CONTROL_EVENTS):
            kind, limit, what = "h2_control_flood", MAX_CONTROL_FRAMES, "HTTP/2 PING/SETTINGS frames"
        else:
            return (yield from original(self, event))
        times = self.__dict__.setdefault(f"_egress_{kind}", deque())
        if limit and too_many_resets(times, time.monotonic(), limit):
            metrics.CONNECTIONS_CLOSED.labels(kind).inc()
            message = f"more than {limit} {what} within {WINDOW_SECONDS}s ({kind})"
            logger.warning("closed connection from %s: %s", self.conn.peername[0] if self.conn.peername else "?", message)
            yield from self.protocol_error(f"egress: {message}", h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            return True
        return (yield from original(self, event))

    _http2.Http2Server.handle_h2_event = handle_h2_event  # type: ignore[method-assign]
