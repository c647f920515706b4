"""Hook dispatch benchmark: library overhead over a bare spawn, and CLI cold start.

    .venv/bin/python bench/hooks_bench.py [--iterations 300] [--cold-runs 20]

1. One trivial command hook (`echo '{"decision":"allow"}'`) dispatched through
   the library API (`egress.hooks.dispatcher.dispatch`), against spawning the
   same `/bin/sh -c` directly with asyncio (stdin written, stdout read), in
   the same run and interleaved, so machine noise hits both alike. Overhead
   = p50(library) - p50(bare). Target: <= 5 ms.
2. Cold start of `egress-hooks dispatch` (a fresh interpreter per run, as the
   runtime calls it): with that one hook, with no hooks.json at all, and
   `python -c pass` for the interpreter's own floor.

Short by design (a few seconds): the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(SOURCE_ROOT))

from egress.hooks.config import parse_config
from egress.hooks.dispatcher import DispatchSettings, dispatch

HOOK_COMMAND = "echo '{\"decision\":\"allow\"}'"
EVENT = {"tool_call": {"name": "code_execution", "args": {"code": "ls", "language": "bash"}}, "environment_id": "env_bench"}
CONFIG = {"bench": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [{"type": "command", "command": HOOK_COMMAND, "timeout": 10}]}]}}


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples, 0.50), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
        "mean_ms": round(statistics.fmean(samples), 2),
    }


async def bare_spawn(payload: bytes) -> bytes:
    process = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", HOOK_COMMAND, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await process.communicate(payload)
    return stdout


async def dispatch_benchmark(iterations: int) -> dict[str, dict[str, float]]:
    config = parse_config(json.dumps(CONFIG))
    settings = DispatchSettings(record_metrics=True)
    payload = json.dumps(EVENT, separators=(",", ":")).encode()
    library: list[float] = []
    bare: list[float] = []
    for _ in range(10):  # warm-up: imports, first fork, page cache
        await dispatch(config, "pre_tool_execution", EVENT, settings)
        await bare_spawn(payload)
    for _ in range(iterations):
        started = time.perf_counter()
        decision = await dispatch(config, "pre_tool_execution", EVENT, settings)
        library.append((time.perf_counter() - started) * 1000)
        assert not decision.denied
        started = time.perf_counter()
        await bare_spawn(payload)
        bare.append((time.perf_counter() - started) * 1000)
    result = {"library": summary(library), "bare_spawn": summary(bare)}
    result["overhead"] = {
        "p50_ms": round(result["library"]["p50_ms"] - result["bare_spawn"]["p50_ms"], 2),
        "p99_ms": round(result["library"]["p99_ms"] - result["bare_spawn"]["p99_ms"], 2),
    }
    return result


def cold_start_benchmark(runs: int) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(SOURCE_ROOT)}
    stdin = json.dumps(EVENT).encode()
    with tempfile.TemporaryDirectory() as with_hook, tempfile.TemporaryDirectory() as without_hooks:
        (Path(with_hook) / ".agents").mkdir()
        (Path(with_hook) / ".agents" / "hooks.json").write_text(json.dumps(CONFIG))
        cases = {
            "python_-c_pass": [sys.executable, "-c", "pass"],
            "dispatch_one_command_hook": [sys.executable, "-m", "egress.hooks", "dispatch", "pre_tool_execution", "--workspace", with_hook],
            "dispatch_no_hooks_json": [sys.executable, "-m", "egress.hooks", "dispatch", "pre_tool_execution", "--workspace", without_hooks],
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):
            for name, argv in cases.items():
                started = time.perf_counter()
                subprocess.run(argv, input=stdin, capture_output=True, env=env, check=True, timeout=30)
                samples[name].append((time.perf_counter() - started) * 1000)
    return {name: summary(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--cold-runs", type=int, default=20)
    args = parser.parse_args()
    results = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "dispatch": asyncio.run(dispatch_benchmark(args.iterations)),
        "cold_start": cold_start_benchmark(args.cold_runs),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
