"""The memo of whole answers on the DNS listener's fast path (egress/dns/answer_memo.py).

A repeated allowlisted query is answered from bytes written a moment ago; these tests
hold that it is never a different answer from the one the full decision would write
now: not after a reload, not after the address cache changed, not once the TTL has
counted down, not for another ID, case or EDNS size; and that every query served
from it is still counted and, when blocked, logged. The clock is the only stand-in."""

from __future__ import annotations

import io
import ipaddress
import json
import struct

from dns_testing import Clock, answer_records, make_spec
from dns_testing import query_bytes as query

from egress.addons.dns_filter import DnsFilter
from egress.dns import policy as dp
from egress.dns.answer_memo import MAX_AGE, AnswerMemo
from egress.dns.cache import AddressCache
from egress.ops.audit import DecisionLog
from egress.ops.metrics import DNS_QUERIES

ip = ipaddress.ip_address
CLIENT = "198.18.1.1:5353"


class Lab:
    def __init__(self, *domains: str):
        self.spec = make_spec(*domains)
        self.clock = Clock()
        self.out = io.StringIO()
        self.filter = DnsFilter(
            lambda: self.spec, lambda addr: False, DecisionLog(stream=self.out), cache=AddressCache(clock=self.clock)
        )

    def fresh_answer(self, packet: bytes) -> bytes | None:
        """What a filter without a memo writes now, from the same cache and spec."""
        memo = self.filter.memo
        self.filter.memo = AnswerMemo(self.clock, max_entries=0)
        try:
            return self.filter.answer_datagram(packet, CLIENT)
        finally:
            self.filter.memo = memo

    def answer(self, packet: bytes) -> bytes | None:
        return self.filter.answer_datagram(packet, CLIENT)


def served(lab: Lab) -> int:
    return len(lab.filter.memo)


def test_a_repeated_query_is_served_from_the_memo_under_its_own_id():
    lab = Lab("cached.test")
    lab.filter.cache.put(lab.spec, "cached.test", 4, [ip("198.18.0.7")])
    first = lab.answer(query("cached.test", ident=1))
    assert served(lab) == 1
    for ident in (2, 0xFFFF, 0):
        packet = query("cached.test", ident=ident)
        again = lab.answer(packet)
        assert again is not None and again[:2] == packet[:2]
        assert again == lab.fresh_answer(packet)
    assert first is not None and answer_records(first) == [(30, "198.18.0.7")]


def test_every_query_served_from_the_memo_is_counted():
    lab = Lab("counted.test")
    lab.filter.cache.put(lab.spec, "counted.test", 4, [ip("198.18.0.7")])
    series = DNS_QUERIES.labels("allowed", "", "counted.test", "A", "")
    before = series._value.get()
    for ident in range(50):
        assert lab.answer(query("counted.test", ident=ident)) is not None
    assert series._value.get() - before == 50


def test_forbidden_cached_addresses_are_logged_for_every_query_served():
    lab = Lab("rebind.test")
    lab.filter.cache.put(lab.spec, "rebind.test", 4, [ip("127.0.0.1")])
    for ident in range(3):
        wire = lab.answer(query("rebind.test", ident=ident))
        assert wire is not None and answer_records(wire) == []
    lines = [json.loads(line) for line in lab.out.getvalue().splitlines()]
    assert [(line["decision"], line["reason"], line["name"]) for line in lines] == [
        ("blocked", "loopback", "rebind.test")
    ] * 3


def test_a_reload_that_removes_the_name_answers_nxdomain_at_once():
    lab = Lab("gone.test", "kept.test")
    lab.filter.cache.put(lab.spec, "gone.test", 4, [ip("198.18.0.7")])
    assert lab.answer(query("gone.test")) is not None
    lab.spec = make_spec("kept.test")  # the reload: a new spec object
    wire = lab.answer(query("gone.test", ident=9))
    assert wire is not None and wire[3] & 0xF == dp.NXDOMAIN


def test_a_reload_that_keeps_the_name_asks_the_resolver_again():
    lab = Lab("same.test")
    lab.filter.cache.put(lab.spec, "same.test", 4, [ip("198.18.0.7")])
    assert lab.answer(query("same.test")) is not None
    lab.spec = make_spec("same.test")
    assert lab.answer(query("same.test")) is None  # a cache miss: the full path resolves it


def test_new_addresses_in_the_cache_are_served_at_once():
    lab = Lab("moved.test")
    lab.filter.cache.put(lab.spec, "moved.test", 4, [ip("198.18.0.7")])
    assert answer_records(lab.answer(query("moved.test")) or b"") == [(30, "198.18.0.7")]
    lab.filter.cache.put(lab.spec, "moved.test", 4, [ip("198.18.0.8")])
    assert answer_records(lab.answer(query("moved.test")) or b"") == [(30, "198.18.0.8")]


def test_the_ttl_counts_down_as_without_the_memo():
    lab = Lab("ttl.test")
    lab.filter.cache.put(lab.spec, "ttl.test", 4, [ip("198.18.0.7")])
    packet = query("ttl.test")
    # The first answer 0.7 s after the put: its TTL (30) turns 29 0.3 s later, before
    # the memo's MAX_AGE would end it.
    for step in (0.7, 0.5, 0.3, 0.49, 0.02, 1.5, 10.0, 16.0):
        lab.clock.now += step
        wire = lab.answer(packet)
        assert wire == lab.fresh_answer(packet), step
    lab.clock.now += 5.0  # 34.51 s after the put: expired
    assert lab.answer(packet) is None


def test_an_entry_is_not_served_longer_than_max_age():
    memo = AnswerMemo(Clock())
    spec = object()
    memo.put(b"\x00\x01tail", b"\x00\x01answer", spec=spec, generation=1, verdict=None, name="n", qtype="A",
             expires=2000.0, ttl=1000)  # fmt: skip
    assert memo.get(b"\x00\x02tail", spec, 1) is not None
    memo._clock.now += MAX_AGE  # type: ignore[attr-defined]
    assert memo.get(b"\x00\x02tail", spec, 1) is None
    assert len(memo) == 0


def test_case_and_edns_size_are_different_questions():
    lab = Lab("case.test")
    lab.filter.cache.put(lab.spec, "case.test", 4, [ip("198.18.0.7")])
    for packet in (query("case.test"), query("CaSe.TeSt"), query("case.test", edns=1232), query("case.test", edns=512)):
        lab.answer(packet)
        wire = lab.answer(packet)
        assert wire == lab.fresh_answer(packet)
        assert wire is not None and wire[12 : 12 + 10] == packet[12 : 12 + 10]  # its own question, its own case
    assert served(lab) == 4


def test_blocked_names_never_enter_the_memo():
    lab = Lab("allowed.test")
    for i in range(100):
        wire = lab.answer(query(f"x{i}.attacker.test"))
        assert wire is not None and wire[3] & 0xF == dp.NXDOMAIN
    lab.answer(query("allowed.test", dp.HTTPS))
    lab.answer(query("localhost"))
    assert served(lab) == 0


def test_the_memo_is_bounded():
    lab = Lab("*.wild.test")
    lab.filter.memo.max_entries = 8
    for i in range(20):
        lab.filter.cache.put(lab.spec, f"n{i}.wild.test", 4, [ip("198.18.0.7")])
    for i in range(20):
        lab.answer(query(f"n{i}.wild.test"))
        assert served(lab) <= 8


def test_a_padded_query_is_answered_but_not_kept():
    lab = Lab("padded.test")
    lab.filter.cache.put(lab.spec, "padded.test", 4, [ip("198.18.0.7")])
    padding = struct.pack("!HH", 12, 60000) + b"\x00" * 60000  # EDNS padding option (RFC 7830)
    labels = b"\x06padded\x04test\x00"
    packet = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 1) + labels + struct.pack("!HH", dp.A, 1)
    packet += b"\x00" + struct.pack("!HHIH", dp.OPT, 1232, 0, len(padding)) + padding
    for _ in range(2):
        wire = lab.answer(packet)
        assert wire is not None and answer_records(wire) == [(30, "198.18.0.7")]
    assert served(lab) == 0
    assert lab.answer(query("padded.test")) is not None and served(lab) == 1
