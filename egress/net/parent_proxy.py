"""A parent proxy (`--upstream-proxy`): every upstream connection is a CONNECT tunnel through it.

Corporate networks often let nothing out but their own proxy. The proxy still
checks the destination name, resolves it and classifies every address itself;
what it asks the parent for is `CONNECT <checked-ip>:<port>`, never the name, so
the parent has no name to resolve differently. Plain HTTP goes the same way
(`CONNECT ip:80`, then the request inside the tunnel): one code path, and the
Host header reaches the destination unchanged (squid rewrites the Host header of
an absolute-form request to the URL's authority, which would be the IP).

Pure parts (URL and credential parsing, the request and the reply parser) are
here; `open_tunnel` is the small I/O shell used by `egress.net.upstream.dial`.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from egress.net.relay import Side
from egress.policy import secrets

logger = logging.getLogger(__name__)
MAX_REPLY_HEAD = 16 * 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")


class ParentProxyError(ValueError):
    """A bad --upstream-proxy / --upstream-proxy-auth; the message never contains a secret."""


class ParentReplyError(Exception):
    """The parent did not open the tunnel; `detail` is safe to log (no secret, no client data)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class ParentCredentials:
    """`--upstream-proxy-auth`: read at start (a bad reference stops the start), and read
    again before each CONNECT when it names files, so a rotated secret file (a Kubernetes
    Secret update) is used without a restart. If a later read fails, the last good value
    is kept and the problem logged once."""

    def __init__(self, reference: str, environ: Mapping[str, str] | None = None) -> None:
        self._reference = reference
        self._environ = environ
        self._rereads = bool(secrets.referenced_files(reference))
        self._value = _authorization(reference, environ)
        self._problem = ""

    def header(self) -> secrets.Secret:
        """The `Proxy-Authorization` value to send now."""
        if self._rereads:
            try:
                self._value = _authorization(self._reference, self._environ)
                self._problem = ""
            except ParentProxyError as exc:
                if str(exc) != self._problem:
                    self._problem = str(exc)
                    logger.warning("%s; the parent proxy gets the credentials read before", exc)
        return self._value

    def __repr__(self) -> str:
        return "<parent proxy credentials>"


@dataclass(frozen=True)
class ParentProxy:
    host: str  # name or IP literal (without brackets); chosen by the operator, not the sandbox
    port: int
    authorization: ParentCredentials | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse(url: str, auth: str | None = None, environ: Mapping[str, str] | None = None) -> ParentProxy:
    """`http://HOST:PORT` plus an optional `USER:PASSWORD` reference; raises ParentProxyError."""
    flag = "--upstream-proxy"
    if "@" in url:  # checked first: a password with '/' or '#' in it confuses URL parsing
        raise ParentProxyError(
            f"{flag}: credentials in the URL would show in `ps` and in logs; "
            "give them by reference with --upstream-proxy-auth 'USER:${file:/path}'"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ParentProxyError(f"{flag} {_shown(url)}: not a valid URL ({exc})") from None
    if parts.scheme == "https":
        raise ParentProxyError(f"{flag} {_shown(url)}: TLS to the parent proxy is not supported; use http://HOST:PORT")
    if parts.scheme != "http":
        raise ParentProxyError(f"{flag} {_shown(url)}: expected http://HOST:PORT")
    host = parts.hostname or ""
    if not host:
        raise ParentProxyError(f"{flag} {_shown(url)}: no host")
    if port is None:
        raise ParentProxyError(f"{flag} {_shown(url)}: no port (http://HOST:PORT)")
    if port == 0:
        raise ParentProxyError(f"{flag} {_shown(url)}: port 0")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ParentProxyError(f"{flag} {_shown(url)}: expected http://HOST:PORT, nothing after the port")
    if parts.netloc.startswith("[") != (":" in host):
        raise ParentProxyError(f"{flag} {_shown(url)}: IPv6 addresses go in brackets, http://[ADDR]:PORT")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ParentProxyError(f"{flag} {_shown(url)}: {host!r} is not an IPv6 address") from None
    return ParentProxy(host, port, ParentCredentials(auth, environ) if auth is not None else None)


def _authorization(reference: str, environ: Mapping[str, str] | None) -> secrets.Secret:
    flag = "--upstream-proxy-auth"
    if "${" not in reference.replace("$${", ""):
        raise ParentProxyError(
            f"{flag}: a literal password would show in `ps` output; "
            "use a reference such as 'USER:${file:/run/secrets/parent-password}' or '${env:NAME}'"
        )
    try:
        value = secrets.expand(reference, environ).reveal()
    except secrets.SecretReferenceError as exc:
        raise ParentProxyError(f"{flag}: {exc}") from None
    user, sep, _ = value.partition(":")
    if not sep or not user:
        raise ParentProxyError(f"{flag}: expected USER:PASSWORD once the references are read (no ':' or no user)")
    if any(c in value for c in "\r\n\0"):
        raise ParentProxyError(f"{flag}: the user or password contains a line break or NUL")
    token = base64.b64encode(value.encode("utf-8")).decode("ascii")
    return secrets.Secret(f"Basic {token}")


def _shown(url: str) -> str:
    return repr(url[:200])  # never holds credentials: a URL with '@' is refused before


def authority(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def connect_request(address: str, port: int, authorization: secrets.Secret | None) -> bytes:
    """The CONNECT we send: the checked IP, never a name; our credentials, never the client's."""
    target = authority(address, port)
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization.reveal()}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


# The parent's answer -> our reason code (SPEC §7 names). 502/503: the parent could not
# reach the destination (squid answers 503 to a refused or unreachable one); 504: its
# connect timed out; anything else that is not 2xx is a refusal (403 policy, 407 our
# credentials, 5xx of its own), answered 502 upstream_refused.
def reason_for_status(status: int) -> str | None:
    if 200 <= status < 300:
        return None
    if status in (502, 503):
        return "upstream_unreachable"
    if status == 504:
        return "upstream_timeout"
    return "upstream_refused"


def parse_reply(head: bytes) -> int:
    """Status code of the parent's reply head (up to and including the blank line).

    Raises ParentReplyError (upstream_refused) for anything that is not an HTTP/1.x reply.
    """
    status_line, _, _ = head.partition(b"\r\n")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise ParentReplyError("upstream_refused", "parent proxy sent a malformed reply to CONNECT")
    status = int(match.group(1))
    if status < 200:  # 1xx to a CONNECT is not something we wait through
        raise ParentReplyError("upstream_refused", f"parent proxy answered {status} to CONNECT")
    return status


def describe_status(status: int) -> str:
    if status == 407:
        return "parent proxy refused our credentials (407): check --upstream-proxy-auth"
    if status == 403:
        return "parent proxy refused the CONNECT (403): its policy must allow CONNECT to the checked address and port"
    return f"parent proxy answered {status} to CONNECT"


class _HandshakeSide(Side):
    """A Side that reads until the parent's reply head is complete, then pauses like any Side."""

    def __init__(self) -> None:
        super().__init__()
        self.reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.reply.done() and (b"\r\n\r\n" in self.early or len(self.early) > MAX_REPLY_HEAD):
            self.reply.set_result(None)

    def eof_received(self) -> bool:
        super().eof_received()
        if not self.reply.done():
            self.reply.set_result(None)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.reply.done():
            self.reply.set_result(None)


async def open_tunnel(parent: ParentProxy, address: str, port: int) -> Side:
    """Connect to the parent and CONNECT to `address:port`; the returned side is paused, with
    any bytes after the reply head in `early`. Raises OSError (connecting to the parent) or
    ParentReplyError; the caller bounds the time."""
    loop = asyncio.get_running_loop()
    _, side = await loop.create_connection(_HandshakeSide, parent.host, parent.port)
    try:
        transport = side.transport
        if transport is None:  # create_connection always calls connection_made first
            raise ConnectionResetError("parent proxy connection has no transport")
        credentials = parent.authorization.header() if parent.authorization is not None else None
        transport.write(connect_request(address, port, credentials))
        transport.resume_reading()
        await side.reply
        transport.pause_reading()
        head, sep, rest = bytes(side.early).partition(b"\r\n\r\n")
        if not sep:
            if side.eof or side.lost:
                raise ParentReplyError("upstream_refused", "parent proxy closed the connection without answering CONNECT")
            raise ParentReplyError("upstream_refused", "parent proxy sent a reply head over 16 KiB")
        status = parse_reply(head + sep)
        if (reason := reason_for_status(status)) is not None:
            raise ParentReplyError(reason, describe_status(status))
        if side.lost:
            raise ParentReplyError("upstream_refused", "parent proxy closed the tunnel at once")
        side.early = bytearray(rest)
        return side
    except BaseException:
        side.close()
        raise
