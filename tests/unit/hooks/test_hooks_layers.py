"""The operator's hooks.json and the workspace's: the agent writes the workspace file,
and nothing it writes there switches the operator's gate off. Run as the runtime
runs it: a fresh `egress-hooks dispatch` process, the seed's gate.py, a real rm -rf event."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import egress
from egress.hooks.layers import load_layers

FIXTURES = Path(__file__).resolve().parents[2] / "hooks"
# The seed page's gates live once, in the hooks-scenarios example; the tests run that copy.
GATES = Path(__file__).resolve().parents[3] / "examples/hooks-scenarios/root/.agents/hooks-scripts"
PAYLOADS = FIXTURES / "payloads"
PYTHON = shlex.quote(sys.executable)
SOURCE_ROOT = str(Path(egress.__file__).resolve().parent.parent)
RM_RF = (PAYLOADS / "pre_rm_rf.json").read_bytes()
GATE_DENIES = {"decision": "deny", "reason": "Destructive command blocked by security gate."}
OPERATOR_GATE = {
    "security-gate": {
        "pre_tool_execution": [
            {"matcher": "code_execution", "hooks": [{"type": "command", "command": f"{PYTHON} {GATES / 'gate.py'}", "timeout": 10}]}
        ]
    }
}


def egress_hooks(*args: str, stdin: bytes = b"", cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SOURCE_ROOT}
    return subprocess.run(
        [sys.executable, "-m", "egress.hooks", *args], input=stdin, capture_output=True, cwd=cwd, env=env, timeout=30, check=False
    )


def write(path: Path, document) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document if isinstance(document, str) else json.dumps(document, indent=2))
    return path


@pytest.fixture
def sandbox(tmp_path):
    """(operator file, workspace dir): the operator's gate mounted, the workspace the agent's."""
    operator = write(tmp_path / "root" / ".agents" / "hooks.json", OPERATOR_GATE)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return operator, workspace


def dispatch_rm_rf(operator: Path, workspace: Path, *extra: str) -> tuple[dict, list[dict]]:
    result = egress_hooks(
        "dispatch", "pre_tool_execution", "--operator-config", str(operator), "--workspace", str(workspace), *extra, stdin=RM_RF
    )
    assert result.returncode == 0, result.stderr
    logs = [json.loads(line) for line in result.stderr.decode().splitlines()]
    return json.loads(result.stdout), logs


def test_the_operator_gate_denies_rm_rf_with_no_workspace_file(sandbox):
    operator, workspace = sandbox
    assert dispatch_rm_rf(operator, workspace) == (GATE_DENIES, [])


@pytest.mark.parametrize(
    ("attack", "written"),
    [
        ("empty object", "{}"),
        ("invalid JSON", '{"security-gate": '),
        ("not an object", "[]"),
        ("same-named group disabled", {"security-gate": {"enabled": False}}),
        ("same-named group allowing", {"security-gate": {"pre_tool_execution": [{"matcher": "*", "hooks": [
            {"type": "command", "command": "echo '{\"decision\": \"allow\"}'"}]}]}}),
        ("settings switching workspace-only", {"$settings": {"workspaceHooks": True}, "security-gate": {"enabled": False}}),
    ],
)  # fmt: skip
def test_what_the_agent_writes_in_the_workspace_cannot_switch_the_gate_off(sandbox, attack, written):
    operator, workspace = sandbox
    write(workspace / ".agents" / "hooks.json", written)
    decision, logs = dispatch_rm_rf(operator, workspace)
    assert decision == GATE_DENIES, attack
    # The attempt is visible, and attributed to the workspace file, never to the operator's.
    problems = [r for r in logs if r["msg"] == "hook_config_problem"]
    if written != "{}":
        assert problems, attack
    assert all(r["layer"] == "workspace" and r["source"] == str(workspace / ".agents" / "hooks.json") for r in problems)


def test_a_same_named_workspace_group_is_ignored_with_a_problem(sandbox):
    operator, workspace = sandbox
    write(workspace / ".agents" / "hooks.json", {"security-gate": {"enabled": False}})
    _, logs = dispatch_rm_rf(operator, workspace)
    (problem,) = [r["problem"] for r in logs]
    assert problem.startswith('group "security-gate": the operator\'s ')
    assert "the workspace one is ignored" in problem


def test_workspace_groups_still_add_to_the_operator_gate_and_run_after_it(sandbox, tmp_path):
    operator, workspace = sandbox
    marker = tmp_path / "order"
    write(operator, {**OPERATOR_GATE, "op-audit": {"pre_tool_execution": [{"matcher": "*", "hooks": [
        {"type": "command", "command": f"echo operator >> {marker}; echo '{{\"decision\": \"allow\"}}'"}]}]}})  # fmt: skip
    write(workspace / ".agents" / "hooks.json", {"ws-lint": {"pre_tool_execution": [{"matcher": "*", "hooks": [
        {"type": "command", "command": f"echo workspace >> {marker}; echo '{{\"decision\": \"deny\", \"reason\": \"ws\"}}'"}]}]}})  # fmt: skip
    event = b'{"tool_call": {"name": "read_file", "args": {"path": "/x"}}, "environment_id": "e"}'
    result = egress_hooks("dispatch", "pre_tool_execution", "--operator-config", str(operator), "--workspace", str(workspace), stdin=event)
    assert json.loads(result.stdout) == {"decision": "deny", "reason": "ws"}
    assert marker.read_text().split() == ["operator", "workspace"]


def test_the_operator_can_say_workspace_files_add_nothing(sandbox, tmp_path):
    operator, workspace = sandbox
    marker = tmp_path / "ran"
    write(operator, {"$settings": {"workspaceHooks": False}, **OPERATOR_GATE})
    write(workspace / ".agents" / "hooks.json", {"ws": {"pre_tool_execution": [{"matcher": "*", "hooks": [
        {"type": "command", "command": f"touch {marker}; echo '{{\"decision\": \"deny\", \"reason\": \"ws\"}}'"}]}]}})  # fmt: skip
    decision, logs = dispatch_rm_rf(operator, workspace)
    assert decision == GATE_DENIES and not marker.exists()
    assert [(r["msg"], r["note"]) for r in logs] == [
        ("hook_config_note", f'not loaded: "$settings": {{"workspaceHooks": false}} in {operator}')
    ]


def test_no_workspace_hooks_flag(sandbox, tmp_path):
    operator, workspace = sandbox
    marker = tmp_path / "ran"
    write(workspace / ".agents" / "hooks.json", {"ws": {"pre_tool_execution": [{"matcher": "*", "hooks": [
        {"type": "command", "command": f"touch {marker}"}]}]}})  # fmt: skip
    decision, logs = dispatch_rm_rf(operator, workspace, "--no-workspace-hooks")
    assert decision == GATE_DENIES and not marker.exists()
    assert [(r["msg"], r["note"]) for r in logs] == [("hook_config_note", "not loaded: --no-workspace-hooks")]
    # A note, not a problem: `check` passes, and says so.
    result = egress_hooks("check", "--operator-config", str(operator), "--workspace", str(workspace), "--no-workspace-hooks")
    assert result.returncode == 0, result.stdout
    assert result.stdout.decode().splitlines() == [
        f"note: {workspace / '.agents' / 'hooks.json'} (workspace): not loaded: --no-workspace-hooks",
        f"{operator}: ok (1 groups)",
    ]


def test_settings_in_the_workspace_file_are_ignored(sandbox, tmp_path):
    operator, workspace = sandbox
    write(workspace / ".agents" / "hooks.json", {"$settings": {"workspaceHooks": False}})
    layered = load_layers(operator, workspace / ".agents" / "hooks.json")
    assert layered.config.settings.workspace_hooks is None
    assert [p for _, _, p in layered.problems] == [
        "\"$settings\": settings are read from the operator's /.agents/hooks.json only; ignored"
    ]


def test_the_same_file_by_both_paths_is_loaded_once_as_the_operators(sandbox):
    operator, workspace = sandbox
    (workspace / ".agents").mkdir()
    (workspace / ".agents" / "hooks.json").symlink_to(operator)
    layered = load_layers(operator, workspace / ".agents" / "hooks.json")
    assert [(f.layer, f.path) for f in layered.files] == [("operator", str(operator))]
    assert [(g.name, g.layer) for g in layered.config.groups] == [("security-gate", "operator")]
    assert layered.problems == ()
    # The workspace is `/`: the two paths are one file, too.
    assert len(load_layers(operator, operator.parent.parent / ".agents" / "hooks.json").files) == 1


def test_an_unreadable_operator_file_fails_open_as_the_seed_says_but_is_logged_as_the_operators(sandbox):
    operator, workspace = sandbox
    write(operator, '{"security-gate": {')
    decision, logs = dispatch_rm_rf(operator, workspace)
    assert decision == {"decision": "allow"}
    (record,) = logs
    assert (record["layer"], record["source"]) == ("operator", str(operator))
    assert "invalid JSON" in record["problem"]


def test_an_operator_path_that_is_a_directory_is_logged_as_the_operators(tmp_path):
    (tmp_path / "dir.json").mkdir()
    layered = load_layers(tmp_path / "dir.json", None)
    assert [(layer, p.split(": ", 1)[1]) for layer, _, p in layered.problems] == [("operator", "cannot read: Is a directory")]


def test_a_missing_default_operator_file_is_no_problem(tmp_path, monkeypatch):
    import egress.hooks.config as config_module

    monkeypatch.setattr(config_module, "ROOT_CONFIG_PATH", tmp_path / "absent" / "hooks.json")
    write(tmp_path / "ws" / ".agents" / "hooks.json", OPERATOR_GATE)
    layered = load_layers(None, tmp_path / "ws" / ".agents" / "hooks.json")
    assert layered.problems == () and [g.layer for g in layered.config.groups] == ["workspace"]


def test_operator_config_named_on_the_command_line_must_exist(tmp_path):
    result = egress_hooks("dispatch", "pre_tool_execution", "--operator-config", str(tmp_path / "none.json"), stdin=RM_RF)
    assert result.returncode == 2
    assert result.stderr.decode().strip() == f"egress-hooks: error: --operator-config {tmp_path / 'none.json'}: no such file"


def test_check_names_the_file_of_each_problem_when_there_are_two(sandbox):
    operator, workspace = sandbox
    write(workspace / ".agents" / "hooks.json", {"security-gate": {}, "lint": {"post_tool_execution": []}})
    result = egress_hooks("check", "--operator-config", str(operator), "--workspace", str(workspace))
    assert result.returncode == 1
    (line,) = result.stdout.decode().splitlines()
    assert line.startswith(f'{workspace / ".agents" / "hooks.json"} (workspace): group "security-gate": the operator')


def test_check_ok_with_both_files(sandbox):
    operator, workspace = sandbox
    write(workspace / ".agents" / "hooks.json", {"lint": {"post_tool_execution": []}})
    result = egress_hooks("check", "--operator-config", str(operator), "--workspace", str(workspace))
    assert result.returncode == 0, result.stdout
    assert result.stdout.decode().splitlines() == [
        f"{operator}: ok (1 groups, operator)",
        f"{workspace / '.agents' / 'hooks.json'}: ok (1 groups, workspace)",
    ]
