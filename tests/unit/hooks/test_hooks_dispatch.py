"""Dispatching through the library API with real `/bin/sh` hooks: the seed's gates, order, enabled, deny short-circuit."""

import asyncio
import json
import shlex
import sys
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from egress.hooks.config import parse_config
from egress.hooks.dispatcher import Decision, DispatchSettings, dispatch, load_hooks

FIXTURES = Path(__file__).resolve().parents[2] / "hooks"
# The seed page's gates live once, in the hooks-scenarios example; the tests run that copy.
GATES = Path(__file__).resolve().parents[3] / "examples/hooks-scenarios/root/.agents/hooks-scripts"
PAYLOADS = FIXTURES / "payloads"
PYTHON = shlex.quote(sys.executable)
PRE = "pre_tool_execution"
POST = "post_tool_execution"
TEST_LIMIT_SECONDS = 20


def payload(name: str) -> dict:
    return json.loads((PAYLOADS / name).read_text())


def event_for(tool: str, **args) -> dict:
    return {"tool_call": {"name": tool, "args": args}, "environment_id": "env_test"}


def command(cmd: str, timeout: float = 10) -> dict:
    return {"type": "command", "command": cmd, "timeout": timeout}


def run_dispatch(document: dict, event_name: str, event: dict, **settings) -> tuple[Decision, list[dict]]:
    config = parse_config(json.dumps(document))
    assert config.problems == ()
    logs: list[dict] = []
    settings.setdefault("record_metrics", False)
    coro = dispatch(config, event_name, event, DispatchSettings(log=logs.append, **settings))
    return asyncio.run(asyncio.wait_for(coro, TEST_LIMIT_SECONDS)), logs


SECURITY_GATE = {
    "security-gate": {
        "pre_tool_execution": [
            {"matcher": "code_execution", "hooks": [command(f"{PYTHON} {GATES / 'gate.py'}", timeout=10)]}
        ]
    }
}
PRIVACY_GATE = {
    "privacy-gate": {
        "pre_tool_execution": [
            {"matcher": "read_file", "hooks": [command(f"{PYTHON} {GATES / 'check_privacy.py'}", timeout=5)]}
        ]
    }
}


def test_security_gate_denies_rm_rf_with_its_reason():
    decision, logs = run_dispatch(SECURITY_GATE, PRE, payload("pre_rm_rf.json"))
    assert decision.as_json() == {"decision": "deny", "reason": "Destructive command blocked by security gate."}
    assert logs == []


def test_security_gate_allows_another_command():
    decision, logs = run_dispatch(SECURITY_GATE, PRE, payload("post_app.json"))
    assert decision.as_json() == {"decision": "allow"} and logs == []


def test_security_gate_is_not_run_for_other_tools(tmp_path):
    decision, _ = run_dispatch(SECURITY_GATE, PRE, event_for("write_file", path="x", content="rm -rf /"))
    assert decision.as_json() == {"decision": "allow"}


def test_privacy_gate_denies_private_records():
    decision, _ = run_dispatch(PRIVACY_GATE, PRE, payload("read_private.json"))
    assert decision.denied
    assert decision.reason.startswith("Access to confidential `/private/` records is blocked by PII compliance policy.")


def test_privacy_gate_allows_public_summary():
    decision, logs = run_dispatch(PRIVACY_GATE, PRE, payload("read_public.json"))
    assert decision.as_json() == {"decision": "allow"} and logs == []


def test_post_prints_empty_object_and_ignores_output():
    document = {"g": {"post_tool_execution": [{"matcher": "*", "hooks": [command("echo '{\"decision\":\"deny\"}'")]}]}}
    decision, logs = run_dispatch(document, POST, payload("post_app.json"))
    assert decision.as_json() == {} and logs == []


def appender(marker: Path, label: str) -> dict:
    # Reads the event (as a real hook would) and records that it ran.
    return command(f"cat >/dev/null; echo {label} >> {shlex.quote(str(marker))}; echo '{{\"decision\":\"allow\"}}'")


def test_disabled_group_does_not_run(tmp_path):
    marker = tmp_path / "ran"
    document = {"off": {"enabled": False, "pre_tool_execution": [{"matcher": "*", "hooks": [appender(marker, "off")]}]}}
    decision, _ = run_dispatch(document, PRE, event_for("read_file", path="/x"))
    assert decision.as_json() == {"decision": "allow"}
    assert not marker.exists()


@pytest.mark.parametrize("event_name", [PRE, POST])
def test_every_matching_group_runs_in_file_order(tmp_path, event_name):
    marker = tmp_path / "order"
    document = {
        "first": {event_name: [{"matcher": ".*_file", "hooks": [appender(marker, "first-a"), appender(marker, "first-b")]}]},
        "not-matching": {event_name: [{"matcher": "code_execution", "hooks": [appender(marker, "never")]}]},
        "disabled": {"enabled": False, event_name: [{"matcher": "*", "hooks": [appender(marker, "never")]}]},
        "second": {event_name: [{"matcher": "", "hooks": [appender(marker, "second")]}]},
        "third": {event_name: [{"matcher": "write_file", "hooks": [appender(marker, "third")]}]},
    }
    run_dispatch(document, event_name, event_for("write_file", path="/x", content="y"))
    assert marker.read_text().split() == ["first-a", "first-b", "second", "third"]


def test_deny_in_first_handler_stops_the_second(tmp_path):
    marker = tmp_path / "second-ran"
    document = {
        "gate": {
            "pre_tool_execution": [
                {"matcher": "*", "hooks": [command("echo '{\"decision\":\"deny\",\"reason\":\"stop\"}'"), appender(marker, "x")]}
            ]
        },
        "later-group": {"pre_tool_execution": [{"matcher": "*", "hooks": [appender(marker, "y")]}]},
    }
    decision, _ = run_dispatch(document, PRE, event_for("delete_file", path="/x"))
    assert decision.as_json() == {"decision": "deny", "reason": "stop"}
    assert not marker.exists()


def test_post_runs_every_handler_even_after_failures(tmp_path):
    marker = tmp_path / "ran"
    document = {
        "g": {"post_tool_execution": [{"matcher": "*", "hooks": [command("exit 3"), command("echo '{\"decision\":\"deny\"}'"), appender(marker, "last")]}]}
    }
    decision, logs = run_dispatch(document, POST, {**event_for("read_file", path="/x"), "error": "boom"})
    assert decision.as_json() == {}
    assert marker.read_text().split() == ["last"]
    assert [(r["handler"], r["failure"]) for r in logs] == [(0, "nonzero_exit")]


def test_deny_without_reason_gets_a_default_naming_the_group():
    document = {"my-gate": {"pre_tool_execution": [{"matcher": "*", "hooks": [command("echo '{\"decision\":\"deny\"}'")]}]}}
    decision, _ = run_dispatch(document, PRE, event_for("list_files", path="/"))
    assert decision.as_json() == {"decision": "deny", "reason": 'Tool call denied by hook group "my-gate".'}


def test_hook_receives_the_event_on_stdin_and_runs_in_the_workspace(tmp_path):
    seen = tmp_path / "seen.json"
    document = {"g": {"pre_tool_execution": [{"matcher": "*", "hooks": [command(f"cat > {seen}; pwd > cwd.txt")]}]}}
    event = event_for("write_file", path="/w/ü.txt", content="ü")
    run_dispatch(document, PRE, event, cwd=str(tmp_path))
    assert json.loads(seen.read_text(encoding="utf-8")) == event
    assert (tmp_path / "cwd.txt").read_text().strip() == str(tmp_path)


def test_event_with_a_lone_surrogate_still_reaches_the_hook_as_json(tmp_path):
    seen = tmp_path / "seen.json"
    document = {"g": {"pre_tool_execution": [{"matcher": "*", "hooks": [command(f"cat > {seen}")]}]}}
    event = event_for("write_file", path="/x", content="half \ud800 pair")
    run_dispatch(document, PRE, event)
    assert json.loads(seen.read_bytes().decode("ascii")) == event


def sample(event: str, handler_type: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "egress_hook_runs_total", {"event": event, "type": handler_type, "outcome": outcome}
    )
    return value or 0.0


def test_runs_are_counted_by_event_type_and_outcome():
    labels = [(PRE, "command", o) for o in ("allow", "deny", "error", "timeout")] + [(POST, "command", "allow")]
    before = {label: sample(*label) for label in labels}
    allow = command("echo '{\"decision\":\"allow\"}'")
    document = {
        "a": {
            "pre_tool_execution": [{"matcher": "*", "hooks": [allow, command("exit 1"), command("sleep 5", timeout=0.2), allow]}],
            "post_tool_execution": [{"matcher": "*", "hooks": [command("true")]}],
        },
        "b": {"pre_tool_execution": [{"matcher": "*", "hooks": [command("echo '{\"decision\":\"deny\"}'"), allow]}]},
    }
    run_dispatch(document, PRE, event_for("read_file", path="/x"), record_metrics=True)
    run_dispatch(document, POST, event_for("read_file", path="/x"), record_metrics=True)
    after = {label: sample(*label) for label in labels}
    assert {label: after[label] - before[label] for label in labels} == {
        (PRE, "command", "allow"): 2,
        (PRE, "command", "deny"): 1,
        (PRE, "command", "error"): 1,
        (PRE, "command", "timeout"): 1,
        (POST, "command", "allow"): 1,
    }


def test_load_hooks_logs_each_problem_once_and_keeps_the_valid_rest(tmp_path):
    hooks_json = tmp_path / ".agents" / "hooks.json"
    hooks_json.parent.mkdir()
    hooks_json.write_text(
        json.dumps(
            {
                "broken": {"pre_tool_execution": [{"matcher": "*_file", "hooks": [command("echo '{\"decision\":\"deny\"}'")]}]},
                "gate": {"pre_tool_execution": [{"matcher": "read_file", "hooks": [command("echo '{\"decision\":\"deny\"}'")]}]},
            }
        )
    )
    logs: list[dict] = []
    config = load_hooks(workspace=tmp_path, log=logs.append)
    assert [r["msg"] for r in logs] == ["hook_config_problem"]
    assert '"*_file" is an invalid RE2 pattern' in logs[0]["problem"]
    decision = asyncio.run(
        asyncio.wait_for(dispatch(config, PRE, event_for("read_file", path="/x"), DispatchSettings(log=logs.append, record_metrics=False)), 10)
    )
    assert decision.denied and decision.reason == 'Tool call denied by hook group "gate".'
    assert len(logs) == 1


def test_no_config_means_no_hooks(tmp_path, monkeypatch):
    import egress.hooks.config as config_module

    monkeypatch.setattr(config_module, "ROOT_CONFIG_PATH", tmp_path / "absent" / "hooks.json")
    config = load_hooks(workspace=tmp_path)
    decision = asyncio.run(dispatch(config, PRE, event_for("read_file", path="/x")))
    assert decision.as_json() == {"decision": "allow"}


def test_event_without_tool_name_is_rejected():
    with pytest.raises(ValueError):
        asyncio.run(dispatch(parse_config("{}"), PRE, {"tool_call": {}}))
