"""A sandbox client for transparent-mode tests: plain sockets, no proxy settings.

Runs inside the sandbox namespace as an unprivileged user (so the redirect rules
apply to it), with the system Python and the standard library only. Prints one
JSON object: the HTTP answer, what a raw socket received, or the error.

    sandbox_client.py https ADDRESS PORT --sni NAME [--no-sni] --ca FILE --host H --path P
    sandbox_client.py http  ADDRESS PORT --host H --path P
    sandbox_client.py raw   ADDRESS PORT --send TEXT
    sandbox_client.py udp   ADDRESS PORT --send TEXT
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys

TIMEOUT = 5.0


def _read_all(sock) -> tuple[bytes, bool]:
    """Everything received, and whether the peer closed (False: it went quiet instead)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk


def _http(sock, host: str, path: str, headers: list[str]) -> dict:
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Connection: close",
        *headers,
        "",
        "",
    ]
    # The peer's certificate before reading to EOF: with OpenSSL 3.5 (Debian trixie, the
    # image's base) getpeercert() after the peer's close_notify raises "handshake not done".
    peer = sock.getpeercert() if isinstance(sock, ssl.SSLSocket) else None
    sock.sendall("\r\n".join(lines).encode())
    data, _ = _read_all(sock)
    if not data:
        return {"error": "closed without an answer"}
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    answer = {
        "status": int(status_line.split()[1]),
        "headers": {
            k.strip().lower(): v.strip()
            for k, _, v in (h.partition(":") for h in header_lines)
        },
        "body": body.decode("utf-8", "replace"),
    }
    if peer is not None:
        issuer = dict(x[0] for x in peer["issuer"])
        answer["issuer"] = issuer.get("commonName", "")
    return answer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("https", "http", "raw", "udp"))
    parser.add_argument("address")
    parser.add_argument("port", type=int)
    parser.add_argument("--sni")
    parser.add_argument("--no-sni", action="store_true")
    parser.add_argument("--ca")
    parser.add_argument("--host")
    parser.add_argument("--path", default="/")
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--send", default="")
    parser.add_argument("--send-hex", default="", help="raw: bytes to send, hex-encoded (e.g. a handcrafted ClientHello)")
    args = parser.parse_args()
    try:
        if args.kind == "udp":
            family = socket.AF_INET6 if ":" in args.address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.settimeout(2.0)
            try:
                sock.sendto(args.send.encode(), (args.address, args.port))
                data, _ = sock.recvfrom(65536)
                result = {"received": data.decode("utf-8", "replace")}
            except TimeoutError:
                result = {"received": None}
            except (
                PermissionError
            ):  # an nftables drop in the output path refuses the send
                result = {"received": None, "send": "EPERM"}
        else:
            sock = socket.create_connection((args.address, args.port), timeout=TIMEOUT)
            if args.kind == "raw":
                sock.sendall(bytes.fromhex(args.send_hex) if args.send_hex else args.send.encode())
                data, closed = _read_all(sock)
                result = {"received": data.decode("utf-8", "replace"), "closed": closed}
            elif args.kind == "http":
                result = _http(sock, args.host, args.path, args.header)
            else:
                ctx = ssl.create_default_context(cafile=args.ca)
                if args.no_sni:
                    ctx.check_hostname = (
                        False  # no SNI is sent without a server_hostname
                    )
                    sock = ctx.wrap_socket(sock)
                else:
                    sock = ctx.wrap_socket(sock, server_hostname=args.sni)
                result = _http(sock, args.host or args.sni, args.path, args.header)
    except (OSError, ssl.SSLError, ValueError) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
