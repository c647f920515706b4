"""DNS decisions (issue 11) as pure functions: query in, verdict out; answer filtering."""

from __future__ import annotations

import ipaddress
import json

import pytest

from egress.dns import policy as dp
from egress.dns.policy import Action, Query
from egress.policy import decisions as policy
from egress.policy.spec import parse_spec

ip = ipaddress.ip_address


def make_spec(mode="enforce", allow_cidrs=(), allowlist=None):
    allowlist = allowlist or [{"domain": "allowed.test"}, {"domain": "*.wild.test"}, {"domain": "198.51.100.7"}]
    network = {"mode": mode, "allowCidrs": list(allow_cidrs), "allowlist": allowlist}
    return parse_spec(json.dumps({"network": network}), source="s.json")


ENFORCE = make_spec()
REPORT = make_spec(mode="report")
ANYTHING = make_spec(allowlist=[{"domain": "*"}])


def q(name, qtype=dp.A, qclass=dp.CLASS_IN, **kw):
    return Query(questions=((name, qtype, qclass),), **kw)


# (query, action, rcode, decision label, reason, rule)
CASES = [
    # allowlisted names
    (q("allowed.test"), Action.RESOLVE, dp.NOERROR, "allowed", "", "allowed.test"),
    (q("ALLOWED.test."), Action.RESOLVE, dp.NOERROR, "allowed", "", "allowed.test"),
    (q("allowed.test", dp.AAAA), Action.RESOLVE, dp.NOERROR, "allowed", "", "allowed.test"),
    (q("a.b.wild.test"), Action.RESOLVE, dp.NOERROR, "allowed", "", "*.wild.test"),
    (q("allowed.test", dp.HTTPS), Action.NODATA, dp.NOERROR, "blocked", dp.HTTPS_RECORD, "allowed.test"),
    (q("x.wild.test", dp.SVCB), Action.NODATA, dp.NOERROR, "blocked", dp.HTTPS_RECORD, "*.wild.test"),
    (q("allowed.test", dp.TXT), Action.NODATA, dp.NOERROR, "blocked", dp.QTYPE_NOT_SERVED, "allowed.test"),
    (q("allowed.test", dp.MX), Action.NODATA, dp.NOERROR, "blocked", dp.QTYPE_NOT_SERVED, "allowed.test"),
    (q("allowed.test", dp.ANY), Action.NODATA, dp.NOERROR, "blocked", dp.QTYPE_NOT_SERVED, "allowed.test"),
    (q("allowed.test", dp.CNAME), Action.NODATA, dp.NOERROR, "blocked", dp.QTYPE_NOT_SERVED, "allowed.test"),
    # not allowlisted: NXDOMAIN for every type
    *[
        (q("secret.attacker.example", t), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, "")
        for t in (dp.A, dp.AAAA, dp.TXT, dp.MX, dp.ANY, dp.HTTPS, dp.SVCB, dp.CNAME, dp.NS, dp.SRV, 99, 65280)
    ],
    (q("wild.test"), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),  # apex not covered
    (q("allowed.test.attacker.example"), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),
    # names that are not host names
    (q("a\x00b.allowed.test"), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),
    (q("a b.wild.test"), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),
    (q("x" * 300 + ".wild.test"), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),
    (q(""), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),
    (q("127.0.0.1"), Action.ERROR, dp.NXDOMAIN, "blocked", policy.LOOPBACK, ""),
    # a label that holds a dot on the wire (`x\\.y.wild.test`) reads like other labels once parsed
    (q("x.y.wild.test", plain_labels=False), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),
    (q("allowed.test", plain_labels=False), Action.ERROR, dp.NXDOMAIN, "blocked", policy.NOT_ALLOWLISTED, ""),
    # PTR: never forwarded, whatever the name
    (q("4.3.2.1.in-addr.arpa", dp.PTR), Action.ERROR, dp.NXDOMAIN, "blocked", dp.REVERSE_LOOKUP, ""),
    (q("secret.data.in-addr.arpa", dp.PTR), Action.ERROR, dp.NXDOMAIN, "blocked", dp.REVERSE_LOOKUP, ""),
    (q("allowed.test", dp.PTR), Action.ERROR, dp.NXDOMAIN, "blocked", dp.REVERSE_LOOKUP, ""),
    # localhost (RFC 6761): answered here
    (q("localhost"), Action.LOOPBACK, dp.NOERROR, "local", "", ""),
    (q("LocalHost.", dp.AAAA), Action.LOOPBACK, dp.NOERROR, "local", "", ""),
    (q("db.localhost"), Action.LOOPBACK, dp.NOERROR, "local", "", ""),
    (q("localhost", dp.TXT), Action.NODATA, dp.NOERROR, "local", "", ""),
    (q("1.0.0.127.in-addr.arpa", dp.PTR), Action.ERROR, dp.NXDOMAIN, "blocked", dp.REVERSE_LOOKUP, ""),
    # not a standard query
    (Query(questions=()), Action.ERROR, dp.FORMERR, "blocked", dp.MALFORMED, ""),
    (Query(questions=(("allowed.test", 1, 1), ("x.test", 1, 1))), Action.ERROR, dp.FORMERR, "blocked", dp.MALFORMED, ""),
    (Query(parsed=False), Action.ERROR, dp.FORMERR, "blocked", dp.MALFORMED, ""),
    (Query(is_query=False, questions=(("allowed.test", 1, 1),)), Action.DROP, dp.NOERROR, "blocked", dp.MALFORMED, ""),
    (q("allowed.test", opcode=2), Action.ERROR, dp.REFUSED, "blocked", dp.UNSUPPORTED, ""),
    (q("allowed.test", opcode=5), Action.ERROR, dp.REFUSED, "blocked", dp.UNSUPPORTED, ""),  # UPDATE
    (q("version.bind", dp.TXT, 3), Action.ERROR, dp.REFUSED, "blocked", dp.UNSUPPORTED, ""),  # CHAOS
    (q("allowed.test", dp.A, 255), Action.ERROR, dp.REFUSED, "blocked", dp.UNSUPPORTED, ""),  # class ANY
    (q("allowed.test", dp.AXFR), Action.ERROR, dp.REFUSED, "blocked", dp.UNSUPPORTED, ""),
    (q("allowed.test", dp.IXFR), Action.ERROR, dp.REFUSED, "blocked", dp.UNSUPPORTED, ""),
    (q("allowed.test", dp.OPT), Action.ERROR, dp.FORMERR, "blocked", dp.MALFORMED, ""),
    (q("allowed.test", opt_records=2), Action.ERROR, dp.FORMERR, "blocked", dp.MALFORMED, ""),
    (q("allowed.test", opt_records=1, edns_version=1), Action.ERROR, dp.BADVERS, "blocked", dp.BAD_EDNS, ""),
    (q("allowed.test", opt_records=1), Action.RESOLVE, dp.NOERROR, "allowed", "", "allowed.test"),
]


@pytest.mark.parametrize(("query", "action", "rcode", "label", "reason", "rule"), CASES)
def test_decide(query, action, rcode, label, reason, rule):
    verdict = dp.decide(ENFORCE, query)
    assert (verdict.action, verdict.rcode, verdict.metric_decision, verdict.reason, verdict.rule) == (
        action, rcode, label, reason, rule,
    )  # fmt: skip


@pytest.mark.parametrize("qtype", [dp.A, dp.TXT, dp.ANY, dp.HTTPS])
def test_report_mode_forwards_what_would_be_blocked(qtype):
    verdict = dp.decide(REPORT, q("secret.attacker.example", qtype))
    assert (verdict.action, verdict.metric_decision, verdict.reason) == (Action.FORWARD, "reported", "not_allowlisted")


@pytest.mark.parametrize(
    "query",
    [q("1.0.0.10.in-addr.arpa", dp.PTR), q("localhost"), q("127.0.0.1"), Query(questions=()), q("x.test", opcode=4)],
)
def test_report_mode_never_forwards_ptr_localhost_loopback_or_nonstandard(query):
    assert dp.decide(REPORT, query).action is not Action.FORWARD


def test_allow_everything_still_answers_https_and_ptr_locally():
    assert dp.decide(ANYTHING, q("anything.example", dp.HTTPS)).action is Action.NODATA
    assert dp.decide(ANYTHING, q("4.3.2.1.in-addr.arpa", dp.PTR)).action is Action.ERROR
    assert dp.decide(ANYTHING, q("anything.example")).action is Action.RESOLVE


def test_hot_reloaded_spec_is_what_decides():
    before = dp.decide(ENFORCE, q("new.example"))
    after = dp.decide(make_spec(allowlist=[{"domain": "new.example"}]), q("new.example"))
    assert (before.rcode, after.action) == (dp.NXDOMAIN, Action.RESOLVE)


# --- filter_addresses ------------------------------------------------------------


def resolved(spec, name="allowed.test"):
    return dp.decide(spec, q(name))


@pytest.mark.parametrize(
    ("addresses", "kept", "label", "reason"),
    [
        (["198.18.0.10"], ["198.18.0.10"], "allowed", ""),
        (["127.0.0.1", "198.18.0.10"], ["198.18.0.10"], "allowed", ""),
        (["127.0.0.1"], [], "blocked", policy.LOOPBACK),
        (["169.254.169.254"], [], "blocked", policy.FORBIDDEN_ADDRESS),
        (["10.0.0.5", "192.168.1.1"], [], "blocked", policy.FORBIDDEN_ADDRESS),
        (["10.0.0.5", "127.0.0.1"], [], "blocked", policy.LOOPBACK),
        (["::ffff:127.0.0.1"], [], "blocked", policy.LOOPBACK),
        (["fe80::1"], [], "blocked", policy.FORBIDDEN_ADDRESS),
        (["2001:2::10", "::1"], ["2001:2::10"], "allowed", ""),
        (["203.0.113.9"], [], "blocked", policy.PROXY_SELF),  # the proxy's own address (below)
        ([], [], "allowed", ""),
    ],
)
def test_filter_addresses(addresses, kept, label, reason):
    spec = make_spec(allow_cidrs=["198.18.0.0/15", "2001:2::/48", "203.0.113.0/24"])
    answer, verdict = dp.filter_addresses(spec, resolved(spec), map(ip, addresses), lambda a: a == ip("203.0.113.9"))
    assert ([str(a) for a in answer], verdict.metric_decision, verdict.reason) == (kept, label, reason)
    if not kept and addresses:
        assert verdict.action is Action.NODATA and verdict.rule == "allowed.test"


def test_allow_cidrs_admit_private_addresses():
    assert dp.filter_addresses(ENFORCE, resolved(ENFORCE), [ip("10.1.2.3")], lambda a: False)[0] == []
    spec = make_spec(allow_cidrs=["10.0.0.0/8"])
    assert dp.filter_addresses(spec, resolved(spec), [ip("10.1.2.3")], lambda a: False)[0] == [ip("10.1.2.3")]


def test_report_mode_keeps_forbidden_but_never_loopback():
    answer, verdict = dp.filter_addresses(REPORT, resolved(REPORT), [ip("10.0.0.1")], lambda a: False)
    assert (answer, verdict.metric_decision) == ([ip("10.0.0.1")], "reported")
    answer, verdict = dp.filter_addresses(REPORT, resolved(REPORT), [ip("127.0.0.1")], lambda a: False)
    assert (answer, verdict.metric_decision, verdict.reason) == ([], "blocked", policy.LOOPBACK)


# --- sizes and labels ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("opt", "advertised", "limit"),
    [(0, 0, 512), (0, 4096, 512), (1, 4096, 4096), (1, 1232, 1232), (1, 100, 512), (1, 0, 512), (1, 70000, 65535)],
)
def test_udp_payload_limit(opt, advertised, limit):
    assert dp.udp_payload_limit(opt, advertised) == limit


def test_qtype_labels_are_a_fixed_set():
    assert [dp.qtype_label(t) for t in (1, 28, 65, 64, 12, 16, 15, 5, 255)] == [
        "A", "AAAA", "HTTPS", "SVCB", "PTR", "TXT", "MX", "CNAME", "ANY",
    ]  # fmt: skip
    assert {dp.qtype_label(t) for t in range(65536)} == set(dp.QTYPE_LABELS.values()) | {"other"}


# --- relayable (report mode: the resolver's answer to a name off the allowlist) ------------------


def _upstream_answer(*addresses: str, additional: tuple[str, ...] = ()) -> bytes:
    from mitmproxy import dns

    def record(address: str) -> dns.ResourceRecord:
        a = ipaddress.ip_address(address)
        return dns.ResourceRecord.A("x.test", a) if a.version == 4 else dns.ResourceRecord.AAAA("x.test", a)

    return dns.DNSMessage(
        id=7, query=False, op_code=0, authoritative_answer=False, truncation=False, recursion_desired=True,
        recursion_available=True, reserved=0, response_code=0, questions=[dns.Question("x.test", dp.A, dp.CLASS_IN)],
        answers=[record(a) for a in addresses], authorities=[], additionals=[record(a) for a in additional],
    ).packed  # fmt: skip


def _addresses(wire: bytes) -> list[str]:
    from mitmproxy import dns

    message = dns.DNSMessage.unpack(wire)
    return [str(ipaddress.ip_address(r.data)) for r in (*message.answers, *message.additionals)]


@pytest.mark.parametrize(
    "addresses, kept",
    [(["127.0.0.1"], []), (["::1"], []), (["127.0.0.1", "169.254.169.254", "198.51.100.7"], ["169.254.169.254", "198.51.100.7"]),
     (["::ffff:127.0.0.1", "203.0.113.9"], []), (["0.0.0.0"], []), (["8.8.8.8"], ["8.8.8.8"])],
)  # fmt: skip
def test_a_relayed_answer_never_names_loopback_or_the_proxy(addresses, kept):  # was a defect
    """Report mode keeps what connections may reach in report mode (metadata included), never loopback or self."""
    wire = _upstream_answer(*addresses, additional=("127.0.0.2",))
    relayed = dp.relayable(REPORT, wire, lambda a: a == ipaddress.ip_address("203.0.113.9"))
    assert _addresses(relayed) == kept


def test_a_relayed_answer_without_such_addresses_is_relayed_byte_for_byte():
    wire = _upstream_answer("198.51.100.7", "2001:db8::1")
    assert dp.relayable(REPORT, wire, lambda a: False) is wire
