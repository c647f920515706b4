"""`HOST:PORT` arguments (`--listen`, `--metrics-listen`, `--dns-listen`), checked
before anything listens, so a typo is one line naming the flag rather than a
mitmproxy error after the start-up banner.

IPv6 addresses are written in brackets (`[::1]:8080`, RFC 3986): without them
`::1:8080` cannot be split into an address and a port, so it is refused with
that advice instead of guessed.
"""

from __future__ import annotations

import ipaddress
import re
import socket


class HostPortError(ValueError):
    pass


# Dotted numbers that are not an IPv4 address (`300.1.1.1`, `1.2.3`): getaddrinfo
# would read some of them in the legacy inet_aton way, and no host name looks like this.
_NUMERIC = re.compile(r"[0-9.]+")
_EXAMPLE = "e.g. 127.0.0.1:8080 or [::1]:8080"


def parse_hostport(text: str, flag: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` / `[IPV6]:PORT`; raises HostPortError naming `flag`."""
    host, port_text = _split(text, flag)
    return _check_host(host, flag), _check_port(port_text, flag)


def _split(text: str, flag: str) -> tuple[str, str]:
    if text.startswith("["):
        inside, closed, rest = text[1:].partition("]")
        if not closed:
            raise HostPortError(f"{flag}: {text!r} has no closing ']' (expected [IPV6]:PORT, {_EXAMPLE})")
        if not rest:
            raise HostPortError(f"{flag}: {text!r} has no port (expected [IPV6]:PORT, e.g. {text}:8080)")
        if not rest.startswith(":"):
            raise HostPortError(f"{flag}: expected ':PORT' after ']' in {text!r} ({_EXAMPLE})")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise HostPortError(f"{flag}: {inside!r} in brackets is not an IPv6 address") from None
        return inside, rest[1:]
    if text.count(":") > 1:
        raise HostPortError(f"{flag}: an IPv6 address needs brackets, [HOST]:PORT (e.g. [::1]:8080), got {text!r}")
    host, sep, port = text.partition(":")
    if not sep:
        raise HostPortError(f"{flag}: expected HOST:PORT, got {text!r} (no port; {_EXAMPLE})")
    if not host:
        raise HostPortError(f"{flag}: expected HOST:PORT, got {text!r} (no host; 0.0.0.0 or [::] for every address)")
    return host, port


def _check_port(text: str, flag: str) -> int:
    digits = text.removeprefix("-")
    if not digits.isascii() or not digits.isdigit():
        raise HostPortError(f"{flag}: port {text!r} is not a number")
    port = int(text)
    if not 0 <= port <= 65535:
        raise HostPortError(f"{flag}: port {port} is out of range (0-65535)")
    return port


def _check_host(host: str, flag: str) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if _NUMERIC.fullmatch(host):
        raise HostPortError(f"{flag}: {host!r} is not an IPv4 address")
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise HostPortError(f"{flag}: cannot resolve host {host!r} ({reason})") from None
    return host


def check_can_listen(text: str, host: str, port: int, flag: str, transports: tuple[str, ...] = ("tcp",)) -> None:
    """Bind (and release) what the proxy is about to listen on, so an address in use or
    not on this machine is one line naming the flag, before the start-up banner, rather
    than mitmproxy's error after it. Port 0 (any free port) needs no check."""
    if port == 0:
        return
    for transport in transports:
        kind = socket.SOCK_STREAM if transport == "tcp" else socket.SOCK_DGRAM
        try:
            addresses = socket.getaddrinfo(host, port, type=kind, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise HostPortError(f"{flag} {text}: cannot resolve ({exc.strerror})") from None
        for family, socktype, proto, _, address in addresses:
            with socket.socket(family, socktype, proto) as sock:
                if transport == "tcp":  # as asyncio's servers do: a TIME_WAIT leftover is no conflict
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(address)
                except OSError as exc:
                    raise HostPortError(f"{flag} {text}: cannot listen on {transport.upper()} ({exc.strerror})") from None
