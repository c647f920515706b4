"""`egress-hooks serve`: one loaded snapshot of hooks.json, answering over a socket.

    egress-hooks serve --listen unix:/run/egress-hooks.sock [--workspace DIR] ...
    POST /v1/dispatch/pre_tool_execution   (event JSON)  ->  200 {"decision": ...}
    GET  /v1/status                                       ->  200 {"files": [...], ...}

Why a server: a fresh `egress-hooks dispatch` per tool call pays ~100-200 ms of
interpreter and imports before any hook runs, on a path the agent waits on;
and a dispatcher that re-reads hooks.json on every call applies whatever the
agent wrote there a moment ago. The server reads the files once, at start;
it re-reads them only on SIGHUP (or a restart), and when the files on disk no
longer match its snapshot it logs that once per change, so an operator sees
an edit that has not taken effect. A reload that would turn a file that parsed
into one that does not is refused and the old snapshot kept.

A Unix socket is created mode 0600; TCP listens on loopback only. Requests
run concurrently; the handlers of one request run in order. What hooks leave
running is swept by `egress.hooks.reaper` after each request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from egress.hooks import EVENTS
from egress.hooks.client import DISPATCH_PATH, Address
from egress.hooks.dispatcher import DispatchSettings, dispatch, log_problems
from egress.hooks.events import EventError, parse_event
from egress.hooks.layers import LayeredConfig, file_digest, file_signature
from egress.hooks.log import LogSink
from egress.hooks.reaper import Reaper

MAX_HEAD_BYTES = 16 * 1024
# write_file events carry the file; 64 MiB is far above any tool payload.
MAX_BODY_BYTES = 64 * 1024 * 1024
STATUS_PATH = "/v1/status"
# A connection that sends nothing (or stalls mid-request) this long is closed.
IDLE_TIMEOUT_SECONDS = 60.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
            413: "Content Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            505: "HTTP Version Not Supported"}  # fmt: skip


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


def parse_head(data: bytes) -> RequestHead:
    """A request line and headers (without the final CRLF CRLF). Raises HttpError."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "request head is not ASCII") from None
    request_line, *lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, f"{version} is not supported")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        key = name.lower()
        if key in headers and key == "content-length":
            raise HttpError(400, "more than one Content-Length")
        headers[key] = value.strip()
    return RequestHead(method, target, version, headers)


def body_length(head: RequestHead) -> int:
    if "transfer-encoding" in head.headers:
        raise HttpError(411, "send the event with a Content-Length, not chunked")
    value = head.headers.get("content-length")
    if value is None:
        if head.method == "POST":
            raise HttpError(411, "a POST needs a Content-Length")
        return 0
    if not value.isdigit():
        raise HttpError(400, "bad Content-Length")
    length = int(value)
    if length > MAX_BODY_BYTES:
        raise HttpError(413, f"event larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")
    return length


def response(status: int, document: Any, keep_alive: bool) -> bytes:
    body = json.dumps(document, ensure_ascii=False).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("ascii") + body


class HookServer:
    """The snapshot, its reload, and the request handling; the socket is `serve`'s."""

    def __init__(self, load: Callable[[], LayeredConfig], settings: DispatchSettings, log: LogSink):
        self._load = load
        self.log = log
        self.reaper = settings.reaper or Reaper()
        self.settings = DispatchSettings(
            cwd=settings.cwd,
            proxy=settings.proxy,
            ca_file=settings.ca_file,
            record_metrics=settings.record_metrics,
            log=log,
            budget=settings.budget,
            reaper=self.reaper,
        )
        self.snapshot = load()
        log_problems(self.snapshot.problems, log, self.snapshot.notes)
        # Per path: the disk state already reported as differing from the snapshot.
        self._reported: dict[str, tuple[Any, ...]] = {}
        self._sweep_pending = False
        self.in_flight = 0

    # -- the snapshot ----------------------------------------------------------

    def reload(self) -> None:
        """SIGHUP: read the files again; refuse a reload that breaks a file that parsed."""
        new = self._load()
        old_files = {f.path: f for f in self.snapshot.files}
        for file in new.files:
            old = old_files.get(file.path)
            broken = file.config is not None and not file.config.readable
            if broken and old is not None and old.config is not None and old.config.readable:
                self.log(
                    {
                        "msg": "hook_config_reload_refused",
                        "layer": file.layer,
                        "source": file.path,
                        "problems": list(file.config.problems) if file.config else [],
                        "kept": "the snapshot loaded before",
                    }
                )
                return
        self.snapshot = new
        self._reported.clear()
        log_problems(new.problems, self.log, new.notes)
        self.log({"msg": "hook_config_reloaded", **self.describe()})

    def describe(self) -> dict[str, Any]:
        return {
            "files": [
                {
                    "layer": f.layer,
                    "path": f.path,
                    "present": f.config is not None,
                    "groups": len(f.config.groups) if f.config is not None else 0,
                    "problems": len(f.config.problems) if f.config is not None else 0,
                }
                for f in self.snapshot.files
            ],
            "groups": [{"name": g.name, "layer": g.layer, "enabled": g.enabled} for g in self.snapshot.config.groups],
            "in_flight": self.in_flight,
        }

    def check_disk(self) -> None:
        """Log (once per change) a file on disk that is not the one in the snapshot."""
        for file in self.snapshot.files:
            signature = file_signature(file.path)
            if signature == file.signature:
                continue
            digest = file_digest(file.path) if signature is not None else None
            if digest is not None and digest == file.digest:
                continue  # touched or rewritten with the same bytes
            state = (signature, digest)
            if self._reported.get(file.path) == state:
                continue
            self._reported[file.path] = state
            self.log(
                {
                    "msg": "hook_config_changed_on_disk",
                    "layer": file.layer,
                    "source": file.path,
                    "change": "removed" if signature is None else "added" if file.signature is None else "modified",
                    "applied": False,
                    "hint": "the server keeps its snapshot; send SIGHUP to load the file",
                }
            )

    # -- requests --------------------------------------------------------------

    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT_SECONDS):
                        head_bytes = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, TimeoutError):
                    return  # closed, or idle, between requests
                except asyncio.LimitOverrunError:
                    writer.write(response(431, {"error": "head_too_large"}, False))
                    return
                keep_alive = False
                try:
                    head = parse_head(head_bytes[:-4])
                    keep_alive = head.keep_alive
                    async with asyncio.timeout(IDLE_TIMEOUT_SECONDS):
                        body = await reader.readexactly(body_length(head))
                    status, document = await self.answer(head.method, head.target, body)
                except HttpError as exc:
                    status, document = exc.status, {"error": "bad_request", "message": exc.message}
                    keep_alive = False
                except (asyncio.IncompleteReadError, TimeoutError):
                    return
                # After an error the client is probably confused about framing too.
                keep_alive = keep_alive and status == 200
                writer.write(response(status, document, keep_alive))
                await writer.drain()
                if not keep_alive:
                    return
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def answer(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        path = target.split("?", 1)[0]
        if path == STATUS_PATH:
            if method != "GET":
                return 405, {"error": "method_not_allowed", "message": f"{STATUS_PATH} answers GET"}
            self.check_disk()
            return 200, self.describe()
        if not path.startswith(DISPATCH_PATH):
            return 404, {"error": "not_found", "message": f"POST {DISPATCH_PATH}<event> or GET {STATUS_PATH}"}
        event_name = path[len(DISPATCH_PATH) :]
        if event_name not in EVENTS:
            return 404, {"error": "unknown_event", "message": f"event must be one of {', '.join(EVENTS)}"}
        if method != "POST":
            return 405, {"error": "method_not_allowed", "message": "dispatch is a POST of the event JSON"}
        try:
            event = parse_event(body, where="event in the request body")
        except EventError as exc:
            return 400, {"error": "bad_event", "message": str(exc)}
        self.check_disk()
        config = self.snapshot.config  # the one this request uses, even if a SIGHUP swaps it meanwhile
        self.in_flight += 1
        try:
            decision = await dispatch(config, event_name, event, self.settings)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
            self.log({"msg": "hook_server_error", "event": event_name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            return 500, {"error": "internal_error"}
        finally:
            self.in_flight -= 1
            self._schedule_sweep()
        return 200, decision.as_json()

    def _schedule_sweep(self) -> None:
        # After the answer is written (call_soon runs after this task yields), and
        # one sweep for a burst of requests that end together.
        if not self._sweep_pending:
            self._sweep_pending = True
            asyncio.get_running_loop().call_soon(self._sweep)

    def _sweep(self) -> None:
        self._sweep_pending = False
        killed = self.reaper.sweep()
        if killed:
            self.log({"msg": "hook_processes_killed", "pids": killed, "why": "left running by a finished hook"})
            # Their own children come back to us as orphans: look again soon.
            asyncio.get_running_loop().call_later(0.2, self._schedule_sweep)


async def serve(address: Address, server: HookServer) -> None:
    """Listen until SIGTERM or SIGINT; SIGHUP reloads the snapshot."""
    loop = asyncio.get_running_loop()
    connections: set[asyncio.Task] = set()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await server.handle_connection(reader, writer)
        finally:
            connections.discard(task)

    socket_inode = None
    if address.path is not None:
        listener = _unix_listener(address.path)
        socket_inode = os.stat(address.path).st_ino
        srv = await asyncio.start_unix_server(on_connection, sock=listener, limit=MAX_HEAD_BYTES)
        shown = address.text
    else:
        srv = await asyncio.start_server(on_connection, address.host, address.port, limit=MAX_HEAD_BYTES, backlog=512)
        host, port = srv.sockets[0].getsockname()[:2]
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, server.reload)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    server.log({"msg": "hook_server_listening", "listen": shown, "pid": os.getpid(), **server.describe()})
    try:
        await stop.wait()
    finally:
        srv.close()
        for task in list(connections):
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        await srv.wait_closed()
        server.reaper.sweep_until_quiet()
        if address.path is not None:
            with contextlib.suppress(OSError):
                if os.stat(address.path).st_ino == socket_inode:
                    os.unlink(address.path)
        server.log({"msg": "hook_server_stopped"})


class ListenError(Exception):
    """The listen address cannot be used; the message is for the operator."""


def _unix_listener(path: str) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600 from the moment it exists."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenError(f"{path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # a socket nobody listens on: left by a server that died
        else:
            raise ListenError(f"{path}: another server is listening there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The umask makes bind create the socket 0600, with no moment of a wider mode.
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ListenError(f"{path}: cannot listen: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(512)
    sock.setblocking(False)
    return sock
