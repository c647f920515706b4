"""Test upstream: an echo server for end-to-end tests, run inside the upstream namespace.

Listens on every address of its namespace (each test host name maps to one of
them) with plain HTTP and HTTPS. Every request is answered with a JSON echo of
what arrived (local address, method, path, headers) and appended to a JSONL log,
so tests can assert both what a client saw and what an upstream received.
`/bytes/N` streams N bytes (for streaming and long-download tests); `/sse/N` sends N
server-sent events 0.4 s apart, chunked, as a streaming LLM API does; `/static/...`
serves files from --static (a dumb-HTTP git repository, for git clients).

Usage: upstream_server.py --cert C --key K --log FILE [--static DIR] [--http-port 80] [--https-port 443]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import BaseServer

LOCK = threading.Lock()


class DualStackServer(ThreadingHTTPServer):
    address_family = __import__("socket").AF_INET6
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        import socket

        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def make_handler(log_path: str, static: str | None, scheme: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _record(self, body: bytes) -> dict:
            local = self.connection.getsockname()[0].removeprefix("::ffff:")
            entry = {
                "time": time.time(),
                "scheme": scheme,
                "local": local,
                "peer": self.client_address[0].removeprefix("::ffff:"),  # who connected (a parent proxy?)
                "method": self.command,
                "path": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body_len": len(body),
            }
            with LOCK, open(log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
            return entry

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            entry = self._record(body)
            if self.path.startswith("/bytes/"):
                return self._stream_bytes(int(self.path.split("/")[2]))
            if self.path.startswith("/sse/"):
                return self._server_sent_events(int(self.path.split("/")[2]))
            if self.path.startswith("/static/") and static:
                return self._static(self.path[len("/static/") :])
            payload = json.dumps(entry).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _stream_bytes(self, count: int) -> None:
            delay = float(self.headers.get("X-Delay-Per-MiB", "0"))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(count))
            self.end_headers()
            chunk = b"x" * 65536
            sent = 0
            while sent < count:
                part = chunk[: min(len(chunk), count - sent)]
                self.wfile.write(part)
                sent += len(part)
                if delay and sent % (1 << 20) < len(part):
                    time.sleep(delay)

        def _server_sent_events(self, count: int) -> None:
            """`count` events, each flushed as its own chunk, 0.4 s apart, then the last chunk."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(count):
                event = f"data: {{\"n\": {i}, \"sent\": {time.time():.3f}}}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.4)
            self.wfile.write(b"0\r\n\r\n")

        def _static(self, rel: str) -> None:
            root = Path(static).resolve()
            target = (root / rel.split("?", 1)[0]).resolve()
            if root not in target.parents or not target.is_file():
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = target.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def serve(server: BaseServer) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--static")
    parser.add_argument("--http-port", type=int, default=80)
    parser.add_argument("--https-port", type=int, default=443)
    args = parser.parse_args()

    plain = DualStackServer(("::", args.http_port), make_handler(args.log, args.static, "http"))
    secure = DualStackServer(("::", args.https_port), make_handler(args.log, args.static, "https"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    # Handshake in the handler thread, so a client that never completes one cannot stall accept().
    secure.socket = context.wrap_socket(secure.socket, server_side=True, do_handshake_on_connect=False)
    serve(plain)
    serve(secure)
    print("ready", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        os._exit(0)


if __name__ == "__main__":
    main()
