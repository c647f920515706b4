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
import contextvars
import logging
import weakref
from collections.abc import Callable
from ipaddress import ip_address
from typing import Any

from mitmproxy import ctx
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy import server as proxy_server
from mitmproxy.proxy.context import Context

from egress.mitm import refusals
from egress.net import upstream
from egress.net.parent_proxy import ParentProxy
from egress.net.relay import Relay, Side
from egress.ops import metrics

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


# -- intercepted tunnels: mitmproxy's upstream connect uses the connection dialled at CONNECT --

_handoffs: weakref.WeakKeyDictionary[asyncio.Task, Side] = weakref.WeakKeyDictionary()
_parent: ParentProxy | None = None  # set by install_connect_handoff


# The name the client asked for, set by the guard's `server_connect` in the task that then
# connects (`ConnectionHandler.open_connection` awaits the hook, then the connect).
_connecting_to: contextvars.ContextVar[str] = contextvars.ContextVar("egress_connecting_to", default="")


def connecting_to(name: str) -> None:
    """From a `server_connect` hook: the destination's name, for a failed connect's answer."""
    _connecting_to.set(name)


def hand_to_mitmproxy(side: Side) -> None:
    """From a `server_connect` hook: the connect mitmproxy is about to make, in this same task
    (`ConnectionHandler.open_connection` awaits the hook, then `asyncio.open_connection`),
    takes over `side`'s already connected transport instead of dialling again."""
    task = asyncio.current_task()
    if task is None:
        side.close()
        return
    _handoffs[task] = side


async def _open_connection(host: str, port: int, **kwargs: Any):
    side = _handoffs.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
    transport = side.transport if side is not None else None
    if side is None or transport is None or side.lost or side.eof or transport.is_closing():
        if side is not None:
            side.close()
        return await _connect(host, port, **kwargs)
    # A real connect always suspends; mitmproxy relies on that (with eager tasks, the
    # `ConnectionIO` it stores after starting this task would replace ours otherwise).
    await asyncio.sleep(0)
    if side.lost or side.eof or transport.is_closing():
        return await _connect(host, port, **kwargs)
    return _streams(side, transport)


def _streams(side: Side, transport: asyncio.Transport):
    """What asyncio.open_connection builds, around the transport we already have."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**16, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if side.early:
        reader.feed_data(bytes(side.early))
    transport.resume_reading()
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _connect(host: str, port: int, **kwargs: Any):
    """mitmproxy's own upstream connect: direct, or a CONNECT through the parent proxy.

    `host` is the address the guard's `server_connect` pinned (the checked IP); through a
    parent it is what the parent is asked for, so plain HTTP and intercepted TLS take the
    same path as a tunnel dialled at CONNECT. Within --connect-timeout, counted like a
    CONNECT's dial; a failure is an OSError whose text mitmproxy hands to its 502, which
    `egress.mitm.patches.error_pages` turns into the CONNECT's answer (reason code and the name the
    client asked for, from `connecting_to`; never the address).
    """
    name = _connecting_to.get()
    seconds = ctx.options.egress_connect_timeout
    if _parent is None:
        try:
            async with asyncio.timeout(seconds or None):
                return await asyncio.open_connection(host, port, **kwargs)
        except OSError as exc:  # TimeoutError included
            reason = upstream.failure_reason(exc)
            metrics.UPSTREAM_ERRORS.labels(reason).inc()
            if reason == upstream.UPSTREAM_TIMEOUT:
                metrics.TIMEOUTS.labels("connect").inc()
                logger.warning("upstream connect timed out after %ss (port %s)", seconds, port)
            else:
                logger.info("upstream %s (port %s)", reason, port)
            raise OSError(refusals.connect_failure_message(reason, name)) from None
    try:
        address = ip_address(host)
    except ValueError:  # fail closed: through a parent we only ever ask for a checked address
        raise OSError(f"egress: {host!r} is not a checked address") from None
    try:
        side = await upstream.dial(address, port, seconds, _parent)
    except upstream.DialFailed as failure:
        metrics.UPSTREAM_ERRORS.labels(failure.reason).inc()
        if failure.reason == upstream.UPSTREAM_REFUSED:
            logger.warning("upstream %s (port %s): %s", failure.reason, port, failure.detail)
        else:
            logger.info("upstream %s (port %s): %s", failure.reason, port, failure.detail)
        raise OSError(refusals.connect_failure_message(failure.reason, name)) from None
    # (the connect time is observed by egress.addons.timings, as for any mitmproxy connect)
    if side.transport is None:  # create_connection always sets it
        raise OSError("egress: parent proxy tunnel has no transport")
    return _streams(side, side.transport)


class _AsyncioWithHandoff:
    """`asyncio` as mitmproxy's proxy/server.py sees it, with `open_connection` replaced."""

    open_connection = staticmethod(_open_connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


def install_connect_handoff(parent: ParentProxy | None = None) -> None:
    """Patch mitmproxy 12.3.1's `proxy/server.py` (module global `asyncio`), once;
    `parent` (--upstream-proxy) is where mitmproxy's own connects go.

    Without it an intercepted tunnel is connected twice: once at CONNECT (so that an
    unreachable upstream gets its 502/504 there) and again by mitmproxy after the
    client's handshake. tests/e2e/test_passthrough.py counts the SYNs.
    """
    global _parent
    _parent = parent
    if not isinstance(proxy_server.asyncio, _AsyncioWithHandoff):
        proxy_server.asyncio = _AsyncioWithHandoff()  # type: ignore[assignment]
