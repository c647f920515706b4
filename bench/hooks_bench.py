"""Hook dispatch benchmark: library overhead over a bare spawn, CLI cold start, and the dispatch server.

    .venv/bin/python bench/hooks_bench.py [--iterations 300] [--cold-runs 20]
                                          [--server-iterations 500] [--concurrent 100] [--concurrent-rounds 5]

1. One trivial command hook (`echo '{"decision":"allow"}'`) dispatched through
   the library API (`egress.hooks.dispatcher.dispatch`), against spawning the
   same `/bin/sh -c` directly with asyncio (stdin written, stdout read), in
   the same run and interleaved, so machine noise hits both alike. Overhead
   = p50(library) - p50(bare). Target: <= 5 ms.
2. Cold start of `egress-hooks dispatch` (a fresh interpreter per run, as the
   runtime calls it): with that one hook, with no hooks.json at all, and
   `python -c pass` for the interpreter's own floor.

3. `egress-hooks serve` with one `true` command handler: the round trip of one
   dispatch over its Unix socket (a new connection per request, as the thin client
   makes), against spawning `/bin/sh -c true` directly, interleaved; overhead =
   p99(server) - p99(bare). Target: <= 5 ms p99. Beside it, `egress-hooks dispatch
   --server` as a new process (what a runtime runs per tool call) and `egress-hooks
   dispatch` without a server; and `--concurrent` dispatches at once from as many
   threads, `--concurrent-rounds` times (each request's latency and each round's
   wall time), beside the same number of thin-client and of local-dispatch processes
   started at once (wall time of one round each).

Short by design (tens of seconds): the machine is shared.
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


SERVER_CONFIG = {"bench": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [{"type": "command", "command": "true", "timeout": 10}]}]}}


def _egress_hooks() -> list[str]:
    script = Path(sys.executable).with_name("egress-hooks")
    return [str(script)] if script.exists() else [sys.executable, "-m", "egress.hooks"]


def _post(path: str, body: bytes) -> bytes:
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    sock.sendall(
        b"POST /v1/dispatch/pre_tool_execution HTTP/1.1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    )
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def server_benchmark(iterations: int, cold_runs: int, concurrent: int, rounds: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    env = {**os.environ, "PYTHONPATH": str(SOURCE_ROOT)}
    body = json.dumps(EVENT).encode()
    with tempfile.TemporaryDirectory() as workdir:
        workspace = Path(workdir) / "ws"
        (workspace / ".agents").mkdir(parents=True)
        (workspace / ".agents" / "hooks.json").write_text(json.dumps(SERVER_CONFIG))
        operator = Path(workdir) / "operator.json"
        operator.write_text("{}")
        sock = str(Path(workdir) / "hooks.sock")
        common = ["--workspace", str(workspace), "--operator-config", str(operator)]
        server = subprocess.Popen(
            [*_egress_hooks(), "serve", "--listen", f"unix:{sock}", *common], env=env, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(sock):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("egress-hooks serve did not start")
                time.sleep(0.05)
            for _ in range(20):  # warm-up
                assert b'"allow"' in _post(sock, body)
            through_server: list[float] = []
            bare: list[float] = []
            for _ in range(iterations):
                started = time.perf_counter()
                answer = _post(sock, body)
                through_server.append((time.perf_counter() - started) * 1000)
                assert b'{"decision": "allow"}' in answer, answer
                started = time.perf_counter()
                subprocess.run(["/bin/sh", "-c", "true"], input=body, check=True)
                bare.append((time.perf_counter() - started) * 1000)
            processes: dict[str, list[float]] = {"thin_client_process": [], "local_dispatch_process": []}
            argv = {
                "thin_client_process": [*_egress_hooks(), "dispatch", "pre_tool_execution", "--server", f"unix:{sock}"],
                "local_dispatch_process": [*_egress_hooks(), "dispatch", "pre_tool_execution", *common],
            }
            for _ in range(cold_runs):
                for name, command in argv.items():
                    started = time.perf_counter()
                    done = subprocess.run(command, input=body, capture_output=True, env=env, check=True, timeout=30)
                    processes[name].append((time.perf_counter() - started) * 1000)
                    assert b'"allow"' in done.stdout, done
            latencies: list[float] = []
            walls: list[float] = []

            def one() -> float:
                started = time.perf_counter()
                assert b'"allow"' in _post(sock, body)
                return (time.perf_counter() - started) * 1000

            with ThreadPoolExecutor(concurrent) as pool:
                for _ in range(rounds):
                    started = time.perf_counter()
                    latencies += list(pool.map(lambda _: one(), range(concurrent)))
                    walls.append((time.perf_counter() - started) * 1000)
            # The same number at once as new processes: thin clients, and local dispatches.
            process_walls: dict[str, float] = {}
            for name, command in argv.items():
                started = time.perf_counter()
                running = [
                    subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
                    for _ in range(concurrent)
                ]
                for process in running:
                    out, _ = process.communicate(body, timeout=120)
                    assert b'"allow"' in out, out
                process_walls[name] = round((time.perf_counter() - started) * 1000, 1)
        finally:
            server.terminate()
            server.wait(10)
    result = {
        "server_round_trip": summary(through_server),
        "bare_spawn_true": summary(bare),
        **{name: summary(values) for name, values in processes.items()},
        f"concurrent_{concurrent}_per_request": summary(latencies),
        f"concurrent_{concurrent}_round_wall": summary(walls),
        f"concurrent_{concurrent}_processes_wall_ms": process_walls,
    }
    result["server_overhead"] = {
        "p50_ms": round(result["server_round_trip"]["p50_ms"] - result["bare_spawn_true"]["p50_ms"], 2),
        "p99_ms": round(result["server_round_trip"]["p99_ms"] - result["bare_spawn_true"]["p99_ms"], 2),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--cold-runs", type=int, default=20)
    parser.add_argument("--server-iterations", type=int, default=500, help="round trips through egress-hooks serve")
    parser.add_argument("--concurrent", type=int, default=100, help="dispatches sent at once")
    parser.add_argument("--concurrent-rounds", type=int, default=5)
    parser.add_argument(
        "--sections", default="dispatch,cold_start,server", help="comma-separated: dispatch, cold_start, server"
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    results: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "load_before": os.getloadavg()}
    if "dispatch" in sections:
        results["dispatch"] = asyncio.run(dispatch_benchmark(args.iterations))
    if "cold_start" in sections:
        results["cold_start"] = cold_start_benchmark(args.cold_runs)
    if "server" in sections:
        results["server"] = server_benchmark(args.server_iterations, args.cold_runs, args.concurrent, args.concurrent_rounds)
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
