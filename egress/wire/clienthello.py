"""The TLS ClientHello's server_name, read from the bytes on the wire.

Pure functions, no I/O. mitmproxy reports a server_name it cannot decode as "no
SNI" (`None`), which made `CONNECT allowed.test:443` followed by a ClientHello
naming `allowed.test@127.0.0.1` look like a ClientHello without SNI, and pass.
Here the extension itself is read (RFC 8446 §4.1.2, RFC 6066 §3), so the three
cases stay apart:

- no server_name extension at all       -> `Hello(server_name=None)`
- one well-formed host_name             -> `Hello(server_name=<normalised host>)`
- anything else in the extension        -> `Hello(server_name=INVALID)`: empty
  lists or names, other name types, several names, bytes a DNS host name cannot
  hold (`@`, `:`, `%`, `;`, NUL, spaces, non-ASCII), over-long names, or a
  name `egress.policy.domains.normalize_host` refuses.

Structural damage (truncated vectors, lengths that do not add up, a duplicated
extension, a record that is not a handshake) raises `HelloError`: the caller
refuses the tunnel. `parse_records` returns None while the ClientHello is still
incomplete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from egress.policy.domains import HostError, normalize_host

INVALID = "\x00invalid"  # a server_name was present but names no valid host
MAX_HELLO_BYTES = 65536  # real ClientHellos are below 2 KiB (16 KiB with huge PQ key shares)
_HANDSHAKE_RECORD = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000
_HOST_NAME = 0x00
# RFC 6066: "HostName" is an ASCII DNS name without a trailing dot; underscores are
# tolerated as `normalize_host` tolerates them. Nothing else may appear: no ports,
# userinfo, percent-encoding, separators or whitespace.
_HOST_NAME_BYTES = re.compile(rb"[A-Za-z0-9._-]{1,254}")


class HelloError(ValueError):
    """The bytes are not a well-formed TLS ClientHello."""


@dataclass(frozen=True)
class Hello:
    server_name: str | None  # None: no extension; INVALID: present but no valid host name


def parse_records(data: bytes) -> Hello | None:
    """Parse the ClientHello carried by one or more TLS records; None if incomplete."""
    message = _handshake_message(data)
    return None if message is None else parse_client_hello(message)


def _handshake_message(data: bytes) -> bytes | None:
    """Reassemble the first handshake message from records; None while incomplete."""
    payload = bytearray()
    offset = 0
    while True:
        if len(payload) >= 4:
            if payload[0] != _CLIENT_HELLO:
                raise HelloError("first handshake message is not a ClientHello")
            length = int.from_bytes(payload[1:4], "big")
            if length > MAX_HELLO_BYTES:
                raise HelloError(f"ClientHello of {length} bytes")
            if len(payload) >= 4 + length:
                # Bytes after the ClientHello in the same record would be a second
                # handshake message, which a client cannot send before the ServerHello.
                if len(payload) > 4 + length:
                    raise HelloError("data after the ClientHello in its record")
                return bytes(payload[4:])
        if len(data) < offset + 5:
            return None
        header = data[offset : offset + 5]
        # The record versions mitmproxy's TLS layer reads (`egress.wire.tunnel_start`), in every record.
        if header[0] != _HANDSHAKE_RECORD or header[1] != 0x03 or header[2] > 0x03:
            raise HelloError("not a TLS handshake record")
        size = int.from_bytes(header[3:5], "big")
        if size == 0 or size > 2**14:
            raise HelloError(f"TLS record of {size} bytes")
        if len(data) < offset + 5 + size:
            return None
        payload += data[offset + 5 : offset + 5 + size]
        offset += 5 + size
        if offset > MAX_HELLO_BYTES + 5 * 8:
            raise HelloError("ClientHello spread over too many bytes")


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise HelloError(f"{self.what}: truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))

    @property
    def done(self) -> bool:
        return self.pos == len(self.data)


def parse_client_hello(body: bytes) -> Hello:
    """Parse a ClientHello handshake body (after the 4-byte handshake header)."""
    r = _Reader(body, "ClientHello")
    r.take(2 + 32)  # legacy_version, random
    if len(r.vector(1)) > 32:
        raise HelloError("session id longer than 32 bytes")
    suites = r.vector(2)
    if not suites or len(suites) % 2:
        raise HelloError("cipher suite list empty or odd")
    if not r.vector(1):
        raise HelloError("no compression method")
    if r.done:
        return Hello(None)  # TLS 1.2 allows a ClientHello without extensions
    extensions = _Reader(r.vector(2), "extensions")
    if not r.done:
        raise HelloError("data after the extensions")
    seen: set[int] = set()
    server_name: str | None = None
    while not extensions.done:
        kind = extensions.number(2)
        data = extensions.vector(2)
        if kind in seen:
            raise HelloError(f"extension {kind} sent twice")
        seen.add(kind)
        if kind == _SERVER_NAME:
            server_name = server_name_of(data)
    return Hello(server_name)


def server_name_of(extension: bytes) -> str:
    """The normalised host name in a server_name extension's data, or INVALID."""
    r = _Reader(extension, "server_name")
    try:
        names = _Reader(r.vector(2), "server_name list")
        if not r.done:
            return INVALID
        entries = []
        while not names.done:
            entries.append((names.number(1), names.vector(2)))
    except HelloError:
        return INVALID
    if len(entries) != 1 or entries[0][0] != _HOST_NAME:
        return INVALID
    raw = entries[0][1]
    if not _HOST_NAME_BYTES.fullmatch(raw):
        return INVALID
    try:
        return normalize_host(raw.decode("ascii"))
    except HostError:
        return INVALID
