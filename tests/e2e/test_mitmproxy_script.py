"""The policy chain as a mitmproxy script: the real `mitmdump -s addons/egress.py` in the
proxy namespace, real curl and httpx in the sandbox's place (SPEC §8)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from e2e.support.clients import as_received, assert_denied, curl, httpx_client, upstream_hits
from e2e.support.lab import CANARY_PORT, HOSTS, VENV_BIN, Lab, ProxyProcess, in_netns
from e2e.test_operations import metric_value

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "addons" / "egress.py"
MITMDUMP = str(VENV_BIN / "mitmdump")
SECRET = "script-canary-4d81e2"
# JSON, the network part only: both forms are specs (docs/spec.md).
SPEC = json.dumps({
    "allowCidrs": ["198.18.0.0/15"],
    "allowlist": [
        {"domain": "api.example.test", "transform": {"Authorization": "Bearer ${env:SCRIPT_TEST_TOKEN}"}},
        {"domain": "passthrough.test"},
    ],
})


class ScriptProxy(ProxyProcess):
    """`mitmdump -s addons/egress.py` with the options `egress-proxy run` would set from its flags."""

    script = SCRIPT

    def command(self, *more: str) -> list[str]:
        return [
            "ip", "netns", "exec", self.lab.proxy_ns, MITMDUMP, "-s", str(self.script),
            "--listen-host", "127.0.0.1", "--listen-port", str(self.port),
            "--set", f"confdir={self.confdir}",
            "--set", f"egress_spec={self.spec_path}",
            "--set", f"egress_metrics_listen=127.0.0.1:{self.metrics_port}",
            "--set", f"egress_upstream_ca={self.lab.upstream_ca}",
            *more,
        ]  # fmt: skip


@pytest.fixture(scope="module")
def script_proxy(lab: Lab):
    proxy = ScriptProxy(lab, SPEC, [], env={"SCRIPT_TEST_TOKEN": SECRET}, name="spec.json")
    proxy.start(ready_within=30)
    yield proxy
    proxy.stop()
    # The injected secret reached the upstream only: not mitmproxy's output, not /metrics.
    assert SECRET not in proxy.stdout() + proxy.stderr()


def test_allowlisted_host_passes_through_untouched(lab, script_proxy):
    # Trusting only the upstream's CA: the certificate is the upstream's own, not the proxy's.
    done = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", script_proxy.url, "--cacert", str(lab.upstream_ca),
        "-o", "/dev/null", "-w", "%{http_code}", "https://passthrough.test/through",
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.stdout == "200", done.stderr
    assert upstream_hits(lab, HOSTS["passthrough.test"])


def test_transform_header_injected_at_the_upstream(lab, script_proxy):
    with in_netns(lab.proxy_ns), httpx_client(lab, script_proxy) as client:
        r = client.get("https://api.example.test/via-script", headers={"Authorization": "Bearer placeholder"})
    assert r.status_code == 200
    assert [v for k, v in as_received(lab, r.json())["headers"] if k.lower() == "authorization"] == [f"Bearer {SECRET}"]
    assert SECRET not in r.text  # the echo reaches the sandbox masked


def test_not_allowlisted_is_403_with_reason(lab, script_proxy):
    status, headers, body = curl(lab, script_proxy, "http://other.test/x")
    assert_denied(status, headers, body, "not_allowlisted", "other.test")


def test_loopback_refused(lab, script_proxy):
    before = len(lab.canary.hits)
    status, headers, body = curl(lab, script_proxy, f"http://127.0.0.1:{CANARY_PORT}/")
    assert_denied(status, headers, body, "loopback", "127.0.0.1")
    assert len(lab.canary.hits) == before


def test_metrics_count_all_three(lab, script_proxy):
    for path in ("/count-a", "/count-b"):
        curl(lab, script_proxy, "http://other.test" + path)
    with in_netns(lab.proxy_ns), httpx_client(lab, script_proxy) as client:
        assert client.get("https://api.example.test/count").status_code == 200
    blocked = {"decision": "blocked", "environment": "", "reason": "not_allowlisted", "rule": ""}
    assert metric_value(script_proxy, "egress_requests_total", blocked) >= 2
    loopback = {"decision": "blocked", "environment": "", "reason": "loopback", "rule": ""}
    assert metric_value(script_proxy, "egress_requests_total", loopback) >= 1
    injected = {"environment": "", "rule": "api.example.test"}
    assert metric_value(script_proxy, "egress_credential_injections_total", injected) >= 1
    passthrough = {"decision": "allowed", "environment": "", "reason": "", "rule": "passthrough.test"}
    assert metric_value(script_proxy, "egress_requests_total", passthrough) >= 1
    assert SECRET not in script_proxy.get_ops("/metrics")[1]


@pytest.mark.parametrize(
    "setting, why",
    [
        ("ssl_insecure=true", "upstream certificates are always verified"),
        ("ignore_hosts=api.example.test", "passthrough is decided by the allowlist"),
        ("allow_hosts=api.example.test", "the allowlist decides which hosts are reached"),
    ],
)
def test_weakening_options_are_refused(lab, setting, why):
    proxy = ScriptProxy(lab, SPEC, [], env={"SCRIPT_TEST_TOKEN": SECRET}, name="spec.json")
    try:
        done = subprocess.run(
            proxy.command("--set", setting), capture_output=True, text=True, timeout=30, env=proxy.env
        )
    except subprocess.TimeoutExpired as exc:  # it kept running: the option was not refused
        raise AssertionError(f"mitmdump --set {setting} kept running") from exc
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"egress: {setting.split('=')[0]}: refused while egress is loaded: {why}" in output
    assert "Traceback" not in output


def test_a_broken_spec_stops_it_with_the_problem(lab):
    proxy = ScriptProxy(lab, "network:\n  allowlist:\n    - domain: '*.co.uk'\n", [], env={}, name="bad.yaml")
    done = subprocess.run(proxy.command(), capture_output=True, text=True, timeout=30)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "network.allowlist[0].domain: '*.co.uk': wildcard over the public suffix 'co.uk'" in output
    assert "Traceback" not in output


def test_audit_line_as_from_egress_proxy_run(lab, script_proxy):
    curl(lab, script_proxy, "http://other.test/audited")
    lines = [json.loads(line) for line in script_proxy.stdout().splitlines() if line.startswith("{")]
    assert any(line["host"] == "other.test" and line["reason"] == "not_allowlisted" for line in lines)



def test_script_reload_reruns_only_the_script(lab, tmp_path):
    """mitmproxy reloads a changed script: the chain is built again from the options, the
    `egress` package stays as imported (no metric registered twice), the policy holds."""
    proxy = ScriptProxy(lab, SPEC, [], env={"SCRIPT_TEST_TOKEN": SECRET}, name="spec.json")
    proxy.script = tmp_path / "egress.py"
    proxy.script.write_text(SCRIPT.read_text())
    proxy.start(ready_within=30)
    try:
        proxy.script.write_text(SCRIPT.read_text() + "\n# changed\n")
        deadline = time.monotonic() + 15
        while proxy.stdout().count("Loading script") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proxy.stdout().count("Loading script") == 2, proxy.stdout()
        deadline = time.monotonic() + 10
        while proxy.get_ops("/readyz")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        status, headers, body = curl(lab, proxy, "http://other.test/after-reload")
        assert_denied(status, headers, body, "not_allowlisted", "other.test")
        assert metric_value(proxy, "egress_requests_total", {"decision": "blocked", "environment": "", "reason": "not_allowlisted", "rule": ""}) >= 1
        output = proxy.stdout() + proxy.stderr()
        assert "Traceback" not in output and "Duplicated timeseries" not in output and "error" not in output.lower(), output
    finally:
        proxy.stop()
