"""The mitmproxy modes a proxy listens with: its own, and the `dns@` listeners.

On loopback each listens on both loopbacks: nftables `redirect` delivers IPv4
connections to 127.0.0.1 and IPv6 ones to ::1.
"""

from __future__ import annotations

from pathlib import Path


def listen_modes(mode: str, listen_host: str, listen_port: int) -> list[str]:
    """mitmproxy modes to run; transparent on loopback listens on both loopbacks.

    nftables `redirect` delivers redirected IPv4 connections to 127.0.0.1 and IPv6
    ones to ::1, so a transparent proxy on one loopback also takes the other (IPv6
    only where the namespace has ::1), staying unreachable from outside the pod.
    """
    if mode != "transparent":
        return [mode]
    return [mode, *(f"transparent@{other}:{listen_port}" for other in _loopback_hosts(listen_host)[1:])]


def dns_modes(host: str, port: int) -> list[str]:
    """The `dns@` listeners (UDP and TCP each); on loopback both loopbacks, as `listen_modes`.

    The sandbox's redirected DNS arrives on 127.0.0.1 (IPv4) or ::1 (IPv6 packets to
    port 53), like its TCP.
    """
    return [f"dns@{h}:{port}" for h in _loopback_hosts(host)]


def _loopback_hosts(host: str) -> list[str]:
    """`host`, and the other loopback when `host` is one (::1 only where the namespace has it)."""
    other = {"127.0.0.1": "::1", "::1": "127.0.0.1"}.get(host)
    if other is None or (other == "::1" and not _has_ipv6_loopback()):
        return [host]
    return [host, other]


def _has_ipv6_loopback() -> bool:
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[0] == "0" * 31 + "1" for line in lines if line.strip())

