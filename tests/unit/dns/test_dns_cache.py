"""The DNS listener's address cache (egress/dns/cache.py) and the synchronous half of
DnsFilter (`answer_now`): what is answered without a hook, from the cache, under the
spec in force, and how it fails closed. Real mitmproxy DNS flows and messages built
from real query bytes; the clock is the only stand-in (TTL expiry without waiting)."""

from __future__ import annotations

import io
import ipaddress
import json

import pytest
from dns_testing import Clock, answer_records, make_spec, query_bytes
from mitmproxy.test import tflow

from egress.addons import failsafe
from egress.addons.dns_filter import DnsFilter
from egress.dns import policy as dp
from egress.dns.cache import AddressCache
from egress.mitm.patches.dns_listener import DROP_KEY, WIRE_KEY, parse
from egress.ops.audit import DecisionLog

ip = ipaddress.ip_address


def flow_for(name: str, qtype: int = dp.A):
    return tflow.tdnsflow(req=parse(query_bytes(name, qtype)))


def rcode_and_addresses(wire: bytes) -> tuple[int, list[str]]:
    return wire[3] & 0xF, [address for _, address in answer_records(wire)]


def answer_ttls(wire: bytes) -> list[int]:
    return [ttl for ttl, _ in answer_records(wire)]


class Holder:
    def __init__(self, spec):
        self.spec = spec


@pytest.fixture
def setup():
    holder = Holder(make_spec("cached.test"))
    clock = Clock()
    out = io.StringIO()
    addon = DnsFilter(lambda: holder.spec, lambda addr: False, DecisionLog(stream=out), cache=AddressCache(clock=clock))
    return holder, clock, addon, out


# -- the cache on its own ----------------------------------------------------------


def test_cache_hit_then_expiry():
    clock = Clock()
    cache = AddressCache(ttl=30, clock=clock)
    owner = object()
    assert cache.get(owner, "a.test", 4) is None
    cache.put(owner, "a.test", 4, [ip("198.18.0.1")])
    assert cache.get(owner, "a.test", 4) == ((ip("198.18.0.1"),), 30)
    clock.now += 29.5
    assert cache.get(owner, "a.test", 4) == ((ip("198.18.0.1"),), 1)  # the TTL counts down
    clock.now += 0.5
    assert cache.get(owner, "a.test", 4) is None
    assert len(cache) == 0


def test_cache_keyed_by_family_and_emptied_by_a_new_spec():
    cache = AddressCache(clock=Clock())
    old, new = object(), object()
    cache.put(old, "a.test", 4, [ip("198.18.0.1")])
    assert cache.get(old, "a.test", 6) is None
    assert cache.get(new, "a.test", 4) is None  # another spec: nothing from the old one
    assert cache.get(old, "a.test", 4) is None  # and the old entries are gone for good
    cache.put(old, "a.test", 4, [ip("198.18.0.1")])  # a lookup that finished after the reload
    assert cache.get(new, "a.test", 4) is None


def test_cache_is_bounded_and_keeps_no_empty_answers():
    cache = AddressCache(max_entries=3, clock=Clock())
    owner = object()
    cache.put(owner, "empty.test", 4, [])
    assert cache.get(owner, "empty.test", 4) is None
    for i in range(5):
        cache.put(owner, f"n{i}.test", 4, [ip("198.18.0.1")])
    assert len(cache) == 3
    assert cache.get(owner, "n0.test", 4) is None and cache.get(owner, "n4.test", 4) is not None


def answered_now(addon, name: str) -> bytes:
    """The answer DnsFilter.answer_now gives `name` itself, without the hook (it must give one)."""
    flow = flow_for(name)
    assert addon.answer_now(flow) is True
    return flow.metadata[WIRE_KEY]


# -- DnsFilter.answer_now: the synchronous half --------------------------------------


def test_blocked_names_are_answered_without_the_hook(setup):
    _, _, addon, out = setup
    assert rcode_and_addresses(answered_now(addon, "secret.attacker.example")) == (dp.NXDOMAIN, [])
    assert json.loads(out.getvalue())["reason"] == "not_allowlisted"


def test_a_response_sent_to_the_listener_is_dropped_without_the_hook(setup):
    _, _, addon, _ = setup
    packet = bytearray(query_bytes("x.test"))
    packet[2] |= 0x80
    flow = tflow.tdnsflow(req=parse(bytes(packet)))
    assert addon.answer_now(flow) is True and flow.metadata[DROP_KEY] is True


def test_an_uncached_allowlisted_name_is_left_to_the_hook(setup):
    _, _, addon, out = setup
    flow = flow_for("cached.test")
    assert addon.answer_now(flow) is False
    assert WIRE_KEY not in flow.metadata and out.getvalue() == ""  # counted once, when finished


def test_cached_addresses_are_filtered_again_and_expire(setup):
    holder, clock, addon, out = setup
    addon.cache.put(holder.spec, "cached.test", 4, [ip("198.18.0.7"), ip("127.0.0.1"), ip("169.254.169.254")])
    assert rcode_and_addresses(answered_now(addon, "CACHED.test")) == (dp.NOERROR, ["198.18.0.7"])
    clock.now += 10
    assert answer_ttls(answered_now(addon, "cached.test")) == [20]
    clock.now += 21
    assert addon.answer_now(flow_for("cached.test")) is False  # expired: back to the resolver


def test_cached_forbidden_addresses_only_give_an_empty_answer(setup):
    holder, _, addon, out = setup
    addon.cache.put(holder.spec, "cached.test", 4, [ip("127.0.0.1"), ip("10.1.2.3")])
    assert rcode_and_addresses(answered_now(addon, "cached.test")) == (dp.NOERROR, [])
    assert json.loads(out.getvalue())["reason"] == "loopback"


def test_a_reload_that_removes_a_name_stops_it_resolving_at_once(setup):
    holder, _, addon, _ = setup
    addon.cache.put(holder.spec, "cached.test", 4, [ip("198.18.0.7")])
    assert rcode_and_addresses(answered_now(addon, "cached.test"))[1] == ["198.18.0.7"]
    holder.spec = make_spec("other.test")
    assert rcode_and_addresses(answered_now(addon, "cached.test")) == (dp.NXDOMAIN, [])
    # a reload that keeps the name does not serve the old spec's entry either
    holder.spec = make_spec("cached.test")
    assert addon.answer_now(flow_for("cached.test")) is False


def test_the_fast_path_fails_closed_and_is_counted(setup, monkeypatch):
    _, _, addon, _ = setup

    def broken(spec, query):
        raise RuntimeError("boom")

    monkeypatch.setattr(dp, "decide", broken)
    guarded = failsafe.fail_closed_call("DnsFilter", "dns_request", addon.answer_now)
    before = failsafe.INTERNAL_ERRORS.labels("dns_request")._value.get()
    flow = flow_for("secret.attacker.example")
    assert guarded(flow) is None  # the layer then answers SERVFAIL and runs no hook
    assert flow.metadata == {} and flow.response is None
    assert failsafe.INTERNAL_ERRORS.labels("dns_request")._value.get() == before + 1


def test_the_test_fault_applies_to_the_fast_path(setup, monkeypatch):
    _, _, addon, _ = setup
    monkeypatch.setenv(failsafe.TEST_FAULT_ENV, "DnsFilter.dns_request@blocked.example")
    guarded = failsafe.fail_closed_call("DnsFilter", "dns_request", addon.answer_now)
    assert guarded(flow_for("other.example")) is True
    assert guarded(flow_for("blocked.example")) is None


def test_the_hook_half_fails_closed_too(setup, monkeypatch):
    """A cache miss goes on to the `dns_request` hook; an exception there (here the
    resolver call raising something unexpected, injected) answers SERVFAIL, counted,
    and caches nothing."""
    import asyncio

    from egress.addons import dns_filter

    _, _, addon, _ = setup

    async def broken(host, version):
        raise RuntimeError("boom")

    monkeypatch.setattr(dns_filter, "resolve_family", broken)
    guarded = failsafe.fail_closed(addon)
    flow = flow_for("cached.test")
    assert addon.answer_now(flow) is False
    before = failsafe.INTERNAL_ERRORS.labels("dns_request")._value.get()
    asyncio.run(guarded.dns_request(flow))
    assert flow.metadata == {} and flow.response is None  # the layer answers SERVFAIL
    assert failsafe.INTERNAL_ERRORS.labels("dns_request")._value.get() == before + 1
    assert len(addon.cache) == 0
