"""Run an HTTP hook: POST the event JSON and read at most MAX_OUTPUT_BYTES back.

The request goes through the egress proxy like any other sandbox traffic:
the standard HTTPS_PROXY / HTTP_PROXY / NO_PROXY variables (or an explicit
`proxy`), trusting SSL_CERT_FILE (or an explicit `ca_file`, typically the
proxy's interception CA). Credentials in the proxy URL
(`http://ENV_ID:TOKEN@gateway:8080`, a `--spec-dir` gateway) are sent as
`Proxy-Authorization: Basic` by httpx, on the CONNECT and on plain-HTTP requests. Redirects are never followed. httpx is imported
here, on first use, so a CLI run with only command hooks does not pay for it.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from dataclasses import dataclass

from egress import __version__
from egress.hooks.decisions import MAX_OUTPUT_BYTES

USER_AGENT = f"egress-hooks/{__version__}"
_MAX_ERROR_TEXT = 200
# `user:password@` in a URL: the proxy URL carries the sandbox's proxy credentials
# (`http://ENV_ID:TOKEN@gateway:8080`), which must not reach a log line.
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


@dataclass(frozen=True)
class HttpResult:
    status: int | None
    body: bytes
    body_truncated: bool
    timed_out: bool
    duration_ms: float
    error: str | None = None


async def post_event(
    url: str,
    body: bytes,
    headers: tuple[tuple[str, str], ...],
    timeout: float,
    *,
    proxy: str | None = None,
    ca_file: str | None = None,
) -> HttpResult:
    started = time.monotonic()

    def elapsed_ms() -> float:
        return round((time.monotonic() - started) * 1000, 1)

    try:
        async with asyncio.timeout(timeout):
            status, received, truncated = await _post(url, body, headers, timeout, proxy, ca_file)
    except TimeoutError:
        return HttpResult(None, b"", False, True, elapsed_ms())
    except Exception as exc:  # noqa: BLE001 - any failure of a hook is a fail-open, never a crash
        if _is_httpx_timeout(exc):
            return HttpResult(None, b"", False, True, elapsed_ms())
        return HttpResult(None, b"", False, False, elapsed_ms(), error=_describe(exc))
    return HttpResult(status, received, truncated, False, elapsed_ms())


async def _post(
    url: str,
    body: bytes,
    headers: tuple[tuple[str, str], ...],
    timeout: float,
    proxy: str | None,
    ca_file: str | None,
) -> tuple[int, bytes, bool]:
    import httpx

    request_headers = httpx.Headers(list(headers))
    # Set, not appended: the body is JSON whatever hooks.json says.
    request_headers["Content-Type"] = "application/json"
    request_headers.setdefault("User-Agent", USER_AGENT)
    # Compressed bodies could expand far past the cap inside a single chunk.
    request_headers["Accept-Encoding"] = "identity"
    client = httpx.AsyncClient(
        follow_redirects=False,
        trust_env=True,  # HTTPS_PROXY / HTTP_PROXY / NO_PROXY, SSL_CERT_FILE / SSL_CERT_DIR
        proxy=proxy,
        verify=_ssl_context(ca_file) if ca_file else True,
        timeout=httpx.Timeout(timeout),
    )
    async with client, client.stream("POST", url, content=body, headers=request_headers) as response:
        received = bytearray()
        truncated = False
        async for chunk in response.aiter_bytes():
            room = MAX_OUTPUT_BYTES - len(received)
            if len(chunk) > room:
                # Unlike a pipe, nobody blocks if we stop reading: leaving
                # the block closes the connection.
                received += chunk[:room]
                truncated = True
                break
            received += chunk
    return response.status_code, bytes(received), truncated


def _ssl_context(ca_file: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file)


def _is_httpx_timeout(exc: Exception) -> bool:
    import httpx

    return isinstance(exc, httpx.TimeoutException)


def _describe(exc: Exception) -> str:
    # Exception texts from httpx name the URL and the OS error; they never
    # carry request headers, which may hold secrets.
    text = _USERINFO.sub("***@", str(exc) or type(exc).__name__)
    return f"{type(exc).__name__}: {text[:_MAX_ERROR_TEXT]}"
