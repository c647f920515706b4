"""Test token servers for end-to-end credential tests, run inside the upstream namespace.

HTTPS (the lab's upstream certificate) on --listen ADDRESS:PORT, with the real libraries
on the server side:
- `POST /oauth/token`: OAuth2 client_credentials; the client authenticates with HTTP
  Basic (RFC 6749 §2.3.1), checked against --client-id/--client-secret.
- `POST /google/token`: the JWT-bearer grant; the assertion is verified by google-auth
  with the service account's public key (--google-public-key), audience this URL.
- `POST /api/v3/app/installations/<id>/access_tokens`: GitHub's installation token
  call; the app JWT is verified by PyJWT with the app's public key (--github-public-key).
Tokens are `<prefix><canary>-<n>` and expire after --lifetime seconds. Every call is
appended to --log as one JSON line (kind, ok), never with the token it issued.
Resource endpoints for the same tests (any host name that maps here):
- `/git/<repo>/...`: real `git http-backend` (CGI) over --git-root, only for HTTP Basic
  `x-access-token:<an installation token this server issued and that has not expired>`;
  401 with `WWW-Authenticate` otherwise, as GitHub answers.
- `GET /echo-large/<N>`: an N-byte body made of the request's Authorization header
  repeated (with padding), Content-Length framed: a large echo the proxy streams.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import ssl
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from google.auth import jwt as google_jwt

LOCK = threading.Lock()
COUNT = [0]
ISSUED: dict[str, float] = {}  # installation token -> expiry (time.time())


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--listen", "--cert", "--key", "--log", "--canary", "--client-id", "--client-secret",
                 "--google-public-key", "--github-public-key", "--github-app-id"):  # fmt: skip
        p.add_argument(name, required=True)
    p.add_argument("--lifetime", type=float, default=3)
    p.add_argument("--git-root", default="")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    google_key = open(args.google_public_key).read()
    github_key = open(args.github_public_key).read()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _log(self, kind: str, ok: bool, detail: str = "") -> None:
            with LOCK, open(args.log, "a") as f:
                f.write(json.dumps({"time": time.time(), "kind": kind, "ok": ok, "detail": detail}) + "\n")

        def _answer(self, status: int, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _token(self, prefix: str) -> str:
            with LOCK:
                COUNT[0] += 1
                return f"{prefix}{args.canary}-{COUNT[0]}"

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            form = dict(urllib.parse.parse_qsl(body.decode()))
            if self.path == "/oauth/token":
                expected = base64.b64encode(f"{args.client_id}:{args.client_secret}".encode()).decode()
                ok = self.headers.get("Authorization") == f"Basic {expected}" and form.get("grant_type") == "client_credentials"
                self._log("oauth2", ok, form.get("scope", ""))
                if not ok:
                    return self._answer(401, {"error": "invalid_client"})
                return self._answer(200, {"access_token": self._token("oat-"), "token_type": "Bearer", "expires_in": args.lifetime})
            if self.path == "/google/token":
                try:
                    claims = google_jwt.decode(form.get("assertion", ""), certs=google_key,
                                               audience=f"https://{self.headers['Host']}/google/token")  # fmt: skip
                    ok = form.get("grant_type") == "urn:ietf:params:oauth:grant-type:jwt-bearer" and "cloud-platform" in claims["scope"]
                except Exception as exc:  # noqa: BLE001
                    ok, claims = False, {"error": type(exc).__name__ + str(exc)[:100]}
                self._log("google", ok, claims.get("iss", "") if ok else claims.get("error", ""))
                if not ok:
                    return self._answer(400, {"error": "invalid_grant"})
                return self._answer(200, {"access_token": self._token("ya29."), "expires_in": args.lifetime, "token_type": "Bearer"})
            if self.path.startswith("/api/v3/app/installations/") and self.path.endswith("/access_tokens"):
                auth = self.headers.get("Authorization", "")
                try:
                    claims = jwt.decode(auth.removeprefix("Bearer "), github_key, algorithms=["RS256"])
                    ok = str(claims["iss"]) == args.github_app_id and claims["exp"] - claims["iat"] <= 600
                except jwt.PyJWTError:
                    ok = False
                self._log("github", ok, self.path)
                if not ok:
                    return self._answer(401, {"message": "A JSON web token could not be decoded"})
                expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=args.lifetime)
                token = self._token("ghs_")
                ISSUED[token] = time.time() + args.lifetime
                return self._answer(201, {"token": token, "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ")})
            if self.path.startswith("/git/"):
                return self._git(body)
            self._answer(404, {"error": "not_found"})

        def do_GET(self) -> None:  # noqa: N802
            if self.path.startswith("/git/"):
                return self._git(b"")
            if self.path.startswith("/echo-large/"):
                size = int(self.path.rsplit("/", 1)[1])
                piece = (self.headers.get("Authorization", "") + " " + "p" * 1237 + "\n").encode()
                body = (piece * (size // len(piece) + 1))[:size]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self._answer(404, {"error": "not_found"})

        def _git(self, body: bytes) -> None:
            scheme, _, value = self.headers.get("Authorization", "").partition(" ")
            try:
                user, _, password = base64.b64decode(value).decode().partition(":")
            except ValueError:
                user = password = ""
            ok = scheme == "Basic" and user == "x-access-token" and ISSUED.get(password, 0) > time.time()
            self._log("git", ok, self.command)
            if not ok:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="GitHub"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            env = {
                "GIT_PROJECT_ROOT": args.git_root, "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path[len("/git"):],
                "QUERY_STRING": query, "REQUEST_METHOD": self.command, "REMOTE_USER": user, "REMOTE_ADDR": "198.18.0.1",
                "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
                "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""), "PATH": "/usr/bin:/bin",
            }  # fmt: skip
            if self.headers.get("Content-Encoding") == "gzip":
                env["HTTP_CONTENT_ENCODING"] = "gzip"
            done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=30)
            head, _, out = done.stdout.partition(b"\r\n\r\n")
            status, headers = 200, []
            for line in head.decode("latin-1").split("\r\n"):
                name, _, field = line.partition(":")
                if name.lower() == "status":
                    status = int(field.split()[0])
                elif name:
                    headers.append((name, field.strip()))
            self.send_response(status)
            for name, field in headers:
                self.send_header(name, field)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.cert, args.key)

    class TLSServer(ThreadingHTTPServer):
        daemon_threads = True

        def finish_request(self, request, client_address) -> None:
            # The handshake in the connection's own thread: a client that connects and waits
            # (the proxy dials at CONNECT, before the sandbox's TLS) must not hold up the others.
            with contextlib.suppress(ssl.SSLError, OSError):
                request = ctx.wrap_socket(request, server_side=True)
                super().finish_request(request, client_address)

    server = TLSServer((host, int(port)), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
