"""Real clients for end-to-end tests: curl in the proxy namespace, httpx, and assertions on answers."""

from __future__ import annotations

import json
import ssl

import httpx

from e2e.support.lab import Lab


def client_ca_bundle(lab: Lab, proxy) -> str:
    """What a sandbox trusts: the proxy's CA (intercepted hosts) and the upstreams' (passthrough)."""
    bundle = proxy.dir / "client-ca.pem"
    if not bundle.exists():
        bundle.write_text(proxy.ca.read_text() + lab.upstream_ca.read_text())
    return str(bundle)


def curl(lab: Lab, proxy, url: str, *args: str) -> tuple[int, dict, str]:
    """Real curl through the proxy; returns (status, headers, body); status 0 when no response."""
    head_file, body_file = proxy.dir / "curl.head", proxy.dir / "curl.body"
    head_file.unlink(missing_ok=True)
    body_file.unlink(missing_ok=True)
    out = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", proxy.url, "--cacert", client_ca_bundle(lab, proxy),
        "-D", str(head_file), "-o", str(body_file), url, *args,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if not head_file.exists() or not head_file.read_bytes().strip():
        return 0, {}, out.stderr
    # With CONNECT, curl records the proxy's answer first; keep the last response.
    head = [b for b in head_file.read_bytes().decode().split("\r\n\r\n") if b.startswith("HTTP/")][-1]
    status = int(head.split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:])}
    return status, headers, body_file.read_text() if body_file.exists() else ""


def httpx_client(lab: Lab, proxy) -> httpx.Client:
    # Explicit CA: the machine's REQUESTS_CA_BUNDLE etc. must not decide what is trusted.
    ctx = ssl.create_default_context(cafile=str(proxy.ca))
    return httpx.Client(proxy=proxy.url, verify=ctx, trust_env=False, timeout=10)


def assert_denied(status: int, headers: dict, body: str, reason: str, host: str) -> None:
    assert status == 403, (status, body)
    assert headers.get("x-egress-denied") == reason
    assert json.loads(body) == {"error": "egress_denied", "reason": reason, "host": host}


def upstream_hits(lab: Lab, address: str) -> list[dict]:
    return [r for r in lab.upstream_requests() if r["local"] == address]


def as_received(lab: Lab, echo: dict) -> dict:
    """The upstream's own record of the request an echo answered: what it received,
    injected credentials included. The echo itself reaches the sandbox with every injected
    secret masked, so the upstream log is where a test sees what went on the wire."""
    key = (echo["time"], echo["path"], echo["local"])
    for hit in reversed(lab.upstream_requests()):
        if (hit["time"], hit["path"], hit["local"]) == key:
            return hit
    raise AssertionError(f"the upstream logged no request {key}")


def status_and_reason(answer: bytes) -> tuple[int, str]:
    """(status, X-Egress-Denied) of a raw HTTP/1 answer; status 0 when there is none."""
    head = answer.partition(b"\r\n\r\n")[0].decode("latin-1")
    first, *lines = head.split("\r\n")
    status = int(first.split()[1]) if first.startswith("HTTP/") else 0
    reason = next((v.strip() for k, _, v in (line.partition(":") for line in lines) if k.lower() == "x-egress-denied"), "")
    return status, reason
