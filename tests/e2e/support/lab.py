"""The end-to-end lab: network namespaces, test hosts, certificates, the real proxy.

Layout (one lab per test session, names unique to the pytest process):

    proxy namespace  egp-N                 upstream namespace  egu-N
    ├─ egress-proxy on 127.0.0.1           ├─ upstream_server.py on every address
    ├─ clients (curl, git, httpx, raw)     │   198.18.0.2, .10-.19, 2001:2::2, ...
    ├─ loopback canary on [::]:CANARY      │
    └─ veth 198.18.0.1/24, 2001:2::1/64 ───┘

Test host names live in /etc/netns/egp-N/hosts, which `ip netns exec` mounts over
/etc/hosts for the proxy. Only 198.18.0.0/15 and 2001:2::/48 (benchmarking
ranges) and loopback inside the namespace are ever used.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HERE = Path(__file__).parent
VENV_BIN = Path(sys.executable).parent
EGRESS_PROXY = str(VENV_BIN / "egress-proxy")

PROXY_V4, UPSTREAM_V4 = "198.18.0.1", "198.18.0.2"
PROXY_V6, UPSTREAM_V6 = "2001:2::1", "2001:2::2"
# name -> upstream address; each name gets an address of its own so that the echo's
# `local` field tells which "host" a request reached.
HOSTS = {
    "api.example.test": "198.18.0.10",
    "a.example.test": "198.18.0.11",
    "deep.a.example.test": "198.18.0.11",
    "example.test": "198.18.0.12",
    "evilexample.test": "198.18.0.13",
    "example.test.evil.test": "198.18.0.13",
    "other.test": "198.18.0.14",
    "telemetry.example.test": "198.18.0.15",
    "plain.test": "198.18.0.16",
    "passthrough.test": "198.18.0.17",
    "mixed.test": "198.18.0.18",
    "v6only.test": "2001:2::10",
}
EXTRA_HOST_LINES = [
    "127.0.0.1 sneaky.test",  # a name that resolves to loopback
    "127.0.0.1 mixed.test",  # ...and one that resolves to loopback and a permitted address
    "169.254.169.254 metadata.test",
]
CANARY_PORT = 7777
# The test hosts' networks: HOSTS live in 198.18.0.0/15, their v6 twins in 2001:2::/48.
TEST_CIDRS_V4 = ("198.18.0.0/15",)
TEST_CIDRS_DUAL = ("198.18.0.0/15", "2001:2::/48")


def bearer(env_var: str) -> dict[str, str]:
    """The transform that injects `Authorization: Bearer <value of env_var>`."""
    return {"Authorization": f"Bearer ${{env:{env_var}}}"}


def allowlist_spec(*entries: str | tuple[str, dict[str, str]], cidrs: tuple[str, ...] = TEST_CIDRS_V4) -> str:
    """A spec's YAML text: `network.allowCidrs` = cidrs and one allowlist entry per item,
    either a bare domain or (domain, {header: value}) for an entry with a transform.
    Many e2e tests and bench/soak.py use the same shape of spec; values are written as
    JSON strings (valid YAML) so that names such as "*.example.test" need no care."""
    lines = ["network:", f"  allowCidrs: {json.dumps(list(cidrs))}", "  allowlist:"]
    for entry in entries:
        domain, transform = (entry, {}) if isinstance(entry, str) else entry
        lines.append(f"    - domain: {json.dumps(domain)}")
        if transform:
            lines.append("      transform:")
            lines += [f"        {header}: {json.dumps(value)}" for header, value in transform.items()]
    return "\n".join(lines) + "\n"


def hosts_file_text() -> str:
    """/etc/hosts of every test namespace and container: the test host names."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost"]
    lines += [f"{address} {name}" for name, address in HOSTS.items()]
    lines += EXTRA_HOST_LINES
    return "\n".join(lines) + "\n"


def write_netns_etc(netns: str) -> None:
    """/etc/netns/NETNS/{hosts,resolv.conf}, what `ip netns exec NETNS` mounts over /etc."""
    etc = Path("/etc/netns") / netns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(hosts_file_text())
    # No resolver: names outside the hosts file fail at once instead of timing out.
    (etc / "resolv.conf").write_text("options timeout:1 attempts:1\nnameserver 127.0.0.53\n")


def run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


@contextlib.contextmanager
def in_netns(name: str):
    """Run the calling thread inside network namespace `name` (sockets keep it afterwards)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        os.setns(target, os.CLONE_NEWNET)
        yield
    finally:
        os.setns(home, os.CLONE_NEWNET)
        os.close(home)
        os.close(target)


def listen_tcp(netns: str, address: str, port: int, backlog: int = 64) -> socket.socket:
    """A listening TCP socket made inside netns (a socket keeps the namespace it was made
    in), IPv6 when the address is. The test servers below all start this way."""
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if address == "::":
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # the wildcard takes v4 too
    sock.bind((address, port))
    sock.listen(backlog)
    return sock


def serve_connections(sock: socket.socket, handle, threaded: bool = True) -> None:
    """Accept on `sock` in a daemon thread until it is closed (accept then raises OSError),
    calling handle(conn, peer) for each connection: in a daemon thread of its own when
    threaded, else in the accept thread (for handlers that must see connections in order)."""

    def accept_loop() -> None:
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            if threaded:
                threading.Thread(target=handle, args=(conn, peer), daemon=True).start()
            else:
                handle(conn, peer)

    threading.Thread(target=accept_loop, daemon=True).start()


def http_get_in_netns(
    netns: str, port: int, path: str, timeout: float = 2.0, host: str = "127.0.0.1"
) -> tuple[int, str]:
    """GET http://HOST:PORT/PATH from inside `netns` (status 0: no answer)."""
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((host, port))
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        return 0, ""
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return (int(head.split()[1]) if head else 0), body.decode("utf-8", "replace")


def _cert(subject: str, key, issuer_cert=None, issuer_key=None, sans=(), ca=False):
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # Python 3.13's default VERIFY_X509_STRICT requires both key identifiers.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key((issuer_key or key).public_key()), critical=False
        )
    )
    if sans:
        alt = []
        for s in sans:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(s)))
            except ValueError:
                alt.append(x509.DNSName(s))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem(obj) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class Canary:
    """A listener on loopback (all addresses, both families) that must never be reached."""

    netns: str
    port: int = CANARY_PORT
    hits: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.sock = listen_tcp(self.netns, "::", self.port)
        serve_connections(self.sock, self._record, threaded=False)

    def _record(self, conn: socket.socket, peer) -> None:
        self.hits.append(str(peer[0]))
        conn.close()


class Lab:
    def __init__(self, workdir: Path):
        self.id = os.getpid() % 100000
        self.proxy_ns = f"egp-{self.id}"
        self.upstream_ns = f"egu-{self.id}"
        self.dir = workdir
        self.upstream_log = workdir / "upstream.jsonl"
        self._procs: list[subprocess.Popen] = []
        self._next_port = 18000

    # -- set-up ----------------------------------------------------------------
    def start(self) -> None:
        self._cleanup_namespaces()
        sh = lambda *a: run(["ip", *a])  # noqa: E731
        sh("netns", "add", self.proxy_ns)
        sh("netns", "add", self.upstream_ns)
        vp, vu = f"vp{self.id}", f"vu{self.id}"
        sh("link", "add", vp, "type", "veth", "peer", "name", vu)
        sh("link", "set", vp, "netns", self.proxy_ns)
        sh("link", "set", vu, "netns", self.upstream_ns)
        pns = ["ip", "netns", "exec", self.proxy_ns]
        uns = ["ip", "netns", "exec", self.upstream_ns]
        run([*pns, "ip", "link", "set", "lo", "up"])
        run([*uns, "ip", "link", "set", "lo", "up"])
        run([*pns, "ip", "addr", "add", f"{PROXY_V4}/24", "dev", vp])
        run([*pns, "ip", "-6", "addr", "add", f"{PROXY_V6}/64", "dev", vp, "nodad"])
        run([*uns, "ip", "addr", "add", f"{UPSTREAM_V4}/24", "dev", vu])
        run([*uns, "ip", "-6", "addr", "add", f"{UPSTREAM_V6}/64", "dev", vu, "nodad"])
        for address in sorted(set(HOSTS.values())):
            if ":" in address:
                run([*uns, "ip", "-6", "addr", "add", f"{address}/64", "dev", vu, "nodad"])
            else:
                run([*uns, "ip", "addr", "add", f"{address}/24", "dev", vu])
        run([*pns, "ip", "link", "set", vp, "up"])
        run([*uns, "ip", "link", "set", vu, "up"])
        write_netns_etc(self.proxy_ns)
        self._make_certificates()
        self._make_git_repo()
        self._start_upstream()
        self.canary = Canary(self.proxy_ns)
        self.canary.start()

    def _make_certificates(self) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("egress test upstream CA", ca_key, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        names = [*HOSTS, *sorted(set(HOSTS.values())), UPSTREAM_V4, "*.example.test"]
        cert = _cert("egress test upstream", key, ca, ca_key, sans=names)
        self.upstream_ca = self.dir / "upstream-ca.pem"
        self.upstream_ca.write_bytes(_pem(ca))
        (self.dir / "upstream.pem").write_bytes(_pem(cert))
        (self.dir / "upstream.key").write_bytes(_pem(key))

    def _make_git_repo(self) -> None:
        """A bare repository served over dumb HTTP, for a real `git clone` through the proxy."""
        work = self.dir / "gitwork"
        static = self.dir / "static"
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
        run(["git", "init", "-q", "-b", "main", str(work)], env=env)
        (work / "README").write_text("hello through the proxy\n")
        run(["git", "-C", str(work), "add", "README"], env=env)
        run(["git", "-C", str(work), "commit", "-q", "-m", "init"], env=env)
        static.mkdir(exist_ok=True)
        run(["git", "clone", "-q", "--bare", str(work), str(static / "repo.git")], env=env)
        run(["git", "-C", str(static / "repo.git"), "update-server-info"], env=env)

    def _start_upstream(self) -> None:
        cmd = [
            "ip", "netns", "exec", self.upstream_ns, sys.executable, str(HERE / "upstream_server.py"),
            "--cert", str(self.dir / "upstream.pem"), "--key", str(self.dir / "upstream.key"),
            "--log", str(self.upstream_log), "--static", str(self.dir / "static"),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._procs.append(proc)
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"upstream server failed: {proc.stderr.read()}")

    # -- helpers for tests -------------------------------------------------------
    def free_port(self) -> int:
        self._next_port += 1
        return self._next_port

    def exec(self, *cmd: str, timeout: float = 30, env: dict | None = None, check: bool = False):
        """Run a client command inside the proxy namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.proxy_ns, *cmd],
            capture_output=True, text=True, timeout=timeout, env=env, check=check,
        )  # fmt: skip

    def upstream_requests(self) -> list[dict]:
        if not self.upstream_log.exists():
            return []
        # Only complete lines: the upstream may be writing the last one while it is read.
        complete = self.upstream_log.read_text().split("\n")[:-1]
        return [json.loads(line) for line in complete if line]

    def start_proxy(
        self,
        spec_text: str | None,
        *extra: str,
        env: dict | None = None,
        name: str = "spec.yaml",
        upstream_ca: bool = True,
        spec_path: Path | None = None,
        spec_dir: Path | None = None,
    ) -> ProxyProcess:
        """Start a proxy on `spec_text` (written to its own dir), on an existing `spec_path`,
        or on the environments in `spec_dir` (`--spec-dir`)."""
        if upstream_ca:
            extra = ("--upstream-ca", str(self.upstream_ca), *extra)
        proxy = ProxyProcess(self, spec_text, list(extra), env=env, name=name, spec_path=spec_path, spec_dir=spec_dir)
        proxy.start()
        self._procs.append(proxy.proc)
        return proxy

    # -- tear-down ---------------------------------------------------------------
    def stop(self) -> None:
        for proc in self._procs:
            _terminate(proc)
        with contextlib.suppress(Exception):
            self.canary.sock.close()
        self._cleanup_namespaces()

    def _cleanup_namespaces(self) -> None:
        for ns in (self.proxy_ns, self.upstream_ns):
            run(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def _terminate(proc: subprocess.Popen) -> None:
    # Only processes this lab started, by PID; `ip netns exec` execs, so the PID is the program's.
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class ProxyProcess:
    """A real `egress-proxy run` inside the proxy namespace."""

    def __init__(
        self, lab: Lab, spec_text: str | None, extra: list[str], env: dict | None, name: str,
        spec_path: Path | None = None, spec_dir: Path | None = None,
    ):  # fmt: skip
        self.lab = lab
        self.port = lab.free_port()
        self.metrics_port = lab.free_port()
        self.dir = lab.dir / f"proxy-{self.port}"
        self.dir.mkdir()
        self.spec_path = spec_path or self.dir / name
        self.spec_dir = spec_dir
        if spec_path is None and spec_dir is None:
            self.spec_path.write_text(spec_text)
        self.confdir = self.dir / "conf"
        self.extra = extra
        self.env = {**os.environ, **(env or {})}
        self.stdout_path = self.dir / "stdout.log"
        self.stderr_path = self.dir / "stderr.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"

    def command(self, *more: str) -> list[str]:
        return [
            "ip", "netns", "exec", self.lab.proxy_ns, EGRESS_PROXY, "run",
            *(("--spec-dir", str(self.spec_dir)) if self.spec_dir else ("--spec", str(self.spec_path))),
            "--listen", f"127.0.0.1:{self.port}",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--confdir", str(self.confdir),
            *self.extra, *more,
        ]  # fmt: skip

    def start(self, ready_within: float = 20) -> None:
        cmd = self.command()
        self.proc = subprocess.Popen(
            cmd, stdout=self.stdout_path.open("w"), stderr=self.stderr_path.open("w"), env=self.env
        )
        program = Path(cmd[4]).name
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{program} exited {self.proc.returncode}: {self.stdout()[-2000:]}{self.stderr()}")
            if self.get_ops("/readyz")[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{program} not ready: {self.stderr()}")

    def get_ops(self, path: str) -> tuple[int, str]:
        """GET on the metrics listener (from inside the namespace)."""
        return http_get_in_netns(self.lab.proxy_ns, self.metrics_port, path)

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout().splitlines() if line.startswith("{")]

    def stop(self) -> None:
        _terminate(self.proc)


def raw_request(lab: Lab, port: int, data: bytes, timeout: float = 10) -> bytes:
    """Send bytes exactly as given to the proxy and return everything it answers."""
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(data)
        out = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out and _complete(out):
                break
        return out
    finally:
        sock.close()


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False
