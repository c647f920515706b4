"""Dial a checked upstream address before a tunnel is answered (CONNECT `200`).

squid, smokescreen and Envoy answer a CONNECT whose upstream cannot be reached
with an error the client can read; answering `200` and then resetting the tunnel
leaves the agent with a TLS error. The address dialled is the one the
destination check returned; nothing here resolves a name.
"""

from __future__ import annotations

import asyncio
import errno
import socket

from egress.net import parent_proxy
from egress.net.relay import Side
from egress.policy.addresses import IPAddress
from egress.policy.reasons import UPSTREAM_REASONS, UPSTREAM_REFUSED, UPSTREAM_TIMEOUT, UPSTREAM_UNREACHABLE

REASONS = UPSTREAM_REASONS
STATUS = {UPSTREAM_REFUSED: 502, UPSTREAM_UNREACHABLE: 502, UPSTREAM_TIMEOUT: 504}
_REFUSED_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE}


class DialFailed(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail  # for the proxy's own log (parent proxy answers); never sent to the client


def failure_reason(exc: BaseException) -> str:
    """Reason code for an exception raised while connecting."""
    if isinstance(exc, TimeoutError):
        return UPSTREAM_TIMEOUT
    if isinstance(exc, ConnectionError) or getattr(exc, "errno", None) in _REFUSED_ERRNOS:
        return UPSTREAM_REFUSED
    return UPSTREAM_UNREACHABLE  # EHOSTUNREACH, ENETUNREACH, EADDRNOTAVAIL, ...


async def dial(
    address: IPAddress, port: int, timeout: float | None, parent: parent_proxy.ParentProxy | None = None
) -> Side:
    """Connect to exactly `address` (through `parent` with `CONNECT address:port` when one is
    configured; the timeout then covers the parent's answer); the returned side is paused
    until a relay takes it."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout or None):
            if parent is not None:
                return await parent_proxy.open_tunnel(parent, str(address), port)
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            _, side = await loop.create_connection(Side, str(address), port, family=family)
    except parent_proxy.ParentReplyError as exc:
        raise DialFailed(exc.reason, exc.detail) from None
    except (OSError, TimeoutError) as exc:
        reason = failure_reason(exc)
        detail = ""
        if parent is not None and isinstance(exc, TimeoutError):
            detail = f"parent proxy {parent.label}: no tunnel within --connect-timeout"
        elif parent is not None:
            detail = f"parent proxy {parent.label} cannot be reached ({type(exc).__name__})"
        raise DialFailed(reason, detail) from None
    return side
