"""The CI version of bench/soak.py: 20 s of mixed traffic (passthrough, intercepted
with injection, blocked, plain) over 24 connections; the full 60 s / 64-connection
figures are in docs/soak.md. Assertions are about correctness and memory, not
throughput (the CI machine is small and shared)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_soak():
    spec = importlib.util.spec_from_file_location("egress_bench_soak", ROOT / "bench" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def soak_module():
    return _load_soak()


def test_soak_20s(lab, soak_module):
    proxy = soak_module.start_proxy(lab)
    try:
        result = soak_module.soak(lab, proxy, duration=20, connections=24)
    finally:
        proxy.stop()
    summary = {k: v for k, v in result.items() if k != "rss_samples"}
    print(json.dumps(summary))
    assert result["proxy_alive"] and result["ready_after"] == 200, summary
    assert result["errors"] == 0, summary
    assert result["stuck_workers"] == 0, summary
    assert all(result["by_kind"].get(kind, 0) > 0 for kind in soak_module.KINDS), summary
    assert result["rss_growth_after_warmup_pct"] <= 20, summary
    assert soak_module.TOKEN not in proxy.stdout() + proxy.stderr()
