"""nftables rules that make a sandbox's network namespace go through the proxy.

Pure text generation (no I/O): `egress-proxy redirect-rules` prints the script and,
with `--apply`, pipes it to `nft -f -`. One `inet` table covers IPv4 and IPv6:

- nat output: every new outbound TCP connection is redirected to the proxy port on
  loopback (nftables maps locally generated IPv4 to 127.0.0.1, IPv6 to ::1), except
  the proxy's own connections (by uid and/or mark), connections to the proxy port
  on loopback itself, and TCP DNS to the configured resolvers.
- with `--dns-port`: every UDP and TCP packet to port 53, whatever its address
  (another resolver, a loopback stub such as 127.0.0.53, IPv6), is redirected to the
  proxy's DNS listener on loopback first; the proxy's own queries are exempt like
  its connections and reach the real resolver. `--dns IP` (the weaker option: the
  resolver still forwards whatever the sandbox asks) cannot be combined with it.
- filter output, default drop: nothing from a loopback source leaves by another
  interface; replies of connections opened from outside pass; the
  proxy's own traffic passes; redirected connections and datagrams pass; TCP on
  loopback passes (nat leaves only the proxy port there); with `--dns`, DNS (UDP and
  TCP) to those resolvers. Everything else a process sends is dropped: other UDP
  (QUIC, DNS elsewhere), TCP that escaped the redirect, every other IP protocol
  (GRE, IPIP, ESP, SCTP, UDP-Lite, ...), every ICMP/ICMPv6 type (ping and ICMP
  tunnels), raw IP of any kind (a sandbox with CAP_NET_RAW). Of the packets the
  kernel sends by itself (no socket, so no uid) only these pass: neighbour
  discovery and MLD reports on the link (IPv6 needs them) and the proxy's TCP
  connections after it closed them (the last ACKs come from a socket with no owner).
- with `--dns-port`, a raw (conntrack) chain keeps the proxy's own DNS queries in
  their own conntrack zone, see `_zone_rules`.

The script deletes and re-creates the table in one transaction, so applying it
again replaces the rules instead of adding to them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

TABLE = "egress_redirect"
DEFAULT_PROXY_PORT = 8080
# The conntrack zone of the proxy's own DNS queries (any id no other tool in the
# namespace uses; "EG"): see _zone_rules.
PROXY_CT_ZONE = 0x4547
# Whatever a process sends has a socket with an owner: this matches any uid.
_ANY_UID = "0-4294967295"
# ICMPv6 the kernel sends for IPv6 to work on a link: neighbour discovery always has hop
# limit 255 (RFC 4861), MLD reports hop limit 1 (RFC 3810); neither crosses a router.
_ND = "nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert"
_MLD = "mld-listener-report, mld2-listener-report"
_MAX_MARK = 2**32 - 1


class RulesError(ValueError):
    """An argument that cannot be turned into a rule (one line, names the flag)."""


def _check_port(flag: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise RulesError(f"{flag}: {port} is out of range (1-65535)")


def _check(proxy_port: int, proxy_uid: int | None, proxy_mark: int | None) -> None:
    if proxy_uid is None and proxy_mark is None:
        raise RulesError(
            "--proxy-uid or --proxy-mark is required: without an exemption the proxy's own "
            "connections would be redirected back to itself"
        )
    _check_port("--proxy-port", proxy_port)
    if proxy_uid is not None and not 0 <= proxy_uid <= _MAX_MARK - 1:
        raise RulesError(f"--proxy-uid: {proxy_uid} is not a valid uid")
    if proxy_mark is not None and not 1 <= proxy_mark <= _MAX_MARK:
        raise RulesError(f"--proxy-mark: {proxy_mark} is out of range (1-0xffffffff)")


def parse_resolvers(values: Iterable[str]) -> tuple[list[str], list[str]]:
    """IPv4 and IPv6 resolver addresses, each validated, in the order given, deduplicated."""
    v4: list[str] = []
    v6: list[str] = []
    for value in values:
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            ip = None
        if ip is None or "%" in text:  # nftables has no scoped (fe80::1%eth0) addresses
            raise RulesError(f"--dns: {value!r} is not an IPv4 or IPv6 address")
        target = v4 if ip.version == 4 else v6
        if str(ip) not in target:
            target.append(str(ip))
    return v4, v6


def _set(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def _zone_rules(exempt: list[str]) -> list[str]:
    """Keep the proxy's DNS queries apart from the sandbox's in conntrack.

    The proxy and the sandbox share the namespace's addresses, and both send UDP to the
    resolver's port 53. The nat chain sees only the first packet of a flow; a sandbox
    datagram from the port a proxy query left from moments before (its socket closed,
    its conntrack entry alive for 30 s) was a packet of the proxy's flow: not redirected,
    dropped by the filter, EPERM for the sender; and a proxy query from the port a
    sandbox query just used was redirected to the proxy's own listener. Tracked in a zone
    of their own in the original direction, the proxy's queries match only themselves;
    their answers arrive in the default zone and are matched as usual (the reply
    direction is not zoned). Only queries: a zone on every packet of the proxy's would
    also catch its answers on loopback to redirected connections, which must find the
    sandbox's entries to be translated back.
    """
    return [
        "# the proxy's DNS queries are tracked in a conntrack zone of their own (original",
        "# direction), so a sandbox datagram from a port a query just used is never taken for",
        "# part of it (and escapes the redirect), nor the reverse",
        *(f"{match} udp dport 53 ct original zone set {PROXY_CT_ZONE}" for match in exempt),
    ]


def render_rules(
    *,
    proxy_port: int = DEFAULT_PROXY_PORT,
    proxy_uid: int | None = None,
    proxy_mark: int | None = None,
    dns: Iterable[str] = (),
    dns_port: int | None = None,
) -> str:
    """The nftables script for one sandbox namespace (see the module docstring)."""
    _check(proxy_port, proxy_uid, proxy_mark)
    dns_v4, dns_v6 = parse_resolvers(dns)
    if dns_port is not None:
        _check_port("--dns-port", dns_port)
        if dns_v4 or dns_v6:
            raise RulesError("--dns and --dns-port exclude each other: with --dns-port no resolver is reached directly")
        if dns_port == proxy_port:
            raise RulesError(f"--dns-port: {dns_port} is the proxy port")

    exempt: list[str] = []
    if proxy_uid is not None:
        exempt.append(f"meta skuid {proxy_uid}")
    if proxy_mark is not None:
        exempt.append(f"meta mark 0x{proxy_mark:08x}")
    dns_rules: list[tuple[str, str]] = []
    if dns_v4:
        dns_rules.append(("ip", _set(dns_v4)))
    if dns_v6:
        dns_rules.append(("ip6", _set(dns_v6)))

    zone = _zone_rules(exempt) if dns_port is not None else []
    nat = [
        "# the proxy's own connections go out as they are",
        *(f"{match} return" for match in exempt),
        "# the proxy itself, reached on loopback",
        f"ip daddr 127.0.0.0/8 tcp dport {proxy_port} return",
        f"ip6 daddr ::1 tcp dport {proxy_port} return",
    ]
    if dns_port is not None:
        nat += [
            "# DNS, UDP and TCP, to any address (loopback stubs, IPv6 included): the proxy's DNS listener",
            f"meta l4proto {{ tcp, udp }} th dport 53 redirect to :{dns_port}",
        ]
    if dns_rules:
        nat.append("# DNS over TCP (truncated answers) to the configured resolvers")
        nat += [
            f"{family} daddr {addrs} tcp dport 53 return" for family, addrs in dns_rules
        ]
    nat += [
        "# everything else: the proxy decides from TLS SNI / HTTP Host",
        f"meta l4proto tcp redirect to :{proxy_port}",
    ]

    filter_ = [
        "# nothing from a loopback address leaves: the proxy's answer to a datagram a process sent",
        "# (raw socket) from a forged source to a redirected port would go to that address, over",
        "# IPv6, which routes a loopback source (nat restores the original address after this)",
        'oif != "lo" ip saddr 127.0.0.0/8 drop',
        'oif != "lo" ip6 saddr ::1 drop',
        "# replies of connections opened from outside the namespace (ICMP errors about them too)",
        "ct direction reply accept",
        "# the proxy's own traffic",
        *(f"{match} accept" for match in exempt),
        "# TCP (and, with --dns-port, DNS) the nat chain redirected to the proxy (the output",
        "# interface is still the original route's here)",
        "ct status dnat accept",
        "# TCP on loopback not redirected: only the proxy port (nat returns nothing else). Not UDP:",
        "# loopback is shared with the proxy and any other sidecar in the pod",
        'oif "lo" meta l4proto tcp accept',
    ]
    if dns_rules:
        filter_.append("# DNS only to the configured resolvers")
        filter_ += [
            f"{family} daddr {addrs} meta l4proto {{ tcp, udp }} th dport 53 accept"
            for family, addrs in dns_rules
        ]
    filter_ += [
        "# anything else a process sends (it has a socket, so a uid) is dropped: other UDP (QUIC",
        "# falls back to TCP), TCP that escaped the redirect, every other IP protocol (GRE, IPIP,",
        "# ESP, SCTP, UDP-Lite, ...), every ICMP type (ping and ICMP tunnels), raw IP (CAP_NET_RAW)",
        f"meta skuid {_ANY_UID} counter drop",
        "# the kernel's own packets (no socket owner) that pass: the last ACKs and retransmissions",
        "# of the proxy's TCP connections after it closed them (the sandbox's TCP was redirected,",
        "# or is DNS accepted above), and what IPv6 needs on the link: router and neighbour",
        "# solicitations, neighbour advertisements, MLD reports",
        "meta l4proto tcp ct state established ct direction original accept",
        f"icmpv6 type {{ {_ND} }} ip6 hoplimit 255 accept",
        f"icmpv6 type {{ {_MLD} }} ip6 hoplimit 1 accept",
        "# nothing else leaves (the policy is drop too; this counts it)",
        "counter drop",
    ]

    def chain(name: str, hook: str, rules: list[str]) -> list[str]:
        body = [f"\t\t{line}" for line in rules]
        return [f"\tchain {name} {{", f"\t\t{hook}", *body, "\t}"]

    lines = [
        f"# egress-proxy redirect-rules: sandbox egress through the proxy on port {proxy_port}",
        "# (re-applying replaces the table: it is deleted and re-created in one transaction)",
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        *(chain("zone_output", "type filter hook output priority raw; policy accept;", zone) + [""] if zone else []),
        *chain("nat_output", "type nat hook output priority -100; policy accept;", nat),
        "",
        *chain(
            "filter_output",
            "type filter hook output priority 0; policy drop;",
            filter_,
        ),
        "}",
    ]
    return "\n".join(lines) + "\n"
