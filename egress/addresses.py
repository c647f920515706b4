"""Address classification: which IP addresses a sandbox may reach.

Pure functions. `ipaddress.is_global` is not enough: it calls
`64:ff9b::a9fe:a9fe` (NAT64 of 169.254.169.254), `2002:a9fe:a9fe::` (6to4)
and `::127.0.0.1` (IPv4-compatible) global. Every IPv6 form that carries an
IPv4 address is unwrapped and judged by the IPv4 address inside.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AddressClass(enum.StrEnum):
    GLOBAL = "global"
    LOOPBACK = "loopback"
    UNSPECIFIED = "unspecified"
    LINK_LOCAL = "link_local"
    MULTICAST = "multicast"
    BROADCAST = "broadcast"
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
    }
)
# Classes whose block reason is `loopback`: connecting to 0.0.0.0 or :: reaches the host itself.
LOOPBACK_LIKE = frozenset({AddressClass.LOOPBACK, AddressClass.UNSPECIFIED})

_N = ipaddress.ip_network
_IPV4_TABLE: tuple[tuple[IPNetwork, AddressClass], ...] = (
    (_N("0.0.0.0/8"), AddressClass.UNSPECIFIED),
    (_N("127.0.0.0/8"), AddressClass.LOOPBACK),
    (_N("169.254.0.0/16"), AddressClass.LINK_LOCAL),
    (_N("224.0.0.0/4"), AddressClass.MULTICAST),
    (_N("255.255.255.255/32"), AddressClass.BROADCAST),
    (_N("10.0.0.0/8"), AddressClass.PRIVATE),
    (_N("172.16.0.0/12"), AddressClass.PRIVATE),
    (_N("192.168.0.0/16"), AddressClass.PRIVATE),
    (_N("100.64.0.0/10"), AddressClass.SHARED),
    (_N("192.0.2.0/24"), AddressClass.DOCUMENTATION),
    (_N("198.51.100.0/24"), AddressClass.DOCUMENTATION),
    (_N("203.0.113.0/24"), AddressClass.DOCUMENTATION),
    (_N("198.18.0.0/15"), AddressClass.BENCHMARKING),
    (_N("192.0.0.0/24"), AddressClass.RESERVED),
    (_N("192.88.99.0/24"), AddressClass.RESERVED),
    (_N("240.0.0.0/4"), AddressClass.RESERVED),
)
_IPV6_TABLE: tuple[tuple[IPNetwork, AddressClass], ...] = (
    (_N("::/128"), AddressClass.UNSPECIFIED),
    (_N("::1/128"), AddressClass.LOOPBACK),
    (_N("fe80::/10"), AddressClass.LINK_LOCAL),
    (_N("ff00::/8"), AddressClass.MULTICAST),
    (_N("fc00::/7"), AddressClass.PRIVATE),
    (_N("fec0::/10"), AddressClass.RESERVED),  # deprecated site-local
    (_N("2001:db8::/32"), AddressClass.DOCUMENTATION),
    (_N("3fff::/20"), AddressClass.DOCUMENTATION),
    (_N("2001:2::/48"), AddressClass.BENCHMARKING),
    (_N("64:ff9b:1::/48"), AddressClass.RESERVED),  # local-use NAT64, layout not fixed
    (_N("100::/64"), AddressClass.RESERVED),  # discard-only
)
_IPV4_MAPPED = _N("::ffff:0:0/96")
_IPV4_TRANSLATED = _N("::ffff:0:0:0/96")
_IPV4_COMPATIBLE = _N("::/96")
_NAT64 = _N("64:ff9b::/96")
_SIX_TO_FOUR = _N("2002::/16")
_TEREDO = _N("2001::/32")
_GLOBAL_UNICAST = _N("2000::/3")

# Ordered from worst to most harmless, to pick the worst of several inner addresses.
_SEVERITY = (
    AddressClass.LOOPBACK,
    AddressClass.UNSPECIFIED,
    AddressClass.LINK_LOCAL,
    AddressClass.MULTICAST,
    AddressClass.BROADCAST,
    AddressClass.PRIVATE,
    AddressClass.SHARED,
    AddressClass.RESERVED,
    AddressClass.DOCUMENTATION,
    AddressClass.BENCHMARKING,
    AddressClass.GLOBAL,
)


def embedded_ipv4(ip: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """IPv4 addresses an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if ip.version != 6:
        return ()
    number = int(ip)
    low32 = ipaddress.IPv4Address(number & 0xFFFFFFFF)
    if ip in _IPV4_MAPPED or ip in _IPV4_TRANSLATED or ip in _NAT64:
        return (low32,)
    if ip in _IPV4_COMPATIBLE and number > 1:  # `::` and `::1` are themselves
        return (low32,)
    if ip in _SIX_TO_FOUR:
        return (ipaddress.IPv4Address(number >> 80 & 0xFFFFFFFF),)
    if ip in _TEREDO:
        server, client = ip.teredo  # type: ignore[misc]
        return (server, client)
    return ()


def _classify_plain(ip: IPAddress) -> AddressClass:
    table = _IPV4_TABLE if ip.version == 4 else _IPV6_TABLE
    for network, address_class in table:
        if ip in network:
            return address_class
    if ip.version == 6 and ip not in _GLOBAL_UNICAST:
        return AddressClass.RESERVED
    return AddressClass.GLOBAL if ip.is_global else AddressClass.RESERVED


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
    for table in (_IPV4_TABLE, _IPV6_TABLE):
        for forbidden, address_class in table:
            if address_class in ALWAYS_FORBIDDEN and network.version == forbidden.version and network.overlaps(forbidden):
                return f"overlaps {forbidden} ({address_class.value}), which can never be allowed"
    if network.version == 6:
        for carrier in (_IPV4_MAPPED, _IPV4_COMPATIBLE, _NAT64, _SIX_TO_FOUR, _TEREDO):
            if network.overlaps(carrier) and network.prefixlen <= carrier.prefixlen:
                return f"covers the IPv4-embedding range {carrier}; list the IPv4 range instead"
    if all(_classify_plain(a) is AddressClass.GLOBAL for a in (network.network_address, network.broadcast_address)):
        return "is a global range, which is reachable without allowCidrs"
    return None
