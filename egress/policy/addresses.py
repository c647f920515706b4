"""Address classification: which IP addresses a sandbox may reach.

Pure functions over one table of our own: every entry of the IANA IPv4 and IPv6
Special-Purpose Address Registries (and the few ranges of the address-space
registries that matter here: multicast, 240/4, site-local, the space outside
2000::/3), each with the class we give it and why. Nothing falls back to
`ipaddress.is_global` / `is_private`: their tables changed between Python
releases (3.12.4 and 3.13, the CVE-2024-4032 fix), so the same address was
refused under one interpreter and dialled under another (e.g. ORCHIDv2
`2001:20::1`). A range not in the table is ordinary unicast (IPv4) or, for
IPv6, global only inside 2000::/3.

`ipaddress.is_global` is not enough for a second reason: it calls
`64:ff9b::a9fe:a9fe` (NAT64 of 169.254.169.254), `2002:a9fe:a9fe::` (6to4)
and `::127.0.0.1` (IPv4-compatible) global. Every IPv6 form that carries an
IPv4 address is unwrapped and judged by the IPv4 address inside.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from typing import NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AddressClass(enum.StrEnum):
    GLOBAL = "global"
    LOOPBACK = "loopback"
    UNSPECIFIED = "unspecified"
    LINK_LOCAL = "link_local"
    MULTICAST = "multicast"
    BROADCAST = "broadcast"
    # Names something but locates nothing: cryptographic identifiers (ORCHID, DRIP)
    # and source-only placeholder addresses. Whatever answers there is not what the
    # registry says the address means, so it is never a destination.
    NOT_A_LOCATOR = "not_a_locator"
    PRIVATE = "private"
    SHARED = "shared"  # CGNAT, 100.64.0.0/10
    RESERVED = "reserved"
    DOCUMENTATION = "documentation"
    BENCHMARKING = "benchmarking"


# Never reachable, whatever `allowCidrs` says.
ALWAYS_FORBIDDEN = frozenset(
    {
        AddressClass.LOOPBACK,
        AddressClass.UNSPECIFIED,
        AddressClass.LINK_LOCAL,
        AddressClass.MULTICAST,
        AddressClass.BROADCAST,
        AddressClass.NOT_A_LOCATOR,
    }
)
# Classes whose block reason is `loopback`: connecting to 0.0.0.0 or :: reaches the host itself.
LOOPBACK_LIKE = frozenset({AddressClass.LOOPBACK, AddressClass.UNSPECIFIED})


class SpecialRange(NamedTuple):
    network: IPNetwork
    address_class: AddressClass
    why: str


def _r(cidr: str, address_class: AddressClass, why: str) -> SpecialRange:
    return SpecialRange(ipaddress.ip_network(cidr), address_class, why)


_N = ipaddress.ip_network
C = AddressClass
# Anycast service addresses (PCP, TURN, DNS-SD SRP, AMT relays, AS112, 6to4/6a44
# relays) are "globally reachable" in the registry, but the instance that answers is
# the nearest one, typically the operator's own router or resolver: infrastructure,
# not an internet destination a sandbox needs. They are `reserved` (allowCidrs can
# open them); Python >= 3.13 calls several of them global.
_ANYCAST = "anycast infrastructure; the nearest instance is usually the operator's own"

# Longest prefix wins (see `_lookup`), so sub-entries such as 192.0.0.9/32 inside
# 192.0.0.0/24 are listed in registry order, not in matching order.
IPV4_RANGES: tuple[SpecialRange, ...] = (
    # IANA IPv4 Special-Purpose Address Registry
    _r("0.0.0.0/8", C.UNSPECIFIED, "'this network': connecting to it reaches the host itself (RFC 791, 1122)"),
    _r("0.0.0.0/32", C.UNSPECIFIED, "'this host on this network' (RFC 1122)"),
    _r("10.0.0.0/8", C.PRIVATE, "private-use (RFC 1918)"),
    _r("100.64.0.0/10", C.SHARED, "shared address space, carrier-grade NAT (RFC 6598)"),
    _r("127.0.0.0/8", C.LOOPBACK, "loopback (RFC 1122)"),
    _r("169.254.0.0/16", C.LINK_LOCAL, "link-local, incl. cloud metadata 169.254.169.254 (RFC 3927)"),
    # Not in the IANA registry, but the same kind of address as 169.254.169.254: Azure's
    # WireServer, a host endpoint every VM reaches (VM agent configuration, certificates,
    # health probes). A globally routed address, so nothing else would refuse it.
    _r("168.63.129.16/32", C.LINK_LOCAL, "Azure WireServer host endpoint: cloud metadata, like 169.254.169.254"),
    _r("172.16.0.0/12", C.PRIVATE, "private-use (RFC 1918)"),
    _r("192.0.0.0/24", C.RESERVED, "IETF protocol assignments, not globally reachable (RFC 6890)"),
    _r("192.0.0.0/29", C.RESERVED, "IPv4 service continuity prefix, DS-Lite B4/AFTR inside the operator (RFC 7335)"),
    _r("192.0.0.8/32", C.NOT_A_LOCATOR, "IPv4 dummy address: a source placeholder, never a destination (RFC 7600)"),
    _r("192.0.0.9/32", C.RESERVED, f"Port Control Protocol anycast: {_ANYCAST} (RFC 7723)"),
    _r("192.0.0.10/32", C.RESERVED, f"TURN anycast: {_ANYCAST} (RFC 8155)"),
    _r("192.0.0.170/31", C.RESERVED, "NAT64/DNS64 discovery, answered inside the operator (RFC 7050)"),
    _r("192.0.2.0/24", C.DOCUMENTATION, "TEST-NET-1 (RFC 5737)"),
    _r("192.31.196.0/24", C.RESERVED, f"AS112-v4: {_ANYCAST} (RFC 7535)"),
    _r("192.52.193.0/24", C.RESERVED, f"AMT relays: {_ANYCAST} (RFC 7450)"),
    _r("192.88.99.0/24", C.RESERVED, "deprecated 6to4 relay anycast (RFC 7526)"),
    _r("192.88.99.2/32", C.RESERVED, f"6a44 relay anycast: {_ANYCAST} (RFC 6751)"),
    _r("192.168.0.0/16", C.PRIVATE, "private-use (RFC 1918)"),
    _r("192.175.48.0/24", C.RESERVED, f"direct delegation AS112 service: {_ANYCAST} (RFC 7534)"),
    _r("198.18.0.0/15", C.BENCHMARKING, "benchmarking, not globally reachable (RFC 2544); the e2e tests' upstreams"),
    _r("198.51.100.0/24", C.DOCUMENTATION, "TEST-NET-2 (RFC 5737)"),
    _r("203.0.113.0/24", C.DOCUMENTATION, "TEST-NET-3 (RFC 5737)"),
    _r("240.0.0.0/4", C.RESERVED, "reserved for future use, not routed (RFC 1112)"),
    _r("255.255.255.255/32", C.BROADCAST, "limited broadcast: the local segment (RFC 919)"),
    # IANA IPv4 Multicast Address Space Registry
    _r("224.0.0.0/4", C.MULTICAST, "multicast, not a TCP destination (RFC 5771)"),
    # IANA IPv4 Address Space Registry: the rest is allocated unicast.
    _r("0.0.0.0/0", C.GLOBAL, "allocated unicast unless a more specific entry says otherwise"),
)
IPV6_RANGES: tuple[SpecialRange, ...] = (
    # IANA IPv6 Special-Purpose Address Registry. The IPv4-carrying prefixes
    # (::ffff:0:0/96, 64:ff9b::/96, 2002::/16, 2001::/32 Teredo, and ::/96 and
    # ::ffff:0:0:0/96 outside the registry) never reach this table: `embedded_ipv4`
    # unwraps them and the IPv4 address inside decides.
    _r("::/128", C.UNSPECIFIED, "unspecified: connecting to it reaches the host itself (RFC 4291)"),
    _r("::1/128", C.LOOPBACK, "loopback (RFC 4291)"),
    _r("64:ff9b:1::/48", C.RESERVED, "local-use IPv4/IPv6 translation: layout not fixed, internal (RFC 8215)"),
    _r("100::/64", C.RESERVED, "discard-only, remote-triggered black hole (RFC 6666)"),
    _r("100:0:0:1::/64", C.NOT_A_LOCATOR, "dummy IPv6 prefix: a source placeholder, never a destination (RFC 9780)"),
    _r("2001::/23", C.RESERVED, "IETF protocol assignments, not globally reachable (RFC 2928)"),
    _r("2001:1::1/128", C.RESERVED, f"Port Control Protocol anycast: {_ANYCAST} (RFC 7723)"),
    _r("2001:1::2/128", C.RESERVED, f"TURN anycast: {_ANYCAST} (RFC 8155)"),
    _r("2001:1::3/128", C.RESERVED, f"DNS-SD service registration protocol anycast: {_ANYCAST} (RFC 9665)"),
    _r("2001:2::/48", C.BENCHMARKING, "benchmarking, not globally reachable (RFC 5180); the e2e tests' IPv6 upstreams"),
    _r("2001:3::/32", C.RESERVED, f"AMT relays: {_ANYCAST} (RFC 7450)"),
    _r("2001:4:112::/48", C.RESERVED, f"AS112-v6: {_ANYCAST} (RFC 7535)"),
    _r("2001:10::/28", C.NOT_A_LOCATOR, "deprecated ORCHID: hash identifiers, not locators (RFC 4843)"),
    _r("2001:20::/28", C.NOT_A_LOCATOR, "ORCHIDv2: hash identifiers, not locators (RFC 7343)"),
    _r("2001:30::/28", C.NOT_A_LOCATOR, "DRIP entity tags: drone identifiers, not locators (RFC 9374)"),
    _r("2001:db8::/32", C.DOCUMENTATION, "documentation (RFC 3849)"),
    _r("2620:4f:8000::/48", C.RESERVED, f"direct delegation AS112 service: {_ANYCAST} (RFC 7534)"),
    _r("3fff::/20", C.DOCUMENTATION, "documentation (RFC 9637)"),
    _r("5f00::/16", C.RESERVED, "SRv6 segment identifiers: inside one SR domain, not global (RFC 9602)"),
    _r("fc00::/7", C.PRIVATE, "unique local (RFC 4193)"),
    _r("fe80::/10", C.LINK_LOCAL, "link-local unicast (RFC 4291)"),
    # IANA IPv6 Address Space Registry: only 2000::/3 is global unicast today.
    _r("::/0", C.RESERVED, "outside 2000::/3: reserved by the IETF, not global unicast (RFC 4291)"),
    _r("2000::/3", C.GLOBAL, "global unicast unless a more specific entry says otherwise (RFC 4291)"),
    _r("fec0::/10", C.RESERVED, "deprecated site-local: internal to a site (RFC 3879)"),
    _r("ff00::/8", C.MULTICAST, "multicast, not a TCP destination (RFC 4291)"),
)
del C
# Longest prefix first, so the first match is the most specific entry.
_IPV4_LOOKUP = tuple(sorted(IPV4_RANGES, key=lambda r: -r.network.prefixlen))
_IPV6_LOOKUP = tuple(sorted(IPV6_RANGES, key=lambda r: -r.network.prefixlen))
_IPV4_MAPPED = _N("::ffff:0:0/96")
_IPV4_TRANSLATED = _N("::ffff:0:0:0/96")
_IPV4_COMPATIBLE = _N("::/96")
_NAT64 = _N("64:ff9b::/96")
_SIX_TO_FOUR = _N("2002::/16")
_TEREDO = _N("2001::/32")

# Ordered from worst to most harmless, to pick the worst of several inner addresses.
_SEVERITY = (
    AddressClass.LOOPBACK,
    AddressClass.UNSPECIFIED,
    AddressClass.LINK_LOCAL,
    AddressClass.MULTICAST,
    AddressClass.BROADCAST,
    AddressClass.NOT_A_LOCATOR,
    AddressClass.PRIVATE,
    AddressClass.SHARED,
    AddressClass.RESERVED,
    AddressClass.DOCUMENTATION,
    AddressClass.BENCHMARKING,
    AddressClass.GLOBAL,
)


def embedded_ipv4(ip: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """IPv4 addresses an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return ()
    number = int(ip)
    low32 = ipaddress.IPv4Address(number & 0xFFFFFFFF)
    if ip in _IPV4_MAPPED or ip in _IPV4_TRANSLATED or ip in _NAT64:
        return (low32,)
    if ip in _IPV4_COMPATIBLE and number > 1:  # `::` and `::1` are themselves
        return (low32,)
    if ip in _SIX_TO_FOUR:
        return (ipaddress.IPv4Address(number >> 80 & 0xFFFFFFFF),)
    if (teredo := ip.teredo) is not None:  # 2001::/32: (server, client)
        return teredo
    return ()


def special_range(ip: IPAddress) -> SpecialRange:
    """The most specific table entry holding `ip` (the /0 entries hold every address)."""
    for entry in _IPV4_LOOKUP if ip.version == 4 else _IPV6_LOOKUP:
        if ip in entry.network:
            return entry
    raise AssertionError("unreachable: the /0 entries hold every address")


def _classify_plain(ip: IPAddress) -> AddressClass:
    return special_range(ip).address_class


def classify_address(ip: IPAddress) -> AddressClass:
    """The class of an address, judging IPv6 forms by the IPv4 address they carry."""
    inner = embedded_ipv4(ip)
    if not inner:
        return _classify_plain(ip)
    return min((_classify_plain(v4) for v4 in inner), key=_SEVERITY.index)


def forbidden_reason(ip: IPAddress, allow_cidrs: Iterable[IPNetwork] = ()) -> str | None:
    """Reason code for refusing `ip` (`loopback` or `forbidden_address`), or None if permitted."""
    address_class = classify_address(ip)
    if address_class in ALWAYS_FORBIDDEN:
        return "loopback" if address_class in LOOPBACK_LIKE else "forbidden_address"
    if address_class is AddressClass.GLOBAL:
        return None
    allow_cidrs = tuple(allow_cidrs)

    def allowed(a: IPAddress) -> bool:
        return any(a.version == n.version and a in n for n in allow_cidrs)

    if allowed(ip):
        return None
    # Teredo carries two addresses: every non-global one must be allowed, not just any one.
    inner = embedded_ipv4(ip)
    if inner and all(_classify_plain(v4) is AddressClass.GLOBAL or allowed(v4) for v4 in inner):
        return None
    return "forbidden_address"


def cidr_problem(network: IPNetwork) -> str | None:
    """Why `network` cannot be an `allowCidrs` entry, or None if it can."""
    for forbidden, address_class, _why in (*IPV4_RANGES, *IPV6_RANGES):
        if address_class in ALWAYS_FORBIDDEN and network.version == forbidden.version and network.overlaps(forbidden):
            return f"overlaps {forbidden} ({address_class.value}), which can never be allowed"
    if network.version == 6:
        for carrier in (_IPV4_MAPPED, _IPV4_COMPATIBLE, _NAT64, _SIX_TO_FOUR, _TEREDO):
            if network.overlaps(carrier) and network.prefixlen <= carrier.prefixlen:
                return f"covers the IPv4-embedding range {carrier}; list the IPv4 range instead"
    if all(_classify_plain(a) is AddressClass.GLOBAL for a in (network.network_address, network.broadcast_address)):
        return "is a global range, which is reachable without allowCidrs"
    return None
