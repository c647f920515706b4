"""Benchmark: one gateway for many environments (`egress-proxy run --spec-dir`).

Targets, 1,000 environments x 20 allowlist entries against the same proxy with one:
- loaded in <= 3 s (EnvironmentRegistry on a fresh interpreter; and start-to-listening),
- RSS <= 1.5x the one-environment process (after the same traffic),
- decision throughput >= 0.95x one environment: pure decisions (proof of environment
  + allowlist check per request, in-process) and real traffic through the proxy
  (plain HTTP with wrk, intercepted HTTPS with injection with hey; credentials in the
  proxy URL / Proxy-Authorization),
- reloading one changed file with 1,000 loaded <= 50 ms, and no latency spike: p99
  while a file changes every second <= 2x p99 without.

    sudo .venv/bin/python bench/gateway_bench.py [--duration S] [--rounds N] [--out docs/benchmarks-gateway.md]

Runs in network namespaces of its own (bench/benchlab.py: nginx upstream on 198.18.0.2).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlab import (  # noqa: E402
    VENV_BIN,
    BenchError,
    BenchLab,
    LoadResult,
    Proxy,
    _wrk_ms,
    load_average,
    rss_bytes,
    run_hey,
    terminate,
)

ENTRIES = 20
BIG = 1000
TOKEN_ENV = "GW_BENCH_SECRET"


def token(i: int) -> str:
    return f"tok-{i:04d}-0123456789abcdef0123456789abcdef"


def env_id(i: int) -> str:
    return f"env-{i:04d}"


def write_environments(directory: Path, count: int) -> Path:
    """`count` environments of ENTRIES entries each: the bench hosts, 2 transforms, generated names."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        entries = [
            {"domain": "inject.bench.test", "transform": {"Authorization": f"Bearer ${{env:{TOKEN_ENV}}}"}},
            {"domain": "plain.bench.test"},
            {"domain": "pass.bench.test"},
            {"domain": f"api.e{i}.example.com", "transform": {"X-Api-Key": f"${{env:{TOKEN_ENV}}}"}},
        ]
        for j in range(ENTRIES - len(entries)):
            entries.append({"domain": f"h{j}.e{i}.example.com"} if j % 2 else {"domain": f"*.w{j}.e{i}.example.net"})
        doc = {"network": {"proxyToken": token(i), "allowCidrs": ["198.18.0.0/15"], "allowlist": entries}}
        (directory / f"{env_id(i)}.json").write_text(json.dumps(doc))
    return directory


def _python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True,
                          env={**os.environ, TOKEN_ENV: "bench-secret"})  # fmt: skip
    return json.loads(done.stdout)


def registry_figures(one_dir: Path, big_dir: Path, rounds: int) -> dict:
    """Load time and one-file reload time of each, and the pure decision cost of both in one
    interpreter, alternating (on a shared machine, separate runs differ more than the two do)."""
    return _python(f"""
import base64, json, time
from pathlib import Path
from egress.environments.registry import EnvironmentRegistry
from egress.policy import decisions as policy
from egress.wire import proxy_auth
out = {{}}
registries, headers = {{}}, {{}}
for name, d in (("one", Path({str(one_dir)!r})), ("many", Path({str(big_dir)!r}))):
    t = time.perf_counter(); registry = EnvironmentRegistry(d, count_reloads=False); load = time.perf_counter() - t
    n = len(registry)
    i = n // 2
    registries[name] = registry
    headers[name] = "Basic " + base64.b64encode(("env-%04d:tok-%04d-0123456789abcdef0123456789abcdef" % (i, i)).encode()).decode()
    # Reload of one changed file among all the others (the poll's scan included), as the watch does it.
    reloads = []
    target = d / ("env-%04d.json" % (n - 1))
    original = target.read_text()
    for k in range(5):
        target.write_text(original.replace("pass.bench.test", "pass%d.bench.test" % k))
        t = time.perf_counter(); assert registry.reload("bench"); reloads.append(time.perf_counter() - t)
    target.write_text(original)
    registry.reload("bench")
    t = time.perf_counter(); registry.reload("bench"); scan = time.perf_counter() - t
    out[name] = {{"environments": n, "load_s": load, "reload_ms": sorted(reloads)[2] * 1e3,
                 "reload_max_ms": max(reloads) * 1e3, "poll_scan_ms": scan * 1e3}}
best = {{"one": float("inf"), "many": float("inf")}}
for _ in range(max(10, {rounds} * 5)):
    for name in ("one", "many"):
        registry, header = registries[name], headers[name]
        t = time.perf_counter()
        for _ in range(20000):
            result = proxy_auth.authenticate(header, registry.spec)
            policy.check_name(registry.spec(result.environment), "inject.bench.test")
        best[name] = min(best[name], (time.perf_counter() - t) / 20000)
        assert result.environment is not None
for name in best:
    out[name]["decision_us"] = best[name] * 1e6
print(json.dumps(out))
""")


def start_gateway(lab: BenchLab, name: str, directory: Path) -> tuple[Proxy, float]:
    port, metrics_port = lab.port(), lab.port()
    confdir = lab.dir / f"{name}-conf"
    cmd = [
        str(VENV_BIN / "egress-proxy"), "run", "--spec-dir", str(directory),
        "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
        "--confdir", str(confdir), "--upstream-ca", str(lab.upstream_ca), "--log-format", "text",
    ]  # fmt: skip
    started = time.monotonic()
    proxy = Proxy(name, port, lab.spawn(cmd, name, env={TOKEN_ENV: "bench-secret"}), metrics_port=metrics_port,
                  ca=confdir / "mitmproxy-ca-cert.pem")  # fmt: skip
    lab.wait_port("127.0.0.1", port, proc=proxy.proc, timeout=60)
    return proxy, time.monotonic() - started


def plain_load(lab: BenchLab, proxy: Proxy, i: int, conns: int, seconds: float):
    """wrk with Proxy-Authorization on every request (as curl/requests send it for plain HTTP)."""
    header = "Basic " + base64.b64encode(f"{env_id(i)}:{token(i)}".encode()).decode()
    script = lab.dir / "wrk-proxy.lua"
    script.write_text(
        'wrk.path = "http://plain.bench.test/small"\nwrk.headers["Host"] = "plain.bench.test"\n'
        f'wrk.headers["Proxy-Authorization"] = "{header}"\n'
    )
    threads = 1 if conns == 1 else 2
    cmd = ["wrk", "--latency", "-t", str(threads), "-c", str(conns), "-d", f"{max(1, round(seconds))}s", "--timeout", "10s",
           "-s", str(script), proxy.url]  # fmt: skip
    done, cpu = lab.exec(cmd, timeout=seconds + 30)
    out = done.stdout
    if done.returncode != 0 or "Requests/sec" not in out:
        raise BenchError(f"wrk failed: {done.stderr or out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.MULTILINE))
    errors = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    return LoadResult(rps, _wrk_ms(lat["50"]), _wrk_ms(lat["99"]), int(re.search(r"(\d+) requests in", out).group(1)), errors, cpu)


def https_load(lab: BenchLab, proxy: Proxy, i: int, conns: int, seconds: float):
    """hey through CONNECT with the credentials in the proxy URL (Go sends them on CONNECT)."""
    with_credentials = types.SimpleNamespace(url=f"http://{env_id(i)}:{token(i)}@127.0.0.1:{proxy.port}")
    return run_hey(lab, "https://inject.bench.test/small", conns, seconds, with_credentials)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per load run (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per comparison (default 2)")
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--environments", type=int, default=BIG, help=f"environments in the big directory (default {BIG})")
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("gateway_bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="egress-gwbench-"))
    lab = BenchLab(work)
    report: list[str] = []
    results: dict = {"load_average_start": load_average()}
    try:
        lab.start()
        one_dir, big_dir = write_environments(work / "one", 1), write_environments(work / "many", args.environments)
        results.update(registry_figures(one_dir, big_dir, args.rounds))

        proxies = {}
        for name, directory in (("one", one_dir), ("many", big_dir)):
            proxies[name], results[f"{name}_start_s"] = start_gateway(lab, name, directory)
        # hey (Go) trusts SSL_CERT_FILE: both proxies' CAs.
        ca_bundle = work / "hey-ca.pem"
        ca_bundle.write_text("".join(Path(p.ca).read_text() for p in proxies.values()))
        os.environ["SSL_CERT_FILE"] = str(ca_bundle)

        env_of = {"one": 0, "many": args.environments // 2}
        runs: dict[tuple[str, str], list] = {}
        for rnd in range(args.rounds):
            order = ("one", "many") if rnd % 2 == 0 else ("many", "one")
            for kind, fn in (("plain", plain_load), ("https", https_load)):
                for name in order:
                    result = fn(lab, proxies[name], env_of[name], args.conns, args.duration)
                    runs.setdefault((name, kind), []).append(result)
        for name, proxy in proxies.items():
            results[f"{name}_rss_mb"] = rss_bytes(proxy.pid) / 2**20

        # Latency while one file of the 1,000 changes every second (the poll reloads it).
        target = big_dir / f"{env_id(args.environments - 1)}.json"
        original = target.read_text()
        quiet = https_load(lab, proxies["many"], env_of["many"], args.conns, args.duration)
        stop = threading.Event()

        def churn():
            i = 0
            while not stop.wait(1.0):
                i += 1
                target.write_text(original.replace("pass.bench.test", f"pass{i}.bench.test"))

        thread = threading.Thread(target=churn, daemon=True)
        thread.start()
        try:
            busy = https_load(lab, proxies["many"], env_of["many"], args.conns, args.duration)
        finally:
            stop.set()
            thread.join()
            target.write_text(original)
        results["p99_quiet_ms"], results["p99_reloading_ms"] = quiet.p99_ms, busy.p99_ms
        results["load_average_end"] = load_average()

        def rps(name, kind):
            return statistics.mean(r.rps for r in runs[(name, kind)])

        def errs(name, kind):
            return sum(r.errors for r in runs[(name, kind)])

        one, many = results["one"], results["many"]
        n = f"{args.environments:,}"
        targets = [
            (f"load {n} x 20 (registry)", f"{many['load_s']:.2f} s", "<= 3 s", many["load_s"] <= 3),
            (f"proxy start to listening, {n}", f"{results['many_start_s']:.2f} s (one: {results['one_start_s']:.2f} s)", "", True),
            (f"RSS {n} / one", f"{results['many_rss_mb']:.0f} / {results['one_rss_mb']:.0f} MB = {results['many_rss_mb'] / results['one_rss_mb']:.2f}x",
             "<= 1.5x", results["many_rss_mb"] <= 1.5 * results["one_rss_mb"]),
            (f"decision (proof + allowlist), {n} / one", f"{many['decision_us']:.2f} / {one['decision_us']:.2f} µs = {one['decision_us'] / many['decision_us']:.2f}x throughput",
             ">= 0.95x", one["decision_us"] / many["decision_us"] >= 0.95),
        ]  # fmt: skip
        for kind, label in (("plain", "plain HTTP (wrk)"), ("https", "intercepted HTTPS + injection (hey)")):
            ratio = rps("many", kind) / rps("one", kind)
            targets.append((f"throughput {label}, {args.conns} conns", f"{rps('many', kind):.0f} / {rps('one', kind):.0f} req/s = {ratio:.2f}x "
                            f"(errors {errs('many', kind)}/{errs('one', kind)})", ">= 0.95x", ratio >= 0.95 and not errs("many", kind)))  # fmt: skip
        targets.append((f"reload one file of {n} (median / max of 5)", f"{many['reload_ms']:.1f} / {many['reload_max_ms']:.1f} ms; idle poll scan {many['poll_scan_ms']:.1f} ms",
                        "<= 50 ms", many["reload_max_ms"] <= 50))  # fmt: skip
        targets.append(("p99 while a file changes every second", f"{busy.p99_ms:.1f} ms vs {quiet.p99_ms:.1f} ms quiet",
                        "<= 2x", busy.p99_ms <= 2 * quiet.p99_ms))  # fmt: skip

        report += [
            f"# Gateway benchmark: {args.environments:,} environments in one proxy",
            "",
            f"`bench/gateway_bench.py --duration {args.duration:g} --rounds {args.rounds} --conns {args.conns}`, "
            f"load average {results['load_average_start']:.2f} at start, {results['load_average_end']:.2f} at end "
            f"({os.cpu_count()} CPUs). Each environment: 20 entries (2 with transforms), its own proxyToken.",
            "",
            "| measure | result | target | met |",
            "|---|---|---|---|",
            *[f"| {a} | {b} | {c} | {'yes' if d else '**no**'} |" for a, b, c, d in targets],
            "",
        ]
        text = "\n".join(report)
        print(text)
        print(json.dumps(results, indent=1, default=str), file=sys.stderr)
        if args.out:
            args.out.write_text(text + "\n")
        return 0
    finally:
        for proc in list(lab.procs):
            terminate(proc)
        lab.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
