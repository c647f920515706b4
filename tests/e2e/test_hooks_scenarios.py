"""examples/hooks-scenarios/run.py, the seed's three hook scenarios as one command, run as
a newcomer runs it: the real egress-proxy, egress-hooks serve and the thin client, on
loopback only (no namespaces, no root). Self-contained: nothing from e2e.support.lab."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOKEN = "telemetry_secret_token_123"


def test_the_seed_scenarios_run_end_to_end():
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "hooks-scenarios" / "run.py"), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    calls = [(c["turn"], c["tool"], c["decision"]) for c in summary["calls"]]
    assert calls == [
        (1, "code_execution", "deny"),  # rm -rf
        (1, "code_execution", "allow"),  # the model adapts
        (1, "write_file", "allow"),  # {} into the workspace's .agents/hooks.json...
        (1, "code_execution", "deny"),  # ...and the operator's gate still holds
        (1, "code_execution", "allow"),
        (2, "read_file", "deny"),  # /private/
        (2, "read_file", "allow"),  # recovered on /public/
        (3, "write_file", "allow"),
        (3, "read_file", "allow"),
    ]
    rm_rf = [c for c in summary["calls"] if c["decision"] == "deny" and c["tool"] == "code_execution"]
    assert {c["reason"] for c in rm_rf} == {"Destructive command blocked by security gate."}
    private = next(c for c in summary["calls"] if c["tool"] == "read_file" and c["decision"] == "deny")
    assert "Query approved `/public/` summary tables instead." in private["reason"]
    recovered = next(c for c in summary["calls"] if c["tool"] == "read_file" and c["decision"] == "allow")
    assert recovered["args"]["path"].endswith("/public/summary.json") and '"team_size": 42' in recovered["result"]
    # Every allowed file event reached the telemetry server with the token the proxy added...
    assert [e["tool"] for e in summary["audit_events"]] == ["write_file", "read_file", "write_file", "read_file"]
    assert {e["authorization"] for e in summary["audit_events"]} == {f"Bearer {TOKEN}"}
    # ...counted in /metrics, and hooks.json never held it.
    assert summary["injections_metric"] == 4
    assert summary["token_in_hooks_json"] is False
