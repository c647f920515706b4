"""Extra test hosts and servers for the credential tests, on top of the session's lab:
names under *.example.test (the lab certificate covers them) on addresses of their own
in 198.18.0.0/15, a token server, and keys made here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from e2e.support.lab import HERE, Lab, run


def add_host(lab: Lab, name: str, address: str) -> None:
    """`name` resolves to `address` in the proxy namespace; the upstream namespace holds it."""
    hosts = Path("/etc/netns") / lab.proxy_ns / "hosts"
    if f" {name}\n" not in hosts.read_text():
        with hosts.open("a") as f:
            f.write(f"{address} {name}\n")
    run(["ip", "netns", "exec", lab.upstream_ns, "ip", "addr", "add", f"{address}/24", "dev", f"vu{lab.id}"], check=False)


def rsa_key_pair(directory: Path, stem: str) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = directory / f"{stem}.pem"
    public = directory / f"{stem}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def start_in_upstream(lab: Lab, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
    """A test server inside the upstream namespace that prints `ready` once listening."""
    proc = subprocess.Popen(["ip", "netns", "exec", lab.upstream_ns, *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    lab._procs.append(proc)
    line = proc.stdout.readline() if proc.stdout else ""
    if "ready" not in line:
        proc.kill()
        raise RuntimeError(f"test server failed: {proc.stderr.read() if proc.stderr else ''}")
    return proc


def token_server_cmd(lab: Lab, listen: str, log: Path, canary: str, keys: dict[str, Path], lifetime: float) -> list[str]:
    return [
        sys.executable, str(HERE / "token_server.py"), "--listen", listen,
        "--cert", str(lab.dir / "upstream.pem"), "--key", str(lab.dir / "upstream.key"), "--log", str(log),
        "--canary", canary, "--client-id", "egress", "--client-secret", keys["client_secret"].read_text(),
        "--google-public-key", str(keys["google_pub"]), "--github-public-key", str(keys["github_pub"]),
        "--github-app-id", "4242", "--lifetime", str(lifetime), "--git-root", str(lab.dir / "static"),
    ]  # fmt: skip
