"""The proxy's own calls to token endpoints (OAuth2, Google, GitHub, STS).

- TLS verified against the same roots as upstream connections (certifi plus
  `--upstream-ca`); `https` only (the spec parser refuses anything else).
- The token host is resolved here and every address classified like a sandbox's
  destination: loopback, link-local (cloud metadata) and the other forbidden ranges
  are never dialled unless the environment's `allowCidrs` permits them, so a spec
  cannot point the proxy at an internal service. The checked address is dialled;
  the name stays the TLS server name.
- With `--upstream-proxy` every call is a CONNECT through the parent (which then
  resolves the token host, as it would for any client of it).
- A total deadline (`egress_credential_timeout`) and a connect deadline
  (`egress_connect_timeout`); answers larger than MAX_REPLY are refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import ssl
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpcore

from egress.net.parent_proxy import ParentProxy
from egress.policy.addresses import IPNetwork, forbidden_reason
from egress.policy.domains import is_loopback_name

MAX_REPLY = 1024 * 1024  # a token answer is a few KiB


class FetchFailed(Exception):
    """A token call that did not yield a token; the message is safe to log (no secret)."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            raise FetchFailed(f"token endpoint answered {self.status} with a body that is not JSON") from None
        if not isinstance(data, dict):
            raise FetchFailed(f"token endpoint answered {self.status} with JSON that is not an object")
        return data


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Dials token hosts only at addresses the address policy permits."""

    def __init__(self, allow_cidrs: tuple[IPNetwork, ...], parent: ParentProxy | None):
        self._inner = httpcore.AnyIOBackend()
        self._allow_cidrs = allow_cidrs
        self._parent = parent

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if self._parent is None:  # with a parent, this is the parent itself (the operator's)
            host = await self._checked_address(host)
        return await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)

    async def _checked_address(self, host: str) -> str:
        if is_loopback_name(host):
            raise httpcore.ConnectError(f"token host {host} is a loopback name")
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise httpcore.ConnectError(f"token host {host} does not resolve") from None
        reasons = []
        for *_, sockaddr in infos:
            ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            reason = forbidden_reason(ip, self._allow_cidrs)
            if reason is None:
                return str(ip)
            reasons.append(reason)
        raise httpcore.ConnectError(f"token host {host} resolves to no permitted address ({', '.join(sorted(set(reasons)))})")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@dataclass
class TokenClient:
    ca_file: str | None = None  # None: certifi's roots
    parent: ParentProxy | None = None
    timeout: float = 10.0
    connect_timeout: float = 10.0

    def _ssl_context(self) -> ssl.SSLContext:
        if self.ca_file:
            return ssl.create_default_context(cafile=self.ca_file)
        import certifi

        return ssl.create_default_context(cafile=certifi.where())

    def _pool(self, allow_cidrs: tuple[IPNetwork, ...]) -> httpcore.AsyncConnectionPool:
        backend = _CheckedBackend(allow_cidrs, self.parent)
        if self.parent is None:
            return httpcore.AsyncConnectionPool(ssl_context=self._ssl_context(), network_backend=backend)
        headers = []
        if self.parent.authorization is not None:
            headers.append((b"Proxy-Authorization", self.parent.authorization.header().reveal().encode()))
        host = f"[{self.parent.host}]" if ":" in self.parent.host else self.parent.host
        return httpcore.AsyncHTTPProxy(
            proxy_url=f"http://{host}:{self.parent.port}",
            proxy_headers=headers,
            ssl_context=self._ssl_context(),
            network_backend=backend,
        )

    async def post(
        self,
        url: str,
        *,
        form: Mapping[str, str] | None = None,
        json_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        allow_cidrs: tuple[IPNetwork, ...] = (),
        body: bytes | None = None,
    ) -> Reply:
        """POST to a token endpoint; raises FetchFailed (naming the host, never a secret)."""
        sent = dict(headers or {})
        if form is not None:
            body = urlencode(form).encode()
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        elif json_body is not None:
            body = json.dumps(json_body).encode()
            sent.setdefault("Content-Type", "application/json")
        sent.setdefault("Accept", "application/json")
        sent.setdefault("User-Agent", "egress-proxy")
        host = urlsplit(url).hostname or "?"
        try:
            return await asyncio.wait_for(self._post(url, body or b"", sent, allow_cidrs), self.timeout)
        except TimeoutError:
            raise FetchFailed(f"token call to {host} timed out after {self.timeout:g} s") from None
        except httpcore.ConnectError as exc:
            raise FetchFailed(f"token call to {host}: cannot connect ({_first_line(exc)})") from None
        except httpcore.TimeoutException:
            raise FetchFailed(f"token call to {host} timed out") from None
        except (httpcore.ProxyError, httpcore.NetworkError, httpcore.ProtocolError, ssl.SSLError, OSError) as exc:
            raise FetchFailed(f"token call to {host} failed ({type(exc).__name__}: {_first_line(exc)})") from None

    async def _post(self, url: str, body: bytes, headers: dict[str, str], allow_cidrs: tuple[IPNetwork, ...]) -> Reply:
        timeouts = {"connect": self.connect_timeout, "read": self.timeout, "write": self.timeout, "pool": self.timeout}
        async with self._pool(allow_cidrs) as pool:
            async with pool.stream(
                "POST", url, headers=list(headers.items()), content=body, extensions={"timeout": timeouts}
            ) as response:
                data = bytearray()
                async for chunk in typing.cast(typing.AsyncIterable[bytes], response.stream):
                    data += chunk
                    if len(data) > MAX_REPLY:
                        raise FetchFailed(f"token endpoint answered more than {MAX_REPLY} bytes")
                return Reply(response.status, bytes(data))


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
