"""DestinationGuard: allowlist, address guard and address pinning on mitmproxy hooks.

Hook by hook:
- `http_connect`     check the CONNECT authority; 403, or dial the checked address
                     before `200` (502/504 with `X-Egress-Error` when it cannot be
                     reached) and remember the tunnel.
- `next_layer`       once the complete ClientHello is in, before mitmproxy stacks
                     its TLS layers: its raw server_name must name the CONNECT host
                     (`egress.wire.clienthello`); entries without a transform are handed
                     to a relay outside mitmproxy (`egress.addons.tunnel`). In
                     transparent mode the server_name *is* the destination: it is
                     checked here, and the connection is renamed from the client's
                     original destination address to that name.
- `requestheaders`   check each request's destination (and that it agrees with the
                     tunnel it travels in); 403 or let it on.
- `tls_clienthello`  intercepted tunnels only: mitmproxy's own reading of the SNI
                     must agree too (defence in depth; the decision was taken above).
- `server_connect`   dial only the address that was checked for this client and
                     destination (for a CONNECT tunnel: take over the connection
                     dialled at CONNECT); anything else is refused (fail closed).
With `--upstream-proxy` every dial above (ours and mitmproxy's own, see
`egress.mitm.patches.connect_handoff`) is a `CONNECT <checked-ip>:<port>` through the parent
(`egress.net.parent_proxy`); nothing else here changes.
Policy lives in `egress.policy.decisions` / `egress.net.destinations`; this file only wires it in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from mitmproxy import connection, ctx, exceptions, http, tls
from mitmproxy.net.http import url
from mitmproxy.proxy import layer, layers, mode_specs, server_hooks
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.proxy.layers.tls import HTTP_ALPNS
from mitmproxy.utils import human

from egress.addons.refuse import refuse
from egress.addons.tunnel import RefuseLayer, RelayLayer, can_take_over
from egress.mitm import refusals
from egress.mitm.patches import connect_handoff
from egress.mitm.patches.connect_handoff import connecting_to, hand_to_mitmproxy
from egress.net import parent_proxy, upstream
from egress.net.destinations import DestinationChecker
from egress.net.hostport import HostPortError, parse_hostport
from egress.net.parent_proxy import ParentProxy
from egress.net.relay import Side
from egress.ops import metrics
from egress.ops.audit import DecisionLog, client_label
from egress.policy import decisions as policy
from egress.policy.addresses import IPAddress
from egress.policy.domains import HostError, normalize_host
from egress.wire import clienthello, protocol_switch, tunnel_start
from egress.wire.fields import connect_target_problem, declared_length_problem, field_value_problem, host_field_problem
from egress.wire.request_target import request_target_problem

logger = logging.getLogger(__name__)
DECISION_KEY = "egress.decision"


@dataclass
class Tunnel:
    host: str  # normalised CONNECT host
    port: int
    decision: policy.Decision
    blocked: str = ""  # reason, once the TLS ClientHello has been refused
    decided: bool = False  # the ClientHello was checked (next_layer); later layers are not ours
    # Intercepted: what the client sends inside the TLS the proxy terminated was classified
    # too (HTTP, checked per request), not left to mitmproxy's guess (`egress.wire.tunnel_start`).
    inner_decided: bool = False
    upstream: Side | None = None  # dialled at CONNECT, until the relay or mitmproxy takes it, or it is closed

    def release(self) -> None:
        """Close the connection dialled at CONNECT without sending it a byte."""
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None


@dataclass
class ClientState:
    tunnel: Tunnel | None = None
    # (normalised host, port) -> the one address checked for it.
    pins: dict[tuple[str, int], IPAddress] = field(default_factory=dict)

    def pin(self, host: str, port: int, address: IPAddress | None) -> IPAddress:
        """Remember the address checked for an allowed destination (which always has one)."""
        if address is None:  # fail closed (internal_error) rather than pin nothing
            raise RuntimeError(f"allowed destination {host}:{port} came without a checked address")
        self.pins[(host, port)] = address
        return address


async def _dial(address: IPAddress, port: int, parent: ParentProxy | None) -> Side:
    """Connect to the checked address (through the parent proxy, if any) within
    --connect-timeout; timed and counted."""
    started = time.monotonic()
    try:
        side = await upstream.dial(address, port, ctx.options.egress_connect_timeout, parent)
    except upstream.DialFailed as failure:
        metrics.UPSTREAM_ERRORS.labels(failure.reason).inc()
        log_dial_failure(failure, port, parent)
        raise
    metrics.UPSTREAM_CONNECT.observe(time.monotonic() - started)
    return side


def log_dial_failure(failure: upstream.DialFailed, port: int, parent: ParentProxy | None) -> None:
    # A parent that is down or refuses us is the operator's to fix: a warning, with what
    # it answered. A destination that cannot be reached is the sandbox's business: info.
    if parent is not None and failure.reason == upstream.UPSTREAM_REFUSED:
        logger.warning("upstream %s at CONNECT (port %s): %s", failure.reason, port, failure.detail)
    else:
        logger.info("upstream %s at CONNECT (port %s)%s", failure.reason, port, f": {failure.detail}" if parent else "")



def _transparent(client: connection.Client) -> bool:
    return isinstance(client.proxy_mode, mode_specs.TransparentMode)


def _refusal(decision: policy.Decision, method: str) -> http.Response:
    if decision.reason == policy.REQUEST_NOT_ALLOWED and decision.request is not None:
        return refusals.request_not_allowed(decision.host, method, decision.request.path, decision.request.problem)
    return refusals.denied(decision.reason, decision.host)


def _stream_threshold() -> int:
    """mitmproxy's `stream_large_bodies` in bytes: a body above it is sent on as it arrives."""
    size = human.parse_size(ctx.options.stream_large_bodies)
    return size if size is not None else 1 << 62


def _has_rules(decision: policy.Decision) -> bool:
    """Only HTTP can be held to the entry's request rules: anything else in its tunnel is refused."""
    return decision.entry is not None and decision.entry.requests is not None


def _normalized(host: str) -> str | None:
    try:
        return normalize_host(host)
    except HostError:
        return None


class DestinationGuard:
    def __init__(
        self, checker: DestinationChecker, log: DecisionLog, parent: ParentProxy | None = None, parent_from: tuple = (None, None)
    ):
        """`parent`: already parsed by `egress-proxy run` from `parent_from` (its two options' values)."""
        self.checker = checker
        self.log = log
        self.parent = parent  # --upstream-proxy: every upstream connection is a CONNECT through it
        self._parent_from = parent_from if parent is not None else (None, None)
        self.clients: dict[str, ClientState] = {}
        self._dialing: dict[str, tuple[str, int]] = {}

    def load(self, loader) -> None:
        loader.add_option(
            "egress_upstream_proxy", str | None, None,
            "Reach the internet through a parent proxy, http://HOST:PORT: every upstream connection is a "
            "CONNECT to the checked IP address through it.",
        )  # fmt: skip
        loader.add_option(
            "egress_upstream_proxy_auth", str | None, None,
            "Credentials for the parent proxy by reference, e.g. 'USER:${file:/run/secrets/parent-password}' "
            "or '${env:PARENT_AUTH}' (USER:PASSWORD); sent to the parent only.",
        )  # fmt: skip
        connect_handoff.use_parent(self.parent)

    def configure(self, updated: set[str]) -> None:
        if updated & {"listen_host", "egress_dns_listen"}:
            # The proxy's own listen addresses are never a destination (proxy_self).
            hosts = [ctx.options.listen_host]
            if ctx.options.egress_dns_listen:
                try:
                    hosts.append(parse_hostport(ctx.options.egress_dns_listen, "egress_dns_listen")[0])
                except HostPortError:
                    pass  # refused by the DNS filter, which owns the option
            self.checker.local.listen_on(hosts)
        if not updated & {"egress_upstream_proxy", "egress_upstream_proxy_auth"}:
            return
        given = (ctx.options.egress_upstream_proxy, ctx.options.egress_upstream_proxy_auth)
        if given == self._parent_from:
            return
        if given[0] is None:
            if given[1] is not None:
                return refuse("egress_upstream_proxy_auth needs egress_upstream_proxy")
            self.parent = None
        else:
            try:
                self.parent = parent_proxy.parse(*given)
            except parent_proxy.ParentProxyError as exc:
                return refuse(str(exc))
        self._parent_from = given
        connect_handoff.use_parent(self.parent)

    def _state(self, client: connection.Client) -> ClientState:
        return self.clients.setdefault(client.id, ClientState())

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:  # refused before us (no proof of environment)
            return
        if (problem := connect_target_problem(flow.request.data.authority)) is not None:
            flow.response = refusals.bad_request(problem)
            return
        host, port = flow.request.host, flow.request.port
        decision, address = await self.checker.check(host, port, flow.client_conn.id)
        if not decision.allowed:
            flow.response = refusals.denied(decision.reason, decision.host)
            self.log.record(decision, client=client_label(flow.client_conn.peername), port=port, method="CONNECT", kind="tunnel")
            return
        state = self._state(flow.client_conn)
        address = state.pin(decision.host, port, address)
        tunnel = Tunnel(decision.host, port, decision)
        # Dial before `200`, so an unreachable upstream is answered here, in one clear line.
        # Intercepted tunnels are dialled too (same answer); mitmproxy's own connect after
        # the client's handshake then takes this connection over (server_connect).
        try:
            side = await _dial(address, port, self.parent)
        except upstream.DialFailed as failure:
            flow.response = refusals.upstream_failed(failure.reason, decision.host)
            self.log.record(
                decision, client=client_label(flow.client_conn.peername), port=port, method="CONNECT", kind="tunnel",
                error=failure.reason,
            )  # fmt: skip
            return
        tunnel.upstream = side
        state.tunnel = tunnel

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method == "CONNECT":
            return
        if (problem := field_value_problem(flow.request.headers.fields)) is not None or (
            problem := host_field_problem(flow.request.headers.fields, flow.request.data.authority)
        ) is not None:
            # Not a destination decision: refused like any malformed request, before one is made.
            flow.response = refusals.bad_request(problem)
            return
        if (problem := request_target_problem(flow.request.data.method, flow.request.data.path)) is not None:
            # HTTP/2 `:method`/`:path` go into the upstream's HTTP/1 request line as they are.
            flow.response = refusals.bad_request(problem)
            return
        decision = await self._check_request(flow)
        flow.metadata[DECISION_KEY] = decision
        if not decision.allowed:
            flow.response = _refusal(decision, flow.request.method)
            self.log.record(
                decision, client=client_label(flow.client_conn.peername), port=flow.request.port, method=flow.request.method
            )
        # Allowed requests are logged by the credential injector, which knows what it added.

    def request(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        # HTTP/1 frames a body by its content-length; HTTP/2 and /3 carry it beside the
        # frames, and the upstream (HTTP/1 or 2) would frame by the header (egress.wire.fields).
        if flow.response is not None:
            return
        if (request.is_http2 or request.is_http3) and request.raw_content is not None and (
            problem := declared_length_problem(request.headers.get("content-length"), len(request.raw_content))
        ) is not None:
            flow.response = refusals.bad_request(problem)
            return
        decision: policy.Decision | None = flow.metadata.get(DECISION_KEY)
        if decision is not None and decision.request is not None and decision.request.body:
            # An item that checks the body too (git-read's LFS batch): the whole body is here
            # and nothing has been sent upstream (its declared length was checked at the headers).
            spec = self.checker.spec_for(flow.client_conn.id)
            checked = policy.check_request_body(
                spec, decision, request.headers.get("content-length"), request.raw_content, _stream_threshold()
            )
            if checked is not decision:
                flow.metadata[DECISION_KEY] = checked
                if not checked.allowed:
                    flow.response = _refusal(checked, request.method)
                # A second line for this request: the one at its headers said what they allowed.
                self.log.record(checked, client=client_label(flow.client_conn.peername), port=request.port,
                                method=request.method, kind="request_body")  # fmt: skip

    async def _check_request(self, flow: http.HTTPFlow) -> policy.Decision:
        request = flow.request
        spec = self.checker.spec_for(flow.client_conn.id)
        state = self._state(flow.client_conn)
        if _transparent(flow.client_conn) and state.tunnel is None:
            # Plain HTTP, redirected: mitmproxy names the client's original destination
            # address, which the client chose. The destination is the Host header's name,
            # and the request goes to the address checked for that name.
            name = self._host_header_name(request)
            if name is None:
                return policy.unnamed()
            request.data.host = name
        host = _normalized(request.host)
        if host is None:
            return policy.check_name(spec, request.host)
        tunnel = state.tunnel
        # Inside a CONNECT tunnel mitmproxy takes the destination from the Host header
        # or :authority, so it must be the host the tunnel was opened (and checked) for;
        # outside one, the absolute URI and the Host header must agree.
        in_wrong_tunnel = tunnel is not None and (host, request.port) != (tunnel.host, tunnel.port)
        if in_wrong_tunnel or not self._authority_agrees(request, host):
            named = tunnel.decision if tunnel is not None else policy.check_name(spec, request.host)
            return policy.with_reason(spec, named, policy.HOST_MISMATCH)

        decision = tunnel.decision if tunnel is not None else None
        if decision is None and (host, request.port) in state.pins:
            # Plain HTTP on a kept-alive client connection: the name is checked against
            # the spec in force, the address already checked for it on this connection is
            # reused instead of resolving again for every request.
            decision = policy.check_name(spec, request.host)
            if not decision.allowed:
                return decision
        elif decision is None or (host, request.port) not in state.pins:
            decision, address = await self.checker.check(request.host, request.port, flow.client_conn.id)
            if not decision.allowed:
                return decision
            state.pin(decision.host, request.port, address)
        if decision.injects and request.scheme != "https":
            return policy.with_reason(spec, decision, policy.PLAINTEXT_CREDENTIALS)
        if decision.injects and policy.echoes_request(request.method):
            # The server's answer to TRACE is the request as it arrived, injected header
            # and all: the sandbox would read the secret.
            return policy.with_reason(spec, decision, policy.TRACE_CREDENTIALS)
        # The entry's request rules, on the method and target as they arrived (HTTP/1 request
        # line, HTTP/2 `:method`/`:path`); a WebSocket handshake is asked as one.
        upgrade = bool(request.headers.get_all("Upgrade")) and protocol_switch.followable_request(request.headers)
        decision = policy.check_request(spec, decision, request.data.method, request.data.path, upgrade)
        if decision.request is not None and decision.request.body:  # its body is checked in `request`, if it can be
            decision = policy.check_request_body(spec, decision, request.headers.get("content-length"), None, _stream_threshold())
        return decision

    @staticmethod
    def _host_header_name(request: http.Request) -> str | None:
        try:
            name, _ = url.parse_authority(request.host_header or "", check=False)
        except ValueError:
            return None
        return name or None

    @staticmethod
    def _authority_agrees(request: http.Request, host: str) -> bool:
        """Every name the request carries (Host header, :authority) is the destination's."""
        for value in (request.headers.get("host"), request.authority or None):
            if value is None:
                continue
            try:
                named, port = url.parse_authority(value, check=False)
            except ValueError:
                return False
            if _normalized(named) != host or (port is not None and port != request.port):
                return False
        return True

    async def next_layer(self, nextlayer: layer.NextLayer) -> None:
        """Decide a TLS tunnel on its complete ClientHello, before mitmproxy's TLS layers exist."""
        context = nextlayer.context
        state = self.clients.get(context.client.id)
        tunnel = state.tunnel if state else None
        transparent = _transparent(context.client)
        if nextlayer.layer is not None:
            return
        if tunnel is not None and tunnel.decided:
            if not tunnel.inner_decided and context.layers and isinstance(context.layers[-1], layers.ClientTLSLayer):
                self._decide_intercepted_stream(nextlayer, tunnel)
            return
        if tunnel is None and not (transparent and len(context.layers) == 1):
            return  # not a tunnel (plain HTTP, the first layer of a regular proxy)
        data = nextlayer.data_client()
        # Which checks apply is decided here, not by mitmproxy's guess (`egress.wire.tunnel_start`).
        start = tunnel_start.classify(data)
        if start is tunnel_start.Start.WAIT:
            raise exceptions.AddonHalt  # could still become a TLS record or a request line: wait
        if start in (tunnel_start.Start.HTTP, tunnel_start.Start.OTHER):
            # HTTP inside the tunnel is checked request by request as before; anything
            # else is mitmproxy's (raw TCP to the checked address, or refused). Either
            # way mitmproxy's connect takes the connection dialled at CONNECT.
            if tunnel is not None:
                tunnel.decided = tunnel.inner_decided = True
                if start is tunnel_start.Start.OTHER and _has_rules(tunnel.decision):
                    self._refuse_unruled_stream(nextlayer, tunnel)
                    return
            if start is tunnel_start.Start.HTTP:
                nextlayer.layer = layers.HttpLayer(context, HTTPMode.transparent)
            return
        try:
            # TLS a server would accept but the proxy cannot read is a server_name that names nothing valid.
            hello = (
                clienthello.parse_records(data)
                if start is tunnel_start.Start.TLS
                else clienthello.Hello(clienthello.INVALID)
            )
        except clienthello.HelloError:
            hello = clienthello.Hello(clienthello.INVALID)
        if hello is None:
            # Incomplete: mitmproxy's NextLayer would stack TLS layers on the first bytes.
            raise exceptions.AddonHalt
        if tunnel is None:
            await self._open_transparent_tls(nextlayer, hello.server_name)
        else:
            self._decide_connect_tls(nextlayer, tunnel, hello.server_name)

    def _refuse_unruled_stream(self, nextlayer: layer.NextLayer, tunnel: Tunnel) -> None:
        """Bytes that are not HTTP in a tunnel to an entry with request rules: no method or
        path to hold to them, so closed (nothing sent upstream) and logged."""
        context = nextlayer.context
        decision = policy.with_reason(self.checker.spec_for(context.client.id), tunnel.decision, policy.REQUEST_NOT_ALLOWED)
        if not decision.allowed:  # report mode lets it pass, as it lets every request pass
            tunnel.blocked = policy.REQUEST_NOT_ALLOWED
            tunnel.release()
            nextlayer.layer = RefuseLayer(context)
        self.log.record(decision, client=client_label(context.client.peername), port=tunnel.port, method="TCP", kind="tunnel")

    def _decide_intercepted_stream(self, nextlayer: layer.NextLayer, tunnel: Tunnel) -> None:
        """The first bytes inside TLS the proxy terminated: HTTP goes to the HTTP layer, however
        short its first write. mitmproxy's guess took `G` (then `ET / ... Host: other.test`)
        for raw TCP unless the client had negotiated an HTTP ALPN."""
        context = nextlayer.context
        if context.client.alpn in HTTP_ALPNS:
            tunnel.inner_decided = True  # mitmproxy's HTTP layer, whatever the bytes
            return
        start = tunnel_start.classify(nextlayer.data_client())
        if start is tunnel_start.Start.WAIT:
            raise exceptions.AddonHalt
        tunnel.inner_decided = True
        if start is tunnel_start.Start.HTTP:
            nextlayer.layer = layers.HttpLayer(context, HTTPMode.transparent)
        elif _has_rules(tunnel.decision):
            self._refuse_unruled_stream(nextlayer, tunnel)
        # Anything else is mitmproxy's: raw TCP over TLS to the checked destination (no
        # credential is added to it), or TLS inside TLS, checked again in tls_clienthello.

    def _decide_connect_tls(self, nextlayer: layer.NextLayer, tunnel: Tunnel, server_name: str | None) -> None:
        context = nextlayer.context
        client = client_label(context.client.peername)
        tunnel.decided = True
        # A ClientHello without server_name keeps the CONNECT host; one that names
        # anything else, or names nothing valid, is refused.
        if server_name is not None and server_name != tunnel.host:
            tunnel.blocked = policy.HOST_MISMATCH
            tunnel.release()  # not a byte was sent to it
            nextlayer.layer = RefuseLayer(context)
            decision = policy.with_reason(self.checker.spec_for(context.client.id), tunnel.decision, policy.HOST_MISMATCH)
            self.log.record(decision, client=client, port=tunnel.port, method="TLS", kind="tunnel")
            return
        if tunnel.decision.intercepted:
            return  # intercepted: mitmproxy's TLS layers come next
        self.log.record(tunnel.decision, client=client, port=tunnel.port, method="CONNECT", kind="tunnel")
        self._pass_through(nextlayer, tunnel, "CONNECT")

    async def _open_transparent_tls(self, nextlayer: layer.NextLayer, server_name: str | None) -> None:
        """Check the SNI of a redirected TLS connection and make it the connection's destination."""
        context = nextlayer.context
        client, server = context.client, context.server
        if server.address is None:  # fail closed (internal_error): redirected TCP always has one
            raise RuntimeError("transparent connection without its original destination")
        _, port = server.address
        if server_name is None or server_name == clienthello.INVALID:
            decision, address = policy.unnamed(policy.NO_SNI), None
        else:
            decision, address = await self.checker.check(server_name, port, client.id)
        state = self._state(client)
        state.tunnel = tunnel = Tunnel(decision.host, port, decision, decided=True)
        if not decision.allowed:
            tunnel.blocked = decision.reason
            nextlayer.layer = RefuseLayer(context)
            self.log.record(decision, client=client_label(client.peername), port=port, method="TLS", kind="tunnel")
            return
        address = state.pin(decision.host, port, address)
        # From here on the destination is the name (and its checked address), never the
        # address the client connected to: SNI `allowed.test` sent to another IP reaches
        # allowed.test. The upstream TLS handshake still uses the client's SNI.
        server.address = (decision.host, port)
        if decision.intercepted:
            return
        if can_take_over(context):
            try:
                tunnel.upstream = await _dial(address, port, self.parent)
            except upstream.DialFailed as failure:
                # No CONNECT to answer: closed as before, but counted and logged.
                tunnel.blocked = failure.reason
                nextlayer.layer = RefuseLayer(context)
                self.log.record(
                    decision, client=client_label(client.peername), port=port, method="TLS", kind="tunnel", error=failure.reason
                )  # fmt: skip
                return
        self.log.record(decision, client=client_label(client.peername), port=port, method="TLS", kind="tunnel")
        self._pass_through(nextlayer, tunnel, "TLS")

    def _pass_through(self, nextlayer: layer.NextLayer, tunnel: Tunnel, method: str) -> None:
        context = nextlayer.context
        if tunnel.upstream is None or not can_take_over(context):
            # TLS to the proxy itself (or another transport mitmproxy owns): relay inside
            # mitmproxy; its upstream connection is the pinned address (server_connect),
            # over the connection dialled at CONNECT where there is one.
            nextlayer.layer = layers.TCPLayer(context, ignore=True)
            return
        side, tunnel.upstream = tunnel.upstream, None
        client = client_label(context.client.peername)

        def closed(bytes_up: int, bytes_down: int) -> None:
            self.log.closed(
                tunnel.decision, client=client, port=tunnel.port, method=method, bytes_up=bytes_up, bytes_down=bytes_down
            )

        nextlayer.layer = RelayLayer(context, side, closed)

    async def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        state = self.clients.get(data.context.client.id)
        tunnel = state.tunnel if state else None
        if tunnel is None and not _transparent(data.context.client):
            return  # TLS to the proxy itself, before any CONNECT
        if tunnel is None or not tunnel.decided:
            # Every tunnel's TLS is decided in next_layer first; anything else is refused.
            if tunnel is not None:
                tunnel.blocked = policy.INTERNAL_ERROR
            data.ignore_connection = True
            data.context.server.error = "egress: TLS connection was not checked"
            logger.warning("refused a TLS connection that was not checked before its handshake")
            return
        sni = data.client_hello.sni
        if sni is not None and _normalized(sni) != tunnel.host:
            tunnel.blocked = policy.HOST_MISMATCH
            # Neither intercept nor forward: server_connect refuses, the client sees a close.
            data.ignore_connection = True
            decision = policy.with_reason(self.checker.spec_for(data.context.client.id), tunnel.decision, policy.HOST_MISMATCH)
            self.log.record(decision, client=client_label(data.context.client.peername), port=tunnel.port, method="TLS", kind="tunnel")

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        state = self.clients.get(data.client.id)
        host, port = data.server.address or ("", 0)
        normalized = _normalized(host)
        address = state.pins.get((normalized, port)) if state and normalized else None
        if state and state.tunnel and state.tunnel.blocked:
            data.server.error = f"egress: tunnel refused ({state.tunnel.blocked})"
        elif address is None and _transparent(data.client) and data.server.address == data.client.sockname:
            # Redirected TCP that is neither TLS nor HTTP names no destination: refused, counted.
            self.log.record(policy.unnamed(), client=client_label(data.client.peername), port=port, method="TCP", kind="tunnel")
            data.server.error = "egress: connection names no destination (neither TLS with SNI nor HTTP)"
        elif address is None:
            # Every legitimate path pins an address before mitmproxy dials; reaching here
            # means an unchecked destination, so refuse instead of resolving it.
            logger.warning("refused unchecked upstream connection to port %s", port)
            data.server.error = "egress: destination was not checked"
        else:
            self._dialing[data.server.id] = (host, port)
            connecting_to(normalized or "")  # a failed connect's answer names it
            data.server.address = (str(address), port)
            tunnel = state.tunnel if state else None
            if tunnel is not None and tunnel.upstream is not None and (normalized, port) == (tunnel.host, tunnel.port):
                if data.server.error:
                    tunnel.release()  # another addon refused this connect
                else:
                    hand_to_mitmproxy(tunnel.upstream)  # the connection dialled at CONNECT
                tunnel.upstream = None

    def _restore_address(self, data: server_hooks.ServerConnectionHookData) -> None:
        # mitmproxy reuses upstream connections by comparing addresses with the requested
        # (host, port); put the name back once the socket to the checked IP is open.
        # `Server.__setattr__` refuses address changes on an open connection, so write
        # the field directly: the socket stays pinned to the checked IP, only the key
        # later requests to the same (host, port) are matched against changes. Without
        # this every request opened (and, over TLS, handshook) a new upstream connection.
        if (original := self._dialing.pop(data.server.id, None)) is not None:
            object.__setattr__(data.server, "address", original)

    server_connected = _restore_address
    server_connect_error = _restore_address

    def client_disconnected(self, client: connection.Client) -> None:
        state = self.clients.pop(client.id, None)
        if state is not None and state.tunnel is not None:
            state.tunnel.release()
