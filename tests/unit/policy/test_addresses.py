"""Address classification, including IPv4 carried inside IPv6, and allowCidrs."""

from __future__ import annotations

import ipaddress

import pytest

from egress.policy.addresses import (
    AddressClass,
    cidr_problem,
    classify_address,
    embedded_ipv4,
    forbidden_reason,
)

ip = ipaddress.ip_address
net = ipaddress.ip_network

C = AddressClass
# (address, class, forbidden_reason without allowCidrs)
TABLE = [
    # always forbidden
    ("127.0.0.1", C.LOOPBACK, "loopback"),
    ("127.255.255.254", C.LOOPBACK, "loopback"),
    ("::1", C.LOOPBACK, "loopback"),
    ("0.0.0.0", C.UNSPECIFIED, "loopback"),
    ("0.1.2.3", C.UNSPECIFIED, "loopback"),
    ("::", C.UNSPECIFIED, "loopback"),
    ("169.254.169.254", C.LINK_LOCAL, "forbidden_address"),
    ("168.63.129.16", C.LINK_LOCAL, "forbidden_address"),  # Azure WireServer: global, yet metadata
    ("169.254.0.1", C.LINK_LOCAL, "forbidden_address"),
    ("fe80::1", C.LINK_LOCAL, "forbidden_address"),
    ("febf:ffff::1", C.LINK_LOCAL, "forbidden_address"),
    ("224.0.0.1", C.MULTICAST, "forbidden_address"),
    ("239.255.255.250", C.MULTICAST, "forbidden_address"),
    ("ff02::1", C.MULTICAST, "forbidden_address"),
    ("255.255.255.255", C.BROADCAST, "forbidden_address"),
    # forbidden unless in allowCidrs
    ("10.0.0.1", C.PRIVATE, "forbidden_address"),
    ("10.255.255.255", C.PRIVATE, "forbidden_address"),
    ("172.16.0.1", C.PRIVATE, "forbidden_address"),
    ("172.31.255.255", C.PRIVATE, "forbidden_address"),
    ("192.168.1.1", C.PRIVATE, "forbidden_address"),
    ("100.64.0.1", C.SHARED, "forbidden_address"),
    ("100.127.255.255", C.SHARED, "forbidden_address"),
    ("192.0.2.1", C.DOCUMENTATION, "forbidden_address"),
    ("198.51.100.7", C.DOCUMENTATION, "forbidden_address"),
    ("203.0.113.200", C.DOCUMENTATION, "forbidden_address"),
    ("2001:db8::1", C.DOCUMENTATION, "forbidden_address"),
    ("198.18.0.1", C.BENCHMARKING, "forbidden_address"),
    ("198.19.255.254", C.BENCHMARKING, "forbidden_address"),
    ("2001:2::1", C.BENCHMARKING, "forbidden_address"),
    ("240.0.0.1", C.RESERVED, "forbidden_address"),
    ("255.255.255.254", C.RESERVED, "forbidden_address"),
    ("192.0.0.7", C.RESERVED, "forbidden_address"),
    ("192.0.0.8", C.NOT_A_LOCATOR, "forbidden_address"),  # dummy address
    ("fc00::1", C.PRIVATE, "forbidden_address"),
    ("fd12:3456::1", C.PRIVATE, "forbidden_address"),
    ("fec0::1", C.RESERVED, "forbidden_address"),
    ("100::1", C.RESERVED, "forbidden_address"),
    ("64:ff9b:1::a00:1", C.RESERVED, "forbidden_address"),
    ("4000::1", C.RESERVED, "forbidden_address"),  # outside 2000::/3
    # edges just outside the ranges
    ("172.15.255.255", C.GLOBAL, None),
    ("172.32.0.0", C.GLOBAL, None),
    ("100.63.255.255", C.GLOBAL, None),
    ("100.128.0.0", C.GLOBAL, None),
    ("198.17.255.255", C.GLOBAL, None),
    ("198.20.0.0", C.GLOBAL, None),
    ("169.253.255.255", C.GLOBAL, None),
    ("126.255.255.255", C.GLOBAL, None),
    ("128.0.0.0", C.GLOBAL, None),
    ("8.8.8.8", C.GLOBAL, None),
    ("2606:4700:4700::1111", C.GLOBAL, None),
    # IPv4 embedded in IPv6
    ("::ffff:127.0.0.1", C.LOOPBACK, "loopback"),
    ("::ffff:0:127.0.0.1", C.LOOPBACK, "loopback"),  # IPv4-translated
    ("::127.0.0.1", C.LOOPBACK, "loopback"),  # IPv4-compatible
    ("::ffff:169.254.169.254", C.LINK_LOCAL, "forbidden_address"),
    ("::ffff:10.0.0.1", C.PRIVATE, "forbidden_address"),
    ("::ffff:8.8.8.8", C.GLOBAL, None),
    ("::8.8.8.8", C.GLOBAL, None),
    (
        "64:ff9b::a9fe:a9fe",
        C.LINK_LOCAL,
        "forbidden_address",
    ),  # NAT64 of 169.254.169.254
    ("64:ff9b::7f00:1", C.LOOPBACK, "loopback"),
    ("64:ff9b::c612:1", C.BENCHMARKING, "forbidden_address"),
    ("64:ff9b::808:808", C.GLOBAL, None),
    ("2002:a9fe:a9fe::", C.LINK_LOCAL, "forbidden_address"),  # 6to4
    ("2002:7f00:1::", C.LOOPBACK, "loopback"),
    ("2002:7f00:1:ffff:ffff:ffff:ffff:ffff", C.LOOPBACK, "loopback"),
    ("2002:808:808::1", C.GLOBAL, None),
    # Teredo: server 65.54.227.120, client bits inverted
    (
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
        C.LOOPBACK,
        "loopback",
    ),  # client 127.0.0.1
    (
        "2001:0:4136:e378:8000:63bf:5601:5656",
        C.LINK_LOCAL,
        "forbidden_address",
    ),  # client 169.254.169.169
    (
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",
        C.PRIVATE,
        "forbidden_address",
    ),  # client 10.0.0.1
    (
        "2001:0:7f00:1:8000:63bf:f7f7:f7f7",
        C.LOOPBACK,
        "loopback",
    ),  # server 127.0.0.1, client 8.8.8.8
]


@pytest.mark.parametrize(("address", "expected_class", "expected_reason"), TABLE)
def test_classify(address, expected_class, expected_reason):
    assert classify_address(ip(address)) is expected_class
    assert forbidden_reason(ip(address)) == expected_reason


def test_teredo_fixture_addresses_decode_as_commented():
    assert ip("2001:0:4136:e378:8000:63bf:80ff:fffe").teredo == (
        ip("65.54.227.120"),
        ip("127.0.0.1"),
    )
    assert ip("2001:0:4136:e378:8000:63bf:5601:5656").teredo[1] == ip("169.254.169.169")
    assert ip("2001:0:4136:e378:8000:63bf:f5ff:fffe").teredo[1] == ip("10.0.0.1")


@pytest.mark.parametrize(
    "address",
    # `ipaddress` calls these global on every supported Python; judged by what they carry,
    # they reach the host itself or the cloud metadata service.
    ["::127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1"],
)
def test_is_global_is_not_enough(address):
    assert ip(address).is_global
    assert forbidden_reason(ip(address)) is not None


def test_is_global_misses_several_embedded_forms():
    embedded = [
        "::ffff:127.0.0.1",
        "::127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::7f00:1",
        "2002:a9fe:a9fe::",
        "2002:7f00:1::",
    ]
    fooled = [a for a in embedded if ip(a).is_global]
    assert len(fooled) >= 3
    assert all(forbidden_reason(ip(a)) is not None for a in embedded)


@pytest.mark.parametrize(
    ("address", "inner"),
    [
        ("::ffff:1.2.3.4", ["1.2.3.4"]),
        ("::ffff:0:1.2.3.4", ["1.2.3.4"]),
        ("::1.2.3.4", ["1.2.3.4"]),
        ("64:ff9b::1.2.3.4", ["1.2.3.4"]),
        ("2002:102:304:5::6", ["1.2.3.4"]),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", ["65.54.227.120", "10.0.0.1"]),
        ("::", []),
        ("::1", []),
        ("2606:4700::1111", []),
        ("64:ff9b:1::1.2.3.4", []),  # local-use NAT64: layout not fixed
        ("1.2.3.4", []),
    ],
)
def test_embedded_ipv4(address, inner):
    assert embedded_ipv4(ip(address)) == tuple(ip(a) for a in inner)


# --- allowCidrs -------------------------------------------------------------------

ALLOW = (
    net("10.0.0.0/8"),
    net("198.18.0.0/15"),
    net("100.64.0.0/10"),
    net("fd00::/8"),
    net("192.0.2.0/24"),
)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.1.2.3", None),
        ("198.18.0.10", None),
        ("100.64.0.1", None),
        ("fd00::1", None),
        ("192.0.2.1", None),
        ("8.8.8.8", None),
        # outside the allowed ranges
        ("172.16.0.1", "forbidden_address"),
        ("192.168.0.1", "forbidden_address"),
        ("fc00::1", "forbidden_address"),
        ("240.0.0.1", "forbidden_address"),
        # through embedded forms
        ("::ffff:10.1.2.3", None),
        ("64:ff9b::c612:a", None),  # NAT64 of 198.18.0.10
        ("2002:a01:203::", None),  # 6to4 of 10.1.2.3
        ("::ffff:172.16.0.1", "forbidden_address"),
        # never: loopback, unspecified, link-local, multicast, broadcast
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "forbidden_address"),
        ("fe80::1", "forbidden_address"),
        ("224.0.0.1", "forbidden_address"),
        ("255.255.255.255", "forbidden_address"),
        ("64:ff9b::a9fe:a9fe", "forbidden_address"),
    ],
)
def test_allow_cidrs(address, expected):
    assert forbidden_reason(ip(address), ALLOW) == expected


@pytest.mark.parametrize(
    ("address", "cidrs", "expected"),
    [
        # Teredo carries two IPv4 addresses; permitting one must not permit the other.
        (
            "2001:0:a00:1:8000:63bf:3f57:fefe",
            ["10.0.0.0/8"],
            "forbidden_address",
        ),  # server 10.0.0.1, client 192.168.1.1
        ("2001:0:a00:1:8000:63bf:3f57:fefe", ["10.0.0.0/8", "192.168.0.0/16"], None),
        ("2001:0:a00:1:8000:63bf:3f57:fefe", ["192.168.0.0/16"], "forbidden_address"),
        # ... nor does a global server inside a broad allowed range.
        (
            "2001:0:808:808:8000:63bf:3f57:fefe",
            ["8.0.0.0/6"],
            "forbidden_address",
        ),  # server 8.8.8.8
        ("2001:0:808:808:8000:63bf:f5ff:fffe", ["8.0.0.0/6"], None),  # client 10.0.0.1
    ],
)
def test_allow_cidrs_must_cover_every_embedded_address(address, cidrs, expected):
    assert forbidden_reason(ip(address), [net(c) for c in cidrs]) == expected


def test_allow_cidrs_version_mismatch_is_ignored():
    # An IPv6 range never covers an IPv4 address (and vice versa).
    assert forbidden_reason(ip("10.0.0.1"), [net("fd00::/8")]) == "forbidden_address"
    assert forbidden_reason(ip("fd00::1"), [net("10.0.0.0/8")]) == "forbidden_address"


@pytest.mark.parametrize(
    ("cidr", "message"),
    [
        ("127.0.0.0/8", "loopback"),
        ("127.0.0.1/32", "loopback"),
        ("0.0.0.0/0", "unspecified"),
        ("0.0.0.0/8", "unspecified"),
        ("::/0", "unspecified"),
        ("::1/128", "loopback"),
        ("169.254.0.0/16", "link_local"),
        ("169.254.169.254/32", "link_local"),
        ("168.63.129.16/32", "link_local"),
        ("fe80::/10", "link_local"),
        ("224.0.0.0/4", "multicast"),
        ("ff00::/8", "multicast"),
        ("240.0.0.0/4", "broadcast"),
        ("8.8.8.0/24", "global"),
        ("1.1.1.1/32", "global"),
        ("2606:4700::/32", "global"),
        # IPv4-embedding ranges: would open every private IPv4 range at once
        ("::ffff:0:0/96", "IPv4-embedding"),
        ("64:ff9b::/96", "IPv4-embedding"),
        ("::/96", "unspecified"),
        ("2000::/3", "not_a_locator"),  # overlaps ORCHIDv2, DRIP, ... before any carrier
        ("2002::/16", "IPv4-embedding"),
        ("2001:20::/28", "not_a_locator"),
        ("192.0.0.0/24", "not_a_locator"),  # holds the dummy address 192.0.0.8
        ("2001::/32", "IPv4-embedding"),
    ],
)
def test_cidr_problem_rejects(cidr, message):
    problem = cidr_problem(net(cidr))
    assert problem is not None and message in problem


@pytest.mark.parametrize(
    "cidr",
    [
        "10.0.0.0/8",
        "10.1.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "198.18.0.0/15",
        "192.0.2.0/24",
        "240.0.0.0/5",
        "fd00::/8",
        "fc00::/7",
        "2001:db8::/32",
        "::ffff:10.0.0.0/104",
    ],
)
def test_cidr_problem_accepts(cidr):
    assert cidr_problem(net(cidr)) is None
