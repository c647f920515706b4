"""DestinationGuard: allowlist, address guard and address pinning on mitmproxy hooks.

Hook by hook:
- `http_connect`     check the CONNECT authority; 403 or remember the tunnel.
- `requestheaders`   check each request's destination (and that it agrees with the
                     tunnel it travels in); 403 or let it on.
- `tls_clienthello`  SNI must equal the CONNECT host; entries without a transform
                     are passed through without interception. In transparent mode
                     the SNI *is* the destination: it is checked here, and the
                     connection is renamed from the client's original destination
                     address to that name, so the original address is never dialled.
- `server_connect`   dial only the address that was checked for this client and
                     destination; anything else is refused (fail closed).
Policy lives in `egress.policy` / `egress.destinations`; this file only wires it in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mitmproxy import connection, http, tls
from mitmproxy.net.http import url
from mitmproxy.proxy import mode_specs, server_hooks

from egress import policy
from egress.addresses import IPAddress
from egress.audit import DecisionLog
from egress.destinations import DestinationChecker
from egress.domains import HostError, normalize_host
from egress.fields import bad_request_body, field_value_problem

logger = logging.getLogger(__name__)
DECISION_KEY = "egress.decision"


@dataclass
class Tunnel:
    host: str  # normalised CONNECT host
    port: int
    decision: policy.Decision
    blocked: str = ""  # reason, once the TLS ClientHello has been refused


@dataclass
class ClientState:
    tunnel: Tunnel | None = None
    # (normalised host, port) -> the one address checked for it.
    pins: dict[tuple[str, int], IPAddress] = field(default_factory=dict)

    def pin(self, host: str, port: int, address: IPAddress | None) -> None:
        """Remember the address checked for an allowed destination (which always has one)."""
        if address is None:  # fail closed (internal_error) rather than pin nothing
            raise RuntimeError(f"allowed destination {host}:{port} came without a checked address")
        self.pins[(host, port)] = address


def deny_response(reason: str, host: str) -> http.Response:
    return http.Response.make(
        403,
        policy.deny_body(reason, host),
        {"Content-Type": "application/json", "X-Egress-Denied": reason},
    )


def _client_label(client: connection.Client) -> str:
    host, port, *_ = client.peername
    return f"{host}:{port}"


def _transparent(client: connection.Client) -> bool:
    return isinstance(client.proxy_mode, mode_specs.TransparentMode)


def _normalized(host: str) -> str | None:
    try:
        return normalize_host(host)
    except HostError:
        return None


class DestinationGuard:
    def __init__(self, checker: DestinationChecker, log: DecisionLog):
        self.checker = checker
        self.log = log
        self.clients: dict[str, ClientState] = {}
        self._dialing: dict[str, tuple[str, int]] = {}

    def _state(self, client: connection.Client) -> ClientState:
        return self.clients.setdefault(client.id, ClientState())

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:  # refused before us (no proof of environment)
            return
        host, port = flow.request.host, flow.request.port
        decision, address = await self.checker.check(host, port, flow.client_conn.id)
        if not decision.allowed:
            flow.response = deny_response(decision.reason, decision.host)
            self.log.record(decision, client=_client_label(flow.client_conn), port=port, method="CONNECT", kind="tunnel")
            return
        state = self._state(flow.client_conn)
        state.tunnel = Tunnel(decision.host, port, decision)
        state.pin(decision.host, port, address)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method == "CONNECT":
            return
        if (problem := field_value_problem(flow.request.headers.fields)) is not None:
            # Not a destination decision: refused like any malformed request, before one is made.
            flow.response = http.Response.make(400, bad_request_body(problem), {"Content-Type": "application/json"})
            return
        decision = await self._check_request(flow)
        flow.metadata[DECISION_KEY] = decision
        if not decision.allowed:
            flow.response = deny_response(decision.reason, decision.host)
            self.log.record(
                decision, client=_client_label(flow.client_conn), port=flow.request.port, method=flow.request.method
            )
        # Allowed requests are logged by the credential injector, which knows what it added.

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
        if decision.transform and request.scheme != "https":
            return policy.with_reason(spec, decision, policy.PLAINTEXT_CREDENTIALS)
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

    async def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        state = self.clients.get(data.context.client.id)
        tunnel = state.tunnel if state else None
        if tunnel is None:
            if _transparent(data.context.client):
                await self._open_transparent_tls(data)
            return
        client = _client_label(data.context.client)
        sni = data.client_hello.sni
        if sni is not None and _normalized(sni) != tunnel.host:
            tunnel.blocked = policy.HOST_MISMATCH
            # Neither intercept nor forward: server_connect refuses, the client sees a close.
            data.ignore_connection = True
            decision = policy.with_reason(self.checker.spec_for(data.context.client.id), tunnel.decision, policy.HOST_MISMATCH)
            self.log.record(decision, client=client, port=tunnel.port, method="TLS", kind="tunnel")
            return
        if not tunnel.decision.transform:
            data.ignore_connection = True
            self.log.record(tunnel.decision, client=client, port=tunnel.port, method="CONNECT", kind="tunnel")

    async def _open_transparent_tls(self, data: tls.ClientHelloData) -> None:
        """Check the SNI of a redirected TLS connection and make it the connection's destination."""
        client, server = data.context.client, data.context.server
        if server.address is None:  # fail closed (internal_error): redirected TCP always has one
            raise RuntimeError("transparent connection without its original destination")
        _, port = server.address
        sni = data.client_hello.sni
        if sni:
            decision, address = await self.checker.check(sni, port, client.id)
        else:
            decision, address = policy.unnamed(policy.NO_SNI), None
        state = self._state(client)
        state.tunnel = Tunnel(decision.host, port, decision)
        if not decision.allowed:
            state.tunnel.blocked = decision.reason
            data.ignore_connection = True  # server_connect refuses: the client sees a close
            self.log.record(decision, client=_client_label(client), port=port, method="TLS", kind="tunnel")
            return
        state.pin(decision.host, port, address)
        # From here on the destination is the name (and its checked address), never the
        # address the client connected to: SNI `allowed.test` sent to another IP reaches
        # allowed.test. The upstream TLS handshake still uses the client's SNI.
        server.address = (decision.host, port)
        if not decision.transform:
            data.ignore_connection = True
            self.log.record(decision, client=_client_label(client), port=port, method="TLS", kind="tunnel")

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        state = self.clients.get(data.client.id)
        host, port = data.server.address or ("", 0)
        normalized = _normalized(host)
        address = state.pins.get((normalized, port)) if state and normalized else None
        if state and state.tunnel and state.tunnel.blocked:
            data.server.error = f"egress: tunnel refused ({state.tunnel.blocked})"
        elif address is None and _transparent(data.client) and data.server.address == data.client.sockname:
            # Redirected TCP that is neither TLS nor HTTP names no destination: refused, counted.
            self.log.record(policy.unnamed(), client=_client_label(data.client), port=port, method="TCP", kind="tunnel")
            data.server.error = "egress: connection names no destination (neither TLS with SNI nor HTTP)"
        elif address is None:
            # Every legitimate path pins an address before mitmproxy dials; reaching here
            # means an unchecked destination, so refuse instead of resolving it.
            logger.warning("refused unchecked upstream connection to port %s", port)
            data.server.error = "egress: destination was not checked"
        else:
            self._dialing[data.server.id] = (host, port)
            data.server.address = (str(address), port)

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
        self.clients.pop(client.id, None)
