"""End-to-end: `egress-proxy run --workers 2` (issue 7).

Two worker processes share the listen port (SO_REUSEPORT) and one CA; the
supervisor's /metrics sums what both counted.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import time

import pytest

from e2e.support.lab import allowlist_spec, bearer, in_netns, raw_request
from e2e.test_operations import metric_value, wait_for

SECRET = "workers-canary-secret-5b1f"
SPEC = allowlist_spec(("api.example.test", bearer("WK_TOKEN")), "plain.test")
CONNECTIONS = 24


def worker_pids(pid: int) -> set[int]:
    children: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                children.update(int(p) for p in fh.read().split())
        except FileNotFoundError:  # a thread that ended since the listing (flaked once in CI)
            continue
    return children


@pytest.fixture(scope="module")
def proxy(lab):
    proxy = lab.start_proxy(SPEC, "--workers", "2", env={"WK_TOKEN": SECRET})
    yield proxy
    proxy.stop()


def open_intercepted(lab, proxy, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    """CONNECT to the transform host, then TLS that must verify against the proxy's one CA."""
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return ctx.wrap_socket(sock, server_hostname="api.example.test")


def tls_get(sock: ssl.SSLSocket) -> bytes:
    sock.sendall(b"GET /workers HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_both_workers_serve_with_one_ca_and_metrics_add_up(lab, proxy):
    workers = worker_pids(proxy.proc.pid)
    assert len(workers) == 2, workers
    # Only the CA in --confdir is trusted: every worker's leaf certificates must chain to it.
    ctx = ssl.create_default_context(cafile=str(proxy.ca))
    labels = {"decision": "allowed", "environment": "", "reason": "", "rule": "api.example.test"}
    before = metric_value(proxy, "egress_requests_total", labels)
    injected_before = metric_value(proxy, "egress_credential_injections_total", {"environment": "", "rule": "api.example.test"})

    conns = [open_intercepted(lab, proxy, ctx) for _ in range(CONNECTIONS)]
    try:
        # The kernel spread the accepted connections over both workers' sockets.
        ss = lab.exec("ss", "-Htnp", "state", "established", f"( sport = :{proxy.port} )").stdout
        serving = {int(p) for p in re.findall(r"pid=(\d+)", ss)}
        assert serving == workers, (serving, workers, ss)
        answers = [tls_get(c) for c in conns]
    finally:
        for c in conns:
            c.close()
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:60] for a in answers]
    assert all(SECRET.encode() not in a.split(b"\r\n\r\n", 1)[0] for a in answers)

    # One /metrics for the pod: the sum over both workers, exactly what was sent.
    assert wait_for(lambda: metric_value(proxy, "egress_requests_total", labels) == before + CONNECTIONS, 5)
    injected = metric_value(proxy, "egress_credential_injections_total", {"environment": "", "rule": "api.example.test"})
    assert injected == injected_before + CONNECTIONS


def test_plain_http_requests_are_counted_once_each(lab, proxy):
    labels = {"decision": "allowed", "environment": "", "reason": "", "rule": "plain.test"}
    before = metric_value(proxy, "egress_requests_total", labels)
    sent = 30
    for i in range(sent):  # a new connection each: spread over the workers
        answer = raw_request(lab, proxy.port, f"GET http://plain.test/w{i} HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert wait_for(lambda: metric_value(proxy, "egress_requests_total", labels) == before + sent, 5)


def test_sighup_reloads_every_worker_and_counts_one_reload(lab, proxy):
    before = metric_value(proxy, "egress_config_reloads_total", {"result": "success"})
    proxy.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: proxy.stderr().count('"spec_reloaded"') >= 2, 5), proxy.stderr()
    time.sleep(0.3)
    assert metric_value(proxy, "egress_config_reloads_total", {"result": "success"}) == before + 1
    assert metric_value(proxy, "egress_allowlist_entries") == 2
    assert proxy.get_ops("/readyz")[0] == 200


def test_a_dead_worker_stops_the_pod(lab):
    proxy = lab.start_proxy(SPEC, "--workers", "2", env={"WK_TOKEN": SECRET})
    try:
        victim, other = sorted(worker_pids(proxy.proc.pid))
        os.kill(victim, signal.SIGKILL)
        assert proxy.proc.wait(timeout=15) == 1
        assert f"pid {victim}) exited" in proxy.stderr()
        assert not os.path.exists(f"/proc/{other}")  # stopped (and reaped) by the supervisor
    finally:
        proxy.stop()
