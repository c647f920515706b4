"""The `dns@` listeners' UDP socket on the event loop (egress/dns/udp.py), with real UDP
sockets on loopback: one stream per client address, whole datagrams in and out, a
closed stream forgotten (the next datagram opens a new one), queues bounded. The
whole listener with mitmproxy's handler is tests/e2e/test_dns.py."""

from __future__ import annotations

import asyncio
import socket

from egress.dns import udp as dns_udp


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def recv(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)


def client() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def test_one_stream_per_client_address_echoing_whole_datagrams():
    async def main():
        seen: list[tuple] = []

        async def handler(reader, writer):
            seen.append((writer.get_extra_info("peername"), writer.get_extra_info("transport_protocol")))
            while data := await reader.read(65535):
                writer.write(data.upper())
                await writer.drain()
                if data == b"bye":
                    writer.close()

        listener = await dns_udp.start_udp_listener("127.0.0.1", 0, handler)
        assert listener.sockets[0].getsockname() == listener.getsockname()
        a, b = client(), client()
        try:
            for sock, word in ((a, b"one"), (b, b"two"), (a, b"three")):
                sock.sendto(word, listener.getsockname())
                assert await recv(sock) == word.upper()
            assert [s[0] for s in seen] == [a.getsockname(), b.getsockname()]
            assert {s[1] for s in seen} == {"udp"}
            a.sendto(b"bye", listener.getsockname())
            assert await recv(a) == b"BYE"
            await asyncio.sleep(0.05)
            a.sendto(b"again", listener.getsockname())  # a closed stream: a new one for the same address
            assert await recv(a) == b"AGAIN"
            assert [s[0] for s in seen] == [a.getsockname(), b.getsockname(), a.getsockname()]
        finally:
            a.close()
            b.close()
            listener.close()

    run(main())


def test_queue_is_bounded_and_close_ends_the_reader():
    async def main():
        started = asyncio.Event()
        release = asyncio.Event()
        got: list[bytes] = []

        async def handler(reader, writer):
            started.set()
            await release.wait()  # a slow handler: datagrams pile up
            while data := await reader.read(65535):
                got.append(data)

        listener = await dns_udp.start_udp_listener("127.0.0.1", 0, handler)
        sock = client()
        try:
            for i in range(dns_udp.MAX_QUEUED + 50):
                sock.sendto(b"%d" % i, listener.getsockname())
            await asyncio.wait_for(started.wait(), 5)
            await asyncio.sleep(0.2)
            release.set()
            await asyncio.sleep(0.1)
            assert len(got) == dns_udp.MAX_QUEUED and got[0] == b"0"
            listener.close()  # shutting down: the waiting reader gets b"" and the handler ends
            await asyncio.sleep(0.05)
            assert not listener._streams
        finally:
            sock.close()

    run(main())


def test_all_queues_together_are_bounded_in_bytes(monkeypatch):
    """Large datagrams from many source ports cannot queue more than MAX_QUEUED_BYTES in all."""
    monkeypatch.setattr(dns_udp, "MAX_QUEUED_BYTES", 100_000)

    async def main():
        release = asyncio.Event()
        got: list[int] = []

        async def handler(reader, writer):
            await release.wait()  # a slow handler: datagrams pile up in every stream
            while data := await reader.read(65535):
                got.append(len(data))
                if len(data) < 1000:
                    writer.close()

        listener = await dns_udp.start_udp_listener("127.0.0.1", 0, handler)
        socks = [client() for _ in range(8)]
        try:
            for sock in socks:
                for _ in range(5):
                    sock.sendto(b"x" * 9_000, listener.getsockname())
            await asyncio.sleep(0.3)
            assert 90_000 <= listener.queued_bytes <= 100_000  # 11 of the 40 datagrams kept
            release.set()
            for sock in socks:
                sock.sendto(b"end", listener.getsockname())
            await asyncio.sleep(0.3)
            assert sum(got) == 11 * 9_000 + 8 * 3 and listener.queued_bytes == 0
            for sock in socks:  # room again once read
                sock.sendto(b"y" * 9_000, listener.getsockname())
            await asyncio.sleep(0.2)
            assert listener.queued_bytes == 0 and got.count(9_000) == 11 + 8
            listener.close()
            assert listener.queued_bytes == 0
        finally:
            for sock in socks:
                sock.close()

    run(main())


def test_closing_a_stream_gives_its_queued_bytes_back():
    async def main():
        hold = asyncio.Event()

        async def handler(reader, writer):
            await hold.wait()

        listener = await dns_udp.start_udp_listener("127.0.0.1", 0, handler)
        sock = client()
        try:
            for _ in range(3):
                sock.sendto(b"z" * 1_000, listener.getsockname())
            await asyncio.sleep(0.2)
            assert listener.queued_bytes == 3_000
            listener.close()  # shutting down with datagrams still queued
            assert listener.queued_bytes == 0
            hold.set()
        finally:
            sock.close()

    run(main())


def test_ipv6_listener_is_v6_only_beside_an_ipv4_one_on_the_same_port():
    async def main():
        async def handler(reader, writer):
            pass

        v4 = await dns_udp.start_udp_listener("0.0.0.0", 0, handler)
        try:
            v6 = await dns_udp.start_udp_listener("::", v4.getsockname()[1], handler)
        except OSError as exc:  # a machine without IPv6
            assert "Address family" in str(exc) or exc.errno in (97, 99), exc
        else:
            assert v6.sockets[0].getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
            v6.close()
        v4.close()

    run(main())
