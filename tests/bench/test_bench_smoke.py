"""CI smoke of the proxy benchmark harness (issue 7): it runs, it writes its tables.

Not a benchmark: one 1-second run per section, figures are not checked.
"""

from __future__ import annotations

import json


def test_bench_smoke_produces_results_tables(tmp_path, run_bench):
    out = tmp_path / "benchmarks.md"
    run_bench("proxy_bench.py", "--smoke", "--output", str(out), timeout=180, tools=("nginx", "wrk", "hey", "ip"))
    text = out.read_text()
    assert "SMOKE MODE" in text
    for heading in ("## Machine", "## Targets", "## Throughput", "## Allowlist scale", "## Workers"):
        assert heading in text, heading
    # A results table with a row per target measured, and figures in it.
    assert "| req/s: mean (runs) |" in text
    assert "| 4 conn, egress-proxy |" in text and "| 4 conn, direct (no proxy) |" in text
    raw = json.loads(out.with_suffix(".json").read_text())
    runs = raw["runs"]
    assert {(r["scenario"], r["target"]) for r in runs} >= {("http", "egress"), ("pass", "egress"), ("inject", "egress")}
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in runs), runs
    assert float(raw["machine"]["egress credential injections seen in /metrics (sanity)"].replace(",", "")) > 0


def test_gateway_bench_smoke(tmp_path, run_bench):
    """The --spec-dir benchmark harness runs end to end (50 environments, 1-second runs; figures not checked)."""
    out = tmp_path / "gateway.md"
    run_bench(
        "gateway_bench.py", "--environments", "50", "--duration", "1", "--rounds", "1", "--conns", "2", "--out", str(out),
        timeout=240,
    )  # fmt: skip
    text = out.read_text()
    for row in ("| RSS 50 / one |", "| throughput plain HTTP (wrk)", "| reload one file of 50 ", "errors 0/0"):
        assert row in text, (row, text)


def test_request_rules_bench_smoke(tmp_path, run_bench):
    """The request-rules benchmark runs end to end (one 1-second round per proxy; figures not checked)."""
    out = tmp_path / "rules.md"
    run_bench("request_rules_bench.py", "--smoke", "--output", str(out), timeout=180)
    text = out.read_text()
    assert "Sanity: a `POST` through the ruled proxy answered `403 request_not_allowed`." in text
    assert "| 1 |" in text and "## One `RequestRules.check`" in text
    runs = json.loads(out.with_suffix(".json").read_text())
    assert all(r["requests"] > 0 and r["errors"] == 0 for v in runs.values() for r in v), runs
