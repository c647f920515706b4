"""CPU cost of relaying bytes between two sockets: egress.net.relay on asyncio and on
uvloop, against an os.splice(2) pump. Measures the relay process's own CPU time per
GiB (user + system), which a busy shared machine disturbs far less than wall-clock
throughput. Loopback only; source and sink are separate processes.

    .venv/bin/python bench/relay_bench.py [--mib 512] [--chunks 1 65536]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import time

from egress.net.relay import Relay, Side

SOURCE = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
chunk = b"x" * int(sys.argv[3]); left = int(sys.argv[2])
while left > 0:
    s.sendall(chunk[:left]); left -= len(chunk)
s.close()
"""
SINK = """
import socket, sys
srv = socket.create_server(("127.0.0.1", 0)); print(srv.getsockname()[1], flush=True)
c, _ = srv.accept(); n = 0
while d := c.recv(1 << 20): n += len(d)
print(n, flush=True)
"""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _run(mode: str, total: int, chunk: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    # Blocking start-up is fine here: it happens before the timed part.
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
    sink_port = int(sink.stdout.readline())
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    source = subprocess.Popen([sys.executable, "-c", SOURCE, str(listener.getsockname()[1]), str(total), str(chunk)])  # noqa: ASYNC220
    client, _ = await loop.sock_accept(listener)
    upstream = socket.create_connection(("127.0.0.1", sink_port))
    upstream.setblocking(False)
    start, cpu0 = time.monotonic(), _cpu()
    if mode == "splice":
        await _splice(client, upstream)
    else:
        done = loop.create_future()
        _, a = await loop.connect_accepted_socket(Side, client)
        _, b = await loop.connect_accepted_socket(Side, upstream)
        Relay(a, b, on_close=lambda up, down: done.set_result(up)).start()
        await done
    wall, cpu = time.monotonic() - start, _cpu() - cpu0
    source.wait()
    got = int(sink.stdout.readline())
    sink.wait()
    listener.close()
    if got != total:
        print(f"  {mode}: the sink received {got} of {total} bytes", flush=True)
    return wall, cpu


async def _splice(src: socket.socket, dst: socket.socket) -> None:
    """One direction is enough for the cost per byte: socket -> pipe -> socket, zero copy."""
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    done = loop.create_future()
    in_pipe = 0

    def pump() -> None:
        nonlocal in_pipe
        try:
            while True:
                if in_pipe:
                    in_pipe -= os.splice(r, dst.fileno(), in_pipe, flags=os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE)
                    if in_pipe:
                        loop.remove_reader(src.fileno())
                        loop.add_writer(dst.fileno(), resume)
                        return
                n = os.splice(src.fileno(), w, 1 << 20, flags=os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE)
                if n == 0:
                    loop.remove_reader(src.fileno())
                    dst.shutdown(socket.SHUT_WR)
                    done.set_result(None)
                    return
                in_pipe += n
        except BlockingIOError:
            return

    def resume() -> None:
        loop.remove_writer(dst.fileno())
        loop.add_reader(src.fileno(), pump)
        pump()

    loop.add_reader(src.fileno(), pump)
    await done
    os.close(r)
    os.close(w)
    src.close()
    dst.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--chunks", type=int, nargs="*", default=[65536])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    modes = ["asyncio", "splice"]
    try:
        import uvloop
    except ImportError:
        uvloop = None
    else:
        modes.insert(1, "uvloop")
    total = args.mib << 20
    print(f"load {os.getloadavg()[0]:.2f}; {args.mib} MiB per run, best of {args.repeat}")
    for chunk in args.chunks:
        for mode in modes:
            results = []
            for _ in range(args.repeat):
                if mode == "uvloop":
                    results.append(uvloop.run(_run(mode, total, chunk)))
                else:
                    results.append(asyncio.run(_run(mode if mode == "splice" else "relay", total, chunk)))
            wall, cpu = min(results, key=lambda x: x[1])
            gib = total / (1 << 30)
            print(f"{mode:8} write size {chunk:6}: relay CPU {cpu / gib:6.2f} s/GiB, wall {total / wall / 1e6:8.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
