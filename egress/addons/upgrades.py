"""ProtocolSwitches: no `101 Switching Protocols` the proxy could not follow (`egress.wire.protocol_switch`).

- `requestheaders`   an `Upgrade` other than a WebSocket handshake mitmproxy follows is
                     removed before the request goes upstream (after the guard's checks).
- `responseheaders`  a 101 that mitmproxy would continue as raw TCP is refused: the flow
                     is killed, the client sees its connection close, and a log line says why.
"""

from __future__ import annotations

import logging

from mitmproxy import ctx, http

from egress.wire import protocol_switch

logger = logging.getLogger(__name__)


class ProtocolSwitches:
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is None and protocol_switch.strip_unfollowable_upgrade(flow.request.headers):
            logger.info("removed an Upgrade header the proxy cannot follow (port %s)", flow.request.port)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or protocol_switch.followable_switch(
            flow.request.headers, response.status_code, response.headers, ctx.options.websocket
        ):
            return
        logger.warning(
            "refused a switch to %r from %s:%s: the proxy could not check what follows",
            response.headers.get("Upgrade", "")[:40], flow.request.host, flow.request.port,
        )  # fmt: skip
        flow.kill()
