"""The command runner against real `/bin/sh` hooks: every fail-open path, big I/O, and hooks that will not die."""

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from egress.hooks.config import parse_config
from egress.hooks.dispatcher import Decision, DispatchSettings, dispatch
from egress.hooks.runners.command import run_command

PRE = "pre_tool_execution"
POST = "post_tool_execution"
TEST_LIMIT_SECONDS = 20
MiB = 1 << 20


def event_for(tool: str, **args) -> dict:
    return {"tool_call": {"name": tool, "args": args}, "environment_id": "env_test"}


def run_dispatch(cmd: str, timeout: float = 10, event: dict | None = None, event_name: str = PRE) -> tuple[Decision, list[dict]]:
    document = {"gate": {event_name: [{"matcher": "*", "hooks": [{"type": "command", "command": cmd, "timeout": timeout}]}]}}
    config = parse_config(json.dumps(document))
    logs: list[dict] = []
    settings = DispatchSettings(log=logs.append, record_metrics=False)
    coro = dispatch(config, event_name, event or event_for("code_execution", code="ls"), settings)
    return asyncio.run(asyncio.wait_for(coro, TEST_LIMIT_SECONDS)), logs


def group_gone_soon(pgid: int, seconds: float = 1.0) -> list[tuple[int, str]]:
    """Members still alive after `seconds`: SIGKILL is delivered asynchronously, so a
    killed process may show as running for a moment before it becomes a zombie."""
    deadline = time.monotonic() + seconds
    while (members := live_group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return members


def live_group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process in the group that is not a zombie."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append((int(stat.parent.name), state))
    return members


DENY = "echo '{\"decision\":\"deny\",\"reason\":\"r\"}'"


@pytest.mark.parametrize(
    ("cmd", "outcome", "failure", "extra"),
    [
        ("exit 1", "error", "nonzero_exit", {"exit_code": 1}),
        ("echo '{\"decision\":\"allow\"}'; exit 4", "error", "nonzero_exit", {"exit_code": 4}),
        ("no-such-command-for-egress-tests", "error", "command_not_found", {"exit_code": 127}),
        (f"{DENY}; exit 1", "error", "deny_with_nonzero_exit", {"exit_code": 1}),
        ("echo 'Destructive command blocked'", "error", "unparsable_output", {"exit_code": 0}),
        ("echo '[{\"decision\":\"deny\"}]'", "error", "not_a_json_object", {"exit_code": 0}),
        ("printf '\\377\\376{\"decision\":\"deny\"}'", "error", "unparsable_output", {"exit_code": 0}),
        ("echo '{\"decision\":\"DENY\"}'", "error", "unrecognised_decision", {"exit_code": 0}),
        ("true", "error", "empty_output", {"exit_code": 0}),
        ("kill -9 $$", "error", "killed_by_signal", {"exit_code": -9}),
    ],
)
def test_fail_open_paths_allow_and_log_one_line(cmd, outcome, failure, extra):
    decision, logs = run_dispatch(cmd)
    assert decision.as_json() == {"decision": "allow"}
    assert len(logs) == 1
    record = logs[0]
    assert {k: record[k] for k in ("msg", "event", "tool", "group", "rule", "handler", "type", "outcome", "failure")} == {
        "msg": "hook_fail_open",
        "event": PRE,
        "tool": "code_execution",
        "group": "gate",
        "rule": 0,
        "handler": 0,
        "type": "command",
        "outcome": outcome,
        "failure": failure,
    }
    assert isinstance(record["duration_ms"], float)
    for key, value in extra.items():
        assert record[key] == value
    json.dumps(record)  # the record is what goes to stderr as one JSON line


def test_fail_open_log_carries_the_stderr_tail():
    _, logs = run_dispatch("echo 'Traceback: gate broke' >&2; exit 1")
    assert logs[0]["stderr"] == "Traceback: gate broke\n"


def test_invalid_utf8_inside_a_deny_reason_still_denies():
    decision, logs = run_dispatch("printf '{\"decision\":\"deny\",\"reason\":\"bad \\377 byte\"}'")
    assert decision.as_json() == {"decision": "deny", "reason": "bad \ufffd byte"} and logs == []


def test_bom_crlf_and_whitespace_around_a_deny_are_tolerated():
    decision, _ = run_dispatch("printf '\\357\\273\\277  \\r\\n{\"decision\": \"deny\", \"reason\": \"bom\"}\\r\\n\\n'")
    assert decision.as_json() == {"decision": "deny", "reason": "bom"}


def test_hook_printing_10_mib_is_capped_and_fails_open_quickly():
    started = time.monotonic()
    decision, logs = run_dispatch("head -c 10485760 /dev/zero | tr '\\0' 'a'; echo done >&2", timeout=15)
    assert time.monotonic() - started < 10
    assert decision.as_json() == {"decision": "allow"}
    # The hook ran to completion (exit 0): it was never blocked on a full pipe.
    assert (logs[0]["failure"], logs[0]["exit_code"], logs[0]["stderr"]) == ("output_too_large", 0, "done\n")


def test_runner_keeps_exactly_one_mib_of_stdout():
    result = asyncio.run(asyncio.wait_for(run_command("head -c 3145728 /dev/zero", b"", 10), TEST_LIMIT_SECONDS))
    assert (len(result.stdout), result.stdout_truncated, result.exit_code) == (MiB, True, 0)
    exact = asyncio.run(asyncio.wait_for(run_command(f"head -c {MiB} /dev/zero", b"", 10), TEST_LIMIT_SECONDS))
    assert (len(exact.stdout), exact.stdout_truncated) == (MiB, False)


def big_write_file_event() -> dict:
    return event_for("write_file", path="/workspace/big.bin", content="x" * (5 * 1000 * 1000))


def test_5mb_payload_to_a_hook_that_never_reads_stdin_does_not_deadlock():
    # The hook exits without reading: our write gets EPIPE, which is normal.
    decision, logs = run_dispatch(DENY, event=big_write_file_event(), timeout=10)
    assert decision.as_json() == {"decision": "deny", "reason": "r"} and logs == []


def test_5mb_payload_arrives_whole_while_the_hook_also_writes_a_lot():
    # Reads all of stdin while writing 2 MiB to stdout and stderr: neither
    # side may wait for the other.
    cmd = (
        "head -c 2097152 /dev/zero >&2; head -c 2097152 /dev/zero; n=$(wc -c); "
        "[ \"$n\" -gt 5000000 ] && exit 0 || exit 1"
    )
    result = asyncio.run(asyncio.wait_for(run_command(cmd, json.dumps(big_write_file_event()).encode(), 10), TEST_LIMIT_SECONDS))
    assert (result.exit_code, result.timed_out) == (0, False)
    assert (len(result.stdout), result.stdout_truncated, len(result.stderr_tail)) == (MiB, True, 4096)
    decision, _ = run_dispatch(
        "n=$(wc -c); [ \"$n\" -gt 5000000 ] && echo '{\"decision\":\"deny\",\"reason\":\"all bytes\"}'",
        event=big_write_file_event(),
    )
    assert decision.reason == "all bytes"


def test_timeout_fails_open_within_timeout_plus_one_second():
    started = time.monotonic()
    decision, logs = run_dispatch("sleep 30", timeout=1)
    elapsed = time.monotonic() - started
    assert 1 <= elapsed < 2
    assert decision.as_json() == {"decision": "allow"}
    assert (logs[0]["outcome"], logs[0]["failure"]) == ("timeout", "timeout")


def test_grandchild_holding_stdout_returns_in_time_and_leaves_no_process(tmp_path):
    pid_file = tmp_path / "pgid"
    # The shell prints a deny and exits at once, but its background `sleep 60`
    # still holds stdout: the hook never finishes, so it times out (allow).
    cmd = f"echo $$ > {pid_file}; {DENY}; sleep 60 & exit 0"
    started = time.monotonic()
    decision, logs = run_dispatch(cmd, timeout=1)
    elapsed = time.monotonic() - started
    assert elapsed < 2, elapsed
    assert decision.as_json() == {"decision": "allow"}
    assert logs[0]["outcome"] == "timeout"
    assert group_gone_soon(int(pid_file.read_text())) == []


def test_hook_ignoring_sigterm_is_killed(tmp_path):
    pid_file = tmp_path / "pgid"
    cmd = f"echo $$ > {pid_file}; trap '' TERM; sh -c \"trap '' TERM; sleep 60\" & sleep 60; wait"
    started = time.monotonic()
    _, logs = run_dispatch(cmd, timeout=1)
    assert time.monotonic() - started < 2
    assert logs[0]["outcome"] == "timeout" and logs[0]["exit_code"] == -signal.SIGKILL
    assert group_gone_soon(int(pid_file.read_text())) == []


def test_cancelled_dispatch_leaves_no_process(tmp_path):
    pid_file = tmp_path / "pgid"
    document = {"gate": {PRE: [{"matcher": "*", "hooks": [{"type": "command", "command": f"echo $$ > {pid_file}; sleep 60 & sleep 60"}]}]}}
    coro = dispatch(parse_config(json.dumps(document)), PRE, event_for("read_file"), DispatchSettings(record_metrics=False))
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(coro, 0.5))
    assert group_gone_soon(int(pid_file.read_text()), seconds=2) == []


def timed_dispatch(cmd: str, timeout: float) -> tuple[Decision, list[dict], float]:
    """run_dispatch, and the seconds it took."""
    started = time.monotonic()
    decision, logs = run_dispatch(cmd, timeout=timeout)
    return decision, logs, time.monotonic() - started


@contextlib.contextmanager
def killed_afterwards(pid_file: Path):
    """SIGKILL, when the block ends, the process whose pid a hook wrote to pid_file: one the hook left running."""
    try:
        yield pid_file
    finally:
        with contextlib.suppress(OSError, ValueError):  # already gone, or the hook never wrote its pid
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_process_that_left_the_group_cannot_hold_the_dispatcher(tmp_path):
    # setsid puts the sleeper in a session of its own, out of reach of the
    # group kill, still holding stdout: the drain after SIGKILL is bounded.
    with killed_afterwards(tmp_path / "escaped") as pid_file:
        decision, logs, seconds = timed_dispatch(f"setsid sleep 30 & echo $! > {pid_file}; wait", timeout=1)
    assert seconds < 2.2
    assert decision.as_json() == {"decision": "allow"} and logs[0]["outcome"] == "timeout"


def test_detached_background_job_without_our_pipes_does_not_delay_the_decision(tmp_path):
    with killed_afterwards(tmp_path / "bg") as pid_file:
        decision, _, seconds = timed_dispatch(f"sleep 30 >/dev/null 2>&1 </dev/null & echo $! > {pid_file}; {DENY}", timeout=5)
    assert seconds < 2 and decision.denied


def test_post_hook_timeout_is_logged_and_returns_empty_object():
    decision, logs = run_dispatch("sleep 30", timeout=0.5, event_name=POST)
    assert decision.as_json() == {}
    assert (logs[0]["event"], logs[0]["outcome"]) == (POST, "timeout")


def test_spawn_failure_fails_open(tmp_path):
    document = {"gate": {PRE: [{"matcher": "*", "hooks": [{"type": "command", "command": "true"}]}]}}
    logs: list[dict] = []
    settings = DispatchSettings(cwd=str(tmp_path / "missing"), log=logs.append, record_metrics=False)
    decision = asyncio.run(dispatch(parse_config(json.dumps(document)), PRE, event_for("read_file"), settings))
    assert decision.as_json() == {"decision": "allow"}
    assert logs[0]["failure"] == "spawn_failed" and "FileNotFoundError" in logs[0]["error"]
