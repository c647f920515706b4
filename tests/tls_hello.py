"""Handcrafted TLS ClientHellos for tests: any server_name bytes, any extension layout."""

from __future__ import annotations

import struct


def vec(data: bytes, length_bytes: int) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def sni_extension(*names: bytes, name_type: int = 0) -> bytes:
    entries = b"".join(bytes([name_type]) + vec(n, 2) for n in names)
    return struct.pack("!H", 0) + vec(vec(entries, 2), 2)


def hello_body(*extensions: bytes, with_extensions: bool = True) -> bytes:
    """A TLS 1.3-style ClientHello body carrying `extensions` (plus supported_versions)."""
    body = b"\x03\x03" + b"\x11" * 32 + vec(b"\x22" * 32, 1) + vec(b"\x13\x01\x13\x02", 2) + vec(b"\x00", 1)
    if with_extensions:
        supported_versions = struct.pack("!H", 43) + vec(vec(b"\x03\x04", 1), 2)
        body += vec(b"".join(extensions) + supported_versions, 2)
    return body


def records(body: bytes, split: int | None = None) -> bytes:
    """The handshake message in one TLS record, or two split at `split`."""
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    parts = [message] if split is None else [message[:split], message[split:]]
    return b"".join(b"\x16\x03\x01" + vec(p, 2) for p in parts)
