"""End-to-end: passthrough tunnels (issue 12). Raw-socket clients send a CONNECT and then
handcrafted ClientHellos (server names from SSRF corpora); a raw TCP recorder in the
upstream namespace shows what reached the upstream, byte for byte. Dead upstreams are
answered at CONNECT; tunnels are relayed outside mitmproxy with byte counts in the
audit log; a 1 GiB download keeps the proxy's memory flat."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time

import pytest
from http_head import recv_head
from tls_hello import hello_body, records, sni_extension

from e2e.support.clients import as_received, curl
from e2e.support.lab import HOSTS, Lab, allowlist_spec, in_netns, listen_tcp, raw_request, serve_connections

RECORDER_PORT = 9443
BLACKHOLE = "198.18.0.42"  # SYNs dropped by a firewall rule in the upstream namespace
UNREACHABLE = "198.19.255.1"  # an `unreachable` route in the proxy namespace
TIMEOUT = 2  # --connect-timeout
SPEC = allowlist_spec(
    ("api.example.test", {"Authorization": "Bearer passthrough-test-token"}),
    "passthrough.test",
    "blackhole.pt.test",
    "unreachable.pt.test",
)


class Recorder:
    """Raw TCP server on passthrough.test:RECORDER_PORT: records the bytes of each connection;
    after the client's EOF it answers `reply` bytes and closes."""

    def __init__(self, lab: Lab, reply: int = 0):
        self.reply = reply
        self.connections: list[bytearray] = []
        self.finished = 0
        self.sock = listen_tcp(lab.upstream_ns, HOSTS["passthrough.test"], RECORDER_PORT)
        # Not threaded: connections are recorded in the order they were accepted.
        serve_connections(self.sock, self._accept_one, threaded=False)

    def _accept_one(self, conn: socket.socket, _peer) -> None:
        received = bytearray()
        self.connections.append(received)
        threading.Thread(target=self._serve, args=(conn, received), daemon=True).start()

    def _serve(self, conn: socket.socket, received: bytearray) -> None:
        conn.settimeout(20)
        try:
            while chunk := conn.recv(65536):
                received += chunk
            if self.reply:
                conn.sendall(b"r" * self.reply)
        except OSError:
            pass
        finally:
            conn.close()
            self.finished += 1


@pytest.fixture(scope="module")
def network(lab: Lab):
    uns = ["ip", "netns", "exec", lab.upstream_ns]
    pns = ["ip", "netns", "exec", lab.proxy_ns]
    subprocess.run([*uns, "ip", "addr", "add", f"{BLACKHOLE}/24", "dev", f"vu{lab.id}"], check=True)
    subprocess.run(
        [*uns, "nft", (f"add table inet egpt; add chain inet egpt input {{ type filter hook input priority 0; }};"
                       f" add rule inet egpt input ip daddr {BLACKHOLE} drop;"
                       f" add rule inet egpt input ip daddr {HOSTS['api.example.test']} tcp dport 443"
                       " tcp flags & (syn | ack) == syn counter")],
        check=True,
    )  # fmt: skip
    subprocess.run([*pns, "ip", "route", "add", "unreachable", "198.19.255.0/24"], check=True)
    with open(f"/etc/netns/{lab.proxy_ns}/hosts", "a") as hosts:
        hosts.write(f"{BLACKHOLE} blackhole.pt.test\n{UNREACHABLE} unreachable.pt.test\n")
    yield


@pytest.fixture(scope="module")
def proxy(lab: Lab, network):
    proxy = lab.start_proxy(SPEC, "--connect-timeout", str(TIMEOUT))
    yield proxy
    proxy.stop()
    assert "passthrough-test-token" not in proxy.stdout() + proxy.stderr()


@pytest.fixture(scope="module")
def recorder(lab: Lab):
    rec = Recorder(lab, reply=4321)
    yield rec
    rec.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread
    rec.sock.close()


def _connect(lab: Lab, proxy, host: str, port: int) -> tuple[socket.socket, bytes]:
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    answer = recv_head(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            while len(body) < int(line.split(b":")[1]):
                body += sock.recv(65536)
    return sock, answer.partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + body


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def metric(proxy, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in proxy.get_ops("/metrics")[1].splitlines() if line.startswith(name))


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    return predicate()


# -- server names: anything but the CONNECT host is refused, and nothing reaches the upstream --

REFUSED_NAMES = [
    b"other.test",
    b"api.example.test",
    b"passthrough.test@127.0.0.1",
    b"127.0.0.1:80;passthrough.test:80",
    b"passthrough%2Etest",
    b"%70assthrough.test",
    b"passthrough.test\x00",
    b"passthrough.test\x00.other.test",
    b"passthrough.test:9443",
    b" passthrough.test",
    b"passthrough.test/x",
    b"127.0.0.1",
    b"",
    "pässthrough.test".encode(),
    b"a" * 300,
]
REFUSED_EXTENSIONS = [
    sni_extension(b"passthrough.test", b"other.test"),  # two names
    sni_extension(b"passthrough.test", name_type=1),  # not a host_name
    b"\x00\x00\x00\x00",  # empty extension data
]


def _refused(lab, proxy, recorder, hello: bytes) -> None:
    before_conns = len(recorder.connections)
    before = metric(proxy, 'egress_requests_total{decision="blocked",environment="",reason="host_mismatch"')
    sock, answer = _connect(lab, proxy, "passthrough.test", RECORDER_PORT)
    try:
        assert answer.startswith(b"HTTP/1.1 200"), answer
        sock.sendall(hello)
        assert _closed_within(sock, 5)
    finally:
        sock.close()
    # The upstream was dialled at CONNECT, then closed without a byte.
    assert wait_for(lambda: recorder.finished >= before_conns + 1, 5)
    assert [bytes(c) for c in recorder.connections[before_conns:]] == [b""]
    assert metric(proxy, 'egress_requests_total{decision="blocked",environment="",reason="host_mismatch"') == before + 1


@pytest.mark.parametrize("name", REFUSED_NAMES, ids=repr)
def test_server_name_not_the_connect_host_is_refused(lab, proxy, recorder, name):
    _refused(lab, proxy, recorder, records(hello_body(sni_extension(name))))


@pytest.mark.parametrize("extension", REFUSED_EXTENSIONS, ids=range(len(REFUSED_EXTENSIONS)))
def test_malformed_server_name_extension_is_refused(lab, proxy, recorder, extension):
    _refused(lab, proxy, recorder, records(hello_body(extension)))


def test_hello_split_in_small_pieces_is_still_checked(lab, proxy, recorder):
    """The decision waits for the complete ClientHello, however it is fragmented."""
    hello = records(hello_body(sni_extension(b"passthrough.test@127.0.0.1")))
    before_conns = len(recorder.connections)
    sock, answer = _connect(lab, proxy, "passthrough.test", RECORDER_PORT)
    try:
        assert answer.startswith(b"HTTP/1.1 200")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(hello), 7):
            sock.sendall(hello[i : i + 7])
            time.sleep(0.01)
        assert _closed_within(sock, 5)
    finally:
        sock.close()
    assert wait_for(lambda: recorder.finished >= before_conns + 1, 5)
    assert [bytes(c) for c in recorder.connections[before_conns:]] == [b""]


@pytest.mark.parametrize("name", [b"passthrough.test", b"PASSTHROUGH.Test.", None], ids=["exact", "case-dot", "no-sni"])
def test_matching_or_absent_server_name_is_relayed_with_byte_counts(lab, proxy, recorder, name):
    """Relayed byte for byte (half-close included); the audit line counts every byte."""
    hello = records(hello_body(sni_extension(name))) if name is not None else records(hello_body())
    junk = bytes(range(256)) * 40
    before_conns = len(recorder.connections)
    seen = len(proxy.audit())
    sock, answer = _connect(lab, proxy, "passthrough.test", RECORDER_PORT)
    try:
        assert answer.startswith(b"HTTP/1.1 200")
        sock.sendall(hello + junk)
        # Half-close once the tunnel is decided (mitmproxy, like bare mitmdump, aborts a
        # connection whose client closes before its next layer is known).
        assert wait_for(
            lambda: len(recorder.connections) > before_conns and len(recorder.connections[before_conns]) == len(hello + junk), 5
        )
        sock.shutdown(socket.SHUT_WR)
        received = b""
        sock.settimeout(10)
        while chunk := sock.recv(65536):
            received += chunk
    finally:
        sock.close()
    assert received == b"r" * recorder.reply
    assert bytes(recorder.connections[before_conns]) == hello + junk
    closed = wait_for(lambda: [e for e in proxy.audit()[seen:] if e["event"] == "tunnel_closed"], 5)
    assert len(closed) == 1, closed
    assert closed[0]["host"] == "passthrough.test" and closed[0]["method"] == "CONNECT"
    assert (closed[0]["bytes_up"], closed[0]["bytes_down"]) == (len(hello + junk), recorder.reply)
    decisions = [e for e in proxy.audit()[seen:] if e["event"] == "tunnel"]
    assert [(e["decision"], e["method"]) for e in decisions] == [("allowed", "CONNECT")]  # counted once


def test_intercepted_tunnel_refuses_an_invalid_server_name(lab, proxy):
    before = len(lab.upstream_requests())
    sock, answer = _connect(lab, proxy, "api.example.test", 443)
    try:
        assert answer.startswith(b"HTTP/1.1 200")
        sock.sendall(records(hello_body(sni_extension(b"api.example.test@127.0.0.1"))))
        assert _closed_within(sock, 5)
    finally:
        sock.close()
    assert len(lab.upstream_requests()) == before


def _syns_to_api(lab: Lab) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", lab.upstream_ns, "nft", "list", "chain", "inet", "egpt", "input"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return int(re.search(r"tcp dport 443 .*counter packets (\d+)", out.stdout).group(1))


def test_intercepted_tunnel_connects_upstream_once(lab, proxy):
    """Dialled at CONNECT, and that connection is the one mitmproxy uses after the handshake."""
    before = _syns_to_api(lab)
    status, headers, body = curl(lab, proxy, "https://api.example.test/one-connection")
    assert status == 200 and body, (status, headers, body, proxy.stdout()[-3000:])
    assert dict(as_received(lab, json.loads(body))["headers"])["Authorization"] == "Bearer passthrough-test-token"
    assert _syns_to_api(lab) - before == 1


# -- dead upstreams are answered at CONNECT ---------------------------------------------------


@pytest.mark.parametrize(
    "host, port, status, reason, at_least, at_most",
    [
        ("passthrough.test", 9, 502, "upstream_refused", 0, 1),
        ("unreachable.pt.test", 443, 502, "upstream_unreachable", 0, 1),
        ("blackhole.pt.test", 443, 504, "upstream_timeout", TIMEOUT, TIMEOUT + 2.5),
        ("api.example.test", 9, 502, "upstream_refused", 0, 1),  # intercepted entries alike
    ],
)
def test_dead_upstream_gets_an_answer_to_connect(lab, proxy, host, port, status, reason, at_least, at_most):
    before = metric(proxy, f'egress_upstream_errors_total{{reason="{reason}"}}')
    start = time.monotonic()
    sock, answer = _connect(lab, proxy, host, port)
    took = time.monotonic() - start
    sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status}".encode()), answer
    assert f"X-Egress-Error: {reason}".encode() in head
    assert json.loads(body) == {"error": "upstream_failed", "reason": reason, "host": host}
    assert at_least <= took < at_most, took
    assert metric(proxy, f'egress_upstream_errors_total{{reason="{reason}"}}') == before + 1
    line = [e for e in proxy.audit() if e.get("error") == reason][-1]
    assert line["host"] == host and line["method"] == "CONNECT"


@pytest.mark.parametrize(
    "host, port, status, reason, at_least, at_most",
    [
        ("passthrough.test", 9, 502, "upstream_refused", 0, 1),
        ("unreachable.pt.test", 80, 502, "upstream_unreachable", 0, 1),
        ("blackhole.pt.test", 80, 504, "upstream_timeout", TIMEOUT, TIMEOUT + 2.5),
    ],
)
def test_dead_upstream_of_a_plain_http_request_gets_the_same_answer(
    lab, proxy, host, port, status, reason, at_least, at_most
):  # was a defect
    """mitmproxy connects for a plain-HTTP request itself; its failure was mitmproxy's HTML 502 with
    `Server: mitmproxy 12.3.1` and the dialled address in the page (`Connect call failed ('198.18.0.17',
    9)`), no `X-Egress-Error`, not counted, and 502 rather than 504 after --connect-timeout."""
    before = metric(proxy, f'egress_upstream_errors_total{{reason="{reason}"}}')
    start = time.monotonic()
    answer = raw_request(lab, proxy.port, f"GET http://{host}:{port}/x HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    took = time.monotonic() - start
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status}".encode()), answer
    assert f"X-Egress-Error: {reason}".encode() in head
    assert json.loads(body) == {"error": "upstream_failed", "reason": reason, "host": host}
    assert b"mitmproxy" not in answer.lower() and b"198." not in answer, answer
    assert at_least <= took < at_most, took
    assert metric(proxy, f'egress_upstream_errors_total{{reason="{reason}"}}') == before + 1


def test_curl_sees_the_502(lab, proxy):
    out = lab.exec("curl", "-sS", "-x", proxy.url, "-o", "/dev/null", "-w", "%{http_connect}", "https://passthrough.test:9/")
    assert out.stdout == "502", out
    assert "502" in out.stderr


# -- volume --------------------------------------------------------------------------------------


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_one_gib_download_with_flat_memory(lab, proxy):
    size = 1 << 30
    seen = len(proxy.audit())
    pid = proxy.proc.pid
    samples = [_rss_kb(pid)]
    done = threading.Event()

    def sample():
        while not done.wait(0.25):
            samples.append(_rss_kb(pid))

    threading.Thread(target=sample, daemon=True).start()
    try:
        out = lab.exec(
            "curl", "-sS", "--max-time", "150", "-x", proxy.url, "--cacert", str(lab.upstream_ca),
            "-o", "/dev/null", "-w", "%{http_code} %{size_download}", f"https://passthrough.test/bytes/{size}",
            timeout=160,
        )  # fmt: skip
    finally:
        done.set()
    assert out.stdout == f"200 {size}", out
    growth_mb = (max(samples) - samples[0]) / 1024
    assert growth_mb < 30, (samples[0], max(samples))
    closed = wait_for(lambda: [e for e in proxy.audit()[seen:] if e["event"] == "tunnel_closed"], 5)
    # TLS adds its record overhead to what curl counted (about 0.1 %, plus the handshake).
    assert size <= closed[0]["bytes_down"] < size * 1.01 + 65536, closed


# -- limits keep working on relayed tunnels -----------------------------------------------


def test_relayed_tunnel_idle_timeout_and_header_deadline(lab, network, recorder):
    """--header-timeout does not cut a relayed tunnel (opaque bytes); --idle-timeout closes a silent one."""
    proxy = lab.start_proxy(SPEC, "--header-timeout", "1", "--idle-timeout", "2")
    try:
        hello = records(hello_body(sni_extension(b"passthrough.test")))
        busy, answer = _connect(lab, proxy, "passthrough.test", RECORDER_PORT)
        assert answer.startswith(b"HTTP/1.1 200")
        busy.sendall(hello)
        idle, answer = _connect(lab, proxy, "passthrough.test", RECORDER_PORT)
        assert answer.startswith(b"HTTP/1.1 200")
        idle.sendall(hello)
        start = time.monotonic()
        idle.settimeout(0.2)
        idle_closed_after = None
        while time.monotonic() - start < 4:  # busy: a byte every 0.3 s, for twice the idle timeout
            busy.sendall(b"x")
            if idle_closed_after is None:
                try:
                    if idle.recv(1) == b"":
                        idle_closed_after = time.monotonic() - start
                except TimeoutError:
                    pass
                except ConnectionResetError:
                    idle_closed_after = time.monotonic() - start
            time.sleep(0.1)
        assert idle_closed_after is not None and 1.5 <= idle_closed_after < 3.5, idle_closed_after
        busy.sendall(b"still open")  # raises if the busy tunnel was closed
        busy.shutdown(socket.SHUT_WR)
        busy.settimeout(5)
        assert busy.recv(65536).startswith(b"r")  # the recorder answered: both directions lived
        busy.close()
        idle.close()
        closed = wait_for(lambda: len([e for e in proxy.audit() if e["event"] == "tunnel_closed"]) == 2, 5)
        assert closed, proxy.audit()
    finally:
        proxy.stop()


def test_relayed_tunnels_release_their_connection_slots_and_memory(lab, network, recorder):
    """200 tunnels through a proxy allowing 10 connections per client: each one, once closed,
    gives its slot back (client_disconnected runs after the relay), and memory stays flat."""
    proxy = lab.start_proxy(SPEC, "--max-connections-per-client", "10")
    try:
        hello = records(hello_body(sni_extension(b"passthrough.test")))

        # Half-close only after the decision (see above): wait for the recorder to see the bytes.
        def one_decided_tunnel() -> None:
            before = len(recorder.connections)
            sock, answer = _connect(lab, proxy, "passthrough.test", RECORDER_PORT)
            try:
                assert answer.startswith(b"HTTP/1.1 200"), answer
                sock.sendall(hello + b"payload")
                assert wait_for(lambda: len(recorder.connections) > before
                                and len(recorder.connections[before]) == len(hello) + 7, 5)  # fmt: skip
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(10)
                received = b""
                while chunk := sock.recv(65536):
                    received += chunk
                assert received == b"r" * recorder.reply
            finally:
                sock.close()

        for _ in range(20):
            one_decided_tunnel()
        rss_before = _rss_kb(proxy.proc.pid)
        for _ in range(180):
            one_decided_tunnel()
        assert wait_for(lambda: len([e for e in proxy.audit() if e["event"] == "tunnel_closed"]) == 200, 10)
        assert (_rss_kb(proxy.proc.pid) - rss_before) / 1024 < 10
        assert metric(proxy, "egress_connections_refused_total") == 0
    finally:
        proxy.stop()


def test_shutdown_with_relayed_tunnels_open(lab, network, recorder):
    """SIGTERM while a tunnel is relayed: the proxy exits promptly and the client sees the close."""
    proxy = lab.start_proxy(SPEC)
    sock, answer = _connect(lab, proxy, "passthrough.test", RECORDER_PORT)
    try:
        assert answer.startswith(b"HTTP/1.1 200")
        sock.sendall(records(hello_body(sni_extension(b"passthrough.test"))))
        time.sleep(0.3)
        start = time.monotonic()
        proxy.proc.send_signal(signal.SIGTERM)
        proxy.proc.wait(timeout=10)
        assert time.monotonic() - start < 5
        assert _closed_within(sock, 5)
    finally:
        sock.close()
        proxy.stop()
