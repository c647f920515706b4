"""`egress-hooks dispatch EVENT --server ADDR`: the thin client of `egress-hooks serve`.

A runtime calls the dispatcher once per tool call and waits for it. Loading
hooks.json, RE2 and asyncio in a fresh interpreter each time costs ~100-200 ms;
this client only reads the event, sends it to the server that holds all that
already, and prints the answer. It imports `json` and `socket` and nothing of
the dispatcher, so it costs little more than the interpreter's own start.

When the server cannot answer (not running, refused, timed out, a garbled or
non-200 reply) the client does what the seed says a broken hook does - allow -
and logs why; with `--fail-closed` a pre-tool event is denied instead, with a
reason naming the server. A post-tool event cannot be blocked either way.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

CONNECT_TIMEOUT_SECONDS = 5.0
# The server bounds every event by its budget (at most 600 s); a little more here.
RESPONSE_TIMEOUT_SECONDS = 630.0
MAX_RESPONSE_BYTES = 2 * 1024 * 1024
DISPATCH_PATH = "/v1/dispatch/"


class Address:
    """`unix:PATH` or `HOST:PORT` (`[V6]:PORT`). A plain class: `dataclasses` costs
    this short-lived process ~10 ms of imports."""

    __slots__ = ("text", "path", "host", "port")

    def __init__(self, text: str, path: str | None = None, host: str | None = None, port: int | None = None):
        self.text = text
        self.path = path
        self.host = host
        self.port = port

    @property
    def is_unix(self) -> bool:
        return self.path is not None


def parse_address(text: str) -> Address:
    """Raises ValueError with a message that can be shown as is."""
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise ValueError(f"{text!r}: expected unix:PATH")
        if "\x00" in path:
            raise ValueError(f"{text!r}: the path holds a NUL byte")
        return Address(text, path=path)
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected unix:PATH or HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{text!r}: the port must be a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: the port must be 0-65535")
    return Address(text, host=host, port=port)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerUnavailable(Exception):
    """The server gave no usable answer; the message is safe to log."""


class EventRefused(Exception):
    """The server read the event as malformed (HTTP 400)."""


def request(address: Address, event_name: str, body: bytes) -> tuple[int, bytes]:
    """One POST to the server: (status, body). Raises ServerUnavailable."""
    head = (
        f"POST {DISPATCH_PATH}{event_name} HTTP/1.1\r\n"
        "Host: egress-hooks\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    try:
        sock = _connect(address)
    except OSError as exc:
        raise ServerUnavailable(f"cannot connect: {exc.strerror or exc}") from None
    try:
        sock.settimeout(RESPONSE_TIMEOUT_SECONDS)
        sock.sendall(head + body)
        received = bytearray()
        while chunk := sock.recv(65536):
            received += chunk
            if len(received) > MAX_RESPONSE_BYTES:
                raise ServerUnavailable("answer larger than 2 MiB")
    except TimeoutError:
        raise ServerUnavailable("no answer in time") from None
    except OSError as exc:
        raise ServerUnavailable(f"connection failed: {exc.strerror or exc}") from None
    finally:
        sock.close()
    return _parse_response(bytes(received))


def _connect(address: Address) -> socket.socket:
    if address.path is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_SECONDS)
            sock.connect(address.path)
        except OSError:
            sock.close()
            raise
        return sock
    assert address.host is not None and address.port is not None
    return socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_SECONDS)


def _parse_response(data: bytes) -> tuple[int, bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise ServerUnavailable("connection closed before a complete answer" if data else "connection closed without an answer")
    status_line, *header_lines = head.split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ServerUnavailable("the answer is not HTTP")
    for line in header_lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise ServerUnavailable("the answer has a bad Content-Length") from None
            if len(body) < length:
                raise ServerUnavailable("connection closed in the middle of the answer")
            body = body[:length]
    return int(parts[1]), body


def decide(address: Address, event_name: str, body: bytes) -> dict[str, Any]:
    """The server's decision JSON. Raises ServerUnavailable or EventRefused."""
    status, answer = request(address, event_name, body)
    if status == 400:
        try:
            message = json.loads(answer)["message"]
        except (ValueError, KeyError, TypeError):
            message = "the server refused the event"
        raise EventRefused(str(message))
    if status != 200:
        raise ServerUnavailable(f"answered HTTP {status}")
    try:
        decision = json.loads(answer)
    except ValueError:
        raise ServerUnavailable("the answer is not JSON") from None
    from egress.hooks import PRE_TOOL_EXECUTION

    if not isinstance(decision, dict):
        raise ServerUnavailable("the answer is not a decision")
    if event_name == PRE_TOOL_EXECUTION and decision.get("decision") not in ("allow", "deny"):
        raise ServerUnavailable("the answer is not a decision")
    if decision.get("decision") == "deny" and not isinstance(decision.get("reason"), str):
        raise ServerUnavailable("the answer is a deny without a reason")
    return decision


def fallback(
    event_name: str, address: Address, error: str, fail_closed: bool, log: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The answer when the server gave none: the seed's allow, or a deny with --fail-closed."""
    from egress.hooks import PRE_TOOL_EXECUTION

    closed = fail_closed and event_name == PRE_TOOL_EXECUTION
    log({"msg": "hook_server_unavailable", "server": address.text, "event": event_name, "error": error, "fail_closed": closed})
    if event_name != PRE_TOOL_EXECUTION:
        return {}
    if not closed:
        return {"decision": "allow"}
    return {
        "decision": "deny",
        "reason": f"Tool call denied: the hook server at {address.text} gave no answer ({error}), "
        "and egress-hooks dispatch runs with --fail-closed.",
    }
