"""The bench smoke tests all run one harness under bench/ the same way: as root, with
its tools on PATH, in a subprocess that must exit 0. `run_bench` is that set-up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDS_ROOT = "the benchmark harness needs root (network namespaces)"


@pytest.fixture
def run_bench():
    """run_bench(script, *args, timeout=..., tools=(...), needs_root=...) runs bench/<script>
    with args and fails the test unless it exits 0 (the tail of its output is the message)."""

    def run(script: str, *args: str, timeout: float, tools: tuple[str, ...] = (), needs_root: str = NEEDS_ROOT) -> None:
        if os.geteuid() != 0:
            pytest.fail(needs_root)
        missing = [t for t in tools if shutil.which(t) is None]
        assert not missing, f"tools missing (scripts/test.sh installs them): {missing}"
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    return run
