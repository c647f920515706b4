"""Reading an HTTP head off a raw socket, which e2e and helm tests do in many places."""

from __future__ import annotations

import socket


def recv_head(sock: socket.socket, chunk_size: int = 65536) -> bytes:
    """Read until the end of an HTTP head (a blank line) or EOF. Returns every byte read:
    the head and whatever followed it in the last chunk; no blank line means EOF came first.
    chunk_size=1 reads nothing past the head (e.g. when a tunnel's bytes follow it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(chunk_size)
        if not chunk:
            break
        data += chunk
    return data
