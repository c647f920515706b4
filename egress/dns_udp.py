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

Bounds: at most `MAX_QUEUED` datagrams wait per client address (more are dropped,
as a full socket buffer would); answers are sent with `sendto` and never wait.
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
RECEIVE_BUFFER = 1 << 20  # bytes asked for (the kernel caps it at net.core.rmem_max)
Address = tuple[str, int]
StreamHandler = Callable[[Any, Any], Awaitable[None]]


class DatagramStream:
    """One client address's datagrams on a listener socket, read and written like a stream."""

    def __init__(self, server: UdpListener, peer: Address):
        self._server = server
        self._peer = peer
        self._queue: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def feed(self, data: bytes) -> None:
        if len(self._queue) >= MAX_QUEUED:
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
        return self._queue.popleft()

    def write(self, data: bytes) -> None:
        if not self._closed:
            self._server.sendto(data, self._peer)

    async def drain(self) -> None:
        return None  # datagrams are sent at once or dropped by the kernel, never buffered here

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.forget(self._peer, self)
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


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, server: UdpListener):
        self._server = server

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self._server.received(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # ICMP errors for earlier answers (a client that went away): nothing to do.
        logger.debug("DNS listener: %s", exc)


class UdpListener:
    """A bound UDP socket that turns each client address into a `DatagramStream` for `handler`."""

    def __init__(self, handler: StreamHandler):
        self._handler = handler
        self._streams: dict[Address, DatagramStream] = {}
        self._tasks: set[asyncio.Task] = set()
        self._transport: asyncio.DatagramTransport | None = None
        self._socket: socket.socket | None = None
        self.sockname: Address = ("", 0)

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
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)

    @property
    def sockets(self) -> list[socket.socket]:
        """As `asyncio.Server.sockets`: mitmproxy lists the listen address from it."""
        return [self._socket] if self._socket is not None else []

    def getsockname(self) -> Address:
        return self.sockname

    def received(self, data: bytes, peer: Address) -> None:
        if not data:  # no header, nothing to answer; a stream would read it as end of stream
            return
        stream = self._streams.get(peer)
        if stream is None:
            stream = self._streams[peer] = DatagramStream(self, peer)
            task = asyncio.get_running_loop().create_task(self._serve(stream))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        stream.feed(data)

    async def _serve(self, stream: DatagramStream) -> None:
        try:
            await self._handler(stream, stream)
        finally:
            stream.close()

    def sendto(self, data: bytes, peer: Address) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.sendto(data, peer)

    def forget(self, peer: Address, stream: DatagramStream) -> None:
        if self._streams.get(peer) is stream:
            del self._streams[peer]

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        for stream in list(self._streams.values()):
            stream.close()
        self._socket = None


async def start_udp_listener(host: str, port: int, handler: StreamHandler) -> UdpListener:
    listener = UdpListener(handler)
    await listener.start(host, port)
    return listener
