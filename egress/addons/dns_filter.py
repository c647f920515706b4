"""DnsFilter: the policy of the proxy's DNS listener (`--dns-listen`).

One sequence, in two halves: `answer_now` (called by the DNS layer for each query,
synchronously) and the `dns_request` hook (only for queries that need I/O). Read the
query, ask `egress.dns.policy.decide` under the spec in force, act on the verdict (answer locally, resolve A/AAAA through the proxy's
resolver and drop forbidden addresses, or, in report mode only, forward), write the
answer within the client's UDP size (egress/dns/wire.py: TC bit, the client retries
over TCP), count it and log blocked ones. A query that needs no I/O (every blocked
one, NODATA, PTR, localhost, FORMERR, an allowlisted name whose resolver answer is
cached, egress/dns/cache.py) is answered by the first half alone; one that needs the
resolver or a forward is finished by the hook. Every query gets an answer from here;
nothing else in the process talks to a resolver on the sandbox's behalf
(egress/mitm/patches/dns_listener.py).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from mitmproxy import ctx, dns

from egress.addons.failsafe import fail_closed_call, fault_injected
from egress.addons.refuse import refuse
from egress.dns import fast as dns_fast
from egress.dns import policy as dp
from egress.dns import wire as dns_wire
from egress.dns.answer_memo import AnswerMemo
from egress.dns.cache import AddressCache
from egress.dns.forward import forward, system_nameserver
from egress.mitm.patches import dns_listener
from egress.mitm.patches.dns_listener import DROP_KEY, RAW, UNPARSED, WIRE_KEY
from egress.net.hostport import HostPortError, parse_hostport
from egress.net.listen_modes import dns_modes
from egress.net.resolver import ResolveError, resolve_family
from egress.ops.audit import DecisionLog, client_label
from egress.policy.addresses import IPAddress
from egress.policy.spec import Spec

logger = logging.getLogger(__name__)
_EAI_NODATA = getattr(socket, "EAI_NODATA", -5)
_EAI_NONAME = socket.EAI_NONAME
_PENDING_KEY = "egress.dns.pending"  # flow.metadata: (spec, query, verdict) left for dns_request


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
        dnssec_ok=bool(opts[0].ttl & dns_wire.DO) if opts else False,
    )


class DnsFilter:
    def __init__(
        self,
        current_spec: Callable[[], Spec],
        is_self: Callable[[IPAddress], bool],
        log: DecisionLog,
        nameserver: Callable[[], str] = system_nameserver,
        cache: AddressCache | None = None,
    ):
        self._current_spec = current_spec
        self._is_self = is_self
        self.log = log
        self._nameserver = nameserver
        self.cache = cache if cache is not None else AddressCache()
        self.memo = AnswerMemo(self.cache.clock)

    def load(self, loader) -> None:
        loader.add_option(
            "egress_dns_listen", str | None, None,
            "HOST:PORT: answer DNS (UDP and TCP) there from the same spec; names not allowlisted get NXDOMAIN.",
        )  # fmt: skip

    def configure(self, updated: set[str]) -> None:
        if "egress_dns_listen" not in updated:
            return
        where = ctx.options.egress_dns_listen
        if not where:
            dns_listener.serve_with(None)
            return
        try:
            host, port = parse_hostport(where, "egress_dns_listen")
        except HostPortError as exc:
            return refuse(str(exc))
        # The fast path is left out while a test fault is set for the hook: that must
        # show the full path failing closed, and the fast path falls back to it anyway.
        fast = None if fault_injected("DnsFilter", "dns_request") else self.answer_datagram
        dns_listener.serve_with(fail_closed_call("DnsFilter", "dns_request", self.answer_now), fast)
        missing = [m for m in dns_modes(host, port) if m not in ctx.options.mode]
        if missing:  # loaded as a mitmproxy script: egress-proxy run lists them itself
            ctx.options.update(mode=[*ctx.options.mode, *missing])

    def answer_now(self, flow: dns.DNSFlow) -> bool:
        """Decide and, where no I/O is needed, answer: True when done (answer or drop in `flow.metadata`).

        The DNS layer calls this for every query before any hook (egress/mitm/patches/dns_listener.py):
        blocked names, NODATA, PTR, localhost, FORMERR and cached allowlisted addresses
        are answered here, in the datagram's own event, without a hook task. False: the
        query needs the resolver (or, report mode, a forward); what was decided is left
        in `flow.metadata` for `dns_request`, which finishes it.
        """
        spec = self._current_spec()
        query = read_query(flow.request)
        verdict = dp.decide(spec, query)
        if verdict.action is dp.Action.DROP:
            flow.metadata[DROP_KEY] = True
            self._record(flow, query, verdict)
            return True
        local = self._local_answer(spec, query, verdict)
        if local is None:
            flow.metadata[_PENDING_KEY] = (spec, query, verdict)
            return False
        addresses, ttl, verdict = local
        self._finish(flow, query, verdict, addresses, ttl)
        return True

    def _local_answer(
        self, spec: Spec, query: dp.Query, verdict: dp.Verdict
    ) -> tuple[list[IPAddress], int, dp.Verdict] | None:
        """(addresses, TTL, verdict to count) for a query answered without I/O; None: it needs
        the resolver (a cache miss) or, report mode, a forward. Shared by both paths."""
        match verdict.action:
            case dp.Action.LOOPBACK:
                return [dp.loopback_address(query.qtype)], dp.ANSWER_TTL, verdict
            case dp.Action.RESOLVE:
                hit = self.cache.get(spec, verdict.decision.host, dp.address_family(query.qtype))
                if hit is None:
                    return None
                found, ttl = hit
                addresses, verdict = dp.filter_addresses(spec, verdict, found, self._is_self)
                return addresses, ttl, verdict
            case dp.Action.FORWARD | dp.Action.DROP:
                return None
        return [], dp.ANSWER_TTL, verdict

    def answer_datagram(self, packet: bytes, client: str) -> bytes | None:
        """The answer to a UDP query of the common shape decided without I/O, else None.

        The listener's fast path (egress/dns/udp.py), ahead of mitmproxy's parser and
        connection handler: the same `decide`, address cache, filtering, answer writer,
        counter and audit line as `answer_now`, read from the packet's bytes by
        egress/dns/fast.py. None (another shape, a cache miss, report mode): the packet
        goes the full way and `answer_now` / `dns_request` answer it. A repeat of a
        query answered from the address cache gets the bytes written for it a moment
        ago while every input is unchanged (egress/dns/answer_memo.py).
        """
        spec = self._current_spec()
        memo = self.memo.get(packet, spec, self.cache.generation)
        if memo is not None:  # this very question, answered a moment ago under the same inputs
            self.log.record_dns(memo.verdict, client=client, name=memo.name, qtype=memo.qtype)
            return packet[:2] + memo.tail
        read = dns_fast.read_simple_query(packet)
        if read is None:
            return None
        query, advertised = read
        verdict = dp.decide(spec, query)
        from_cache = verdict.action is dp.Action.RESOLVE
        local = self._local_answer(spec, query, verdict)  # DROP never happens for a query
        if local is None:
            return None
        addresses, ttl, verdict = local
        wire = dns_wire.answer(
            packet,
            rcode=verdict.rcode,
            qtype=query.qtype,
            addresses=addresses,
            ttl=ttl,
            opt_size=dp.OUR_UDP_PAYLOAD if query.opt_records == 1 else None,
            dnssec_ok=query.dnssec_ok,
            limit=dp.udp_payload_limit(query.opt_records, advertised),
        )
        name = query.questions[0][0]
        qtype = dp.qtype_label(query.qtype)
        self.log.record_dns(verdict, client=client, name=name, qtype=qtype)
        if from_cache:  # an allowlisted name's cached addresses, filtered: keep it for repeats
            self._memorise(packet, wire, spec, verdict, name, qtype, ttl, query.qtype)
        return wire

    def _memorise(
        self, packet: bytes, wire: bytes, spec: Spec, verdict: dp.Verdict, name: str, qtype: str, ttl: int, qtype_code: int
    ) -> None:
        """Keep the answer for repeats of this very query (egress/dns/answer_memo.py)."""
        generation = self.cache.generation  # what the answer was built from (after its lookup)
        entry = self.cache.entry(spec, verdict.decision.host, dp.address_family(qtype_code))
        if entry is None or self.cache.generation != generation:
            return
        self.memo.put(
            packet, wire, spec=spec, generation=generation, verdict=verdict, name=name, qtype=qtype,
            expires=entry.expires, ttl=ttl,
        )  # fmt: skip

    async def dns_request(self, flow: dns.DNSFlow) -> None:
        pending = flow.metadata.pop(_PENDING_KEY, None)
        if pending is None:  # not seen by `answer_now` (the layer always calls it first)
            if self.answer_now(flow):
                return
            pending = flow.metadata.pop(_PENDING_KEY)
        spec, query, verdict = pending
        if verdict.action is dp.Action.FORWARD:
            raw: bytes = getattr(flow.request, RAW, b"")
            wire = await self._forward(spec, raw, self._limit(flow, query))
            flow.metadata[WIRE_KEY] = wire
            self._record(flow, query, verdict)
            return
        addresses, verdict = await self._resolve(spec, verdict, query)
        self._finish(flow, query, verdict, addresses, dp.ANSWER_TTL)

    def _limit(self, flow: dns.DNSFlow, query: dp.Query) -> int:
        if flow.client_conn.transport_protocol == "tcp":
            return dp.MAX_TCP_PAYLOAD
        opt = next((rr for rr in flow.request.additionals if rr.type == dp.OPT), None)
        return dp.udp_payload_limit(query.opt_records, opt.class_ if opt else 0)

    def _finish(
        self, flow: dns.DNSFlow, query: dp.Query, verdict: dp.Verdict, addresses: list[IPAddress], ttl: int
    ) -> None:
        flow.metadata[WIRE_KEY] = dns_wire.answer(
            getattr(flow.request, RAW, b""),
            rcode=verdict.rcode,
            qtype=query.qtype,
            addresses=addresses,
            ttl=ttl,
            with_question=query.parsed and len(query.questions) == 1,
            opt_size=dp.OUR_UDP_PAYLOAD if query.opt_records == 1 else None,
            dnssec_ok=query.dnssec_ok,
            limit=self._limit(flow, query),
        )
        self._record(flow, query, verdict)

    async def _resolve(self, spec: Spec, verdict: dp.Verdict, query: dp.Query) -> tuple[list[IPAddress], dp.Verdict]:
        family = dp.address_family(query.qtype)
        try:
            found = await resolve_family(verdict.decision.host, family)
        except ResolveError as exc:
            # getaddrinfo asked for one family cannot tell "no such name" from "no
            # address of this family" (glibc says EAI_NONAME for both): an empty answer
            # is right for both, where NXDOMAIN for the AAAA of an IPv4-only name would
            # make caches forget its A records. Resolver failures stay SERVFAIL.
            rcode = dp.NOERROR if exc.code in (_EAI_NONAME, _EAI_NODATA) else dp.SERVFAIL
            return [], dp.resolve_failed(spec, verdict, rcode)
        # The resolver's answer, before policy: each hit is filtered again (egress/dns/cache.py).
        self.cache.put(spec, verdict.decision.host, family, found)
        return dp.filter_addresses(spec, verdict, found, self._is_self)

    async def _forward(self, spec: Spec, raw: bytes, limit: int) -> bytes:
        """Report mode: the query as the sandbox sent it, to the proxy's resolver (its answer
        less loopback and the proxy's own addresses); SERVFAIL on failure."""
        try:
            upstream = dp.relayable(spec, await forward(raw, self._nameserver()), self._is_self)
            return dns_wire.relayed(upstream, raw, limit)
        except Exception as exc:  # ForwardError, a short answer
            logger.warning("report mode: forwarding a DNS query failed (%s)", type(exc).__name__)
            return dns_wire.answer(raw, rcode=dp.SERVFAIL, limit=limit)

    def _record(self, flow: dns.DNSFlow, query: dp.Query, verdict: dp.Verdict) -> None:
        qtype = dp.qtype_label(query.qtype)
        name = query.questions[0][0] if len(query.questions) == 1 else ""
        self.log.record_dns(verdict, client=client_label(flow.client_conn.peername), name=name, qtype=qtype)

