"""Send one DNS query to the proxy's own resolver and return its answer (report mode only).

Enforce mode never forwards a query: allowlisted A/AAAA are resolved through
getaddrinfo (egress.net.resolver) and everything else is answered locally. Report mode
lets a would-be-blocked query through, as it lets connections through; this is
that path: UDP to the first `nameserver` of the proxy's resolv.conf, TCP when the
answer comes back truncated.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from egress.policy.domains import parse_ip_literal

TIMEOUT_SECONDS = 3.0
_LENGTH = struct.Struct("!H")


class ForwardError(Exception):
    pass


def nameservers(resolv_conf: str) -> list[str]:
    """`nameserver` addresses of a resolv.conf text, in order (scoped IPv6 kept out)."""
    found = []
    for line in resolv_conf.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver" and parse_ip_literal(fields[1]) is not None:
            found.append(fields[1])
    return found


def system_nameserver(path: str = "/etc/resolv.conf") -> str:
    try:
        servers = nameservers(Path(path).read_text())
    except OSError as exc:
        raise ForwardError(f"cannot read {path}: {exc.strerror}") from None
    if not servers:
        raise ForwardError(f"no nameserver in {path}")
    return servers[0]


class _OneAnswer(asyncio.DatagramProtocol):
    def __init__(self, ident: bytes):
        self.ident = ident
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr) -> None:
        if data[:2] == self.ident and not self.answer.done():
            self.answer.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():
            self.answer.set_exception(ForwardError(str(exc)))


async def forward(query: bytes, server: str, port: int = 53) -> bytes:
    """The upstream answer to `query` (wire format); TCP when UDP's is truncated."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            transport, protocol = await loop.create_datagram_endpoint(
                lambda: _OneAnswer(query[:2]), remote_addr=(server, port)
            )
            try:
                transport.sendto(query)
                answer = await protocol.answer
            finally:
                transport.close()
            if len(answer) > 2 and answer[2] & 0x02:  # TC
                reader, writer = await asyncio.open_connection(server, port)
                try:
                    writer.write(_LENGTH.pack(len(query)) + query)
                    (size,) = _LENGTH.unpack(await reader.readexactly(2))
                    answer = await reader.readexactly(size)
                finally:
                    writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        raise ForwardError(f"{server}: {type(exc).__name__}") from None
    return answer
