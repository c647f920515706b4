"""The UDP socket of the proxy's `dns@` listeners, served by the asyncio event loop itself.

mitmproxy 12.3.1 serves a `dns@` mode's UDP side with mitmproxy_rs's UDP server: a
Rust runtime on its own thread receives each datagram and hands it to the Python
event loop through a cross-thread wake-up (and each answer back the same way). With
the proxy on one core that hop was the largest single cost of a query: the Python
thread sat idle in epoll about 30 % of the time while the Rust thread, on the same
core, passed datagrams across (docs/benchmarks-dns.md).

This module gives the `DnsInstance` (still started, stopped and listed by
mitmproxy's server manager, still one process and one spec) a plain non-blocking
UDP socket on the event loop instead. Everything above the socket stays mitmproxy's:
each client address gets a stream that looks like mitmproxy_rs's (`read`, `write`,
`drain`, `close`, `get_extra_info`), handed to the instance's own `handle_stream`,
which runs mitmproxy's connection handler, timeout watchdog and our DNS layer on it
exactly as before. A stream lives until mitmproxy's UDP idle timeout closes it; a
datagram for a closed stream opens a new one, as with the Rust server.

Fast path: before a datagram goes to its stream, `answer_datagram(packet, client)`
(egress/addons/dns_filter.py `DnsFilter.answer_datagram`) may answer it at once — the
common query shape, decided without I/O by the same policy, counter and audit line —
and then it never reaches mitmproxy's parser or handler, which were about a third of
a locally answered query's cost. It returns None for everything else, which takes
the full way as before. If it raises, the datagram takes the full way too, where
the same decision fails closed (SERVFAIL, counted).

Bounds: at most `MAX_QUEUED` datagrams wait per client address, and at most
`MAX_QUEUED_BYTES` in all the listener's queues together (a datagram may be 64 KiB
and a sandbox can use many source ports); more are dropped, as a full socket buffer
would drop them. At most `READ_BATCH` are read per wake-up; answers
are sent with one `sendto` and never wait (a full send buffer drops one, as the
network may; the client retries).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

MAX_QUEUED = 256
MAX_QUEUED_BYTES = 8 << 20  # all client addresses together
RECEIVE_BUFFER = 1 << 20  # bytes asked for (the kernel caps it at net.core.rmem_max)
RECEIVE_SIZE = 65535  # a whole datagram, whatever its size (the layer answers FORMERR or TC)
READ_BATCH = 64  # datagrams read per wake-up before other work gets its turn
Address = tuple[str, int]
StreamHandler = Callable[[Any, Any], Awaitable[None]]
AnswerDatagram = Callable[[bytes, str], "bytes | None"]


class DatagramStream:
    """One client address's datagrams on a listener socket, read and written like a stream."""

    def __init__(self, server: UdpListener, peer: Address, reply_to: Any = None):
        self._server = server
        self._peer = peer  # (host, port), as mitmproxy_rs reports it
        self._reply_to = reply_to or peer  # the address as received (IPv6: with its scope)
        self._queue: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def feed(self, data: bytes) -> None:
        if len(self._queue) >= MAX_QUEUED or not self._server.reserve(len(data)):
            return
        self._queue.append(data)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self, n: int = -1) -> bytes:
        """The next datagram (whole, whatever `n`); b"" once closed."""
        while not self._queue:
            if self._closed:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._queue.popleft()
        self._server.release(len(data))
        return data

    def write(self, data: bytes) -> None:
        if not self._closed:
            self._server.sendto(data, self._reply_to)

    async def drain(self) -> None:
        return None  # datagrams are sent at once or dropped by the kernel, never buffered here

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.forget(self._peer, self)
        self._server.release(sum(map(len, self._queue)))
        self._queue.clear()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def is_closing(self) -> bool:
        return self._closed

    async def wait_closed(self) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "transport_protocol":
            return "udp"
        if name == "peername":
            return self._peer
        if name == "sockname":
            return self._server.sockname
        return default


class UdpListener:
    """A bound UDP socket that turns each client address into a `DatagramStream` for `handler`."""

    def __init__(self, handler: StreamHandler, answer_datagram: AnswerDatagram | None = None):
        self._handler = handler
        self._answer_datagram = answer_datagram
        self._streams: dict[Address, DatagramStream] = {}
        self._tasks: set[asyncio.Task] = set()
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sockname: Address = ("", 0)
        self.queued_bytes = 0  # datagrams waiting in all streams' queues

    async def start(self, host: str, port: int) -> None:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            if family == socket.AF_INET6:
                # As mitmproxy does for "::": IPv4 has its own socket on the same port.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # A burst of queries waits in the kernel while one is answered: the default
            # receive buffer (~200 KiB, ~1 KiB of accounting per datagram) held too few.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            sock.bind(addr)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        bound = sock.getsockname()
        self.sockname = (str(bound[0]), int(bound[1]))
        # The socket is read straight from the loop's selector, not through an asyncio
        # datagram transport: up to READ_BATCH datagrams per wake-up (one select for a
        # burst instead of one each), answers sent with one sendto.
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._read_ready)

    @property
    def sockets(self) -> list[socket.socket]:
        """As `asyncio.Server.sockets`: mitmproxy lists the listen address from it."""
        return [self._socket] if self._socket is not None else []

    def getsockname(self) -> Address:
        return self.sockname

    def _read_ready(self) -> None:
        sock = self._socket
        for _ in range(READ_BATCH):
            if sock is None:
                return
            try:
                data, addr = sock.recvfrom(RECEIVE_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # ICMP errors for earlier answers (a client that went away)
                logger.debug("DNS listener: %s", exc)
                continue
            self.received(data, addr)

    def received(self, data: bytes, addr: Any) -> None:
        if not data:  # no header, nothing to answer; a stream would read it as end of stream
            return
        peer = (str(addr[0]), int(addr[1]))
        if self._answer_datagram is not None:
            try:
                wire = self._answer_datagram(data, f"{peer[0]}:{peer[1]}")
            except Exception:  # the full way decides again, and fails closed there
                logger.debug("DNS listener: fast path failed, query takes the full path", exc_info=True)
                wire = None
            if wire is not None:
                self.sendto(wire, addr)
                return
        stream = self._streams.get(peer)
        if stream is None:
            stream = self._streams[peer] = DatagramStream(self, peer, addr)
            task = asyncio.get_running_loop().create_task(self._serve(stream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        stream.feed(data)

    async def _serve(self, stream: DatagramStream) -> None:
        try:
            await self._handler(stream, stream)
        finally:
            stream.close()

    def sendto(self, data: bytes, peer: Any) -> None:
        if self._socket is None:
            return
        try:
            self._socket.sendto(data, peer)
        except OSError as exc:
            # A full send buffer or an unreachable client: the answer is lost like any
            # datagram, and the client asks again (its retry, or TCP after TC).
            logger.debug("DNS listener: answer to %s dropped (%s)", peer[0], exc)

    def reserve(self, size: int) -> bool:
        """Room for a datagram of `size` bytes in the listener's queues (False: drop it)."""
        if self.queued_bytes + size > MAX_QUEUED_BYTES:
            return False
        self.queued_bytes += size
        return True

    def release(self, size: int) -> None:
        self.queued_bytes -= size

    def forget(self, peer: Address, stream: DatagramStream) -> None:
        if self._streams.get(peer) is stream:
            del self._streams[peer]

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(sock.fileno())
            sock.close()
        for stream in list(self._streams.values()):
            stream.close()


async def start_udp_listener(
    host: str, port: int, handler: StreamHandler, answer_datagram: AnswerDatagram | None = None
) -> UdpListener:
    listener = UdpListener(handler, answer_datagram)
    await listener.start(host, port)
    return listener
