"""`egress-hooks dispatch` / `check` as the runtime runs them: a fresh process, stdin in, JSON out."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import egress

FIXTURES = Path(__file__).resolve().parents[2] / "hooks"
# The seed page's gates live once, in the hooks-scenarios example; the tests run that copy.
GATES = Path(__file__).resolve().parents[3] / "examples/hooks-scenarios/root/.agents/hooks-scripts"
PAYLOADS = FIXTURES / "payloads"
PYTHON = shlex.quote(sys.executable)
SOURCE_ROOT = str(Path(egress.__file__).resolve().parent.parent)


def egress_hooks(*args: str, stdin: bytes = b"", cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(filter(None, [SOURCE_ROOT, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "egress.hooks", *args], input=stdin, capture_output=True, cwd=cwd, env=env, timeout=30, check=False
    )


def write_workspace(tmp_path: Path, document) -> Path:
    hooks_json = tmp_path / ".agents" / "hooks.json"
    hooks_json.parent.mkdir(parents=True, exist_ok=True)
    hooks_json.write_text(document if isinstance(document, str) else json.dumps(document, indent=2))
    return tmp_path


SEED_GATES = {
    "security-gate": {
        "pre_tool_execution": [
            {"matcher": "code_execution", "hooks": [{"type": "command", "command": f"{PYTHON} {GATES / 'gate.py'}", "timeout": 10}]}
        ]
    },
    "privacy-gate": {
        "pre_tool_execution": [
            {"matcher": "read_file", "hooks": [{"type": "command", "command": f"{PYTHON} {GATES / 'check_privacy.py'}", "timeout": 5}]}
        ]
    },
    "audit": {"post_tool_execution": [{"matcher": "*", "hooks": [{"type": "command", "command": "cat > /dev/null; exit 1"}]}]},
}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("pre_rm_rf.json", {"decision": "deny", "reason": "Destructive command blocked by security gate."}),
        ("post_app.json", {"decision": "allow"}),
        ("read_public.json", {"decision": "allow"}),
    ],
)
def test_dispatch_pre_with_the_seed_gates(tmp_path, payload, expected):
    workspace = write_workspace(tmp_path, SEED_GATES)
    result = egress_hooks("dispatch", "pre_tool_execution", "--workspace", str(workspace), stdin=(PAYLOADS / payload).read_bytes())
    assert (result.returncode, result.stderr) == (0, b"")
    assert json.loads(result.stdout) == expected


def test_dispatch_discovers_the_workspace_from_the_current_directory(tmp_path):
    workspace = write_workspace(tmp_path, SEED_GATES)
    result = egress_hooks("dispatch", "pre_tool_execution", stdin=(PAYLOADS / "read_private.json").read_bytes(), cwd=workspace)
    assert result.returncode == 0
    assert json.loads(result.stdout)["decision"] == "deny"


def test_dispatch_explicit_config(tmp_path):
    config = tmp_path / "elsewhere.json"
    config.write_text(json.dumps(SEED_GATES))
    result = egress_hooks("dispatch", "pre_tool_execution", "--config", str(config), stdin=(PAYLOADS / "pre_rm_rf.json").read_bytes())
    assert json.loads(result.stdout)["decision"] == "deny"


def test_dispatch_post_prints_empty_object_and_logs_the_failure(tmp_path):
    workspace = write_workspace(tmp_path, SEED_GATES)
    result = egress_hooks("dispatch", "post_tool_execution", "--workspace", str(workspace), stdin=(PAYLOADS / "post_app.json").read_bytes())
    assert result.returncode == 0 and json.loads(result.stdout) == {}
    (line,) = result.stderr.decode().splitlines()
    record = json.loads(line)
    assert (record["msg"], record["group"], record["failure"], record["exit_code"]) == ("hook_fail_open", "audit", "nonzero_exit", 1)


def test_dispatch_without_any_hooks_json_allows(tmp_path):
    result = egress_hooks("dispatch", "pre_tool_execution", "--workspace", str(tmp_path), stdin=(PAYLOADS / "pre_rm_rf.json").read_bytes())
    if Path("/.agents/hooks.json").exists():
        pytest.skip("this machine has a /.agents/hooks.json")
    assert (result.returncode, json.loads(result.stdout), result.stderr) == (0, {"decision": "allow"}, b"")


def test_dispatch_with_broken_hooks_json_fails_open_and_says_why(tmp_path):
    workspace = write_workspace(tmp_path, '{"security-gate": ')
    result = egress_hooks("dispatch", "pre_tool_execution", "--workspace", str(workspace), stdin=(PAYLOADS / "pre_rm_rf.json").read_bytes())
    assert result.returncode == 0 and json.loads(result.stdout) == {"decision": "allow"}
    record = json.loads(result.stderr)
    assert record["msg"] == "hook_config_problem" and "invalid JSON at line 1" in record["problem"]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("dispatch", "pre_tool_execution"), b"{not json", "egress-hooks: error: event on stdin is not JSON (line 1 column 2"),
        (("dispatch", "pre_tool_execution"), b"", "egress-hooks: error: event on stdin is not JSON"),
        (("dispatch", "pre_tool_execution"), b"[1]", "egress-hooks: error: event on stdin must be a JSON object"),
        (("dispatch", "pre_tool_execution"), b'{"tool_call": {}}', 'egress-hooks: error: event on stdin has no "tool_call"'),
        (("dispatch", "pre_tool_execution"), b"\xff", "egress-hooks: error: event on stdin is not UTF-8"),
        (("dispatch", "during_tool_execution"), b"{}", "egress-hooks: error: argument EVENT: invalid choice"),
        (("dispatch",), b"{}", "egress-hooks: error: the following arguments are required: EVENT"),
        (("dispatch", "pre_tool_execution", "--config", "/nonexistent/hooks.json"), b"{}", "egress-hooks: error: --config"),
        (("dispatch", "pre_tool_execution", "--ca-file", "/nonexistent.pem"), b"{}", "egress-hooks: error: --ca-file"),
        (("dispatch", "pre_tool_execution", "--bogus"), b"{}", "egress-hooks: error: unrecognized arguments: --bogus"),
        ((), b"", "egress-hooks: error: the following arguments are required: command"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, args, stdin, message):
    result = egress_hooks(*args, stdin=stdin, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == b""
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


def test_non_ascii_command_and_reason_under_an_ascii_locale(tmp_path):
    reason = "caf\u00e9 \u00fc"
    decision = json.dumps({"decision": "deny", "reason": reason}, ensure_ascii=False)
    document = {"g": {"pre_tool_execution": [{"matcher": "*", "hooks": [{"type": "command", "command": f"echo '{decision}'"}]}]}}
    workspace = write_workspace(tmp_path, document)
    ascii_locale = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"}
    result = egress_hooks(
        "dispatch", "pre_tool_execution", "--workspace", str(workspace), stdin=b'{"tool_call": {"name": "x"}}', env=ascii_locale
    )
    assert (result.returncode, result.stderr) == (0, b"")
    assert json.loads(result.stdout.decode("utf-8")) == {"decision": "deny", "reason": reason}


def test_check_ok(tmp_path):
    workspace = write_workspace(tmp_path, SEED_GATES)
    result = egress_hooks("check", "--workspace", str(workspace))
    assert result.returncode == 0
    assert result.stdout.decode().endswith(": ok (3 groups)\n")


def test_check_reports_each_problem_on_its_own_line(tmp_path):
    document = (
        '{"gate": {"enabled": "yes", "pre_tool_execution": [{"matcher": "*_file", "hooks": '
        '[{"type": "script", "command": "x"}, {"type": "command", "command": "x", "timeout": 0}]}]},'
        ' "gate": {"post_tool_execution": [{"matcher": "*"}]}}'
    )
    result = egress_hooks("check", "--config", str(write_workspace(tmp_path, document) / ".agents" / "hooks.json"))
    assert result.returncode == 1
    assert result.stdout.decode().splitlines() == [
        'group "gate": duplicate group name (a JSON parser would silently keep only the last one); every copy is run, in file order',
        'group "gate": enabled: must be true or false, got "yes"; the group stays enabled',
        'group "gate": pre_tool_execution[0].matcher: "*_file" is an invalid RE2 pattern: no argument for repetition operator: *; the rule matches nothing',
        'group "gate": pre_tool_execution[0].hooks[0].type: must be "command" or "http", got "script"; skipped',
        'group "gate": pre_tool_execution[0].hooks[1].timeout: must be a positive number of seconds, got 0; the default 30 s is used',
        'group "gate" (copy 2): post_tool_execution[0].hooks: missing (an array of handlers)',
    ]
    assert result.stderr == b""


def test_check_without_a_hooks_json(tmp_path):
    if Path("/.agents/hooks.json").exists():
        pytest.skip("this machine has a /.agents/hooks.json")
    result = egress_hooks("check", "--workspace", str(tmp_path))
    assert result.returncode == 1 and result.stdout.decode().startswith("no hooks.json found")


def test_cli_does_not_import_httpx_or_prometheus_for_command_hooks(tmp_path):
    workspace = write_workspace(tmp_path, SEED_GATES)
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['egress-hooks', 'dispatch', 'pre_tool_execution', '--workspace', sys.argv[1]]\n"
        "try:\n    runpy.run_module('egress.hooks', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in ('httpx', 'prometheus_client') if m in sys.modules), file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": SOURCE_ROOT}
    result = subprocess.run(
        [sys.executable, "-c", probe, str(workspace)],
        input=(PAYLOADS / "pre_rm_rf.json").read_bytes(),
        capture_output=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert json.loads(result.stdout)["decision"] == "deny"
    assert result.stderr.decode().strip() == "[]"
