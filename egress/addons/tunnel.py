"""mitmproxy layers for decided tunnels: hand a passthrough tunnel to `egress.net.relay`, or refuse it.

`RelayLayer` is what the guard's `next_layer` hook puts in place of mitmproxy's TLS
layers once a passthrough tunnel is checked. On `Start` it takes the client's
transport away from mitmproxy's stream reader (`set_protocol`: mitmproxy's read loop
stays parked, its connection handler, connection limits and idle watchdog stay
alive) and starts a relay to the upstream transport dialled for the tunnel. Bytes
mitmproxy had already read (the ClientHello) arrive here as events and are
forwarded first. When the relay ends, mitmproxy's handler for the client is ended
the way its own inactivity timeout ends it, so `client_disconnected` runs as for
any connection. Written against mitmproxy 12.3.1 (`proxy/server.py`:
`ConnectionHandler.transports`, `TimeoutWatchdog`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mitmproxy import ctx
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.context import Context

from egress.net.relay import Relay, Side

logger = logging.getLogger(__name__)


def _handler(context: Context):
    return ctx.master.addons.get("proxyserver").connections.get(context.client.id)


def _client_transport(context: Context) -> asyncio.Transport | None:
    handler = _handler(context)
    io = handler.transports.get(context.client) if handler is not None else None
    writer = io.writer if io is not None else None
    if not isinstance(writer, asyncio.StreamWriter) or writer.transport.is_closing():
        return None
    transport = writer.transport
    return transport if isinstance(transport, asyncio.Transport) else None


def can_take_over(context: Context) -> bool:
    """A plain asyncio TCP client connection (not TLS to the proxy, not a mitmproxy_rs stream)."""
    return not context.client.tls and _client_transport(context) is not None


class RefuseLayer(layer.Layer):
    """Close the client connection; nothing is sent upstream."""

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Start):
            yield commands.CloseConnection(self.context.client)


class RelayLayer(layer.Layer):
    opaque = True  # no more request heads on this connection (egress.addons.limits)

    def __init__(self, context: Context, upstream: Side, on_close: Callable[[int, int], None]):
        super().__init__(context)
        self.upstream = upstream
        self.relay: Relay | None = None
        self._on_close = on_close
        self._mitmproxy_closed = False

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        client = self.context.client
        if isinstance(event, events.Start):
            self._take_over()
        elif isinstance(event, events.DataReceived) and event.connection == client:
            if self.relay is not None:
                self.relay.forward(self.relay.client, event.data)
        elif isinstance(event, events.ConnectionClosed) and event.connection == client:
            # mitmproxy ended the client connection (idle timeout, shutdown, our own hand-back).
            self._mitmproxy_closed = True
            if self.relay is not None:
                self.relay.close()
            else:
                self.upstream.close()
            yield commands.CloseConnection(client)
        yield from ()

    def _take_over(self) -> None:
        transport = _client_transport(self.context)
        handler = _handler(self.context)
        if transport is None or handler is None:
            # Checked by the guard before choosing this layer; if it changed since, refuse.
            self.upstream.close()
            self._end_client(handler, "egress: tunnel hand-over impossible")
            return
        try:
            client = Side()
            client.transport = transport
            transport.set_protocol(client)
            self.relay = Relay(
                client, self.upstream, on_activity=handler.timeout_watchdog.register_activity, on_close=self._closed
            )
            self.relay.start()
        except Exception as exc:  # noqa: BLE001  (fail closed: a tunnel that cannot be relayed is closed, not left hanging)
            logger.error("passthrough relay failed to start (%s); tunnel closed", type(exc).__name__)
            self.upstream.close()
            transport.abort()
            self._end_client(handler, "egress: tunnel hand-over failed")

    def _closed(self, bytes_up: int, bytes_down: int) -> None:
        try:
            self._on_close(bytes_up, bytes_down)
        finally:
            if not self._mitmproxy_closed:
                self._end_client(_handler(self.context), "egress: tunnel closed")

    def _end_client(self, handler, reason: str) -> None:
        io = handler.transports.get(self.context.client) if handler is not None else None
        if io is not None and io.handler is not None:
            io.handler.cancel(reason)
