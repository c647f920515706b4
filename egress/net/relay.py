"""Relay of a passthrough tunnel between two asyncio transports, outside mitmproxy.

Once a tunnel is decided (the checks are done, nothing more will be read from it),
every chunk that went through mitmproxy's layer stack cost a `DataReceived` event,
a walk down the layers and a `SendData` command back up. Here each side is a plain
`asyncio.Protocol`: bytes received on one transport are written to the other, with
the transports' own flow control (a peer whose write buffer is full pauses reading
on this side). No policy lives here; the caller hands over two transports that were
already checked, and learns the byte counts when the tunnel ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast


class Side(asyncio.Protocol):
    """One end of a tunnel. Until a relay is attached, reading is paused and early bytes are kept."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.relay: Relay | None = None
        self.early = bytearray()
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not asyncio subclasses)
        if self.relay is None:
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self.relay is None:
            self.early += data
        else:
            self.relay.forward(self, data)

    def eof_received(self) -> bool:
        self.eof = True
        if self.relay is not None:
            self.relay.half_closed(self)
        return True  # keep the other direction open (TCP half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.relay is not None:
            self.relay.close()

    def pause_writing(self) -> None:
        if self.relay is not None:
            self.relay.peer(self).pause()

    def resume_writing(self) -> None:
        if self.relay is not None:
            self.relay.peer(self).resume()

    def pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing() and not self.eof:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()  # flushes what is buffered, then closes


class Relay:
    """Pumps bytes between `client` and `upstream` until both directions are done or one side is lost."""

    def __init__(
        self,
        client: Side,
        upstream: Side,
        *,
        on_activity: Callable[[], None] = lambda: None,
        on_close: Callable[[int, int], None] = lambda up, down: None,
    ) -> None:
        self.client, self.upstream = client, upstream
        self.bytes_up = 0  # client -> upstream
        self.bytes_down = 0  # upstream -> client
        self.closed = False
        self._on_activity = on_activity
        self._on_close = on_close

    def peer(self, side: Side) -> Side:
        return self.upstream if side is self.client else self.client

    def start(self, first_up: bytes = b"") -> None:
        """Attach both sides, send what arrived before the hand-over, and start reading."""
        self.client.relay = self.upstream.relay = self
        if first_up:
            self.forward(self.client, first_up)
        if self.upstream.early:
            early, self.upstream.early = bytes(self.upstream.early), bytearray()
            self.forward(self.upstream, early)
        for side in (self.client, self.upstream):
            if side.lost:
                self.close()
                return
            if side.eof:
                self.half_closed(side)
            else:
                side.resume()

    def forward(self, side: Side, data: bytes) -> None:
        peer = self.peer(side)
        if peer.transport is None or peer.transport.is_closing():
            return
        peer.transport.write(data)
        if side is self.client:
            self.bytes_up += len(data)
        else:
            self.bytes_down += len(data)
        self._on_activity()

    def half_closed(self, side: Side) -> None:
        peer = self.peer(side)
        if self.client.eof and self.upstream.eof:
            self.close()
        elif peer.transport is not None and not peer.transport.is_closing() and peer.transport.can_write_eof():
            peer.transport.write_eof()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.client.close()
        self.upstream.close()
        self._on_close(self.bytes_up, self.bytes_down)
