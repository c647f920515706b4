"""DNS listener benchmark: dnsperf through `egress-proxy --dns-listen` vs the resolver direct.

    namespace ebd-N (loopback only)
    ├─ dnsmasq on 127.0.0.1:53 (the proxy's resolv.conf; answers from its command line)
    ├─ egress-proxy --dns-listen 127.0.0.1:5353, pinned to one core (taskset)
    └─ dnsperf, pinned to the other core when there is one

Three runs per round, each `--seconds` long (bounded: dnsperf -l):
- blocked: names not on the allowlist (NXDOMAIN answered by the proxy itself);
- allowed: an allowlisted name, resolved through the proxy's resolver (getaddrinfo
  to dnsmasq), forbidden addresses filtered; after the first query it is answered
  from the proxy's address cache (egress/dns/cache.py, 30 s);
- uncached: a new allowlisted name per query (under a wildcard entry), so every
  query goes to the resolver (the cache's miss path);
- direct: the same allowlisted name asked of dnsmasq itself.
Writes a Markdown table (default docs/benchmarks-dns.md) and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EGRESS_PROXY = str(VENV_BIN / "egress-proxy")
SPEC = (
    "network:\n  allowCidrs: [198.18.0.0/15]\n  allowlist:\n    - domain: allowed.bench.test\n"
    '    - domain: "*.allowed.bench.test"\n'
)
TARGETS = ("blocked", "allowed", "uncached", "direct")
PROXY_PORT, DNS_PORT, METRICS_PORT = 18080, 5353, 19090


def run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def cores() -> tuple[str, str]:
    """(proxy core, dnsperf core): different ones when the machine has two or more."""
    available = sorted(os.sched_getaffinity(0))
    return str(available[0]), str(available[1 if len(available) > 1 else 0])


def proxy_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dnsperf(ns: str, port: int, queries: Path, seconds: int, core: str) -> dict:
    out = run(
        ["ip", "netns", "exec", ns, "taskset", "-c", core, "dnsperf", "-s", "127.0.0.1", "-p", str(port),
         "-d", str(queries), "-l", str(seconds), "-c", "4", "-q", "200", "-t", "2"],
        check=False, timeout=seconds + 30,
    )  # fmt: skip
    qps = re.search(r"Queries per second:\s+([\d.]+)", out.stdout)
    lost = re.search(r"Queries lost:\s+(\d+)", out.stdout)
    latency = re.search(r"Average Latency \(s\):\s+([\d.]+)", out.stdout)
    codes = re.search(r"Response codes:\s+(.*)", out.stdout)
    if not qps:
        raise RuntimeError(f"dnsperf failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    return {
        "qps": float(qps.group(1)),
        "lost": float(lost.group(1)) if lost else 0.0,
        "latency_ms": float(latency.group(1)) * 1000 if latency else 0.0,
        "codes": codes.group(1).strip() if codes else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="length of each dnsperf run (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three runs (default 2)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks-dns.md"))
    parser.add_argument("--py-spy", metavar="DIR", help="profile the proxy during each first-round run (py-spy raw output)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("dns_bench: needs root (network namespace)", file=sys.stderr)
        return 2
    missing = [t for t in ("dnsperf", "dnsmasq", "taskset", "ip") if shutil.which(t) is None]
    if missing:
        print(f"dns_bench: missing tools: {', '.join(missing)}", file=sys.stderr)
        return 2

    ns = f"ebd-{os.getpid() % 100000}"
    work = Path(tempfile.mkdtemp(prefix="egress-dns-bench-"))
    etc = Path("/etc/netns") / ns
    procs: list[subprocess.Popen] = []
    proxy_core, load_core = cores()
    try:
        run(["ip", "netns", "add", ns])
        run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        (etc / "hosts").write_text("127.0.0.1 localhost\n")
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--no-resolv",
             "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1", "--pid-file=", "--user=root",
             "--address=/allowed.bench.test/198.18.0.10", "--address=/attacker.test/198.18.0.13"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        spec = work / "spec.yaml"
        spec.write_text(SPEC)
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, "taskset", "-c", proxy_core, EGRESS_PROXY, "run", "--spec", str(spec),
             "--listen", f"127.0.0.1:{PROXY_PORT}", "--metrics-listen", f"127.0.0.1:{METRICS_PORT}",
             "--dns-listen", f"127.0.0.1:{DNS_PORT}", "--confdir", str(work / "conf")],
            stdout=(work / "audit.log").open("w"), stderr=(work / "proxy.err").open("w"),
        ))  # fmt: skip
        deadline = time.monotonic() + 30
        while "allowlist entries" not in (work / "proxy.err").read_text():
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                raise RuntimeError(f"proxy did not start: {(work / 'proxy.err').read_text()}")
            time.sleep(0.1)
        time.sleep(1)
        blocked = work / "blocked.txt"
        blocked.write_text("".join(f"x{i:06d}.attacker.test A\n" for i in range(20000)))
        allowed = work / "allowed.txt"
        allowed.write_text("allowed.bench.test A\n" * 100)
        results: dict[str, list[dict]] = {name: [] for name in TARGETS}
        for round_no in range(args.rounds):
            # New names each round: none of them may be in the proxy's cache yet.
            uncached = work / f"uncached-{round_no}.txt"
            uncached.write_text("".join(f"r{round_no}u{i:06d}.allowed.bench.test A\n" for i in range(60000)))
            files = {"blocked": (blocked, DNS_PORT), "allowed": (allowed, DNS_PORT),
                     "uncached": (uncached, DNS_PORT), "direct": (allowed, 53)}  # fmt: skip
            for name in TARGETS:
                spy = None
                if args.py_spy and round_no == 0 and name != "direct":
                    spy = subprocess.Popen(
                        [str(VENV_BIN / "py-spy"), "record", "-r", "200", "-d", str(args.seconds), "-f", "raw",
                         "-p", str(procs[-1].pid), "-o", str(Path(args.py_spy) / f"{name}.txt")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                cpu = proxy_cpu_seconds(procs[-1].pid)
                result = dnsperf(ns, files[name][1], files[name][0], args.seconds, load_core)
                answered = result["qps"] * args.seconds
                # The proxy's own CPU time per answered query: what a core of its own
                # would sustain, less sensitive to other load on a shared machine.
                if name != "direct" and answered:
                    result["cpu_us"] = (proxy_cpu_seconds(procs[-1].pid) - cpu) / answered * 1e6
                results[name].append(result)
                if spy is not None:
                    spy.wait(timeout=args.seconds + 30)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(etc, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    def mean(name: str, key: str) -> float:
        return sum(r[key] for r in results[name]) / len(results[name])

    direct = mean("direct", "qps")
    def cpu(name: str) -> str:
        runs = [r["cpu_us"] for r in results[name] if "cpu_us" in r]
        return f"{sum(runs) / len(runs):.0f}" if runs else "-"

    rows = [
        f"| {name} | {mean(name, 'qps'):,.0f} | {', '.join(f'{r['qps']:,.0f}' for r in results[name])} "
        f"| {cpu(name)} | {mean(name, 'latency_ms'):.2f} | {sum(r['lost'] for r in results[name]):.0f} "
        f"| {results[name][-1]['codes']} |"
        for name in TARGETS
    ]
    text = "\n".join([
        "| target | q/s mean | q/s per run | proxy CPU µs/query | avg latency ms | lost | response codes (last run) |",
        "|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        f"allowed / direct = {mean('allowed', 'qps') / direct:.2f}, uncached / direct = "
        f"{mean('uncached', 'qps') / direct:.2f}; "
        f"proxy on core {proxy_core}, dnsperf on core {load_core}; {args.rounds} x {args.seconds} s runs, "
        f"dnsperf -c 4 -q 200; {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.",
    ])  # fmt: skip
    print(text)
    Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
