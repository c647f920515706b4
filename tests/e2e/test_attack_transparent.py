"""End-to-end: the transparent sandbox (redirect rules applied) against loopback services beside it.

In the chart's sidecar pod the sandbox shares its network namespace with the proxy,
so whatever listens on loopback there (the proxy's listeners, another sidecar's
statsd or admin port) is one packet away. TCP to loopback is redirected to the proxy,
which refuses it (`loopback`); UDP must not get there either.
"""

from __future__ import annotations

import socket
import threading

import pytest

from e2e.support.lab import Lab, in_netns
from e2e.support.transparent_lab import RESOLVER_V4, SANDBOX_V4, Sandbox

SPEC = """
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: "*"
"""
SIDECAR_UDP_PORT = 8125  # statsd's port, say


class LoopbackUdpService:
    """A UDP echo on every address of the sandbox namespace (loopback included), as a sidecar would run."""

    def __init__(self, netns: str, port: int):
        with in_netns(netns):
            self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind(("::", port))
        self.received: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(65536)
            except OSError:
                return
            if peer is None:
                return
            self.received.append(data)
            self.sock.sendto(b"echo:" + data, peer)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


@pytest.fixture(scope="module", params=[["--dns", RESOLVER_V4], ["--dns-port", "5353"]], ids=["dns", "dns-port"])
def box(lab: Lab, request):
    sandbox = Sandbox(lab)
    service = None
    try:
        sandbox.start()
        proxy = sandbox.start_proxy(SPEC)
        applied = sandbox.redirect_rules("--proxy-port", str(proxy.port), "--proxy-uid", "0", *request.param, "--apply")
        assert applied.returncode == 0, applied.stderr
        service = LoopbackUdpService(sandbox.proxy_ns, SIDECAR_UDP_PORT)
        sandbox.service = service
        yield sandbox
    finally:
        if service is not None:
            service.close()
        sandbox.stop()


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", SANDBOX_V4])
def test_udp_to_a_loopback_service_beside_the_sandbox_is_dropped(box, address):  # was a defect
    """`oif lo accept` let every UDP datagram to loopback (and the namespace's own addresses) through."""
    before = len(box.service.received)
    assert box.client("udp", address, str(SIDECAR_UDP_PORT), "--send", "exfil")["received"] is None
    assert len(box.service.received) == before
    # The service is there: the proxy's uid (exempt) gets its answer.
    assert box.client("udp", address, str(SIDECAR_UDP_PORT), "--send", "ping", as_root=True) == {"received": "echo:ping"}


# UDP-Lite (IP protocol 136) needs no privilege: socket(AF_INET, SOCK_DGRAM, 136).
UDPLITE = 136
_SEND_UDPLITE = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM, 136)
s.settimeout(2)
try:
    s.sendto(b"exfil", (sys.argv[1], int(sys.argv[2])))
except PermissionError:  # dropped in the output hook: netfilter says EPERM
    print("refused")
    sys.exit()
try:
    print(s.recv(100).decode())
except OSError:
    print("none")
"""


@pytest.fixture
def udplite_echo(lab: Lab):
    """A UDP-Lite echo on every address of the upstream namespace: (port, datagrams received)."""
    with in_netns(lab.upstream_ns):
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, UDPLITE)
        except OSError as exc:
            pytest.skip(f"this kernel has no UDP-Lite ({exc}): nothing to escape with")
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    port = lab.free_port()  # a port per test: a closed UDP-Lite socket is not always free at once
    sock.bind(("::", port))
    sock.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            received.append(data)
            sock.sendto(b"echo:" + data, peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, received
    stop.set()
    thread.join(timeout=2)
    sock.close()


@pytest.mark.parametrize("address", ["198.18.0.10", "2001:2::10"])
def test_udplite_does_not_leave_the_sandbox(box, udplite_echo, address):  # was a defect
    """Only `tcp` and `udp` were dropped; any other IP protocol an unprivileged process can send
    (UDP-Lite) went out to any address as it was."""
    port, received = udplite_echo
    out = box.exec("/usr/bin/python3", "-I", "-c", _SEND_UDPLITE, address, str(port))
    assert out.stdout.strip() in ("none", "refused"), out.stderr
    assert received == []
    # The echo is there: the proxy's uid (exempt) gets its answer.
    out = box.exec("/usr/bin/python3", "-I", "-c", _SEND_UDPLITE, address, str(port), as_root=True)
    assert out.stdout.strip() == "echo:exfil", out.stderr
