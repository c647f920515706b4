"""Misbehaving upstreams for the reliability tests, run inside the upstream namespace.

Each fault listens on port 8080 (plain) and 8443 (TLS) of an address of its own
(80/443 belong to the echo server, which listens on every address):
- --reset ADDR      reads the request, sends a response head promising 10 kB
                    (10 MB for /large) and 1000 bytes of it, then resets the
                    connection (RST);
- --stall ADDR      reads the request and never answers (plain HTTP and TLS);
- --big-head ADDR   answers with a 1 MiB response head.
Refused connections need no server (nothing listens), blackholed ones are made
with a firewall rule by the test. Prints `ready` once listening.

Usage: fault_server.py --cert C --key K [--reset A] [--stall A] [--big-head A]
"""

from __future__ import annotations

import argparse
import socket
import ssl
import struct
import threading
import time

HELD: list[socket.socket] = []  # stalled connections stay open until the process ends


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    conn.settimeout(30)
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def reset(conn: socket.socket) -> None:
    head = _read_head(conn)
    # /large promises more than the proxy buffers (it streams), anything else less.
    size = 10_000_000 if b" /large" in head.split(b"\r\n", 1)[0] else 10_000
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % size)
    conn.sendall(b"x" * 1000)
    time.sleep(0.2)
    # SO_LINGER with a zero timeout: close() sends RST instead of FIN.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def stall(conn: socket.socket) -> None:
    _read_head(conn)
    HELD.append(conn)


def big_head(conn: socket.socket) -> None:
    _read_head(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"a" * (1 << 20) + b"\r\n\r\n")
    time.sleep(1)
    conn.close()


def serve(address: str, port: int, handler, tls: ssl.SSLContext | None) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(128)

    def accept_loop() -> None:
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=_handle, args=(conn, handler, tls), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()


def _handle(conn: socket.socket, handler, tls: ssl.SSLContext | None) -> None:
    try:
        if tls is not None:
            conn.settimeout(30)
            conn = tls.wrap_socket(conn, server_side=True)
        handler(conn)
    except OSError:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--reset")
    parser.add_argument("--stall")
    parser.add_argument("--big-head")
    args = parser.parse_args()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(args.cert, args.key)
    tls.set_alpn_protocols(["http/1.1"])
    for address, handler in ((args.reset, reset), (args.stall, stall), (args.big_head, big_head)):
        if address:
            serve(address, 8080, handler, None)
            serve(address, 8443, handler, tls)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
