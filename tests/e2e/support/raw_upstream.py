"""A raw upstream for attack tests: records every byte it receives, answers from a script.

The echo server (`upstream_server.py`) parses requests like a well-behaved server, so it
cannot show what a *proxy* put on the wire: a second request hidden in a body, a header
line smuggled by framing, a credential sent to a port or method it was not meant for.
This one runs as threads inside the upstream namespace (its sockets are created there),
listens on one address and port, with or without TLS (the lab's upstream certificate),
keeps the raw bytes of each connection, and answers each request head it sees with
`respond(head)` (bytes written as they are, so a test can play a hostile server: a
TRACE echo, a redirect, an `Alt-Svc`).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from e2e.support.lab import Lab, listen_tcp, serve_connections


def ok(head: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class RawUpstream:
    lab: Lab
    address: str
    port: int
    tls: bool = True
    respond: Callable[[bytes], bytes] = ok
    connections: list[bytearray] = field(default_factory=list)

    def __enter__(self) -> RawUpstream:
        self.sock = listen_tcp(self.lab.upstream_ns, self.address, self.port)
        self.context = None
        if self.tls:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(self.lab.dir / "upstream.pem", self.lab.dir / "upstream.key")
            self.context.set_alpn_protocols(["http/1.1"])
        serve_connections(self.sock, self._serve)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread; close() alone would not
        self.sock.close()

    @property
    def received(self) -> bytes:
        return b"".join(bytes(c) for c in self.connections)

    def _serve(self, conn: socket.socket, _peer) -> None:
        data = bytearray()
        self.connections.append(data)
        answered = 0  # request heads answered so far
        try:
            conn.settimeout(5)
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            while chunk := conn.recv(65536):
                data += chunk
                heads = bytes(data).split(b"\r\n\r\n")[:-1]
                for head in heads[answered:]:
                    if head.split(b" ", 1)[0].isalpha():  # a request line, not a body chunk
                        conn.sendall(self.respond(head))
                answered = len(heads)
        except (OSError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()
