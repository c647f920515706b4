"""CI smoke of the credential benchmark (bench/credentials_bench.py): it runs, every variant
answers without errors (so the credential, SigV4 and echo paths work under load), and it
writes its tables. Not a benchmark: one 1-second run per variant, figures are not checked."""

from __future__ import annotations


def test_credentials_bench_smoke(tmp_path, run_bench):
    out = tmp_path / "benchmarks-credentials.md"
    run_bench(
        "credentials_bench.py", "--duration", "1", "--rounds", "1", "--out", str(out), timeout=240, tools=("nginx", "hey", "ip")
    )
    text = out.read_text()
    for row in ("| static, 100 B |", "| ${credential:}, 100 B |", "| sign (SigV4), 100 B |", "| ${credential:} + echo scan, 1 MiB |"):
        assert row in text, row
    assert "| sign |" in text and "µs per request" in text
