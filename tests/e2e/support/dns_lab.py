"""Real resolvers for the DNS tests (issue 11): dnsmasq that logs every query it gets.

    sandbox namespace egs-N (transparent_lab)          upstream namespace egu-N
    ├─ egress-proxy --mode transparent --dns-listen    ├─ dnsmasq "cluster"  198.18.0.53, 2001:2::53
    ├─ redirect-rules --dns-port (uid 0 exempt)        │    (the sandbox's resolv.conf; the proxy's too)
    ├─ dnsmasq "stub" on 127.0.0.53 (a loopback stub)  ├─ dnsmasq "public"   198.18.0.54
    └─ clients as `nobody`: getent, python, curl, dig  └─ sink: UDP+TCP :53 on 198.18.0.55 (no resolver;
                                                            records whatever arrives)

Every dnsmasq answers from its command line only (`--no-resolv --no-hosts`), so a
query that reaches one never goes further, and `--log-queries` writes each query
it receives to its own log file: a name absent from every log never left.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from e2e.support.lab import Lab, ProxyProcess, in_netns, listen_tcp, run, serve_connections
from e2e.support.transparent_lab import RESOLVER_V4, RESOLVER_V6, SANDBOX_GW_V4, SANDBOX_GW_V6, Sandbox

PUBLIC_RESOLVER_V4 = "198.18.0.54"
SINK_V4 = "198.18.0.55"
STUB_V4 = "127.0.0.53"
# name -> addresses the "cluster" and "public" resolvers answer; none of these names is
# in the namespace's hosts file, so the proxy's getaddrinfo asks the cluster resolver.
RECORDS = {
    "dnsonly.example.test": ["198.18.0.10"],
    "reload.example.test": ["198.18.0.11"],
    "mixed.dns.example.test": ["127.0.0.1", "169.254.169.254", "198.18.0.12"],
    "internal.example.test": ["10.1.2.3"],
    "loop.example.test": ["127.0.0.1"],
    "many.example.test": [f"198.18.2.{i}" for i in range(1, 41)],  # 40 A records: > 512 bytes
    "attacker.test": ["198.18.0.13"],
    "dual.example.test": ["198.18.0.14", "2001:2::14"],  # one of each family
    # Under an allowlisted wildcard, resolving to addresses the guard refuses.
    "loop.wild.example.test": ["127.0.0.1", "::1"],
    "meta.wild.example.test": ["169.254.169.254", "fd00:ec2::254"],
}


class Dnsmasq:
    """One dnsmasq in a namespace, on given addresses, logging queries to `log`."""

    def __init__(self, netns: str, workdir: Path, name: str, addresses: list[str], wildcard: str | None = None):
        self.log = workdir / f"dnsmasq-{name}.log"
        self.log.write_text("")
        hosts = workdir / f"dnsmasq-{name}.hosts"
        hosts.write_text("".join(f"{a} {n}\n" for n, addrs in RECORDS.items() for a in addrs))
        cmd = [
            "ip", "netns", "exec", netns, "dnsmasq", "--no-daemon", "--conf-file=/dev/null",
            "--no-resolv", "--no-hosts", f"--addn-hosts={hosts}", "--log-queries", f"--log-facility={self.log}",
            "--bind-interfaces", "--pid-file=", "--user=root", "--cache-size=0",
            *(f"--listen-address={a}" for a in addresses),
            # Any other name under attacker.test answers too, like an attacker's name server.
            "--address=/attacker.test/198.18.0.13",
            # Any name under fresh.example.test: one A and one AAAA (a name no cache holds yet).
            "--address=/fresh.example.test/198.18.0.15", "--address=/fresh.example.test/2001:2::15",
            # Authoritative for example.test: unknown names NXDOMAIN, missing types NODATA.
            "--local=/example.test/",
        ]  # fmt: skip
        if wildcard:
            cmd.append(f"--address=/#/{wildcard}")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while "started" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dnsmasq {name} did not start: {self.proc.stderr.read() if self.proc.stderr else ''}")
            time.sleep(0.05)

    def queries(self) -> str:
        """Only the query lines (the start-up lines name options, not queries)."""
        return "\n".join(line for line in self.log.read_text().splitlines() if "query[" in line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


class Sink:
    """UDP and TCP port 53 on an address where no resolver runs; records every byte that arrives."""

    def __init__(self, netns: str, address: str):
        self.received: list[bytes] = []
        with in_netns(netns):
            self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((address, 53))
        self.tcp = listen_tcp(netns, address, 53, backlog=16)
        threading.Thread(target=self._udp, daemon=True).start()
        serve_connections(self.tcp, self._record_tcp, threaded=False)

    def _udp(self) -> None:
        while True:
            try:
                self.received.append(self.udp.recv(65536))
            except OSError:
                return

    def _record_tcp(self, conn: socket.socket, _peer) -> None:
        conn.settimeout(2)
        try:
            self.received.append(conn.recv(65536) or b"<connected>")
        except OSError:
            self.received.append(b"<connected>")
        finally:
            conn.close()

    def stop(self) -> None:
        # shutdown wakes the threads blocked in recv/accept: a socket closed under a
        # blocked call stays bound until the call returns, keeping port 53 taken for
        # the next module's UDP echo on the same namespace.
        for sock in (self.udp, self.tcp):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class DnsSandbox(Sandbox):
    """The transparent sandbox with real resolvers instead of the UDP echo on port 53."""

    udp_ports = (443,)  # port 53 is the resolvers' here

    def start(self) -> None:
        super().start()
        lab, ns = self.lab, self.proxy_ns
        uns = ["ip", "netns", "exec", lab.upstream_ns]
        # Like a pod: a default route, so a query to any address is routable (and must
        # still never leave).
        run(["ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", SANDBOX_GW_V4])
        run(["ip", "netns", "exec", ns, "ip", "-6", "route", "add", "default", "via", SANDBOX_GW_V6])
        vt = f"vt{lab.id}"
        for address in (PUBLIC_RESOLVER_V4, SINK_V4):
            run([*uns, "ip", "addr", "add", f"{address}/32", "dev", vt])
        # The sandbox (and the proxy beside it) use the "cluster" resolver.
        (Path("/etc/netns") / ns / "resolv.conf").write_text(f"options timeout:2 attempts:1\nnameserver {RESOLVER_V4}\n")
        self.cluster = Dnsmasq(lab.upstream_ns, self.dir, "cluster", [RESOLVER_V4, RESOLVER_V6])
        self.public_resolver = Dnsmasq(lab.upstream_ns, self.dir, "public", [PUBLIC_RESOLVER_V4])
        self.stub = Dnsmasq(ns, self.dir, "stub", [STUB_V4], wildcard="198.18.0.13")
        self.sink = Sink(lab.upstream_ns, SINK_V4)
        self.resolvers = [self.cluster, self.public_resolver, self.stub]

    def start_dns_proxy(self, spec_text: str, *extra: str) -> ProxyProcess:
        self.dns_port = self.free_port()
        return self.start_proxy(spec_text, extra=("--dns-listen", f"127.0.0.1:{self.dns_port}", *extra))

    def all_queries(self) -> str:
        return "\n".join(r.queries() for r in self.resolvers)

    def stop(self) -> None:
        for resolver in getattr(self, "resolvers", []):
            resolver.stop()
        if getattr(self, "sink", None) is not None:
            self.sink.stop()
        super().stop()



@contextlib.contextmanager
def redirected_sandbox(lab: Lab, spec_text: str) -> Iterator[DnsSandbox]:
    """A started DnsSandbox whose proxy has a DNS listener, with the rules of
    `redirect-rules --dns-port` applied (uid 0 exempt: root's queries reach the resolvers)."""
    sandbox = DnsSandbox(lab)
    try:
        sandbox.start()
        proxy = sandbox.start_dns_proxy(spec_text)
        applied = sandbox.redirect_rules(
            "--proxy-port", str(proxy.port), "--proxy-uid", "0", "--dns-port", str(sandbox.dns_port), "--apply"
        )
        assert applied.returncode == 0, applied.stderr
        yield sandbox
    finally:
        sandbox.stop()
