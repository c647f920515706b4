"""End-to-end: HTTP hooks dispatched by the real `egress-hooks` through the real
`egress-proxy` (issue: hook dispatcher, last bullet)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.support.lab import CANARY_PORT, HOSTS, Lab, allowlist_spec, bearer

SECRET = "hooks-telemetry-secret-93ad"
SPEC = allowlist_spec(("telemetry.example.test", bearer("TELEMETRY_TOKEN")), "*")
EVENT = {"tool_call": {"name": "write_file", "args": {"path": "/workspace/out.txt", "content": "x"}}, "environment_id": "env-1"}
EGRESS_HOOKS = str(Path(sys.executable).parent / "egress-hooks")


@pytest.fixture(scope="module")
def proxy(lab: Lab):
    proxy = lab.start_proxy(SPEC, env={"TELEMETRY_TOKEN": SECRET})
    yield proxy
    proxy.stop()
    assert SECRET not in proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]


def dispatch(lab: Lab, proxy, hooks: dict, event: str = "post_tool_execution"):
    """The real `egress-hooks dispatch` in the proxy namespace, seeing only the proxy and its CA."""
    config = proxy.dir / "hooks.json"
    config.write_text(json.dumps(hooks))
    env = {"PATH": "/usr/bin:/bin", "HTTPS_PROXY": proxy.url, "HTTP_PROXY": proxy.url, "SSL_CERT_FILE": str(proxy.ca)}
    return subprocess.run(
        ["ip", "netns", "exec", lab.proxy_ns, EGRESS_HOOKS, "dispatch", event, "--config", str(config)],
        input=json.dumps(EVENT), capture_output=True, text=True, timeout=30, env=env,
    ), config  # fmt: skip


def test_http_hook_gets_credentials_from_the_proxy(lab, proxy):
    hooks = {
        "audit-logging": {
            "post_tool_execution": [
                {
                    "matcher": "read_file|write_file",
                    "hooks": [{"type": "http", "url": "https://telemetry.example.test/api/v1/agent-events", "timeout": 10}],
                }
            ]
        }
    }
    out, config = dispatch(lab, proxy, hooks)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {}
    assert SECRET not in config.read_text()  # hooks.json holds no secret...
    hits = [r for r in lab.upstream_requests() if r["path"] == "/api/v1/agent-events"]
    assert len(hits) == 1
    headers = dict(hits[0]["headers"])
    assert hits[0]["local"] == HOSTS["telemetry.example.test"] and hits[0]["method"] == "POST"
    assert headers["Authorization"] == f"Bearer {SECRET}"  # ...the proxy put it on the wire
    assert headers["Content-Type"] == "application/json"
    assert SECRET not in out.stdout + out.stderr


def test_http_hook_to_loopback_is_blocked_and_fails_open(lab, proxy):
    before = len(lab.canary.hits)
    hooks = {
        "security-gate": {
            "pre_tool_execution": [
                {"matcher": "*", "hooks": [{"type": "http", "url": f"http://127.0.0.1:{CANARY_PORT}/gate", "timeout": 5}]}
            ]
        }
    }
    out, _ = dispatch(lab, proxy, hooks, event="pre_tool_execution")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"decision": "allow"}  # fail open...
    logged = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    assert any(e.get("group") == "security-gate" and "403" in json.dumps(e) for e in logged), out.stderr  # ...visibly
    assert len(lab.canary.hits) == before  # and the loopback server received nothing
    assert any(e["reason"] == "loopback" for e in proxy.audit())
