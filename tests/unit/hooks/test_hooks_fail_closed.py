"""`"onError": "deny"`: each failure the seed reads as an allow denies instead, with a
reason naming the group, the hook and the failure; without onError the same failure
allows (the seed's table unchanged). Real /bin/sh hooks and a real HTTP server."""

import asyncio
import json
import threading
from http.server import ThreadingHTTPServer

import pytest
from hook_testing import QuietHandler

from egress.hooks.config import parse_config
from egress.hooks.dispatcher import Decision, DispatchSettings, dispatch

PRE = "pre_tool_execution"
POST = "post_tool_execution"
MiB = 1 << 20
EVENT = {"tool_call": {"name": "code_execution", "args": {"code": "npm publish"}}, "environment_id": "env_1"}
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy")


class Handler(QuietHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, payload, extra = {
            "/500": (500, b'{"decision": "allow"}', {}),
            "/302": (302, b'{"decision": "allow"}', {"Location": "/allow"}),
            "/text": (200, b"OK, logged.", {}),
            "/big": (200, b'{"decision": "deny", "reason": "big"}' + b" " * (2 * MiB), {}),
            "/allow": (200, b'{"decision": "allow"}', {}),
        }[self.path]
        self.reply(status, payload, extra)


@pytest.fixture(scope="module")
def http_base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(autouse=True)
def no_ambient_proxy(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def run(handler: dict, event_name: str = PRE, on_error: str | None = "deny") -> tuple[Decision, list[dict]]:
    if on_error is not None:
        handler = {**handler, "onError": on_error}
    document = {"publish-gate": {event_name: [{"matcher": "code_execution", "hooks": [handler]}]}}
    config = parse_config(json.dumps(document))
    assert config.problems == ()
    logs: list[dict] = []
    settings = DispatchSettings(log=logs.append, record_metrics=False)
    return asyncio.run(asyncio.wait_for(dispatch(config, event_name, EVENT, settings), 20)), logs


def command(cmd: str, timeout: float = 10) -> dict:
    return {"type": "command", "command": cmd, "timeout": timeout}


DENY_THEN_2_MB = "echo '{\"decision\": \"deny\", \"reason\": \"no\"}'; head -c 2097152 /dev/zero | tr '\\0' ' '"
COMMAND_FAILURES = [
    ("crash", command("kill -SEGV $$"), "killed_by_signal", "was killed by signal 11"),
    ("exit 1", command("exit 1"), "nonzero_exit", "exited with status 1"),
    ("timeout", command("sleep 5", timeout=0.3), "timeout", "timed out after 0.3 s"),
    ("plain text", command("echo 'looks fine to me'"), "unparsable_output", "gave output that is not JSON"),
    ("deny then 2 MB", command(DENY_THEN_2_MB), "output_too_large", "gave more than 1 MiB of output"),
    ("no decision", command("echo '{}'"), "no_decision", 'gave JSON without a "decision"'),
    ("not found", command("/nonexistent/gate"), "command_not_found", "command not found"),
]
HTTP_FAILURES = [
    ("500", "/500", "http_status", "answered HTTP 500"),
    ("302", "/302", "redirect", "answered with a redirect (HTTP 302)"),
    ("plain text", "/text", "unparsable_output", "gave output that is not JSON"),
    ("deny then 2 MB", "/big", "output_too_large", "gave more than 1 MiB of output"),
]


@pytest.mark.parametrize(("name", "handler", "failure", "text"), COMMAND_FAILURES, ids=[c[0] for c in COMMAND_FAILURES])
def test_command_failure_denies_with_on_error_deny(name, handler, failure, text):
    decision, logs = run(handler)
    assert decision.denied, name
    assert decision.reason == (
        'Tool call denied: hook group "publish-gate" (workspace), pre_tool_execution[0].hooks[0] (command) '
        f'{decision.reason.split("(command) ", 1)[1]}'
    )
    assert text in decision.reason and decision.reason.endswith('and its onError is "deny".')
    (record,) = logs
    assert (record["msg"], record["failure"], record["on_error"]) == ("hook_fail_closed", failure, "deny")


@pytest.mark.parametrize(("name", "handler", "failure", "text"), COMMAND_FAILURES, ids=[c[0] for c in COMMAND_FAILURES])
def test_command_failure_allows_without_on_error(name, handler, failure, text):
    decision, logs = run(handler, on_error=None)
    assert decision.as_json() == {"decision": "allow"}, name
    (record,) = logs
    assert (record["msg"], record["failure"], record["on_error"]) == ("hook_fail_open", failure, "allow")


@pytest.mark.parametrize(("name", "path", "failure", "text"), HTTP_FAILURES, ids=[c[0] for c in HTTP_FAILURES])
def test_http_failure_denies_with_on_error_deny(http_base, name, path, failure, text):
    decision, logs = run({"type": "http", "url": http_base + path, "timeout": 5})
    assert decision.denied, name
    assert decision.reason.startswith(
        'Tool call denied: hook group "publish-gate" (workspace), pre_tool_execution[0].hooks[0] (http to 127.0.0.1) '
    )
    assert text in decision.reason
    assert [(r["msg"], r["failure"]) for r in logs] == [("hook_fail_closed", failure)]


@pytest.mark.parametrize(("name", "path", "failure", "text"), HTTP_FAILURES, ids=[c[0] for c in HTTP_FAILURES])
def test_http_failure_allows_without_on_error(http_base, name, path, failure, text):
    decision, logs = run({"type": "http", "url": http_base + path, "timeout": 5}, on_error=None)
    assert decision.as_json() == {"decision": "allow"}, name
    assert [(r["msg"], r["failure"]) for r in logs] == [("hook_fail_open", failure)]


def test_http_timeout_and_refused_connection_deny(http_base):
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    decision, logs = run({"type": "http", "url": f"http://127.0.0.1:{port}/gate", "timeout": 2})
    assert decision.denied and "request failed" in decision.reason
    with socket.socket() as silent:  # accepts (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        decision, _ = run({"type": "http", "url": f"http://127.0.0.1:{silent.getsockname()[1]}/gate", "timeout": 0.3})
    assert decision.denied and "timed out after 0.3 s" in decision.reason


def test_a_working_fail_closed_gate_allows_and_denies_as_it_says(http_base):
    decision, logs = run(command("echo '{\"decision\": \"allow\"}'"))
    assert decision.as_json() == {"decision": "allow"} and logs == []
    decision, logs = run(command("echo '{\"decision\": \"deny\", \"reason\": \"not today\"}'"))
    assert decision.as_json() == {"decision": "deny", "reason": "not today"} and logs == []
    decision, _ = run({"type": "http", "url": http_base + "/allow", "timeout": 5})
    assert decision.as_json() == {"decision": "allow"}


def test_post_tool_events_cannot_block_even_with_on_error_deny():
    decision, logs = run(command("exit 1"), event_name=POST)
    assert decision.as_json() == {}
    assert [(r["msg"], r["failure"]) for r in logs] == [("hook_fail_open", "nonzero_exit")]


def test_a_fail_closed_deny_stops_later_handlers(tmp_path):
    marker = tmp_path / "ran"
    document = {
        "gate": {PRE: [{"matcher": "*", "hooks": [{**command("exit 3"), "onError": "deny"}, command(f"touch {marker}")]}]},
        "later": {PRE: [{"matcher": "*", "hooks": [command(f"touch {marker}")]}]},
    }
    config = parse_config(json.dumps(document))
    decision = asyncio.run(dispatch(config, PRE, EVENT, DispatchSettings(log=lambda r: None, record_metrics=False)))
    assert decision.denied and "exited with status 3" in decision.reason
    assert not marker.exists()


@pytest.mark.parametrize(
    ("output", "failure", "said"),
    [
        ('{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", '
         '"permissionDecisionReason": "claude says no"}}', "foreign_permission_decision", "claude says no"),
        ('{"permissionDecision": "deny", "permissionDecisionReason": "top-level"}', "foreign_permission_decision", "top-level"),
        ('{"decision": "block", "reason": "codex says no"}', "foreign_decision_block", "codex says no"),
        ('{"permission": "deny", "agent_message": "cursor says no"}', "foreign_permission", "cursor says no"),
    ],
)  # fmt: skip
def test_another_agents_block_still_allows_but_is_logged_with_its_reason(output, failure, said):
    decision, logs = run(command(f"echo '{output}'"), on_error=None)
    assert decision.as_json() == {"decision": "allow"}
    (record,) = logs
    assert (record["failure"], record["foreign_reason"]) == (failure, said)


def test_exit_2_with_a_reason_on_stderr_still_allows_but_is_logged_as_another_agents_block():
    decision, logs = run(command("echo 'Blocked: rm -rf is not allowed' >&2; exit 2"), on_error=None)
    assert decision.as_json() == {"decision": "allow"}
    (record,) = logs
    assert (record["failure"], record["exit_code"], record["foreign_reason"]) == (
        "foreign_exit_status_2", 2, "Blocked: rm -rf is not allowed"
    )
    decision, _ = run(command("echo 'Blocked' >&2; exit 2"))
    assert decision.denied and "exited with status 2 (another agent's way to block" in decision.reason


def test_exit_2_without_stderr_is_a_plain_nonzero_exit():
    _, logs = run(command("exit 2"), on_error=None)
    assert logs[0]["failure"] == "nonzero_exit"


def test_on_error_must_be_allow_or_deny_and_a_typo_fails_closed():
    document = {"g": {PRE: [{"matcher": "*", "hooks": [{**command("exit 1"), "onError": "block"}]}]}}
    config = parse_config(json.dumps(document))
    assert config.problems == ('group "g": pre_tool_execution[0].hooks[0].onError: must be "allow" or "deny", got "block"; "deny" is used',)
    decision = asyncio.run(dispatch(config, PRE, EVENT, DispatchSettings(log=lambda r: None, record_metrics=False)))
    assert decision.denied
