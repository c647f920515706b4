"""A sandbox namespace for transparent-mode tests, attached to the session's lab.

    sandbox namespace egs-N                       upstream namespace egu-N (the lab's)
    ├─ egress-proxy --mode transparent, as root   ├─ upstream_server.py (HTTP/HTTPS echo)
    ├─ `egress-proxy redirect-rules --apply`      ├─ UDP echo on :53 and :443
    │    (exempts uid 0: the proxy)               │   (198.18.0.53 = the sandbox's resolver)
    ├─ clients as `nobody`: curl, sandbox_client  │
    └─ veth 198.18.1.1/24, 2001:2:1::1/64 ────────┘ 198.18.1.2/24, 2001:2:1::2/64

The sandbox has no proxy settings: its clients resolve test names through
/etc/netns/egs-N/hosts (the same file the proxy reads) and connect directly; the
nftables rules send their TCP to the proxy. Only 198.18.0.0/15, 2001:2::/48 and
loopback are used.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

from e2e.support.lab import (
    EGRESS_PROXY,
    HERE,
    Lab,
    ProxyProcess,
    in_netns,
    run,
    write_netns_etc,
)

SANDBOX_V4, SANDBOX_GW_V4 = "198.18.1.1", "198.18.1.2"
SANDBOX_V6, SANDBOX_GW_V6 = "2001:2:1::1", "2001:2:1::2"
RESOLVER_V4, RESOLVER_V6 = "198.18.0.53", "2001:2::53"
UDP_PORTS = (53, 443)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
CLIENT_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/nonexistent",
    "LC_ALL": "C.UTF-8",
}
SYSTEM_PYTHON = "/usr/bin/python3"


class UdpEcho:
    """UDP echo on every address of the upstream namespace, both families."""

    def __init__(self, netns: str, ports=UDP_PORTS):
        self.socks: list[socket.socket] = []
        for port in ports:
            with in_netns(netns):
                sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", port))
            self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    @staticmethod
    def _serve(sock: socket.socket) -> None:
        while True:
            try:
                data, peer = sock.recvfrom(65536)
                if peer is None:  # woken by shutdown
                    return
                sock.sendto(b"echo:" + data, peer)
            except OSError:
                return

    def close(self) -> None:
        for sock in self.socks:
            # shutdown wakes the thread blocked in recvfrom; closed under it, the socket
            # would stay bound until that call returned, and the next sandbox (another
            # test module, same upstream namespace) could not bind the port.
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class Sandbox:
    """Duck-types the parts of `Lab` that `ProxyProcess` uses, for the sandbox namespace."""

    udp_ports = UDP_PORTS  # the UDP echo's ports in the upstream namespace

    def __init__(self, lab: Lab):
        self.lab = lab
        self.proxy_ns = f"egs-{lab.id}"  # ProxyProcess runs the proxy here
        self.dir = lab.dir / "sandbox"
        self.dir.mkdir(exist_ok=True)
        self.upstream_ca = lab.upstream_ca
        # Readable by `nobody` (pytest's directories are private to root).
        self.public = Path(tempfile.mkdtemp(prefix="egress-sandbox-"))
        self.public.chmod(0o755)
        self.proxy: ProxyProcess | None = None
        self.udp: UdpEcho | None = None

    def free_port(self) -> int:
        return self.lab.free_port()

    # -- set-up ----------------------------------------------------------------
    def start(self) -> None:
        self._cleanup()
        lab, ns = self.lab, self.proxy_ns
        vs, vt = f"vs{lab.id}", f"vt{lab.id}"
        sns = ["ip", "netns", "exec", ns]
        uns = ["ip", "netns", "exec", lab.upstream_ns]
        self._create_namespace()
        run(["ip", "link", "add", vs, "type", "veth", "peer", "name", vt])
        run(["ip", "link", "set", vs, "netns", ns])
        run(["ip", "link", "set", vt, "netns", lab.upstream_ns])
        run([*sns, "ip", "link", "set", "lo", "up"])
        run([*sns, "ip", "addr", "add", f"{SANDBOX_V4}/24", "dev", vs])
        run([*sns, "ip", "-6", "addr", "add", f"{SANDBOX_V6}/64", "dev", vs, "nodad"])
        run([*uns, "ip", "addr", "add", f"{SANDBOX_GW_V4}/24", "dev", vt])
        run(
            [*uns, "ip", "-6", "addr", "add", f"{SANDBOX_GW_V6}/64", "dev", vt, "nodad"]
        )
        # Host routes only: the upstream's routes back to the lab's proxy namespace stay as they are.
        run([*uns, "ip", "addr", "add", f"{RESOLVER_V4}/32", "dev", vt])
        run([*uns, "ip", "-6", "addr", "add", f"{RESOLVER_V6}/128", "dev", vt, "nodad"])
        run([*sns, "ip", "link", "set", vs, "up"])
        run([*uns, "ip", "link", "set", vt, "up"])
        run([*sns, "ip", "route", "add", "198.18.0.0/15", "via", SANDBOX_GW_V4])
        run([*sns, "ip", "-6", "route", "add", "2001:2::/48", "via", SANDBOX_GW_V6])
        write_netns_etc(ns)
        self.udp = UdpEcho(lab.upstream_ns, self.udp_ports)

    def _create_namespace(self) -> None:
        """A new namespace; tests/image/ names an existing one (a podman pod's) instead."""
        run(["ip", "netns", "add", self.proxy_ns])

    def start_proxy(self, spec_text: str, env: dict | None = None, extra: tuple[str, ...] = ()) -> ProxyProcess:
        proxy = ProxyProcess(
            self,
            spec_text,
            ["--upstream-ca", str(self.upstream_ca), "--mode", "transparent", *extra],
            env=env,
            name="spec.yaml",
        )
        proxy.start()
        self.proxy = proxy
        bundle = self.public / "client-ca.pem"
        bundle.write_text(proxy.ca.read_text() + self.upstream_ca.read_text())
        bundle.chmod(0o644)
        return proxy

    def redirect_rules(self, *args: str) -> subprocess.CompletedProcess:
        """`egress-proxy redirect-rules ARGS` inside the sandbox namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.proxy_ns, EGRESS_PROXY, "redirect-rules", *args],
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip

    # -- clients ---------------------------------------------------------------
    @property
    def ca_bundle(self) -> str:
        return str(self.public / "client-ca.pem")

    def exec(
        self, *cmd: str, as_root: bool = False, timeout: float = 20
    ) -> subprocess.CompletedProcess:
        """A command inside the sandbox namespace, as `nobody` (redirected) unless `as_root`."""
        prefix = [] if as_root else NOBODY
        return subprocess.run(
            ["ip", "netns", "exec", self.proxy_ns, *prefix, *cmd],
            check=False, capture_output=True, text=True, timeout=timeout, env=CLIENT_ENV,
        )  # fmt: skip

    def client(self, *args: str, as_root: bool = False) -> dict:
        out = self.exec(
            SYSTEM_PYTHON, "-I", str(HERE / "sandbox_client.py"), *args, as_root=as_root
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def curl(self, url: str, *args: str) -> tuple[int, dict, str]:
        """Real curl without proxy settings; (status, headers, body), status 0 when no answer."""
        out = self.exec(
            "curl", "-q", "-sS", "--max-time", "10", "--cacert", self.ca_bundle, "-i", url, *args
        )  # fmt: skip
        if not out.stdout.startswith("HTTP/"):
            return 0, {}, out.stderr
        head, _, body = out.stdout.partition(
            "\n\n"
        )  # text mode: CRLF already reads as LF
        status_line, *lines = head.split("\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in lines)
        }
        return int(status_line.split()[1]), headers, body

    # -- tear-down ---------------------------------------------------------------
    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.udp is not None:
            self.udp.close()
        self._cleanup()
        shutil.rmtree(self.public, ignore_errors=True)

    def _cleanup(self) -> None:
        # Deleting the namespace deletes the veth pair, and with the upstream's end the
        # resolver addresses on it.
        run(["ip", "netns", "del", self.proxy_ns], check=False)
        shutil.rmtree(Path("/etc/netns") / self.proxy_ns, ignore_errors=True)
