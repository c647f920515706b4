"""ConnectionLimits: timeouts and caps, so one sandbox cannot starve the others.

Hook by hook:
- `client_connected`    refuse a connection over `egress_max_connections` (all
                        clients) or `egress_max_connections_per_client` (one
                        client address); arm the request-head deadline. Sessions
                        of the DNS listener are not counted.
- `http_connect`, `requestheaders`, `tls_clienthello`, `response`, `error`
                        keep that deadline: a connection with no request in
                        flight must deliver a complete request head within
                        `egress_header_timeout` (slowloris, idle keep-alive);
                        passthrough tunnels and WebSockets are exempt (opaque bytes,
                        mitmproxy's `tcp_timeout` closes them when idle).
- `request`             the upstream must start answering within
                        `egress_read_timeout` of the request: 504 (plain HTTP/1
                        upstreams) or 502 (TLS or HTTP/2 upstreams, where
                        mitmproxy only reports a lost upstream as 502).

mitmproxy 12 reads HTTP/1 heads without a size limit (`_http1.py`: "FIXME: protect
against header size DoS"); `egress.mitm.patches.head_limit` bounds them at
`egress_max_header_bytes`: 431 to the client, 502 for an upstream's response head.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from mitmproxy import connection, ctx, exceptions, http, tls
from mitmproxy.proxy import events, layer, mode_specs

from egress.mitm import refusals
from egress.mitm.patches import head_limit
from egress.net.limits import DEFAULTS, NO_IDLE_TIMEOUT
from egress.ops import metrics

logger = logging.getLogger(__name__)

REFUSED = metrics.CONNECTIONS_REFUSED


@dataclass
class _Slot:
    address: str
    deadline: asyncio.TimerHandle | None = None
    in_flight: int = 0
    opaque: bool = False  # passthrough tunnel or WebSocket: no more request heads


# The integer options this addon adds, all defaulting to egress.net.limits DEFAULTS: name -> help.
_OPTIONS = {
    "egress_connect_timeout": (
        "Seconds an upstream TCP connect may take before the client gets 502."
    ),
    "egress_read_timeout": (
        "Seconds the upstream may take to start its response after the request was sent; "
        "then 504 (502 for TLS or HTTP/2 upstreams). Keep it below tcp_timeout."
    ),
    "egress_header_timeout": (
        "Seconds a client connection with no request in flight has to deliver a complete "
        "request head (slow or idle clients are closed). 0 disables."
    ),
    "egress_max_connections": (
        "Client connections open at once, all clients together; more are closed at accept. 0 disables."
    ),
    "egress_max_connections_per_client": (
        "Client connections open at once from one client address; more are closed at accept. 0 disables."
    ),
    "egress_max_header_bytes": (
        "Largest HTTP/1 request or response head (request line and headers) in bytes: 431 to the client."
    ),
    "egress_idle_timeout": (
        "Seconds a connection may stay silent in both directions before it is closed (sets "
        "mitmproxy's tcp_timeout). 0 disables."
    ),
}


class ConnectionLimits:
    def __init__(self) -> None:
        self.slots: dict[str, _Slot] = {}
        self.per_address: dict[str, int] = {}
        self._read_timers: dict[str, asyncio.TimerHandle] = {}

    def load(self, loader) -> None:
        for name, help_text in _OPTIONS.items():
            loader.add_option(name, int, DEFAULTS[name], help_text)

    def configure(self, updated: set[str]) -> None:
        if "egress_idle_timeout" in updated:
            seconds = ctx.options.egress_idle_timeout
            if seconds < 0:
                raise exceptions.OptionsError("egress_idle_timeout must be 0 (off) or more")
            idle = seconds or NO_IDLE_TIMEOUT
            if ctx.options.tcp_timeout != idle:
                ctx.options.update(tcp_timeout=idle)
        if "egress_max_header_bytes" in updated:
            if ctx.options.egress_max_header_bytes < 1:  # 0 or less would refuse every request with 431
                raise exceptions.OptionsError("egress_max_header_bytes must be at least 1")
            head_limit.settings.max_bytes = ctx.options.egress_max_header_bytes

    # -- connection caps and the request-head deadline -----------------------------
    def client_connected(self, client: connection.Client) -> None:
        if isinstance(client.proxy_mode, mode_specs.DnsMode):
            # The DNS listener (--dns-listen): mitmproxy keeps a session per client
            # *socket* for 20 s, and stub resolvers open a socket per lookup, so
            # counting them would refuse the 257th lookup in 20 s, and the client's
            # HTTP with it. No request head ever comes on them either.
            return
        address = str(client.peername[0]) if client.peername else ""
        total, per_client = ctx.options.egress_max_connections, ctx.options.egress_max_connections_per_client
        if total and len(self.slots) >= total:
            return self._refuse(client, "total", total)
        if per_client and self.per_address.get(address, 0) >= per_client:
            return self._refuse(client, "per_client", per_client)
        self.slots[client.id] = _Slot(address)
        self.per_address[address] = self.per_address.get(address, 0) + 1
        self._arm(client)

    @staticmethod
    def _refuse(client: connection.Client, limit: str, value: int) -> None:
        REFUSED.labels(limit).inc()
        client.error = f"egress: connection limit ({limit}={value})"
        logger.warning("refused connection from %s: %s connection limit %d reached", client.peername[0], limit, value)

    def client_disconnected(self, client: connection.Client) -> None:
        slot = self.slots.pop(client.id, None)
        if slot is None:
            return
        self._disarm(slot)
        left = self.per_address.get(slot.address, 1) - 1
        if left > 0:
            self.per_address[slot.address] = left
        else:
            self.per_address.pop(slot.address, None)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        # What travels in the tunnel (TLS handshake, first request) gets its own deadline.
        self._arm(flow.client_conn)

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        slot = self.slots.get(data.context.client.id)
        if slot is not None and data.ignore_connection:  # passthrough: opaque from here on
            slot.opaque = True
            self._disarm(slot)

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        # A tunnel handed to the relay (egress.addons.tunnel) never reaches tls_clienthello.
        slot = self.slots.get(nextlayer.context.client.id)
        if slot is not None and getattr(nextlayer.layer, "opaque", False):
            slot.opaque = True
            self._disarm(slot)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        slot = self.slots.get(flow.client_conn.id)
        if slot is not None and flow.request.method != "CONNECT":
            slot.in_flight += 1
            self._disarm(slot)

    def response(self, flow: http.HTTPFlow) -> None:
        self._flow_done(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._flow_done(flow)

    def _flow_done(self, flow: http.HTTPFlow) -> None:
        # Also drops the read timer of a flow that ended in an error (it never sees
        # response headers) rather than keep the flow alive until the timer fires.
        self._cancel(self._read_timers, flow.id)
        slot = self.slots.get(flow.client_conn.id)
        if slot is None or flow.request.method == "CONNECT":
            return
        slot.in_flight = max(0, slot.in_flight - 1)
        if flow.websocket is not None:
            slot.opaque = True
        if slot.in_flight == 0 and not slot.opaque:
            self._arm(flow.client_conn)

    def _arm(self, client: connection.Client) -> None:
        slot = self.slots.get(client.id)
        seconds = ctx.options.egress_header_timeout
        if slot is None or slot.opaque or not seconds:
            return
        self._disarm(slot)
        slot.deadline = asyncio.get_running_loop().call_later(seconds, self._header_expired, client, seconds)

    @staticmethod
    def _disarm(slot: _Slot) -> None:
        if slot.deadline is not None:
            slot.deadline.cancel()
            slot.deadline = None

    def _header_expired(self, client: connection.Client, seconds: int) -> None:
        slot = self.slots.get(client.id)
        if slot is None:
            return
        slot.deadline = None
        metrics.TIMEOUTS.labels("header").inc()
        logger.info("closed connection from %s: no complete request head within %ss", client.peername[0], seconds)
        _cancel_transport(client, client, f"egress: no request head within {seconds}s")

    # -- upstream read timeout (the connect timeout is egress.addons.tunnel's) -----
    def request(self, flow: http.HTTPFlow) -> None:
        seconds = ctx.options.egress_read_timeout
        if flow.response is not None or not seconds:
            return
        self._read_timers[flow.id] = asyncio.get_running_loop().call_later(seconds, self._read_expired, flow, seconds)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._cancel(self._read_timers, flow.id)

    def _read_expired(self, flow: http.HTTPFlow, seconds: int) -> None:
        self._read_timers.pop(flow.id, None)
        if flow.response is not None or flow.error is not None or not flow.live:
            return
        metrics.TIMEOUTS.labels("read").inc()
        server = flow.server_conn
        logger.warning("upstream sent no response within %ss (port %s)", seconds, flow.request.port)
        handler = _handler(flow.client_conn)
        if handler is None:
            return
        if server.connected and not server.tls and server.alpn in (None, b"", b"http/1.1") and server in handler.transports:
            # Plain HTTP/1: answer as the upstream would have, so the client gets a real
            # 504 through the normal response path; `Connection: close` drops the upstream.
            answer = refusals.read_timeout(flow.request.host)
            task = asyncio.get_running_loop().create_task(handler.server_event(events.DataReceived(server, answer)))
            _background.add(task)
            task.add_done_callback(_background.discard)
        else:
            _cancel_transport(flow.client_conn, server, f"egress: upstream read timed out after {seconds}s")

    @staticmethod
    def _cancel(timers: dict[str, asyncio.TimerHandle], key: str) -> None:
        if (timer := timers.pop(key, None)) is not None:
            timer.cancel()


_background: set[asyncio.Task] = set()


def _handler(client: connection.Client):
    return ctx.master.addons.get("proxyserver").connections.get(client.id)


def _cancel_transport(client: connection.Client, conn: connection.Connection, reason: str) -> None:
    """End one connection's I/O task the way mitmproxy's own inactivity timeout does."""
    handler = _handler(client)
    io = handler.transports.get(conn) if handler is not None else None
    if io is not None and io.handler is not None:
        io.handler.cancel(reason)
