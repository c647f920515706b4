"""What the HTTP-hook unit tests share: a quiet HTTP/1.1 request handler that sends canned replies."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive, as real webhooks are), no request log on stderr; `reply` sends one answer."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def reply(self, status: int, payload: bytes, extra: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
