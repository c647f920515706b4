"""CI smoke of the DNS benchmark harness (issue 11): it runs and writes its table.

Not a benchmark: one 1-second run per target, figures are not checked.
"""

from __future__ import annotations


def test_dns_bench_smoke_writes_its_table(tmp_path, run_bench):
    out = tmp_path / "benchmarks-dns.md"
    run_bench(
        "dns_bench.py", "--seconds", "1", "--rounds", "1", "--output", str(out),
        timeout=120, tools=("dnsperf", "dnsmasq", "taskset", "ip"), needs_root="the DNS benchmark needs root (a network namespace)",
    )  # fmt: skip
    text = out.read_text()
    for target in ("| blocked |", "| allowed |", "| uncached |", "| direct |"):
        assert target in text
    assert "allowed / direct = " in text
