"""The tunnel relay (egress.net.relay) over real loopback sockets, and the dial's error mapping
(egress.net.upstream). No mitmproxy here: the e2e tests cover the hand-over from it."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

from egress.net import upstream
from egress.net.relay import Relay, Side


async def _pair() -> tuple[Side, socket.socket]:
    """A Side on one end of a connected loopback TCP pair, the plain socket on the other."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    peer = socket.socket()
    peer.setblocking(False)
    (ours, _), _ = await asyncio.gather(loop.sock_accept(listener), loop.sock_connect(peer, listener.getsockname()))
    listener.close()
    _, side = await loop.connect_accepted_socket(Side, ours)
    return side, peer


async def _two_pairs() -> tuple[Side, socket.socket, Side, socket.socket]:
    """The relay's two sides, client then server, each with the plain socket at its far end."""
    client, client_peer = await _pair()
    server, server_peer = await _pair()
    return client, client_peer, server, server_peer


async def _read_all(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while chunk := await loop.sock_recv(sock, 1 << 20):
        data += chunk
    return data


def test_relay_moves_bytes_both_ways_with_half_close_and_counts():
    async def main():
        loop = asyncio.get_running_loop()
        client, client_peer, server, server_peer = await _two_pairs()
        closed = loop.create_future()
        relay = Relay(client, server, on_close=lambda up, down: closed.set_result((up, down)))
        # Bytes the upstream sent before the relay existed are kept and delivered first.
        await loop.sock_sendall(server_peer, b"early")
        await asyncio.sleep(0.05)
        relay.start(first_up=b"hello")
        up = b"u" * 3_000_000
        await loop.sock_sendall(client_peer, up)
        client_peer.shutdown(socket.SHUT_WR)
        assert await _read_all(server_peer) == b"hello" + up  # EOF passed on
        await loop.sock_sendall(server_peer, b"d" * 1_000_000)
        server_peer.shutdown(socket.SHUT_WR)
        assert await _read_all(client_peer) == b"early" + b"d" * 1_000_000
        assert await asyncio.wait_for(closed, 5) == (5 + len(up), 5 + 1_000_000)
        client_peer.close()
        server_peer.close()

    asyncio.run(main())


def test_a_lost_side_closes_the_other():
    async def main():
        loop = asyncio.get_running_loop()
        client, client_peer, server, server_peer = await _two_pairs()
        closed = loop.create_future()
        Relay(client, server, on_close=lambda up, down: closed.set_result(True)).start()
        server_peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        server_peer.close()  # RST
        await asyncio.wait_for(closed, 5)
        assert await asyncio.wait_for(_read_all(client_peer), 5) == b""
        client_peer.close()

    asyncio.run(main())


def test_activity_is_reported():
    async def main():
        loop = asyncio.get_running_loop()
        client, client_peer, server, server_peer = await _two_pairs()
        ticks = []
        Relay(client, server, on_activity=lambda: ticks.append(1)).start()
        await loop.sock_sendall(client_peer, b"x")
        assert await loop.sock_recv(server_peer, 10) == b"x"
        assert ticks
        client_peer.close()
        server_peer.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "exc, reason",
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), upstream.UPSTREAM_REFUSED),
        (ConnectionResetError(errno.ECONNRESET, "reset"), upstream.UPSTREAM_REFUSED),
        (OSError(errno.EHOSTUNREACH, "no route"), upstream.UPSTREAM_UNREACHABLE),
        (OSError(errno.ENETUNREACH, "unreachable"), upstream.UPSTREAM_UNREACHABLE),
        (TimeoutError(), upstream.UPSTREAM_TIMEOUT),
    ],
)
def test_failure_reason(exc, reason):
    assert upstream.failure_reason(exc) == reason
    assert upstream.STATUS[reason] == (504 if reason == upstream.UPSTREAM_TIMEOUT else 502)


def test_dial_refused_on_loopback():
    import ipaddress

    async def main():
        probe = socket.create_server(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()  # nothing listens there now
        with pytest.raises(upstream.DialFailed) as failed:
            await upstream.dial(ipaddress.IPv4Address("127.0.0.1"), port, 2)
        assert failed.value.reason == upstream.UPSTREAM_REFUSED

    asyncio.run(main())
