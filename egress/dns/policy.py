"""DNS decisions as pure functions: one query in, one verdict out.

A DNS query names a destination like a CONNECT authority does, so its name goes
through the same `policy.check_name` (normalisation, loopback names, allowlist)
and resolved addresses through the same classification (`policy.address_reason`).
What is DNS-specific lives here:

- only well-formed standard queries (opcode QUERY, one question, class IN) are
  answered from the policy; anything else gets FORMERR or REFUSED, never a forward;
- a name the allowlist does not match: NXDOMAIN for every type (report mode:
  forwarded upstream and counted `reported`);
- an allowlisted name: A/AAAA are resolved by the proxy and forbidden addresses
  dropped; HTTPS/SVCB get an empty answer (no ECH configurations that would hide
  the SNI the proxy decides on); every other type gets an empty answer too;
- PTR: NXDOMAIN, never forwarded, whatever the mode (a reverse name is text the
  sandbox chooses, `<data>.in-addr.arpa` would carry data out like any name);
- `localhost` and names under it: answered locally with loopback (RFC 6761).

No I/O here: the addon (egress/addons/dns_filter.py) turns a verdict into a message.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from mitmproxy import dns

from egress.policy import decisions as policy
from egress.policy.addresses import IPAddress
from egress.policy.domains import HostError, is_loopback_name, normalize_host
from egress.policy.reasons import (  # noqa: F401  (callers read them from here too)
    BAD_EDNS,
    DNS_REASONS,
    HTTPS_RECORD,
    MALFORMED,
    QTYPE_NOT_SERVED,
    REVERSE_LOOKUP,
    UNSUPPORTED,
)
from egress.policy.spec import Spec

# Query types (RFC 1035, 3596, 9460) and classes.
A, NS, CNAME, SOA, PTR, MX, TXT, AAAA, SRV, OPT = 1, 2, 5, 6, 12, 15, 16, 28, 33, 41
SVCB, HTTPS, IXFR, AXFR, ANY = 64, 65, 251, 252, 255
CLASS_IN = 1
OPCODE_QUERY = 0
# Response codes.
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, REFUSED = 0, 1, 2, 3, 5
BADVERS = 16  # extended RCODE (RFC 6891): upper 8 bits travel in the OPT record

# `qtype` label values: a fixed set, so a sandbox cannot create new series.
QTYPE_LABELS = {
    A: "A", AAAA: "AAAA", HTTPS: "HTTPS", SVCB: "SVCB", PTR: "PTR", TXT: "TXT",
    MX: "MX", CNAME: "CNAME", ANY: "ANY", SRV: "SRV", NS: "NS", SOA: "SOA",
}  # fmt: skip
OTHER_QTYPE = "other"


MIN_UDP_PAYLOAD = 512  # RFC 1035: without EDNS, and the floor with it (RFC 6891 6.2.5)
OUR_UDP_PAYLOAD = 1232  # what we advertise (DNS flag day 2020)
MAX_TCP_PAYLOAD = 65535
ANSWER_TTL = 30  # short: a reload that removes a name should not linger in caches
LOG_NAME_CHARS = 253


def qtype_label(qtype: int) -> str:
    return QTYPE_LABELS.get(qtype, OTHER_QTYPE)


class Action(Enum):
    DROP = "drop"  # no answer at all (a response sent to us: answering could loop)
    ERROR = "error"  # rcode only (FORMERR, REFUSED, BADVERS, NXDOMAIN, SERVFAIL)
    NODATA = "nodata"  # NOERROR, empty answer
    LOOPBACK = "loopback"  # localhost: 127.0.0.1 / ::1
    RESOLVE = "resolve"  # A/AAAA through the proxy's resolver, then `filter_addresses`
    FORWARD = "forward"  # report mode: the query goes upstream as it is


@dataclass(frozen=True)
class Query:
    """What the verdict depends on, read from a parsed message (or its header only)."""

    is_query: bool = True
    opcode: int = OPCODE_QUERY
    questions: tuple[tuple[str, int, int], ...] = ()  # (name, qtype, qclass)
    parsed: bool = True  # False: only the header could be read
    opt_records: int = 0
    edns_version: int = 0
    dnssec_ok: bool = False  # the OPT record's DO bit, copied into the answer's
    # False when a label of the name as sent holds a dot (`a\.b`): the parsed name
    # would then read as other labels than the ones on the wire.
    plain_labels: bool = True

    @property
    def qtype(self) -> int:
        return self.questions[0][1] if len(self.questions) == 1 else 0


@dataclass(frozen=True)
class Verdict:
    action: Action
    rcode: int = NOERROR
    decision: policy.Decision = policy.Decision(host="")
    label: str = ""  # the `decision` label; empty: taken from `decision`

    @property
    def metric_decision(self) -> str:
        return self.label or self.decision.label

    @property
    def reason(self) -> str:
        return self.decision.reason

    @property
    def rule(self) -> str:
        return self.decision.rule

    @property
    def blocked(self) -> bool:
        return self.metric_decision == "blocked"


def _blocked(action: Action, rcode: int, reason: str, host: str = "", decision: policy.Decision | None = None) -> Verdict:
    base = decision or policy.Decision(host=host)
    return Verdict(action, rcode, policy.Decision(host=base.host, reason=reason, entry=base.entry), "blocked")


def decide(spec: Spec, query: Query) -> Verdict:
    """The verdict for one query under the spec in force."""
    if not query.is_query:
        return _blocked(Action.DROP, NOERROR, MALFORMED)
    if not query.parsed or len(query.questions) != 1 or query.opt_records > 1:
        return _blocked(Action.ERROR, FORMERR, MALFORMED)
    name, qtype, qclass = query.questions[0]
    raw_host = name[:LOG_NAME_CHARS]
    if query.opcode != OPCODE_QUERY or qclass != CLASS_IN or qtype in (IXFR, AXFR):
        return _blocked(Action.ERROR, REFUSED, UNSUPPORTED, raw_host)
    if qtype == OPT:
        return _blocked(Action.ERROR, FORMERR, MALFORMED, raw_host)
    if query.opt_records and query.edns_version != 0:
        return _blocked(Action.ERROR, BADVERS, BAD_EDNS, raw_host)
    if not query.plain_labels:  # not a host name: answered here like any other
        return _blocked(Action.ERROR, NXDOMAIN, policy.NOT_ALLOWLISTED, raw_host)
    try:
        host = normalize_host(name)
    except HostError:
        host = None
    if host is not None and is_loopback_name(host):
        # RFC 6761 6.3: answered here, never sent to any resolver.
        action = Action.LOOPBACK if qtype in (A, AAAA) else Action.NODATA
        return Verdict(action, NOERROR, policy.Decision(host=host), "local")
    if qtype == PTR:
        return _blocked(Action.ERROR, NXDOMAIN, REVERSE_LOOKUP, host or raw_host)
    # The name is normalised once (above): the same decision as `check_name(spec, name)`.
    decision = policy.check_name(spec, name) if host is None else policy.check_normalized_name(spec, host)
    if decision.reported:
        return Verdict(Action.FORWARD, NOERROR, decision)
    if not decision.allowed:
        return Verdict(Action.ERROR, NXDOMAIN, decision)
    if qtype in (HTTPS, SVCB):
        return _blocked(Action.NODATA, NOERROR, HTTPS_RECORD, decision=decision)
    if qtype in (A, AAAA):
        return Verdict(Action.RESOLVE, NOERROR, decision)
    return _blocked(Action.NODATA, NOERROR, QTYPE_NOT_SERVED, decision=decision)


def filter_addresses(
    spec: Spec,
    verdict: Verdict,
    addresses: Iterable[IPAddress],
    is_self: Callable[[IPAddress], bool],
) -> tuple[list[IPAddress], Verdict]:
    """The addresses the sandbox may be told about, and the verdict to count.

    The same classification as a connection's (`policy.address_reason`): loopback,
    metadata/link-local, private outside `allowCidrs`, the proxy's own addresses are
    dropped. None left: an empty answer with the worst reason (report mode keeps the
    merely forbidden ones, as a connection would be let through to them).
    """
    addresses = list(addresses)
    reasons = [policy.address_reason(spec, ip, is_self) for ip in addresses]
    kept = [ip for ip, reason in zip(addresses, reasons, strict=True) if reason is None]
    if kept or not addresses:
        return kept, verdict
    worst = next(r for r in (policy.LOOPBACK, policy.PROXY_SELF, policy.FORBIDDEN_ADDRESS) if r in reasons)
    decision = policy.with_reason(spec, verdict.decision, worst)
    if decision.reported:
        reported = [ip for ip, reason in zip(addresses, reasons, strict=True) if reason == policy.FORBIDDEN_ADDRESS]
        return reported, Verdict(Action.RESOLVE, NOERROR, decision)
    return [], Verdict(Action.NODATA, NOERROR, decision)


def relayable(spec: Spec, upstream: bytes, is_self: Callable[[IPAddress], bool]) -> bytes:
    """A report-mode answer from the proxy's resolver, less its A/AAAA records that name
    loopback or the proxy's own addresses: report mode still blocks those (README), and an
    allowlisted name's answer drops them too (`filter_addresses`). The relay passed
    `127.0.0.1` / `::1` through for a name off the allowlist."""
    message = dns.DNSMessage.unpack(upstream)
    never = (policy.LOOPBACK, policy.PROXY_SELF)

    def keep(record: dns.ResourceRecord) -> bool:
        if record.type not in (A, AAAA) or len(record.data) not in (4, 16):
            return True
        return policy.address_reason(spec, ipaddress.ip_address(record.data), is_self) not in never

    answers = [r for r in message.answers if keep(r)]
    additionals = [r for r in message.additionals if keep(r)]
    if len(answers) == len(message.answers) and len(additionals) == len(message.additionals):
        return upstream
    message.answers, message.additionals = answers, additionals
    return message.packed


def resolve_failed(spec: Spec, verdict: Verdict, rcode: int) -> Verdict:
    """The proxy's resolver found nothing: NXDOMAIN/NODATA/SERVFAIL as it said, counted."""
    decision = policy.Decision(host=verdict.decision.host, reason=policy.RESOLVE_FAILED, entry=verdict.decision.entry)
    return Verdict(Action.NODATA if rcode == NOERROR else Action.ERROR, rcode, decision, "blocked")


def udp_payload_limit(opt_records: int, advertised: int) -> int:
    """Largest UDP answer the client accepts: 512 without EDNS, its EDNS size otherwise."""
    if not opt_records:
        return MIN_UDP_PAYLOAD
    return max(MIN_UDP_PAYLOAD, min(advertised, MAX_TCP_PAYLOAD))


def address_family(qtype: int) -> int:
    return 4 if qtype == A else 6


def loopback_address(qtype: int) -> IPAddress:
    return ipaddress.ip_address("127.0.0.1" if qtype == A else "::1")
