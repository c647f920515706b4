"""End-to-end: metrics scraped by a real Prometheus, health, audit log, hot reload
and report mode (issue: operations)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse

import pytest

from e2e.support.clients import assert_denied, curl, httpx_client
from e2e.support.lab import HOSTS, Lab, allowlist_spec, bearer, in_netns

SECRET = "ops-canary-secret-0c9d1e"

OPS_SPEC = allowlist_spec(("api.example.test", bearer("OPS_TOKEN")), "*.example.test", "plain.test")


def metric_value(proxy, name: str, labels: dict[str, str] | None = None) -> float:
    """Read one sample from the proxy's /metrics (0 when absent)."""
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in proxy.get_ops("/metrics")[1].splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if _canonical(series) == wanted:
            return float(value)
    return 0.0


def _canonical(series: str) -> str:
    if "{" not in series:
        return series
    name, _, rest = series.partition("{")
    parts = sorted(p for p in rest.rstrip("}").split(",") if p)
    return name + "{" + ",".join(parts) + "}"


def wait_for(predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(interval)
    return predicate()


def assert_no_secret(proxy) -> None:
    everything = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    assert SECRET not in everything


# -- Prometheus ------------------------------------------------------------------------


@pytest.fixture
def prometheus(lab: Lab, tmp_path):
    """A real Prometheus (Debian package) in the proxy namespace, scraping every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed (scripts/test.sh installs it with apt)")
    started = []

    def start(metrics_port: int) -> str:
        port = lab.free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: egress\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
        )
        proc = subprocess.Popen(
            [
                "ip", "netns", "exec", lab.proxy_ns, binary,
                f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "prometheus.log").open("w"),
        )
        started.append(proc)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)


def promql(lab: Lab, base: str, query: str) -> list[dict]:
    out = lab.exec("curl", "-sS", "--max-time", "5", f"{base}/api/v1/query?query={urllib.parse.quote(query)}")
    if not out.stdout:
        return []
    body = json.loads(out.stdout)
    return body.get("data", {}).get("result", []) if body.get("status") == "success" else []


def test_prometheus_counts_exactly(lab, prometheus):
    proxy = lab.start_proxy(OPS_SPEC, env={"OPS_TOKEN": SECRET})
    try:
        base = prometheus(proxy.metrics_port)
        # The scripted mix: 3 allowed plain, 2 injected, 1 passthrough, 2 not allowlisted, 1 loopback.
        for i in range(3):
            assert curl(lab, proxy, f"http://plain.test/{i}")[0] == 200
        with in_netns(lab.proxy_ns), httpx_client(lab, proxy) as client:
            for i in range(2):
                assert client.get(f"https://api.example.test/{i}").status_code == 200
        assert curl(lab, proxy, "https://a.example.test/")[0] == 200
        for host in ("other.test", "evilexample.test"):
            assert curl(lab, proxy, f"http://{host}/")[0] == 403
        assert curl(lab, proxy, "http://127.0.0.1:9/")[0] == 403

        expected = {
            ("allowed", "", "plain.test"): 3,
            ("allowed", "", "api.example.test"): 2,
            ("allowed", "", "*.example.test"): 1,
            ("blocked", "not_allowlisted", ""): 2,
            ("blocked", "loopback", ""): 1,
        }

        def scraped():
            rows = promql(lab, base, "sum by (decision, reason, rule) (egress_requests_total)")
            got = {(r["metric"].get("decision", ""), r["metric"].get("reason", ""), r["metric"].get("rule", "")): int(float(r["value"][1])) for r in rows}
            return got if got == expected else None

        assert wait_for(scraped, timeout=20, interval=0.5), promql(lab, base, "egress_requests_total")
        injections = promql(lab, base, 'egress_credential_injections_total{rule="api.example.test"}')
        assert [int(float(r["value"][1])) for r in injections] == [2]
        assert promql(lab, base, "egress_allowlist_entries")[0]["value"][1] == "3"
        assert promql(lab, base, "egress_build_info")[0]["metric"]["version"]
        assert promql(lab, base, 'sum(egress_request_duration_seconds_count)')[0]["value"][1] == "8"

        # The exposition itself passes Prometheus' own linter.
        status, exposition = proxy.get_ops("/metrics")
        assert status == 200
        check = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        # No label value carries a requested host that is not a configured rule.
        assert "other.test" not in exposition and "evilexample.test" not in exposition
    finally:
        proxy.stop()
    assert_no_secret(proxy)


def test_health_and_audit_log(lab):
    proxy = lab.start_proxy(OPS_SPEC, env={"OPS_TOKEN": SECRET})
    try:
        assert proxy.get_ops("/healthz") == (200, "ok\n")
        assert proxy.get_ops("/readyz") == (200, "ready\n")
        with in_netns(lab.proxy_ns), httpx_client(lab, proxy) as client:
            assert client.get("https://api.example.test/secret-path?token=abc").status_code == 200
        curl(lab, proxy, "http://other.test/x?q=1")
        lines = wait_for(lambda: len(proxy.audit()) >= 2 and proxy.audit(), timeout=5)
        injected = next(e for e in lines if e["host"] == "api.example.test")
        assert injected["decision"] == "allowed" and injected["rule"] == "api.example.test"
        assert injected["injected"] == ["Authorization"]
        assert {"time", "client", "environment", "host", "port", "method", "decision", "reason", "rule"} <= set(injected)
        assert injected["environment"] == ""  # --spec: the one environment
        blocked = next(e for e in lines if e["host"] == "other.test")
        assert blocked["decision"] == "blocked" and blocked["reason"] == "not_allowlisted"
        assert "token=abc" not in proxy.stdout() and "q=1" not in proxy.stdout()
    finally:
        proxy.stop()
    assert_no_secret(proxy)


# -- reload ------------------------------------------------------------------------------

BASE = """
network:
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: plain.test
"""
WITH_OTHER = BASE + "    - domain: other.test\n"


def test_reload_valid_and_invalid_edits(lab):
    proxy = lab.start_proxy(BASE)
    try:
        assert curl(lab, proxy, "http://other.test/")[0] == 403
        proxy.spec_path.write_text(WITH_OTHER)
        assert wait_for(lambda: curl(lab, proxy, "http://other.test/")[0] == 200, timeout=2.5, interval=0.2)
        assert metric_value(proxy, "egress_config_reloads_total", {"result": "success"}) == 1

        proxy.spec_path.write_text(WITH_OTHER + "    - domain: '*.com'\n")
        assert wait_for(lambda: metric_value(proxy, "egress_config_reloads_total", {"result": "failure"}) == 1, timeout=3)
        assert curl(lab, proxy, "http://other.test/")[0] == 200  # old policy kept
        assert "network.allowlist[2].domain" in proxy.stderr()

        proxy.spec_path.write_text(BASE)
        os.kill(proxy.proc.pid, signal.SIGHUP)  # reloads at once, whatever the file watch does
        assert wait_for(lambda: curl(lab, proxy, "http://other.test/")[0] == 403, timeout=2.5, interval=0.2)
    finally:
        proxy.stop()


def test_reload_configmap_symlink_swap(lab, tmp_path):
    """Kubernetes mounts spec.yaml -> ..data/spec.yaml, ..data -> ..<timestamp>; updates swap ..data."""
    mount = tmp_path / "configmap"
    mount.mkdir()

    def publish(version: str, text: str) -> None:
        target = mount / f"..{version}"
        target.mkdir()
        (target / "spec.yaml").write_text(text)
        tmp_link = mount / "..data_tmp"
        tmp_link.symlink_to(target.name)
        os.replace(tmp_link, mount / "..data")

    publish("2026_11_29_a", BASE)
    (mount / "spec.yaml").symlink_to("..data/spec.yaml")
    proxy = lab.start_proxy(None, spec_path=mount / "spec.yaml")
    try:
        assert curl(lab, proxy, "http://other.test/")[0] == 403
        publish("2026_11_29_b", WITH_OTHER)
        assert wait_for(lambda: curl(lab, proxy, "http://other.test/")[0] == 200, timeout=2.5, interval=0.2)
    finally:
        proxy.stop()


def test_long_download_survives_reload(lab):
    proxy = lab.start_proxy(BASE)
    size = 8 << 20
    result: dict = {}

    def download():
        out = lab.exec(
            "curl", "-sS", "--max-time", "30", "-x", proxy.url, "-H", "X-Delay-Per-MiB: 0.25",
            "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "http://plain.test/bytes/" + str(size),
            timeout=40,
        )  # fmt: skip
        result["out"] = out.stdout

    try:
        worker = threading.Thread(target=download)
        worker.start()
        time.sleep(0.7)  # the download is under way (8 MiB at 4 MiB/s)
        proxy.spec_path.write_text(WITH_OTHER.replace("    - domain: plain.test\n", ""))
        assert wait_for(lambda: curl(lab, proxy, "http://plain.test/new")[0] == 403, timeout=2.5, interval=0.2)
        worker.join(timeout=40)
        assert result["out"] == f"200 {size}"
    finally:
        proxy.stop()


# -- report mode -------------------------------------------------------------------------

REPORT_SPEC = """
network:
  mode: report
  allowlist:
    - domain: plain.test
"""


def test_report_mode_lets_would_be_blocks_pass(lab):
    # No allowCidrs: the benchmarking-range upstreams themselves are "forbidden" here.
    proxy = lab.start_proxy(REPORT_SPEC)
    try:
        status, _, body = curl(lab, proxy, "http://other.test/reported")
        assert status == 200 and json.loads(body)["local"] == HOSTS["other.test"]
        status, headers, body = curl(lab, proxy, "http://127.0.0.1:9/")
        assert_denied(status, headers, body, "loopback", "127.0.0.1")
        status, headers, body = curl(lab, proxy, f"http://198.18.0.1:{proxy.port}/")
        assert_denied(status, headers, body, "proxy_self", "198.18.0.1")
        reported = [e for e in proxy.audit() if e["decision"] == "reported"]
        assert {e["host"] for e in reported} == {"other.test"}
        assert metric_value(proxy, "egress_requests_total", {"decision": "reported", "environment": "", "reason": "not_allowlisted", "rule": ""}) == 1
    finally:
        proxy.stop()


def test_report_only_flag_overrides_enforce(lab):
    proxy = lab.start_proxy(BASE, "--report-only")
    try:
        assert curl(lab, proxy, "http://other.test/")[0] == 200
        assert curl(lab, proxy, "http://localhost:9/")[0] == 403
    finally:
        proxy.stop()
