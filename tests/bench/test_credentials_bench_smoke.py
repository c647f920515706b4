"""CI smoke of the credential benchmark (bench/credentials_bench.py): it runs, every variant
answers without errors (so the credential, SigV4 and echo paths work under load), and it
writes its tables. Not a benchmark: one 1-second run per variant, figures are not checked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_credentials_bench_smoke(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the benchmark harness needs root (network namespaces)")
    missing = [t for t in ("nginx", "hey", "ip") if shutil.which(t) is None]
    assert not missing, f"tools missing (scripts/test.sh installs them): {missing}"
    out = tmp_path / "benchmarks-credentials.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "credentials_bench.py"), "--duration", "1", "--rounds", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    for row in ("| static, 100 B |", "| ${credential:}, 100 B |", "| sign (SigV4), 100 B |", "| ${credential:} + echo scan, 1 MiB |"):
        assert row in text, row
    assert "| sign |" in text and "µs per request" in text
