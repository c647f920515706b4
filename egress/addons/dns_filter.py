"""DnsFilter: the `dns_request` hook of the proxy's DNS listener (`--dns-listen`).

One hook, one sequence: read the query, ask `egress.dns_policy.decide` under the spec
in force, act on the verdict (answer locally, resolve A/AAAA through the proxy's
resolver and drop forbidden addresses, or, in report mode only, forward), write the
answer within the client's UDP size (egress/dns_wire.py: TC bit, the client retries
over TCP), count it and log blocked ones. Every query gets an answer from here;
nothing else in the process talks to a resolver on the sandbox's behalf
(egress/addons/dns_layer.py).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from mitmproxy import dns

from egress import dns_policy as dp
from egress import dns_wire
from egress.addons.dns_layer import DROP_KEY, RAW, UNPARSED, WIRE_KEY
from egress.addresses import IPAddress
from egress.audit import DecisionLog
from egress.dns_forward import forward, system_nameserver
from egress.resolver import ResolveError, resolve_family
from egress.spec import Spec

logger = logging.getLogger(__name__)
_EAI_NODATA = getattr(socket, "EAI_NODATA", -5)
_EAI_NONAME = socket.EAI_NONAME


def read_query(msg: dns.DNSMessage) -> dp.Query:
    opts = [rr for rr in msg.additionals if rr.type == dp.OPT]
    labels = dns_wire.question_labels(getattr(msg, RAW, b"")) if len(msg.questions) == 1 else None
    return dp.Query(
        plain_labels=labels is None or not any(b"." in label for label in labels),
        is_query=msg.query,
        opcode=msg.op_code,
        questions=tuple((q.name, q.type, q.class_) for q in msg.questions),
        parsed=not getattr(msg, UNPARSED, False),
        opt_records=len(opts),
        edns_version=(opts[0].ttl >> 16) & 0xFF if opts else 0,
    )


class DnsFilter:
    def __init__(
        self,
        current_spec: Callable[[], Spec],
        is_self: Callable[[IPAddress], bool],
        log: DecisionLog,
        nameserver: Callable[[], str] = system_nameserver,
    ):
        self._current_spec = current_spec
        self._is_self = is_self
        self.log = log
        self._nameserver = nameserver

    async def dns_request(self, flow: dns.DNSFlow) -> None:
        spec = self._current_spec()
        request = flow.request
        query = read_query(request)
        verdict = dp.decide(spec, query)
        if verdict.action is dp.Action.DROP:
            flow.metadata[DROP_KEY] = True
            self._record(flow, query, verdict)
            return
        raw: bytes = getattr(request, RAW, b"")
        opt = next((rr for rr in request.additionals if rr.type == dp.OPT), None)
        if flow.client_conn.transport_protocol == "tcp":
            limit = dp.MAX_TCP_PAYLOAD
        else:
            limit = dp.udp_payload_limit(query.opt_records, opt.class_ if opt else 0)
        wire: bytes | None = None
        addresses: list[IPAddress] = []
        match verdict.action:
            case dp.Action.LOOPBACK:
                addresses = [dp.loopback_address(query.qtype)]
            case dp.Action.RESOLVE:
                addresses, verdict = await self._resolve(spec, verdict, query)
            case dp.Action.FORWARD:
                wire = await self._forward(raw, limit)
        if wire is None:
            wire = dns_wire.answer(
                raw,
                rcode=verdict.rcode,
                qtype=query.qtype,
                addresses=addresses,
                ttl=dp.ANSWER_TTL,
                with_question=query.parsed and len(query.questions) == 1,
                opt_size=dp.OUR_UDP_PAYLOAD if query.opt_records == 1 else None,
                limit=limit,
            )
        flow.metadata[WIRE_KEY] = wire
        self._record(flow, query, verdict)

    async def _resolve(self, spec: Spec, verdict: dp.Verdict, query: dp.Query) -> tuple[list[IPAddress], dp.Verdict]:
        try:
            found = await resolve_family(verdict.decision.host, dp.address_family(query.qtype))
        except ResolveError as exc:
            # getaddrinfo asked for one family cannot tell "no such name" from "no
            # address of this family" (glibc says EAI_NONAME for both): an empty answer
            # is right for both, where NXDOMAIN for the AAAA of an IPv4-only name would
            # make caches forget its A records. Resolver failures stay SERVFAIL.
            rcode = dp.NOERROR if exc.code in (_EAI_NONAME, _EAI_NODATA) else dp.SERVFAIL
            return [], dp.resolve_failed(spec, verdict, rcode)
        return dp.filter_addresses(spec, verdict, found, self._is_self)

    async def _forward(self, raw: bytes, limit: int) -> bytes:
        """Report mode: the query as the sandbox sent it, to the proxy's resolver; SERVFAIL on failure."""
        try:
            return dns_wire.relayed(await forward(raw, self._nameserver()), raw, limit)
        except Exception as exc:  # ForwardError, a short answer
            logger.warning("report mode: forwarding a DNS query failed (%s)", type(exc).__name__)
            return dns_wire.answer(raw, rcode=dp.SERVFAIL, limit=limit)

    def _record(self, flow: dns.DNSFlow, query: dp.Query, verdict: dp.Verdict) -> None:
        qtype = dp.qtype_label(query.qtype)
        name = query.questions[0][0] if len(query.questions) == 1 else ""
        self.log.record_dns(verdict, client=_client_label(flow), name=name, qtype=qtype)


def _client_label(flow: dns.DNSFlow) -> str:
    peer = flow.client_conn.peername
    return f"{peer[0]}:{peer[1]}" if peer else ""

