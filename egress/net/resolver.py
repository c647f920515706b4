"""The I/O half of address checking: name resolution and the proxy's own addresses."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import socket
import time
from pathlib import Path

from egress.policy.addresses import IPAddress
from egress.policy.domains import parse_ip_literal


class ResolveError(Exception):
    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code  # socket.EAI_* when getaddrinfo said why


async def resolve_family(host: str, version: int) -> list[IPAddress]:
    """The IPv4 (4) or IPv6 (6) addresses of a name, for a DNS A/AAAA answer.

    The same resolver as connections use (getaddrinfo: hosts file, then the
    proxy's resolv.conf), asked for one family so that an A query costs one lookup.
    """
    loop = asyncio.get_running_loop()
    family = socket.AF_INET if version == 4 else socket.AF_INET6
    try:
        infos = await loop.getaddrinfo(host, None, family=family, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ResolveError(str(exc), getattr(exc, "errno", 0) or 0) from None
    seen: dict[IPAddress, None] = {}
    for found_family, *_, sockaddr in infos:
        if found_family == family:
            seen.setdefault(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]), None)
    return list(seen)


async def resolve(host: str, port: int) -> list[IPAddress]:
    """All addresses of `host` (an IP literal resolves to itself), in resolver order, deduplicated."""
    literal = parse_ip_literal(host)
    if literal is not None:
        return [literal]
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise ResolveError(str(exc)) from None
    seen: dict[IPAddress, None] = {}
    for family, *_, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            seen.setdefault(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]), None)
    return list(seen)


def _linux_local_addresses() -> set[IPAddress]:
    found: set[IPAddress] = set()
    # IPv4: /proc/net/fib_trie lists every local address as a "/32 host LOCAL" leaf.
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for previous, line in itertools.pairwise(lines):
        if "/32 host LOCAL" in line:
            candidate = previous.strip().split()[-1]
            if (ip := parse_ip_literal(candidate)) is not None:
                found.add(ip)
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hexaddr = line.split()[0]
            found.add(ipaddress.IPv6Address(int(hexaddr, 16)))
    except (OSError, ValueError, IndexError):
        pass
    return found


class LocalAddresses:
    """Addresses of this machine (or network namespace), which a sandbox must not reach.

    Connecting to the proxy's own pod IP would reach the proxy's listeners (and
    anything else in the pod) from the inside. The set is re-read at most every few
    seconds so that addresses added later (a new interface) are covered too.
    """

    REFRESH_SECONDS = 5.0

    def __init__(self, listen_hosts: list[str]):
        self.listen_on(listen_hosts)

    def listen_on(self, listen_hosts: list[str]) -> None:
        """The proxy's own listen addresses (an unspecified one adds nothing beyond the machine's)."""
        self._explicit = {ip for h in listen_hosts if (ip := parse_ip_literal(h)) is not None}
        self._cached: set[IPAddress] = set()
        self._read_at = float("-inf")

    def __contains__(self, ip: IPAddress) -> bool:
        if ip in self._explicit:
            return True
        now = time.monotonic()
        if now - self._read_at > self.REFRESH_SECONDS:
            self._cached = _linux_local_addresses()
            self._read_at = now
        return ip in self._cached
