"""DnsFilter: the `dns_request` hook of the proxy's DNS listener (`--dns-listen`).

One hook, one sequence: read the query, ask `egress.dns_policy.decide` under the spec
in force, act on the verdict (answer locally, resolve A/AAAA through the proxy's
resolver and drop forbidden addresses, or, in report mode only, forward), fit the
answer into the client's UDP size (TC bit, the client retries over TCP), count it
and log blocked ones. Every query gets an answer from here; nothing else in the
process talks to a resolver on the sandbox's behalf (egress/addons/dns_layer.py).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence

from mitmproxy import dns

from egress import dns_policy as dp
from egress.addons.dns_layer import DROP_KEY, UNPARSED
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
    return dp.Query(
        is_query=msg.query,
        opcode=msg.op_code,
        questions=tuple((q.name, q.type, q.class_) for q in msg.questions),
        parsed=not getattr(msg, UNPARSED, False),
        opt_records=len(opts),
        edns_version=(opts[0].ttl >> 16) & 0xFF if opts else 0,
    )


def _opt_record(extended_rcode: int = 0) -> dns.ResourceRecord:
    # Root name, our UDP size in the class field, extended RCODE in the TTL's top byte.
    return dns.ResourceRecord("", dp.OPT, dp.OUR_UDP_PAYLOAD, (extended_rcode >> 4) << 24, b"")


def build_answer(
    request: dns.DNSMessage, query: dp.Query, rcode: int, addresses: Sequence[IPAddress] = ()
) -> dns.DNSMessage:
    qname, qtype = (query.questions[0][0], query.qtype) if len(query.questions) == 1 else ("", 0)
    answers = [
        dns.ResourceRecord(qname, qtype, dp.CLASS_IN, dp.ANSWER_TTL, ip.packed)
        for ip in addresses
        if ip.version == dp.address_family(qtype)
    ]
    return dns.DNSMessage(
        id=request.id,
        query=False,
        op_code=request.op_code,
        authoritative_answer=False,
        truncation=False,
        recursion_desired=request.recursion_desired,
        recursion_available=True,
        reserved=0,
        response_code=rcode & 0xF,
        # A question that is not exactly one well-formed question is not echoed.
        questions=list(request.questions) if query.parsed and len(query.questions) == 1 else [],
        answers=answers,
        authorities=[],
        additionals=[_opt_record(rcode)] if query.opt_records == 1 else [],
    )


def fit(response: dns.DNSMessage, limit: int) -> dns.DNSMessage:
    """`response`, or its truncated form (TC set, no records) when larger than `limit` bytes."""
    try:
        size = len(response.packed)
    except ValueError:  # the question's name does not survive re-encoding
        response.questions = []
        size = len(response.packed)
    if size <= limit:
        return response
    response.truncation = True
    response.answers, response.authorities = [], []
    return response


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
        response: dns.DNSMessage | None = None
        addresses: list[IPAddress] = []
        match verdict.action:
            case dp.Action.DROP:
                flow.metadata[DROP_KEY] = True
            case dp.Action.LOOPBACK:
                addresses = [dp.loopback_address(query.qtype)]
            case dp.Action.RESOLVE:
                addresses, verdict = await self._resolve(spec, verdict, query)
            case dp.Action.FORWARD:
                response, verdict = await self._forward(spec, request, verdict)
        if response is None and verdict.action is not dp.Action.DROP:
            response = build_answer(request, query, verdict.rcode, addresses)
        if response is not None:
            tcp = flow.client_conn.transport_protocol == "tcp"
            request_opt = next((rr for rr in request.additionals if rr.type == dp.OPT), None)
            limit = dp.MAX_TCP_PAYLOAD if tcp else dp.udp_payload_limit(query.opt_records, request_opt.class_ if request_opt else 0)
            flow.response = fit(response, limit)
        self._record(flow, query, verdict)

    async def _resolve(self, spec: Spec, verdict: dp.Verdict, query: dp.Query) -> tuple[list[IPAddress], dp.Verdict]:
        try:
            found = await resolve_family(verdict.decision.host, dp.address_family(query.qtype))
        except ResolveError as exc:
            rcode = {_EAI_NONAME: dp.NXDOMAIN, _EAI_NODATA: dp.NOERROR}.get(exc.code, dp.SERVFAIL)
            return [], dp.resolve_failed(spec, verdict, rcode)
        return dp.filter_addresses(spec, verdict, found, self._is_self)

    async def _forward(
        self, spec: Spec, request: dns.DNSMessage, verdict: dp.Verdict
    ) -> tuple[dns.DNSMessage | None, dp.Verdict]:
        try:
            wire = await forward(request.packed, self._nameserver())
            answer = dns.DNSMessage.unpack(wire)
        except Exception as exc:  # ForwardError, or an answer mitmproxy cannot parse
            logger.warning("report mode: forwarding a DNS query failed (%s)", type(exc).__name__)
            return request.fail(dp.SERVFAIL), verdict
        answer.id = request.id
        return answer, verdict

    def _record(self, flow: dns.DNSFlow, query: dp.Query, verdict: dp.Verdict) -> None:
        qtype = dp.qtype_label(query.qtype)
        name = query.questions[0][0] if len(query.questions) == 1 else ""
        self.log.record_dns(verdict, client=_client_label(flow), name=name, qtype=qtype)


def _client_label(flow: dns.DNSFlow) -> str:
    peer = flow.client_conn.peername
    return f"{peer[0]}:{peer[1]}" if peer else ""

