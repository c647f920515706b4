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
- filter output: replies of connections opened from outside pass; the proxy's own
  traffic and loopback pass; DNS (UDP and TCP) only to the configured resolvers;
  every other UDP datagram (QUIC, DNS elsewhere, ...) and any TCP that was not
  redirected are dropped, as are ICMP echo requests (ping tunnels).

The script deletes and re-creates the table in one transaction, so applying it
again replaces the rules instead of adding to them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

TABLE = "egress_redirect"
DEFAULT_PROXY_PORT = 8080
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
        "# replies of connections opened from outside the namespace",
        "ct direction reply accept",
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
        "# all other UDP (QUIC falls back to TCP), TCP that escaped the redirect",
        "meta l4proto { tcp, udp } counter drop",
        "# the other transports an unprivileged process can send on: DCCP, L2TP/IP, SCTP, UDP-Lite",
        "# (kernel permitting); each would otherwise leave as it is",
        "meta l4proto { 33, 115, 132, 136 } counter drop",
        "# ping tunnels",
        "icmp type echo-request drop",
        "icmpv6 type echo-request drop",
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
        *chain("nat_output", "type nat hook output priority -100; policy accept;", nat),
        "",
        *chain(
            "filter_output",
            "type filter hook output priority 0; policy accept;",
            filter_,
        ),
        "}",
    ]
    return "\n".join(lines) + "\n"
