"""Bounded time and nothing left behind: the event's budget, the 600 s timeout cap, the
reaper of processes that left the hook's process group, and what a hook sees
(environment variables, working directory). Real /bin/sh hooks, real processes."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import egress
from egress.hooks.config import parse_config
from egress.hooks.dispatcher import DispatchSettings, dispatch

PRE = "pre_tool_execution"
POST = "post_tool_execution"
EVENT = {"tool_call": {"name": "code_execution", "args": {"code": "ls"}}, "environment_id": "env_budget"}
SOURCE_ROOT = str(Path(egress.__file__).resolve().parent.parent)


def command(cmd: str, timeout: float = 10, **extra) -> dict:
    return {"type": "command", "command": cmd, "timeout": timeout, **extra}


def run(hooks: list[dict], event_name: str = PRE, **settings) -> tuple[object, list[dict], float]:
    config = parse_config(json.dumps({"g": {event_name: [{"matcher": "*", "hooks": hooks}]}}))
    assert config.problems == ()
    logs: list[dict] = []
    started = time.monotonic()
    decision = asyncio.run(
        asyncio.wait_for(dispatch(config, event_name, EVENT, DispatchSettings(log=logs.append, record_metrics=False, **settings)), 20)
    )
    return decision, logs, time.monotonic() - started


def test_three_one_second_handlers_under_a_1_5_s_budget_finish_in_time():
    decision, logs, elapsed = run([command("sleep 5", timeout=1)] * 3, budget=1.5)
    assert elapsed <= 1.6, elapsed
    assert decision.as_json() == {"decision": "allow"}
    assert [(r["msg"], r["handler"], r["failure"]) for r in logs] == [
        ("hook_fail_open", 0, "timeout"),
        ("hook_fail_open", 1, "budget_exhausted"),
        ("hook_skipped", 2, "skipped_budget_spent"),
    ]


def test_a_skipped_fail_closed_handler_denies():
    hooks = [command("sleep 5", timeout=1), command("true", onError="deny")]
    decision, logs, elapsed = run(hooks, budget=1.0)
    assert elapsed < 1.5
    assert decision.denied
    assert decision.reason == (
        'Tool call denied: hook group "g" (workspace), pre_tool_execution[0].hooks[1] (command) was not run: '
        "the event's time budget of 1 s was spent, and its onError is \"deny\"."
    )
    assert [r["msg"] for r in logs] == ["hook_fail_open", "hook_skipped"]


def test_a_handler_cut_by_the_budget_fails_closed_with_the_budget_named():
    decision, _, elapsed = run([command("sleep 5", timeout=10, onError="deny")], budget=0.5)
    assert elapsed < 1.0
    assert decision.denied and "was stopped when the event's time budget of 0.5 s ran out" in decision.reason


def test_a_handler_that_ignores_sigterm_is_still_held_to_the_budget():
    decision, _, elapsed = run([command("trap '' TERM; sleep 5", timeout=10)], budget=0.5)
    assert decision.as_json() == {"decision": "allow"}
    assert elapsed < 0.9, elapsed


def test_the_default_budget_lets_every_handler_use_its_timeout():
    decision, logs, elapsed = run([command("sleep 5", timeout=0.3), command("sleep 5", timeout=0.3), command("echo '{\"decision\": \"allow\"}'")])
    assert [r["failure"] for r in logs] == ["timeout", "timeout"]  # the third ran, and succeeded (no log)
    assert elapsed < 2


def test_a_timeout_above_600_s_is_a_problem_and_600_is_used():
    config = parse_config(json.dumps({"g": {PRE: [{"matcher": "*", "hooks": [command("true", timeout=3600)]}]}}))
    assert config.problems == (
        'group "g": pre_tool_execution[0].hooks[0].timeout: 3600 s is above the maximum of 600 s; 600 s is used',
    )
    assert config.groups[0].rules[PRE][0].handlers[0].timeout == 600


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_gone(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


def test_a_setsid_grandchild_is_gone_after_the_dispatch(tmp_path):
    pid_file = tmp_path / "pid"
    hook = command(f"setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > {pid_file}; echo '{{\"decision\": \"allow\"}}'")
    decision, logs, _ = run([hook])
    assert decision.as_json() == {"decision": "allow"} and logs == []
    pid = int(pid_file.read_text())
    assert wait_gone(pid), f"sleep {pid} outlived the dispatch"


def test_a_plain_background_child_is_gone_after_the_dispatch(tmp_path):
    pid_file = tmp_path / "pid"
    decision, _, elapsed = run([command(f"sleep 1000 >/dev/null 2>&1 & echo $! > {pid_file}; echo '{{\"decision\": \"allow\"}}'")])
    assert elapsed < 2
    assert wait_gone(int(pid_file.read_text()))


def cli_dispatch_in_workspace(tmp_path: Path, hooks: list[dict], *flags: str) -> subprocess.CompletedProcess:
    """`egress-hooks dispatch` of EVENT in a fresh process, the hooks in a workspace under tmp_path."""
    workspace = tmp_path / "ws"
    (workspace / ".agents").mkdir(parents=True)
    (workspace / ".agents" / "hooks.json").write_text(json.dumps({"g": {PRE: [{"matcher": "*", "hooks": hooks}]}}))
    return subprocess.run(
        [sys.executable, "-m", "egress.hooks", "dispatch", PRE, "--workspace", str(workspace), *flags],
        input=json.dumps(EVENT).encode(), capture_output=True, timeout=30, env={**os.environ, "PYTHONPATH": SOURCE_ROOT},
    )  # fmt: skip


def test_cli_kills_a_setsid_double_fork_that_cleared_its_environment(tmp_path):
    """`env -i` drops the run token: the CLI, as the child subreaper, still finds the orphan."""
    pid_file = tmp_path / "pid"
    hook = command(f"(env -i setsid sh -c 'echo $$ > {pid_file}; exec sleep 1000' >/dev/null 2>&1 </dev/null &); sleep 0.2")
    result = cli_dispatch_in_workspace(tmp_path, [hook])
    assert result.returncode == 0, result.stderr
    pid = int(pid_file.read_text())
    assert b"EGRESS_HOOK_RUN" not in Path(f"/proc/{pid}/environ").read_bytes() if alive(pid) else True
    assert wait_gone(pid), f"orphan {pid} outlived the dispatch"


def test_a_process_of_the_dispatcher_that_is_no_hook_is_left_alone(tmp_path):
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        run([command("setsid sleep 1000 >/dev/null 2>&1 </dev/null &")])
        assert alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


def test_hooks_see_the_event_in_their_environment_and_run_in_the_workspace(tmp_path):
    seen = tmp_path / "seen"
    hook = command(f'printf "%s|%s|%s|%s" "$HOOK_EVENT" "$HOOK_TOOL_NAME" "$HOOK_ENVIRONMENT_ID" "$PWD" > {seen}')
    run([hook], cwd=str(tmp_path))
    assert seen.read_text() == f"{PRE}|code_execution|env_budget|{tmp_path}"
    run([hook], event_name=POST, cwd=str(tmp_path))
    assert seen.read_text().startswith(f"{POST}|code_execution|env_budget|")


def test_a_missing_environment_id_is_an_empty_variable(tmp_path):
    seen = tmp_path / "seen"
    config = parse_config(json.dumps({"g": {PRE: [{"matcher": "*", "hooks": [command(f'echo "[$HOOK_ENVIRONMENT_ID]" > {seen}')]}]}}))
    asyncio.run(dispatch(config, PRE, {"tool_call": {"name": "x"}}, DispatchSettings(log=lambda r: None, record_metrics=False)))
    assert seen.read_text().strip() == "[]"


@pytest.mark.parametrize("value", ["0", "-1", "601", "nan", "soon"])
def test_budget_flag_must_be_a_positive_number_up_to_600(value):
    result = subprocess.run(
        [sys.executable, "-m", "egress.hooks", "dispatch", PRE, "--budget", value],
        input=b"{}", capture_output=True, timeout=30, env={**os.environ, "PYTHONPATH": SOURCE_ROOT},
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.decode().splitlines()
    assert line.startswith("egress-hooks: error: argument --budget: "), line


def test_budget_flag_bounds_a_cli_dispatch(tmp_path):
    hooks = [command("sleep 5", timeout=1)] * 3
    started = time.monotonic()
    result = cli_dispatch_in_workspace(tmp_path, hooks, "--budget", "0.5")
    assert time.monotonic() - started < 1.5
    assert json.loads(result.stdout) == {"decision": "allow"}
    assert [json.loads(line)["msg"] for line in result.stderr.decode().splitlines()] == [
        "hook_fail_open", "hook_skipped", "hook_skipped"
    ]  # fmt: skip


def test_cli_kills_a_chain_of_escaped_processes(tmp_path):
    """A setsid'd process that itself starts one more: both are gone after the dispatch."""
    pids = tmp_path / "pids"
    inner = f"sleep 1000 & echo $! >> {pids}; wait"
    hook = command(f"(env -i setsid sh -c '{inner}' >/dev/null 2>&1 </dev/null &); sleep 0.3")
    result = cli_dispatch_in_workspace(tmp_path, [hook])
    assert result.returncode == 0, result.stderr
    (pid,) = [int(p) for p in pids.read_text().split()]
    assert wait_gone(pid), f"{pid} outlived the dispatch"


def test_the_default_budget_is_the_sum_of_the_timeouts_capped_at_600_s():
    from egress.hooks.config import CommandHandler
    from egress.hooks.dispatcher import default_budget

    assert default_budget([CommandHandler(0, "true", timeout=1.0)] * 3) == pytest.approx(3.9)  # + 0.3 s each to stop
    assert default_budget([CommandHandler(0, "true", timeout=30.0)] * 30) == 600


def test_what_a_handler_left_running_is_gone_before_the_next_handler_starts(tmp_path):
    pid_file = tmp_path / "pid"
    first = command(f"setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > {pid_file}; echo '{{\"decision\": \"allow\"}}'")
    # The second handler denies if the first one's escapee is still alive (and not a zombie).
    second = command(
        f'state=$(cut -d")" -f2 /proc/$(cat {pid_file})/stat 2>/dev/null | cut -d" " -f2); '
        "if [ -n \"$state\" ] && [ \"$state\" != Z ]; then echo '{\"decision\": \"deny\", \"reason\": \"still running\"}'; "
        "else echo '{\"decision\": \"allow\"}'; fi"
    )
    decision, logs, _ = run([first, second])
    assert decision.as_json() == {"decision": "allow"}, logs
