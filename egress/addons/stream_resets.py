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
(`Http2Server.handle_h2_event`, wrapped in egress/mitm/patches/h2_floods.py like
the HTTP/1 head reader in head_limit.py): more than `egress_max_h2_resets` client resets within 10 s on one
connection ends it with GOAWAY(ENHANCE_YOUR_CALM), a log line and
`egress_connections_closed_total{reason="h2_resets"}`. Browsers and gRPC clients cancel
a handful of streams; the attack needs thousands. More than 1,000 PING or SETTINGS
frames within 10 s is closed the same way (`reason="h2_control_flood"`).
"""

from __future__ import annotations

from mitmproxy import ctx, exceptions

from egress.mitm.patches import h2_floods


class StreamResetLimit:
    def load(self, loader) -> None:
        loader.add_option(
            "egress_max_h2_resets", int, h2_floods.settings.max_resets,
            "HTTP/2 streams one client connection may reset within 10 s; one more closes the "
            "connection with GOAWAY (rapid reset, CVE-2023-44487). 0 disables.",
        )  # fmt: skip

    def configure(self, updated: set[str]) -> None:
        if "egress_max_h2_resets" in updated:
            if ctx.options.egress_max_h2_resets < 0:
                raise exceptions.OptionsError("egress_max_h2_resets must be 0 (off) or more")
            h2_floods.settings.max_resets = ctx.options.egress_max_h2_resets
