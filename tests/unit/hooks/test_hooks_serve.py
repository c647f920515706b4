"""`egress-hooks serve` and its thin client `egress-hooks dispatch --server`: the real
server process on a Unix socket (or loopback TCP), real client processes and raw
sockets, the seed's gate."""

import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import egress
from egress.hooks import client

FIXTURES = Path(__file__).resolve().parents[2] / "hooks"
# The seed page's gates live once, in the hooks-scenarios example; the tests run that copy.
GATES = Path(__file__).resolve().parents[3] / "examples/hooks-scenarios/root/.agents/hooks-scripts"
PAYLOADS = FIXTURES / "payloads"
PYTHON = shlex.quote(sys.executable)
SOURCE_ROOT = str(Path(egress.__file__).resolve().parent.parent)
ENV = {**os.environ, "PYTHONPATH": SOURCE_ROOT}
RM_RF = (PAYLOADS / "pre_rm_rf.json").read_bytes()
LS = json.dumps({"tool_call": {"name": "code_execution", "args": {"code": "ls"}}, "environment_id": "e"}).encode()
GATE_DENIES = {"decision": "deny", "reason": "Destructive command blocked by security gate."}
ALLOW = "echo '{\"decision\": \"allow\"}'"
OPERATOR_GATE = {
    "security-gate": {
        "pre_tool_execution": [
            {"matcher": "code_execution", "hooks": [{"type": "command", "command": f"{PYTHON} {GATES / 'gate.py'}", "timeout": 10}]}
        ]
    }
}


class Server:
    def __init__(self, tmp_path: Path, *extra: str, listen: str | None = None, operator: dict | None = None):
        self.dir = tmp_path
        self.operator = tmp_path / "operator.json"
        self.operator.write_text(json.dumps(operator if operator is not None else OPERATOR_GATE))
        self.workspace = tmp_path / "workspace"
        (self.workspace / ".agents").mkdir(parents=True, exist_ok=True)
        self.socket = tmp_path / "hooks.sock"
        self.listen = listen or f"unix:{self.socket}"
        self.logs: list[dict] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "egress.hooks", "serve", "--listen", self.listen, "--operator-config", str(self.operator),
             "--workspace", str(self.workspace), *extra],
            stderr=subprocess.PIPE, env=ENV,
        )  # fmt: skip
        threading.Thread(target=self._read_logs, daemon=True).start()
        listening = self.wait_for("hook_server_listening")
        self.address = listening["listen"] if listen else self.listen

    def _read_logs(self):
        for line in self.process.stderr:
            try:
                self.logs.append(json.loads(line))
            except ValueError:
                self.logs.append({"msg": "not_json", "line": line.decode(errors="replace")})

    def wait_for(self, msg: str, count: int = 1, seconds: float = 15) -> dict:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = [r for r in self.logs if r.get("msg") == msg]
            if len(found) >= count:
                return found[count - 1]
            if self.process.poll() is not None and not found:
                raise AssertionError(f"server exited {self.process.returncode}: {self.logs}")
            time.sleep(0.02)
        raise AssertionError(f"no {msg} in {self.logs}")

    def write_workspace(self, document) -> None:
        (self.workspace / ".agents" / "hooks.json").write_text(json.dumps(document))

    def sighup(self, count: int) -> None:
        self.process.send_signal(signal.SIGHUP)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture
def server(tmp_path):
    started = Server(tmp_path)
    yield started
    started.stop()


def thin(address: str, event: bytes, *extra: str, event_name: str = "pre_tool_execution") -> tuple[dict, list[dict]]:
    result = subprocess.run(
        [sys.executable, "-m", "egress.hooks", "dispatch", event_name, "--server", address, *extra],
        input=event, capture_output=True, timeout=30, env=ENV,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), [json.loads(line) for line in result.stderr.decode().splitlines()]


def raw(address: str, request: bytes) -> tuple[int, dict]:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(address.removeprefix("unix:"))
    sock.sendall(request)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return client._parse_response(data)[0], json.loads(client._parse_response(data)[1])


def test_the_socket_is_mode_0600_and_the_gate_answers(server):
    mode = os.stat(server.socket).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert thin(server.address, RM_RF) == (GATE_DENIES, [])
    assert thin(server.address, LS) == ({"decision": "allow"}, [])
    assert thin(server.address, LS, event_name="post_tool_execution") == ({}, [])


def test_the_workspace_file_cannot_switch_the_operators_gate_off_through_the_server(tmp_path):
    (tmp_path / "workspace" / ".agents").mkdir(parents=True)
    (tmp_path / "workspace" / ".agents" / "hooks.json").write_text('{"security-gate": {"enabled": false}}')
    started = Server(tmp_path)
    try:
        assert thin(started.address, RM_RF)[0] == GATE_DENIES
        (problem,) = [r for r in started.logs if r["msg"] == "hook_config_problem"]
        assert problem["layer"] == "workspace" and "the workspace one is ignored" in problem["problem"]
    finally:
        started.stop()


def test_concurrent_dispatches_from_many_clients(server, tmp_path):
    server.write_workspace({"slow": {"pre_tool_execution": [{"matcher": "read_file", "hooks": [
        {"type": "command", "command": f"sleep 0.5; {ALLOW}"}]}]}})  # fmt: skip
    server.process.send_signal(signal.SIGHUP)
    server.wait_for("hook_config_reloaded")
    address = client.parse_address(server.address)
    read = json.dumps({"tool_call": {"name": "read_file", "args": {"path": "/x"}}}).encode()
    started = time.monotonic()
    with ThreadPoolExecutor(40) as pool:
        slow = [pool.submit(client.decide, address, "pre_tool_execution", read) for _ in range(20)]
        gate = [pool.submit(client.decide, address, "pre_tool_execution", RM_RF if i % 2 else LS) for i in range(20)]
        answers = [f.result(timeout=30) for f in slow], [f.result(timeout=30) for f in gate]
    elapsed = time.monotonic() - started
    assert answers[0] == [{"decision": "allow"}] * 20
    assert answers[1] == [GATE_DENIES if i % 2 else {"decision": "allow"} for i in range(20)]
    # Twenty 0.5 s handlers one after another would take 10 s.
    assert elapsed < 5, elapsed
    # ...and real client processes side by side.
    with ThreadPoolExecutor(4) as pool:
        assert [d for d, _ in pool.map(lambda e: thin(server.address, e), [RM_RF, LS] * 3)] == [GATE_DENIES, {"decision": "allow"}] * 3


def test_handlers_of_one_request_run_in_order(server, tmp_path):
    marker = tmp_path / "order"
    hooks = [{"type": "command", "command": f"sleep 0.{3 - i}; echo {i} >> {marker}; {ALLOW}"} for i in range(3)]
    server.write_workspace({"ordered": {"pre_tool_execution": [{"matcher": "*", "hooks": hooks}]}})
    server.process.send_signal(signal.SIGHUP)
    server.wait_for("hook_config_reloaded")
    thin(server.address, LS)
    assert marker.read_text().split() == ["0", "1", "2"]


def test_a_changed_file_is_logged_but_not_applied_before_sighup(server):
    deny_all = {"lockdown": {"pre_tool_execution": [{"matcher": "*", "hooks": [
        {"type": "command", "command": "echo '{\"decision\": \"deny\", \"reason\": \"locked\"}'"}]}]}}  # fmt: skip
    server.write_workspace(deny_all)
    assert thin(server.address, LS)[0] == {"decision": "allow"}  # the snapshot is unchanged
    changed = server.wait_for("hook_config_changed_on_disk")
    assert (changed["layer"], changed["source"], changed["change"], changed["applied"]) == (
        "workspace", str(server.workspace / ".agents" / "hooks.json"), "added", False
    )  # fmt: skip
    thin(server.address, LS)
    assert len([r for r in server.logs if r["msg"] == "hook_config_changed_on_disk"]) == 1  # once per change
    server.process.send_signal(signal.SIGHUP)
    reloaded = server.wait_for("hook_config_reloaded")
    assert [g["name"] for g in reloaded["groups"]] == ["security-gate", "lockdown"]
    assert thin(server.address, LS)[0] == {"decision": "deny", "reason": "locked"}
    assert thin(server.address, RM_RF)[0] == GATE_DENIES  # the operator's gate still runs first


def test_a_sighup_that_would_break_the_operator_file_keeps_the_snapshot(server):
    server.operator.write_text('{"security-gate": ')
    server.process.send_signal(signal.SIGHUP)
    refused = server.wait_for("hook_config_reload_refused")
    assert refused["layer"] == "operator" and "invalid JSON" in refused["problems"][0]
    assert thin(server.address, RM_RF)[0] == GATE_DENIES


def test_an_unchanged_touch_is_not_reported(server):
    operator = server.operator
    os.utime(operator, (time.time() + 5, time.time() + 5))
    thin(server.address, LS)
    assert not [r for r in server.logs if r["msg"] == "hook_config_changed_on_disk"]


def test_a_killed_server_fails_open_or_closed_as_the_client_says(server):
    server.process.kill()
    server.process.wait(10)
    assert server.socket.exists()  # left behind: nobody listens on it
    decision, logs = thin(server.address, RM_RF)
    assert decision == {"decision": "allow"}
    (record,) = logs
    assert (record["msg"], record["server"], record["fail_closed"]) == ("hook_server_unavailable", server.address, False)
    assert "cannot connect: Connection refused" in record["error"]
    decision, logs = thin(server.address, RM_RF, "--fail-closed")
    assert decision["decision"] == "deny"
    assert decision["reason"].startswith(f"Tool call denied: the hook server at {server.address} gave no answer (cannot connect")
    assert logs[0]["fail_closed"] is True
    # A post-tool event cannot be blocked, --fail-closed or not.
    assert thin(server.address, LS, "--fail-closed", event_name="post_tool_execution")[0] == {}


def test_no_server_at_all(tmp_path):
    decision, logs = thin(f"unix:{tmp_path / 'none.sock'}", RM_RF, "--fail-closed")
    assert decision["decision"] == "deny" and "No such file or directory" in logs[0]["error"]


def test_a_new_server_replaces_a_stale_socket_but_not_a_live_one_or_a_file(tmp_path):
    first = Server(tmp_path)
    first.process.kill()
    first.process.wait(10)
    second = Server(tmp_path)  # the dead one's socket is replaced
    try:
        assert thin(second.address, RM_RF)[0] == GATE_DENIES
        third = subprocess.run(
            [sys.executable, "-m", "egress.hooks", "serve", "--listen", second.address, "--operator-config", str(second.operator)],
            capture_output=True, timeout=30, env=ENV,
        )  # fmt: skip
        assert third.returncode == 1
        assert third.stderr.decode().strip() == f"egress-hooks: error: --listen {second.socket}: another server is listening there"
    finally:
        second.stop()
    assert not second.socket.exists()  # removed on a clean stop
    plain = tmp_path / "plain"
    plain.write_text("keep me")
    refused = subprocess.run(
        [sys.executable, "-m", "egress.hooks", "serve", "--listen", f"unix:{plain}"], capture_output=True, timeout=30, env=ENV
    )
    assert refused.returncode == 1 and b"exists and is not a socket; not replacing it" in refused.stderr
    assert plain.read_text() == "keep me"


def test_tcp_on_loopback(tmp_path):
    started = Server(tmp_path, listen="127.0.0.1:0")
    try:
        host, port = started.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert thin(started.address, RM_RF)[0] == GATE_DENIES
    finally:
        started.stop()


@pytest.mark.parametrize("listen", ["0.0.0.0:8123", "192.0.2.1:8123", "example.com:80"])
def test_tcp_elsewhere_than_loopback_is_refused(listen):
    result = subprocess.run([sys.executable, "-m", "egress.hooks", "serve", "--listen", listen], capture_output=True, timeout=30, env=ENV)
    assert result.returncode == 2
    assert result.stderr.decode().startswith(f"egress-hooks: error: --listen {listen}: TCP listens on loopback only")


@pytest.mark.parametrize(
    ("request_bytes", "status", "error"),
    [
        (b"GET /v1/dispatch/pre_tool_execution HTTP/1.1\r\n\r\n", 405, "method_not_allowed"),
        (b"POST /v1/dispatch/during_tool_execution HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 404, "unknown_event"),
        (b"POST /elsewhere HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 404, "not_found"),
        (b"POST /v1/dispatch/pre_tool_execution HTTP/1.1\r\nContent-Length: 5\r\n\r\n{not}", 400, "bad_event"),
        (b"POST /v1/dispatch/pre_tool_execution HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]", 400, "bad_event"),
        (b"POST /v1/dispatch/pre_tool_execution HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, "bad_request"),
        (b"POST /v1/dispatch/pre_tool_execution HTTP/1.1\r\n\r\n", 411, "bad_request"),
        (b"BREW /pot HTTP/9.9\r\n\r\n", 505, "bad_request"),
    ],
)
def test_bad_requests_get_a_clear_answer_and_the_server_keeps_going(server, request_bytes, status, error):
    assert raw(server.address, request_bytes)[0] == status
    assert raw(server.address, request_bytes)[1]["error"] == error
    assert thin(server.address, RM_RF)[0] == GATE_DENIES


def test_status_and_keep_alive(server):
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(str(server.socket))
    body = LS
    for _ in range(3):  # three requests on one connection
        sock.sendall(b"POST /v1/dispatch/pre_tool_execution HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        assert json.loads(sock.recv(length)) == {"decision": "allow"}
    sock.close()
    status, document = raw(server.address, b"GET /v1/status HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 200 and [g["name"] for g in document["groups"]] == ["security-gate"]


def test_a_setsid_grandchild_of_a_served_hook_is_killed(server, tmp_path):
    pid_file = tmp_path / "pid"
    server.write_workspace({"bg": {"pre_tool_execution": [{"matcher": "*", "hooks": [
        {"type": "command", "command": f"setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > {pid_file}; {ALLOW}"}]}]}})  # fmt: skip
    server.process.send_signal(signal.SIGHUP)
    server.wait_for("hook_config_reloaded")
    thin(server.address, LS)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:  # killed and reaped, not left a zombie
        time.sleep(0.05)
        thin(server.address, b'{"tool_call": {"name": "nothing-matches-this"}}', event_name="post_tool_execution")
    assert not Path(f"/proc/{pid}").exists()
    # Killed by the reaper (logged) - unless the group kill got it before it left the group.
    killed = [p for r in server.logs if r["msg"] == "hook_processes_killed" for p in r["pids"]]
    assert killed == [pid] or not killed, killed


def test_the_thin_client_imports_nothing_of_the_dispatcher(server):
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['egress-hooks', 'dispatch', 'pre_tool_execution', '--server', sys.argv[1]]\n"
        "try:\n    runpy.run_module('egress.hooks', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = ('asyncio', 're2', 'egress.hooks.dispatcher', 'egress.hooks.config', 'httpx', 'prometheus_client')\n"
        "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, server.address], input=RM_RF, capture_output=True, env=ENV, timeout=30)
    assert json.loads(result.stdout) == GATE_DENIES
    assert result.stderr.decode().strip() == "[]"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--server", "unix:"), "--server 'unix:': expected unix:PATH"),
        (("--server", "nowhere"), "--server 'nowhere': expected unix:PATH or HOST:PORT"),
        (("--server", "unix:/x", "--config", "/x"), "--config cannot be used with --server"),
        (("--fail-closed",), "--fail-closed applies to --server"),
    ],
)
def test_client_usage_errors(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "egress.hooks", "dispatch", "pre_tool_execution", *args], input=RM_RF, capture_output=True, env=ENV, timeout=30
    )
    assert result.returncode == 2
    assert result.stderr.decode().strip().startswith(f"egress-hooks: error: {message}")


def test_a_malformed_event_is_a_usage_error_with_the_server_too(server):
    result = subprocess.run(
        [sys.executable, "-m", "egress.hooks", "dispatch", "pre_tool_execution", "--server", server.address],
        input=b"{not json", capture_output=True, env=ENV, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.decode().startswith("egress-hooks: error: event on stdin is not JSON")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", "the answer is not a decision"),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n{"decision": "deny"}', "the answer is a deny without a reason"),
        (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n", "answered HTTP 500"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "connection closed before a complete answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", "connection closed in the middle of the answer"),
    ],
)
def test_an_answer_that_is_no_decision_fails_open_or_closed(tmp_path, answer, error):
    """A server that is up but answers garbage is treated like one that is down."""
    path = tmp_path / "fake.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)

    def serve():
        for _ in range(2):
            conn, _ = listener.accept()
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(answer)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        decision, logs = thin(f"unix:{path}", RM_RF)
        assert decision == {"decision": "allow"}
        assert logs[0]["error"].startswith(error), logs
        decision, _ = thin(f"unix:{path}", RM_RF, "--fail-closed")
        assert decision["decision"] == "deny" and error in decision["reason"]
    finally:
        listener.close()
