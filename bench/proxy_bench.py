"""Proxy benchmark: egress-proxy against direct, bare mitmdump and squid, in one run.

    sudo .venv/bin/python bench/proxy_bench.py            # full run (~15 min), writes docs/benchmarks.md
    sudo .venv/bin/python bench/proxy_bench.py --smoke --output /tmp/b.md   # ~15 s harness check

Needs root (network namespaces), nginx, wrk, hey and squid (scripts/test.sh installs
them) and, for the profiles, py-spy in .venv (`.venv/bin/pip install py-spy`).

Sections:
1. throughput: plain HTTP (wrk, absolute-form requests to the proxy), HTTPS
   passthrough and HTTPS with injection (hey, CONNECT through `-x`), at 1, 16 and
   64 connections, 100-byte and 1 MiB bodies; direct, bare mitmdump (intercepting,
   and passthrough with `--ignore-hosts .*`), egress-proxy on a realistic spec, squid.
   Every figure is measured `--repeat` times (rounds interleaved across targets).
2. allowlist scale: decision cost and spec load time with 10, 1,000 and 100,000
   entries, and requests/s of a proxy on the 10- and the 100,000-entry spec.
3. workers: `egress-proxy run --workers 1` against `--workers 2`.
4. profiles (py-spy) of egress-proxy and bare mitmdump intercepting (16 connections; --profile-conns).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlab
from benchlab import (
    BenchError,
    BenchLab,
    Proxy,
    RssSampler,
    cpu_seconds,
    load_average,
    rss_bytes,
    run_hey,
    run_wrk,
    start_egress,
    start_mitmdump,
    start_squid,
)

ROOT = benchlab.ROOT
TOKEN = "bench-secret-token-0123456789"

# scenario -> (title, load generator, url template, targets)
SCENARIOS = {
    "http": ("plain HTTP", run_wrk, "http://plain.bench.test/{body}", ("direct", "mitmdump", "egress", "squid")),
    "pass": ("HTTPS passthrough", run_hey, "https://pass.bench.test/{body}", ("direct", "mitmdump-pass", "egress", "squid")),
    "inject": ("HTTPS with injection", run_hey, "https://inject.bench.test/{body}", ("mitmdump", "egress")),
}
TARGET_TITLES = {
    "direct": "direct (no proxy)",
    "mitmdump": "bare mitmdump (intercepting)",
    "mitmdump-pass": "bare mitmdump (passthrough)",
    "egress": "egress-proxy",
    "squid": "squid",
}
BODIES = {"small": "100 B", "large": "1 MiB"}


@dataclass
class Run:
    section: str
    scenario: str
    target: str
    body: str
    conns: int
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int
    rss_before: int
    rss_peak: int
    rss_after: int
    proxy_cpu: float
    client_cpu: float
    upstream_cpu: float
    other_cpu: float  # busy CPU on the machine not used by proxy, client or upstream
    seconds: float
    load1: float
    retries: int = 0  # runs discarded because hey churned connections (see measure)
    opened: int = 0  # TCP connections opened in the client/proxy namespace during the run
    valid: bool = True  # False: hey churned connections in every attempt; excluded from means



def _active_opens(lab: BenchLab) -> int:
    """TCP connections opened from the client/proxy namespace so far (clients and proxies' upstream dials)."""
    done, _ = lab.exec(["cat", "/proc/net/snmp"], timeout=10)
    head, values = [line.split() for line in done.stdout.splitlines() if line.startswith("Tcp:")][:2]
    return int(values[head.index("ActiveOpens")])


def _busy_seconds() -> float:
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def measure(lab: BenchLab, section: str, scenario: str, target: str, proxy: Proxy | None, body: str, conns: int,
            seconds: float, rnd: int, settle: float = 0.0) -> Run:  # fmt: skip
    _, loadgen, url, _ = SCENARIOS[scenario]
    pid = proxy.pid if proxy else None
    rss_before = rss_bytes(pid) if pid else 0
    load1 = load_average()
    cpu0 = cpu_seconds(pid) if pid else 0.0
    up0, busy0, t0 = cpu_seconds(lab.nginx.pid), _busy_seconds(), time.monotonic()
    retries = 0
    while True:
        opens = _active_opens(lab)
        failed = False
        with RssSampler(pid) as sampler:
            try:
                result = loadgen(lab, url.format(body=body), conns, seconds, proxy)
            except BenchError as exc:
                if loadgen is not run_hey:
                    raise
                # hey churning into timeouts can end without a single answer: repeated too.
                print(f"  ({target} {scenario} c={conns}: {str(exc).splitlines()[0]})", flush=True)
                result, failed = benchlab.LoadResult(0.0, 0.0, 0.0, 0, conns, 0.0), True
        opened = _active_opens(lab) - opens
        # hey (Go's http.Transport) sometimes falls into dialling a new connection for
        # almost every request and dropping it again: through a proxy that is a CONNECT
        # and a TLS set-up per request, a different benchmark. Such a run is repeated.
        churned = failed or (loadgen is run_hey and opened > 3 * conns + 20)
        if not churned or retries == 3:
            break
        retries += 1
        print(f"  ({target} {scenario} c={conns}: hey opened {opened} connections, repeating the run)", flush=True)
        cpu0 = cpu_seconds(pid) if pid else 0.0
        up0, busy0, t0 = cpu_seconds(lab.nginx.pid), _busy_seconds(), time.monotonic()
    elapsed = time.monotonic() - t0
    proxy_cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
    upstream_cpu = cpu_seconds(lab.nginx.pid) - up0
    other = max(0.0, _busy_seconds() - busy0 - proxy_cpu - upstream_cpu - result.client_cpu)
    rss_after = 0
    if pid and settle:
        time.sleep(settle)
        rss_after = rss_bytes(pid)
    run = Run(section, scenario, target, body, conns, rnd, result.rps, result.p50_ms, result.p99_ms, result.errors,
              result.requests, rss_before, sampler.peak, rss_after, proxy_cpu, result.client_cpu, upstream_cpu,
              other, elapsed, load1, retries, opened, not churned)  # fmt: skip
    print(
        f"  {section:9} {scenario:6} {body:5} c={conns:<3} {target:14} r{rnd}: {run.rps:9.1f} req/s "
        f"p50 {run.p50_ms:7.2f} ms p99 {run.p99_ms:7.2f} ms rss {run.rss_peak / 1e6:6.1f} MB "
        f"cpu proxy {proxy_cpu:4.1f}s client {result.client_cpu:4.1f}s other {other:4.1f}s load {load1:.2f}"
        + (f" ERRORS {run.errors}" if run.errors else "")
        + ("" if run.valid else " INVALID (hey churned connections)"),
        flush=True,
    )
    return run


# -- specs -------------------------------------------------------------------------
BENCH_ENTRIES = [
    {"domain": "inject.bench.test", "transform": {"Authorization": "Bearer ${env:BENCH_TOKEN}"}},
    {"domain": "pass.bench.test"},
    {"domain": "plain.bench.test"},
]
REALISTIC_ENTRIES = [
    {"domain": "api.github.com", "transform": {"Authorization": "Bearer ${env:BENCH_TOKEN}"}},
    {"domain": "api.anthropic.com", "transform": {"x-api-key": "${env:BENCH_TOKEN}"}},
    {"domain": "github.com"},
    {"domain": "*.githubusercontent.com"},
    {"domain": "pypi.org"},
    {"domain": "files.pythonhosted.org"},
    {"domain": "registry.npmjs.org"},
    {"domain": "*.docker.io"},
    {"domain": "proxy.golang.org"},
    {"domain": "crates.io"},
    {"domain": "*.crates.io"},
    {"domain": "deb.debian.org"},
]


def write_spec(path: Path, n_extra: int = 0, realistic: bool = True) -> Path:
    """The bench hosts plus a realistic allowlist, or plus `n_extra` generated entries (exact and wildcard)."""
    entries = list(BENCH_ENTRIES) + (REALISTIC_ENTRIES if realistic else [])
    for i in range(n_extra):
        if i % 2:
            entries.append({"domain": f"h{i}.svc{i % 1000}.example.com"})
        else:
            entries.append({"domain": f"*.w{i}.example.net"})
    doc = {"network": {"allowCidrs": ["198.18.0.0/15"], "allowlist": entries}}
    path.write_text(json.dumps(doc, indent=None if n_extra > 100 else 2) if path.suffix == ".json" else _yaml(doc))
    return path


def _yaml(doc: dict) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


def sized_spec(workdir: Path, total: int, suffix: str = ".yaml") -> Path:
    """A spec with exactly `total` entries: the 3 bench hosts and `total - 3` generated ones."""
    return write_spec(workdir / f"spec-{total}{suffix}", n_extra=total - len(BENCH_ENTRIES), realistic=False)


# -- sections ----------------------------------------------------------------------
def section_throughput(lab, proxies, args) -> list[Run]:
    runs: list[Run] = []
    plan = [("small", c) for c in args.conns] + [("large", c) for c in args.large_conns]
    # Small bodies first for every round, then 1 MiB: RSS at 64 connections is not
    # inflated by what an earlier 1 MiB run left behind.
    for body in ("small", "large"):
        for rnd in range(1, args.repeat + 1):
            for b, conns in plan:
                if b != body:
                    continue
                for scenario, (_, _, _, targets) in SCENARIOS.items():
                    if scenario not in args.scenarios:
                        continue
                    for target in targets:
                        if target not in proxies:
                            continue
                        seconds = args.duration if body == "small" else args.large_duration
                        settle = 2.0 if body == "large" else 0.0
                        runs.append(measure(lab, "throughput", scenario, target, proxies[target], body, conns,
                                            seconds, rnd, settle))  # fmt: skip
    return runs


def decision_cost(spec_path: Path, lookups: int) -> dict:
    """µs per `policy.check_name` for an exact hit, a deep wildcard hit and a miss."""
    code = f"""
import json, time
from egress.policy.spec import load_spec
from egress.policy import decisions as policy
spec = load_spec({str(spec_path)!r})
hosts = {{"exact hit": "plain.bench.test", "wildcard hit": "a.b.c.w2.example.net", "miss": "x.y.not-listed.org"}}
if len(spec.entries) < 10: hosts["wildcard hit"] = "plain.bench.test"
out = {{}}
for name, host in hosts.items():
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range({lookups}):
            policy.check_name(spec, host)
        best = min(best, (time.perf_counter() - t) / {lookups} * 1e6)
    out[name] = best
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, env=_token_env())
    return json.loads(done.stdout)


def _token_env() -> dict:
    return {**os.environ, "BENCH_TOKEN": TOKEN}


def load_time(spec_path: Path) -> float:
    """Seconds for `load_spec` on a fresh interpreter (Public Suffix List set-up included)."""
    code = f"""
import time
from egress.policy.spec import load_spec
t = time.perf_counter()
load_spec({str(spec_path)!r})
print(time.perf_counter() - t)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, env=_token_env())
    return float(done.stdout.strip())


def section_allowlist(lab, args) -> tuple[list[dict], list[Run]]:
    rows = []
    for total in args.allowlist_sizes:
        yaml_path, json_path = sized_spec(lab.dir, total), sized_spec(lab.dir, total, ".json")
        loads_yaml = [load_time(yaml_path) for _ in range(args.repeat)]
        loads_json = [load_time(json_path) for _ in range(args.repeat)]
        costs = decision_cost(json_path, 2000 if args.smoke else 20000)
        rows.append({"entries": total, "load_yaml": loads_yaml, "load_json": loads_json, "decision_us": costs})
        print(f"  allowlist {total:>7} entries: load yaml {min(loads_yaml):.3f}s json {min(loads_json):.3f}s "
              f"decision {costs}", flush=True)  # fmt: skip
    runs: list[Run] = []
    if args.allowlist_proxy_sizes:
        proxies = {}
        for total in args.allowlist_proxy_sizes:
            spec = lab.dir / f"spec-{total}.json"
            if not spec.exists():
                sized_spec(lab.dir, total, ".json")
            proxies[total] = start_egress(lab, f"egress-{total}", spec, env={"BENCH_TOKEN": TOKEN})
        try:
            # Three rounds: the two proxies differ by only a few percent, if at all.
            for rnd in range(1, (args.repeat if args.smoke else max(3, args.repeat)) + 1):
                for scenario in ("http", "inject"):
                    # Alternate which proxy goes first, so an order effect cancels out.
                    for total, proxy in list(proxies.items())[:: 1 if rnd % 2 else -1]:
                        runs.append(measure(lab, "allowlist", scenario, f"egress-{total}", proxy, "small", 16,
                                            args.duration, rnd))  # fmt: skip
        finally:
            for proxy in proxies.values():
                benchlab.terminate(proxy.proc)
    return rows, runs


def section_workers(lab, args, spec: Path) -> list[Run]:
    proxies = {n: start_egress(lab, f"egress-w{n}", spec, "--workers", str(n), env={"BENCH_TOKEN": TOKEN})
               for n in args.workers}  # fmt: skip
    runs: list[Run] = []
    try:
        for rnd in range(1, args.repeat + 1):
            for scenario in args.worker_scenarios:
                for n, proxy in list(proxies.items())[:: 1 if rnd % 2 else -1]:
                    runs.append(measure(lab, "workers", scenario, f"workers={n}", proxy, "small", 64,
                                        args.duration, rnd))  # fmt: skip
    finally:
        for proxy in proxies.values():
            benchlab.terminate(proxy.proc)
    return runs


def section_profiles(lab, proxies, args) -> dict[str, dict]:
    out = {}
    for target in ("egress", "mitmdump"):
        proxy = proxies.get(target)
        if proxy is None:
            continue
        raw = lab.dir / f"profile-{target}.txt"
        seconds = args.profile_seconds
        with benchlab.py_spy(proxy.pid, seconds, raw) as spy:
            time.sleep(0.5)
            try:
                run_hey(lab, SCENARIOS["inject"][2].format(body="small"), args.profile_conns, seconds, proxy)
            except BenchError as exc:
                print(f"  profile load failed: {exc}", flush=True)
        if spy.returncode != 0 or not raw.exists():
            print(f"  py-spy failed for {target}: {spy.stderr.read().decode()[-500:]}", flush=True)
            continue
        out[target] = summarize_profile(raw)
        print(f"  profile {target}: {out[target]['shares']}", flush=True)
    return out


# Where a sampled stack spends its time, by the innermost frame that is in one of these.
PROFILE_BUCKETS = (
    ("hook dispatch (mitmproxy addon manager / egress.mitm.event_cache)", ("(mitmproxy/addonmanager.py", "(egress/mitm/event_cache.py")),
    ("our addons and policy (egress/*)", ("(egress/",)),
    ("TLS (OpenSSL, certificates)", ("(OpenSSL/", "(cryptography/", "(mitmproxy/tls.py", "layers/tls.py", "(mitmproxy/certs.py", "addons/tlsconfig.py")),
    ("HTTP layer and HTTP/1 parsing", ("(mitmproxy/net/http/", "layers/http/", "(mitmproxy/http.py", "(h11/", "(h2/", "(mitmproxy/coretypes/")),
    ("other mitmproxy (server, layers, other addons)", ("(mitmproxy/",)),
    ("asyncio event loop and socket I/O", ("(asyncio/", "(selectors.py")),
)
# Frames that are on every stack and say nothing about where time goes.
_OUTER = ("(egress/cli/main.py", "(egress-proxy:", "(mitmdump:", "(mitmproxy/tools/main.py", "(mitmproxy/master.py")


def summarize_profile(raw: Path) -> dict:
    """Share of samples per bucket (the innermost matching frame wins) and the top own-time functions."""
    buckets: Counter = Counter()
    own: Counter = Counter()
    ours: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        leaf = frames[-1]
        own[_frame_name(leaf)] += n
        if idle := ("select (selectors.py" in leaf or "epoll" in leaf or "_run_once" in leaf and len(frames) < 4):
            buckets["idle (waiting in epoll)"] += n
            continue
        for frame in reversed(frames):
            if any(o in frame for o in _OUTER):
                continue
            for name, needles in PROFILE_BUCKETS:
                if any(needle in frame for needle in needles):
                    buckets[name] += n
                    if name.startswith("our addons") and "(egress/" in frame:
                        ours[_frame_name(frame)] += n
                    break
            else:
                continue
            break
        else:
            buckets["other"] += n
        del idle
    busy = total - buckets["idle (waiting in epoll)"]
    shares = {k: round(100 * v / busy, 1) for k, v in buckets.most_common() if not k.startswith("idle")}
    return {
        "samples": total,
        "busy_samples": busy,
        "shares": shares,
        "top_own": [(name, round(100 * n / max(total, 1), 1)) for name, n in own.most_common(12)],
        "our_top": [(name, round(100 * n / max(busy, 1), 1)) for name, n in ours.most_common(8)],
    }


def _frame_name(frame: str) -> str:
    # py-spy raw frames: "function (path/to/file.py:line)"
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    short = "/".join(path.split("/")[-2:])
    return f"{func} ({short})"


# -- report ------------------------------------------------------------------------
def machine() -> dict:
    import mitmproxy.version

    def out(cmd):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
            return (done.stdout.strip() or done.stderr.strip() or "?").splitlines()[0].split(" Copyright")[0]
        except OSError:
            return "?"

    cpu = "?"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as fh:
        mem = int(fh.readline().split()[1]) // 1024
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "memory": f"{mem} MiB",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mitmproxy": mitmproxy.version.VERSION,
        "nginx": out(["nginx", "-v"]),
        "squid": out(["squid", "-v"]),
        "wrk": out(["wrk", "-v"]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _mean(values):
    return statistics.fmean(values) if values else 0.0


def _group(runs, **key):
    return [r for r in runs if all(getattr(r, k) == v for k, v in key.items())]


def _valid(group):
    return [r for r in group if r.valid]


def _fmt_rps(group):
    runs = " / ".join(f"{r.rps:,.0f}" + ("" if r.valid else "†") for r in group)
    mean = f"**{_mean([r.rps for r in _valid(group)]):,.0f}**" if _valid(group) else "**—**"
    return f"{mean} ({runs})"


def _p99(runs, **key) -> float:
    group = _valid(_group(runs, **key))
    return _mean([r.p99_ms for r in group]) if group else 0.0


def rps_of(runs, **key) -> float:
    return _mean([r.rps for r in _valid(_group(runs, **key))])


def table(runs: list[Run], rows: list[tuple[str, dict]], ratio_to: str | None = None) -> list[str]:
    head = "| | req/s: mean (runs) | p50 ms | p99 ms | proxy RSS peak MB | proxy CPU % | errors | load avg |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, key in rows:
        group = _group(runs, **key)
        if not group:
            continue
        secs = sum(r.seconds for r in group)
        cpu = 100 * sum(r.proxy_cpu for r in group) / secs if secs else 0
        rss = max(r.rss_peak for r in group) / 1e6
        lines.append(
            f"| {label} | {_fmt_rps(group)} | {_mean([r.p50_ms for r in _valid(group) or group]):.2f} | "
            f"{_mean([r.p99_ms for r in _valid(group) or group]):.2f} | {rss:.0f} | {cpu:.0f} | {sum(r.errors for r in group)} | "
            f"{' / '.join(f'{r.load1:.2f}' for r in group)} |"
        )
    return lines


@dataclass
class Target:
    what: str
    value: str
    goal: str
    met: bool | None  # None: not measured in this run


def evaluate(throughput, allowlist_rows, allowlist_runs, worker_runs) -> list[Target]:
    t: list[Target] = []

    def ratio(a, b):
        return a / b if b else 0.0

    for scenario, name in (("inject", "intercepted HTTPS"), ("http", "plain HTTP")):
        for conns in sorted({r.conns for r in throughput}):
            e = rps_of(throughput, scenario=scenario, target="egress", body="small", conns=conns)
            m = rps_of(throughput, scenario=scenario, target="mitmdump", body="small", conns=conns)
            if e and m:
                r = ratio(e, m)
                t.append(Target(f"{name}, {conns} conn: egress / bare mitmdump", f"{r:.2f}×", "≥ 1.2× (never < 0.95×)", r >= 1.2))
        for conns in sorted({r.conns for r in throughput if r.body == "large"}):
            e = rps_of(throughput, scenario=scenario, target="egress", body="large", conns=conns)
            m = rps_of(throughput, scenario=scenario, target="mitmdump", body="large", conns=conns)
            if e and m:
                r = ratio(e, m)
                t.append(Target(f"{name}, 1 MiB bodies, {conns} conn: egress / bare mitmdump", f"{r:.2f}×", "never < 0.95×", r >= 0.95))
    # Passthrough targets (relay outside mitmproxy's layer stack).
    for conns in sorted({r.conns for r in throughput}):
        e = rps_of(throughput, scenario="pass", target="egress", body="small", conns=conns)
        m = rps_of(throughput, scenario="pass", target="mitmdump-pass", body="small", conns=conns)
        sq = rps_of(throughput, scenario="pass", target="squid", body="small", conns=conns)
        i = rps_of(throughput, scenario="inject", target="egress", body="small", conns=conns)
        if e and m:
            r = ratio(e, m)
            goal = 1.5 if conns > 1 else 0.95
            t.append(Target(f"passthrough HTTPS, {conns} conn: egress / bare mitmdump passthrough", f"{r:.2f}×", f"≥ {goal}×", r >= goal))
        if e and sq:
            r = ratio(e, sq)
            t.append(Target(f"passthrough HTTPS, {conns} conn: egress / squid", f"{r:.2f}×", "aim ≥ 0.7×", r >= 0.7))
        if e and i:
            r = ratio(e, i)
            t.append(Target(f"passthrough HTTPS, {conns} conn: egress passthrough / egress intercepting", f"{r:.1f}×", "≥ 10×", r >= 10))
        if conns >= 64 and e and m:
            pe = _p99(throughput, scenario="pass", target="egress", body="small", conns=conns)
            pm = _p99(throughput, scenario="pass", target="mitmdump-pass", body="small", conns=conns)
            t.append(Target(f"passthrough HTTPS p99, {conns} conn: egress vs bare mitmdump passthrough",
                            f"{pe:.2f} / {pm:.2f} ms", "≤ mitmdump's", pe <= pm))  # fmt: skip
    for conns in sorted({r.conns for r in throughput if r.body == "large"}):
        e = rps_of(throughput, scenario="pass", target="egress", body="large", conns=conns)
        m = rps_of(throughput, scenario="pass", target="mitmdump-pass", body="large", conns=conns)
        if e and m:
            r = ratio(e, m)
            t.append(Target(f"passthrough HTTPS, 1 MiB bodies, {conns} conn: egress / bare mitmdump passthrough (MB/s)",
                            f"{r:.2f}×", "≥ 1.3×", r >= 1.3))  # fmt: skip
    sizes = sorted({int(r.target.split("-")[1]) for r in allowlist_runs})
    if len(sizes) >= 2:
        small, big = sizes[0], sizes[-1]
        for scenario in ("http", "inject"):
            a = rps_of(allowlist_runs, scenario=scenario, target=f"egress-{big}")
            b = rps_of(allowlist_runs, scenario=scenario, target=f"egress-{small}")
            r = ratio(a, b)
            t.append(Target(f"{SCENARIOS[scenario][0]}: {big:,}-entry / {small}-entry allowlist req/s", f"{r:.2f}×", "≥ 0.95×", r >= 0.95))
    if allowlist_rows:
        big = allowlist_rows[-1]
        for fmt in ("json", "yaml"):
            times = big[f"load_{fmt}"]
            t.append(Target(f"{big['entries']:,}-entry spec load time, {fmt.upper()}",
                            " / ".join(f"{x:.2f} s" for x in times), "≤ 2 s", max(times) <= 2))  # fmt: skip
    workers = sorted({r.target for r in worker_runs})
    if len(workers) >= 2:
        for scenario in sorted({r.scenario for r in worker_runs}):
            one = rps_of(worker_runs, scenario=scenario, target=workers[0])
            two = rps_of(worker_runs, scenario=scenario, target=workers[-1])
            what = f"{SCENARIOS[scenario][0]}, 64 conn: {workers[-1]} / {workers[0]}"
            if not (one and two):
                t.append(Target(what, "no valid run (hey churned connections in every attempt)", "≥ 1.6×", None))
                continue
            r = ratio(two, one)
            t.append(Target(what, f"{r:.2f}×", "≥ 1.6×", r >= 1.6))
    for conns in (64,):
        e = _group(throughput, target="egress", body="small", conns=conns)
        m = _group(throughput, target="mitmdump", body="small", conns=conns)
        if e and m:
            er, mr = max(r.rss_peak for r in e), max(r.rss_peak for r in m)
            r = ratio(er, mr)
            t.append(Target(f"RSS at {conns} conn: egress / bare mitmdump", f"{er / 1e6:.0f} / {mr / 1e6:.0f} MB = {r:.2f}×", "≤ 1.2×", r <= 1.2))
    large = _group(throughput, target="egress", body="large", conns=16)
    if large:
        peak = max(r.rss_peak for r in large) / 1e6
        after = max(r.rss_after for r in large) / 1e6
        before = min(r.rss_before for r in large) / 1e6
        t.append(Target("egress RSS, 1 MiB bodies at 16 conn (peak)", f"{peak:.0f} MB", "≤ 150 MB", peak <= 150))
        t.append(Target("egress RSS 2 s after the 1 MiB load vs before it", f"{after:.0f} MB vs {before:.0f} MB", "near idle (≤ +20 MB)", after - before <= 20))
    return t


def render(args, info, throughput, allowlist_rows, allowlist_runs, worker_runs, profiles, targets, started, wall) -> str:
    L: list[str] = []
    L += ["# Proxy benchmarks", ""]
    L += [f"Generated by `{args.command_line}` in {wall / 60:.1f} minutes "
          f"({'SMOKE MODE: tiny runs, figures meaningless' if args.smoke else f'{args.duration:g} s per run, each figure {args.repeat}×'}). "
          "Do not edit by hand: run the command again.", ""]  # fmt: skip
    L += ["## Machine", ""]
    L += [f"- {k}: {v}" for k, v in info.items()]
    L += [f"- load average (1 min) at start: {started['load']}; "
          "every row below lists the 1-minute load average at the start of each of its runs. "
          "Our own runs raise it: the per-run `other CPU` column in the raw data "
          "(busy CPU not used by proxy, client or nginx) is the better measure of foreign load; "
          f"over the whole run it averaged {args.other_cpu_share:.0f} % of one core.", ""]  # fmt: skip
    L += ["## How it is measured", ""]
    L += [
        "- nginx (1 worker, `sendfile`, keep-alive) in its own network namespace on 198.18.0.2, serving a 100-byte "
        "and a 1 MiB file over HTTP and HTTPS (ECDSA P-256 certificate from a lab CA); the clients and the proxies "
        "run in a second namespace, connected by a veth pair. Everything stays on 198.18.0.0/15.",
        "- Plain HTTP: `wrk` (`--latency`, 1 thread for 1 connection, else 2) sends absolute-form requests "
        "(`GET http://plain.bench.test/... HTTP/1.1`, `Host: plain.bench.test`) to the proxy through a 2-line Lua "
        "script, since wrk has no proxy option. HTTPS: `hey` (Go, HTTP/1.1, keep-alive) with `-x http://proxy`, "
        "i.e. one CONNECT per connection, then TLS inside the tunnel; `direct` rows run the same clients without proxy.",
        "- bare mitmdump: `mitmdump -q` (all default addons, output quiet), intercepting, or with `--ignore-hosts '.*'` "
        "for passthrough. egress-proxy: `egress-proxy run` on a realistic spec (the three bench hosts, "
        "`inject.bench.test` with an `Authorization` transform from `${env:...}`, and 12 typical registry/API "
        "entries), JSON audit log to a file. squid 5 (`cache deny all`, access log to a file) as the reference forward proxy.",
        "- hey's Go transport sometimes falls into dialling a new connection for nearly every request (seen with "
        "every proxy and without one: the rate collapses to a few hundred per second with the client CPU busy on "
        "handshakes); a run that opened more than 3 × connections + 20 TCP connections is discarded and repeated "
        "(at most 3 times; the raw JSON has `retries` and `opened` per run). A run that churned in every attempt "
        "is marked † and left out of the means and ratios.",
        "- Proxy RSS: peak resident memory of the proxy's process tree, sampled every 0.2 s; CPU %: proxy CPU time "
        "over wall time (100 % = one core). Rounds are interleaved (every target once, then again), small bodies "
        "first, so noise and leftovers from 1 MiB runs do not land on one target.",
        "",
    ]
    L += ["## Targets", "", "| target | measured | goal | |", "|---|---|---|---|"]
    for t in targets:
        mark = "met" if t.met else ("**missed**" if t.met is False else "not measured")
        L.append(f"| {t.what} | {t.value} | {t.goal} | {mark} |")
    L += [""]
    L += ["## Throughput", ""]
    for body in ("small", "large"):
        for scenario, (title, _, _, targets_) in SCENARIOS.items():
            group = _group(throughput, scenario=scenario, body=body)
            if not group:
                continue
            L += [f"### {title}, {BODIES[body]} bodies", ""]
            rows = []
            for conns in sorted({r.conns for r in group}):
                for target in targets_:
                    rows.append((f"{conns} conn, {TARGET_TITLES[target]}", {"target": target, "conns": conns}))
            L += table(group, rows)
            ratios = []
            for conns in sorted({r.conns for r in group}):
                e = rps_of(group, target="egress", conns=conns)
                parts = []
                for other in targets_:
                    o = rps_of(group, target=other, conns=conns)
                    if other != "egress" and o and e:
                        parts.append(f"{e / o:.2f}× {other}")
                if parts:
                    ratios.append(f"{conns} conn: egress = " + ", ".join(parts))
            if ratios:
                L += ["", "Ratios (egress-proxy req/s over each): " + "; ".join(ratios) + "."]
            L += [""]
    large = _group(throughput, body="large", conns=16)
    if large:
        L += ["### Memory with 1 MiB bodies at 16 connections", "",
              "| scenario | proxy | RSS before MB | peak MB | 2 s after MB |", "|---|---|---:|---:|---:|"]  # fmt: skip
        for scenario, (title, _, _, targets_) in SCENARIOS.items():
            for target in targets_:
                g = _group(large, scenario=scenario, target=target)
                if g and target != "direct":
                    L.append(f"| {title} | {TARGET_TITLES[target]} | {min(r.rss_before for r in g) / 1e6:.0f} | "
                             f"{max(r.rss_peak for r in g) / 1e6:.0f} | {max(r.rss_after for r in g) / 1e6:.0f} |")  # fmt: skip
        L += [""]
    if allowlist_rows:
        L += ["## Allowlist scale", "",
              "Specs of N entries: the 3 bench hosts, then alternately exact (`hN.svcM.example.com`) and wildcard "
              "(`*.wN.example.net`) entries. Load time: `load_spec()` in a fresh interpreter (parsing, validation of "
              "every entry incl. the Public Suffix List check of wildcards), each run listed. Decision cost: "
              "`policy.check_name()` per call, best of 3 × many lookups. Lookups are one dictionary probe per label "
              "of the host (`domains.Allowlist`), not a scan of the entries.", "",
              "| entries | load JSON s | load YAML s | decision µs: exact hit | wildcard hit (3 labels deep) | miss |",
              "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for row in allowlist_rows:
            d = row["decision_us"]
            L.append(f"| {row['entries']:,} | {' / '.join(f'{x:.3f}' for x in row['load_json'])} | "
                     f"{' / '.join(f'{x:.3f}' for x in row['load_yaml'])} | {d['exact hit']:.2f} | "
                     f"{d['wildcard hit']:.2f} | {d['miss']:.2f} |")  # fmt: skip
        L += [""]
    if allowlist_runs:
        L += ["Requests/s through egress-proxy by allowlist size (100-byte bodies, 16 connections):", ""]
        rows = [(f"{SCENARIOS[s][0]}, {t}", {"scenario": s, "target": t})
                for s in ("http", "inject") for t in sorted({r.target for r in allowlist_runs}, key=lambda x: int(x.split('-')[1]))]  # fmt: skip
        L += table(allowlist_runs, rows) + [""]
    if worker_runs:
        L += ["## Workers", "",
              "`egress-proxy run --workers N` (N processes on one SO_REUSEPORT port, one CA, one aggregated `/metrics`), "
              "100-byte bodies, 64 connections. RSS is that of the whole process tree (supervisor + workers).", ""]  # fmt: skip
        rows = [(f"{SCENARIOS[s][0]}, {t}", {"scenario": s, "target": t})
                for s in sorted({r.scenario for r in worker_runs}) for t in sorted({r.target for r in worker_runs})]
        L += table(worker_runs, rows) + [""]
        L += ["CPU per run (seconds over the run, 2 cores = 2 s per s): " + "; ".join(
            f"{r.scenario} {r.target} r{r.round}: proxy {r.proxy_cpu / r.seconds:.2f}, client {r.client_cpu / r.seconds:.2f}, "
            f"nginx {r.upstream_cpu / r.seconds:.2f}, other {r.other_cpu / r.seconds:.2f}" for r in worker_runs) + ".", ""]  # fmt: skip
    if profiles:
        L += ["## Profiles (py-spy)", "",
              f"`py-spy record --nonblocking --rate 200 --format raw` for {args.profile_seconds:g} s while `hey` runs "
              f"HTTPS with interception at {args.profile_conns} connections (100-byte bodies). Shares are of busy samples (idle epoll "
              "waits excluded); each sample is attributed to the innermost frame that falls in a bucket.", ""]  # fmt: skip
        for target, p in profiles.items():
            L += [f"### {TARGET_TITLES[target]} ({p['busy_samples']} busy of {p['samples']} samples)", ""]
            L += ["| bucket | share of busy samples |", "|---|---:|"]
            L += [f"| {k} | {v} % |" for k, v in p["shares"].items()]
            L += ["", "Top functions by own time (% of all samples): " + "; ".join(f"`{n}` {s} %" for n, s in p["top_own"][:8]) + "."]
            if p["our_top"]:
                L += ["", "Our frames (innermost egress frame, % of busy samples): " + "; ".join(f"`{n}` {s} %" for n, s in p["our_top"]) + "."]
            L += [""]
    if args.notes and Path(args.notes).exists():
        L += [Path(args.notes).read_text().rstrip(), ""]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="~15 s harness check: one short run per section")
    p.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--raw", help="also write every run as JSON here (default: beside --output, .json)")
    p.add_argument("--duration", type=float, default=4.0, help="seconds per run, small bodies")
    p.add_argument("--large-duration", type=float, default=3.0, help="seconds per run, 1 MiB bodies")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS),
                   help="throughput scenarios to run (default all)")  # fmt: skip
    p.add_argument("--conns", type=int, nargs="*", default=[1, 16, 64])
    p.add_argument("--large-conns", type=int, nargs="*", default=[1, 16, 64])
    p.add_argument("--allowlist-sizes", type=int, nargs="*", default=[10, 1000, 100000])
    p.add_argument("--allowlist-proxy-sizes", type=int, nargs="*", default=[10, 100000])
    p.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    p.add_argument("--worker-scenarios", nargs="*", default=["http", "pass", "inject"])
    p.add_argument("--profile-seconds", type=float, default=8.0)
    p.add_argument("--profile-conns", type=int, default=16, help="connections of the profiled load (default 16)")
    p.add_argument("--sections", nargs="*", default=["throughput", "allowlist", "workers", "profiles"])
    p.add_argument("--keep", action="store_true", help="keep the work directory (proxy logs, specs) for inspection")
    p.add_argument("--render-from", metavar="RAW.json", help="only re-render the report from an earlier run's JSON")
    p.add_argument("--notes", default=str(ROOT / "bench" / "benchmarks-notes.md"),
                   help="Markdown appended verbatim (analysis of missed targets)")  # fmt: skip
    args = p.parse_args(argv)
    args.command_line = "sudo .venv/bin/python bench/proxy_bench.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:]) if (argv or sys.argv[1:]) else "")
    if args.smoke:
        args.duration = args.large_duration = 1.0
        args.repeat = 1
        args.conns, args.large_conns = [4], []
        args.allowlist_sizes, args.allowlist_proxy_sizes = [10, 1000], []
        args.workers, args.worker_scenarios = [2], ["http"]
        args.sections = [s for s in args.sections if s != "profiles"]
        args.notes = None
    if args.render_from:
        # Re-render a report from its raw JSON (after editing the notes), measuring nothing.
        raw = json.loads(Path(args.render_from).read_text())
        return write_report(args, raw["meta"], raw["machine"], [Run(**r) for r in raw["runs"]], raw["allowlist"],
                            raw["profiles"])  # fmt: skip
    if os.geteuid() != 0:
        print("proxy_bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    if "profiles" in args.sections and benchlab.py_spy_exe() is None:
        # Checked before measuring: the profiles come after ten minutes of throughput runs.
        print("proxy_bench: py-spy not found (.venv/bin/pip install py-spy), or leave out the profiles section",
              file=sys.stderr)  # fmt: skip
        return 2
    t_start = time.monotonic()
    busy0 = _busy_seconds()
    started = {"load": " / ".join(f"{x:.2f}" for x in os.getloadavg())}
    print(f"proxy_bench: load average {started['load']}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    lab = BenchLab(workdir)
    throughput: list[Run] = []
    allowlist_rows, allowlist_runs, worker_runs, profiles = [], [], [], {}
    try:
        lab.start()
        spec = write_spec(workdir / "spec.yaml")
        proxies: dict[str, Proxy | None] = {"direct": None}
        if not args.smoke:
            proxies["mitmdump"] = start_mitmdump(lab, "mitmdump", passthrough=False)
            proxies["mitmdump-pass"] = start_mitmdump(lab, "mitmdump-pass", passthrough=True)
            proxies["squid"] = start_squid(lab)
        proxies["egress"] = start_egress(lab, "egress", spec, env={"BENCH_TOKEN": TOKEN})
        if "throughput" in args.sections:
            print("throughput", flush=True)
            throughput = section_throughput(lab, proxies, args)
        if "profiles" in args.sections:
            print("profiles", flush=True)
            profiles = section_profiles(lab, proxies, args)
        injected = _injections(lab, proxies["egress"])
        for proxy in proxies.values():
            if proxy is not None:
                benchlab.terminate(proxy.proc)
        if "allowlist" in args.sections:
            print("allowlist", flush=True)
            allowlist_rows, allowlist_runs = section_allowlist(lab, args)
        if "workers" in args.sections:
            print("workers", flush=True)
            worker_runs = section_workers(lab, args, spec)
    finally:
        lab.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.monotonic() - t_start
    del busy0
    info = machine()
    info["egress credential injections seen in /metrics (sanity)"] = injected
    meta = {"command_line": args.command_line, "duration": args.duration, "repeat": args.repeat, "smoke": args.smoke,
            "profile_seconds": args.profile_seconds, "started": started, "wall": wall}  # fmt: skip
    return write_report(args, meta, info, throughput + allowlist_runs + worker_runs, allowlist_rows, profiles)


def write_report(args, meta, info, all_runs, allowlist_rows, profiles) -> int:
    """Evaluate the targets and write the Markdown report and the raw JSON."""
    throughput = [r for r in all_runs if r.section == "throughput"]
    allowlist_runs = [r for r in all_runs if r.section == "allowlist"]
    worker_runs = [r for r in all_runs if r.section == "workers"]
    for key in ("command_line", "duration", "repeat", "smoke", "profile_seconds"):
        setattr(args, key, meta[key])
    if args.smoke:
        args.notes = None  # the analysis is about full runs
    args.other_cpu_share = 100 * sum(r.other_cpu for r in all_runs) / max(sum(r.seconds for r in all_runs), 1e-9)
    targets = evaluate(throughput, allowlist_rows, allowlist_runs, worker_runs)
    text = render(args, info, throughput, allowlist_rows, allowlist_runs, worker_runs, profiles, targets,
                  meta["started"], meta["wall"])  # fmt: skip
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    raw = Path(args.raw) if args.raw else out.with_suffix(".json")
    raw.write_text(json.dumps({"meta": meta, "machine": info, "runs": [asdict(r) for r in all_runs],
                               "allowlist": allowlist_rows, "profiles": profiles,
                               "targets": [asdict(t) for t in targets]}, indent=1))  # fmt: skip
    print(f"proxy_bench: wrote {out} and {raw} ({meta['wall']:.0f} s of measuring)", flush=True)
    for t in targets:
        print(f"  {'MET   ' if t.met else 'MISSED'} {t.what}: {t.value} (goal {t.goal})")
    return 0


def _injections(lab: BenchLab, proxy: Proxy) -> str:
    """egress_credential_injections_total from the proxy's /metrics: proves the inject rows injected."""
    import socket

    with benchlab.in_netns(lab.ns):
        sock = socket.create_connection(("127.0.0.1", proxy.metrics_port), timeout=5)
    try:
        sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    finally:
        sock.close()
    total = 0.0
    for line in data.decode().splitlines():
        if line.startswith("egress_credential_injections_total"):
            total += float(line.rsplit(" ", 1)[1])
    return f"{total:,.0f}"


if __name__ == "__main__":
    sys.exit(main())
