"""CI smoke of the DNS benchmark harness (issue 11): it runs and writes its table.

Not a benchmark: one 1-second run per target, figures are not checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_dns_bench_smoke_writes_its_table(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the DNS benchmark needs root (a network namespace)")
    missing = [t for t in ("dnsperf", "dnsmasq", "taskset", "ip") if shutil.which(t) is None]
    assert not missing, f"tools missing (scripts/test.sh installs them): {missing}"
    out = tmp_path / "benchmarks-dns.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dns_bench.py"), "--seconds", "1", "--rounds", "1", "--output", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    for target in ("| blocked |", "| allowed |", "| uncached |", "| direct |"):
        assert target in text
    assert "allowed / direct = " in text
