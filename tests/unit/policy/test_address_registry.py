"""Every entry of the IANA special-purpose address registries, decided by our own table.

The expectations are written out here, independently of `egress.policy.addresses`' table,
so that a changed or dropped table entry fails a test. The same file runs under every
supported interpreter in CI (scripts/test.sh runs tests/unit under a second Python);
`test_address_interpreters.py` also compares the two directly.
"""

from __future__ import annotations

import ipaddress

import pytest

from egress.policy.addresses import (
    ALWAYS_FORBIDDEN,
    IPV4_RANGES,
    IPV6_RANGES,
    AddressClass,
    cidr_problem,
    classify_address,
    forbidden_reason,
    special_range,
)

C = AddressClass
ip = ipaddress.ip_address
net = ipaddress.ip_network

# (range, class). Carriers of IPv4 (mapped, NAT64, 6to4, Teredo) are in CARRIERS below.
REGISTRY_V4 = [
    ("0.0.0.0/8", C.UNSPECIFIED),
    ("0.0.0.0/32", C.UNSPECIFIED),
    ("10.0.0.0/8", C.PRIVATE),
    ("100.64.0.0/10", C.SHARED),
    ("127.0.0.0/8", C.LOOPBACK),
    ("169.254.0.0/16", C.LINK_LOCAL),
    ("172.16.0.0/12", C.PRIVATE),
    ("192.0.0.0/29", C.RESERVED),  # DS-Lite
    ("192.0.0.8/32", C.NOT_A_LOCATOR),  # IPv4 dummy address
    ("192.0.0.9/32", C.RESERVED),  # PCP anycast
    ("192.0.0.10/32", C.RESERVED),  # TURN anycast
    ("192.0.0.11/32", C.RESERVED),  # rest of the IETF protocol assignments /24
    ("192.0.0.170/31", C.RESERVED),  # NAT64/DNS64 discovery
    ("192.0.0.255/32", C.RESERVED),
    ("192.0.2.0/24", C.DOCUMENTATION),
    ("192.31.196.0/24", C.RESERVED),  # AS112-v4
    ("192.52.193.0/24", C.RESERVED),  # AMT
    ("192.88.99.0/24", C.RESERVED),  # deprecated 6to4 relay anycast
    ("192.88.99.2/32", C.RESERVED),  # 6a44 relay anycast
    ("192.168.0.0/16", C.PRIVATE),
    ("192.175.48.0/24", C.RESERVED),  # AS112 direct delegation
    ("198.18.0.0/15", C.BENCHMARKING),
    ("198.51.100.0/24", C.DOCUMENTATION),
    ("203.0.113.0/24", C.DOCUMENTATION),
    ("224.0.0.0/4", C.MULTICAST),
    ("240.0.0.0/5", C.RESERVED),  # 240.0.0.0/4 up to the broadcast address
    ("255.255.255.254/32", C.RESERVED),
    ("255.255.255.255/32", C.BROADCAST),
]
REGISTRY_V6 = [
    ("::/128", C.UNSPECIFIED),
    ("::1/128", C.LOOPBACK),
    ("64:ff9b:1::/48", C.RESERVED),  # local-use NAT64
    ("100::/64", C.RESERVED),  # discard-only
    ("100:0:0:1::/64", C.NOT_A_LOCATOR),  # dummy IPv6 prefix
    ("2001:1::1/128", C.RESERVED),  # PCP anycast
    ("2001:1::2/128", C.RESERVED),  # TURN anycast
    ("2001:1::3/128", C.RESERVED),  # DNS-SD SRP anycast
    ("2001:1::4/128", C.RESERVED),  # rest of the IETF protocol assignments /23
    ("2001:2::/48", C.BENCHMARKING),
    ("2001:3::/32", C.RESERVED),  # AMT
    ("2001:4:112::/48", C.RESERVED),  # AS112-v6
    ("2001:5::/32", C.RESERVED),
    ("2001:10::/28", C.NOT_A_LOCATOR),  # deprecated ORCHID
    ("2001:20::/28", C.NOT_A_LOCATOR),  # ORCHIDv2
    ("2001:30::/28", C.NOT_A_LOCATOR),  # DRIP entity tags
    ("2001:40::/26", C.RESERVED),
    ("2001:100::/24", C.RESERVED),
    ("2001:db8::/32", C.DOCUMENTATION),
    ("2620:4f:8000::/48", C.RESERVED),  # AS112 direct delegation
    ("3fff::/20", C.DOCUMENTATION),
    ("5f00::/16", C.RESERVED),  # SRv6 SIDs
    ("fc00::/7", C.PRIVATE),
    ("fe80::/10", C.LINK_LOCAL),
    ("fec0::/10", C.RESERVED),  # deprecated site-local
    ("ff00::/8", C.MULTICAST),
    # outside 2000::/3 (IPv6 address space registry: reserved by the IETF)
    ("0:0:0:1::/64", C.RESERVED),  # between ::/96 and ::ffff:0:0/96, which carry IPv4
    ("1::/16", C.RESERVED),
    ("4000::/3", C.RESERVED),
    ("e000::/4", C.RESERVED),
]
# Just outside each range, or in ordinary unicast space: global.
GLOBAL = [
    "1.1.1.1",
    "8.8.8.8",
    "192.0.1.255",
    "192.0.3.0",
    "192.31.195.255",
    "192.31.197.0",
    "192.52.192.255",
    "192.52.194.0",
    "192.88.98.255",
    "192.88.100.0",
    "192.175.47.255",
    "192.175.49.0",
    "223.255.255.255",
    "2000::",
    "2001:200::",
    "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
    "2001:db9::",
    "2003::1",
    "2606:4700:4700::1111",
    "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff",
    "2620:4f:8001::",
    "3ffe::1",
    "3fff:1000::",
    "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
]
# The addresses the issue names, that moved between Python 3.12.1 and 3.13.0: their
# decision must not depend on the interpreter (ORCHIDv2 was dialled under 3.13).
MOVED_BETWEEN_INTERPRETERS = [
    ("2001:20::1", C.NOT_A_LOCATOR),
    ("2001:1::1", C.RESERVED),
    ("2001:1::2", C.RESERVED),
    ("2001:3::1", C.RESERVED),
    ("2001:4:112::1", C.RESERVED),
    ("2001:30::1", C.NOT_A_LOCATOR),
]


def samples(cidr: str) -> list[str]:
    """First, last and a middle address of a range."""
    n = net(cidr)
    first, last = int(n.network_address), int(n.broadcast_address)
    return sorted({str(ip(a) if n.version == 4 else ipaddress.IPv6Address(a)) for a in (first, (first + last) // 2, last)})


def cases(table):
    return [pytest.param(a, cls, id=f"{cidr}:{a}") for cidr, cls in table for a in samples(cidr)]


def expected_reason(cls: AddressClass) -> str | None:
    if cls is C.GLOBAL:
        return None
    if cls in (C.LOOPBACK, C.UNSPECIFIED):
        return "loopback"
    return "forbidden_address"


@pytest.mark.parametrize(("address", "cls"), cases(REGISTRY_V4) + cases(REGISTRY_V6))
def test_registry_entry_decision(address, cls):
    a = ip(address)
    assert classify_address(a) is cls
    assert forbidden_reason(a) == expected_reason(cls)
    # allowCidrs opens what is not always forbidden, and nothing else.
    own = [net(address)]
    if cls in ALWAYS_FORBIDDEN:
        assert forbidden_reason(a, own) == expected_reason(cls)
        assert cidr_problem(own[0]) is not None
    else:
        assert forbidden_reason(a, own) is None
        assert cidr_problem(own[0]) is None


@pytest.mark.parametrize("address", GLOBAL)
def test_ordinary_unicast_is_global(address):
    assert classify_address(ip(address)) is C.GLOBAL
    assert forbidden_reason(ip(address)) is None


@pytest.mark.parametrize(("address", "cls"), MOVED_BETWEEN_INTERPRETERS)
def test_addresses_is_global_disagrees_on(address, cls):
    assert classify_address(ip(address)) is cls
    assert forbidden_reason(ip(address)) == "forbidden_address"
    assert forbidden_reason(ip(address), [net("::/0")]) == ("forbidden_address" if cls in ALWAYS_FORBIDDEN else None)


def test_identifiers_are_never_a_destination_even_if_listed():
    """ORCHID, ORCHIDv2 and DRIP name hosts; they locate nothing. allowCidrs cannot open them."""
    for cidr in ("2001:10::/28", "2001:20::/28", "2001:30::/28", "100:0:0:1::/64"):
        assert cidr_problem(net(cidr)) is not None
        problem = cidr_problem(net(cidr))
        assert problem is not None and "not_a_locator" in problem
        assert forbidden_reason(ip(cidr.split("/")[0]) + 1, [net(cidr)]) == "forbidden_address"


def test_benchmarking_range_stays_open_via_allow_cidrs():
    """The e2e tests' IPv6 upstreams live in 2001:2::/48 (inside 2001::/23) and are allowed explicitly."""
    assert cidr_problem(net("2001:2::/48")) is None
    assert forbidden_reason(ip("2001:2::10"), [net("2001:2::/48")]) is None
    assert forbidden_reason(ip("2001:2::10")) == "forbidden_address"


CARRIERS = [
    # (IPv6 form, the IPv4 address inside decides)
    ("::ffff:169.254.169.254", C.LINK_LOCAL),
    ("64:ff9b::a9fe:a9fe", C.LINK_LOCAL),
    ("64:ff9b::8.8.8.8", C.GLOBAL),
    ("2002:c000:8::1", C.NOT_A_LOCATOR),  # 6to4 of 192.0.0.8
    ("2002:c01f:c401::1", C.RESERVED),  # 6to4 of AS112-v4
    ("2002:0808:0808::1", C.GLOBAL),
    ("2001:0:4136:e378:8000:63bf:3fff:fff7", C.NOT_A_LOCATOR),  # Teredo client 192.0.0.8
    ("::ffff:0:192.0.0.9", C.RESERVED),
]


@pytest.mark.parametrize(("address", "cls"), CARRIERS)
def test_ipv4_carriers_are_unwrapped(address, cls):
    assert classify_address(ip(address)) is cls


def test_table_is_the_registry_and_nothing_is_left_to_the_interpreter():
    # Each /0 entry is the default; every other address gets a stated decision and reason.
    assert special_range(ip("8.8.8.8")).network == net("0.0.0.0/0")
    assert special_range(ip("2606:4700::1")).network == net("2000::/3")
    assert special_range(ip("4000::1")).network == net("::/0")
    for entry in (*IPV4_RANGES, *IPV6_RANGES):
        assert entry.why, entry
        assert special_range(entry.network.network_address).network.prefixlen >= entry.network.prefixlen
    # Every registry entry above has a table entry of its own (not just a covering one).
    table = {str(e.network) for e in (*IPV4_RANGES, *IPV6_RANGES)}
    own = {c for c, _ in REGISTRY_V4 + REGISTRY_V6} - {
        "192.0.0.11/32",
        "192.0.0.255/32",
        "255.255.255.254/32",
        "2001:1::4/128",
        "2001:5::/32",
        "2001:40::/26",
        "2001:100::/24",
        "240.0.0.0/5",
        "0:0:0:1::/64",
        "1::/16",
        "4000::/3",
        "e000::/4",
    }
    assert own <= table, own - table
