"""Soak: many client connections of mixed traffic through the real proxy for a while,
recording every unexpected answer and the proxy's memory (RSS) over time.

    sudo .venv/bin/python bench/soak.py --duration 60 --connections 64

builds the end-to-end lab (network namespaces, echo upstreams on 198.18.0.0/15,
tests/e2e/support/lab.py), starts `egress-proxy run`, and drives it from inside the
proxy namespace with N worker threads, each holding at most one connection at a
time. Workers cycle through four kinds of request, a few in a row on one
keep-alive connection before switching (so connections are opened and closed
all the time):

- passthrough  https://a.example.test/   TLS tunnelled untouched (upstream's certificate)
- intercept    https://api.example.test/ TLS intercepted, Authorization injected
- blocked      http://other.test/        403 not_allowlisted
- plain        http://plain.test/        plain HTTP, allowed

Every answer is checked (status, reached host, injected credential present only
where it belongs); anything else counts as an error. RSS is read from
/proc/PID/status every second; growth is measured from the end of warm-up (the
first 20 %, at least 5 s: certificates generated, pools filled) to the end.
Prints one JSON summary. `tests/e2e/test_soak.py` runs a 20-second version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The e2e lab (network namespaces, test hosts, the spec helper) lives under tests/.
sys.path.insert(0, str(ROOT / "tests"))
from e2e.support.lab import allowlist_spec, bearer  # noqa: E402

TOKEN = "soak-token-3d91f0"
SPEC = allowlist_spec(("api.example.test", bearer("EGRESS_SOAK_TOKEN")), "*.example.test", "plain.test")
# kind -> (url, expected status, expected upstream address or None, credential expected)
KINDS = {
    "passthrough": ("https://a.example.test/soak", 200, "198.18.0.11", False),
    "intercept": ("https://api.example.test/soak", 200, "198.18.0.10", True),
    "blocked": ("http://other.test/soak", 403, None, False),
    "plain": ("http://plain.test/soak", 200, "198.18.0.16", False),
}
BURST = 5  # requests of one kind in a row on one keep-alive connection


# -- the load driver (runs inside the proxy namespace) ---------------------------------
def _check(kind: str, response) -> str | None:
    """None when the answer is what the proxy must give, else what was wrong."""
    _, status, local, credential = KINDS[kind]
    if response.status_code != status:
        return f"status {response.status_code}"
    if kind == "blocked":
        if response.headers.get("x-egress-denied") != "not_allowlisted":
            return "403 without X-Egress-Denied: not_allowlisted"
        return None
    echo = response.json()
    if echo["local"] != local:
        return f"reached {echo['local']}"
    auth = [v for k, v in echo["headers"] if k.lower() == "authorization"]
    # The upstream echoes what it received; the proxy masks the injected token on the way
    # back, so a masked value is the proof it was injected (and the sandbox never saw it).
    if credential and auth != [f"Bearer {'*' * len(TOKEN)}"]:
        return "credential not injected (or its echo not masked)"
    if not credential and auth:
        return "credential sent where it does not belong"
    return None


def drive(proxy_url: str, cafile: str, duration: float, connections: int, kinds: list[str]) -> dict:
    import httpx

    ctx = ssl.create_default_context(cafile=cafile)
    stop_at = time.monotonic() + duration
    lock = threading.Lock()
    counts: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    samples: list[str] = []
    latencies: list[float] = []

    def worker(index: int) -> None:
        rng = random.Random(index)
        # One connection at a time per worker: `connections` workers hold at most that many.
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        with httpx.Client(proxy=proxy_url, verify=ctx, trust_env=False, timeout=15, limits=limits) as client:
            while time.monotonic() < stop_at:
                kind = rng.choice(kinds)
                url = KINDS[kind][0]
                for _ in range(BURST):
                    if time.monotonic() >= stop_at:
                        break
                    start = time.monotonic()
                    try:
                        problem = _check(kind, client.get(url))
                    except Exception as exc:  # every failure is a finding, not a crash of the driver
                        problem = f"{type(exc).__name__}: {exc}"[:200]
                    took = time.monotonic() - start
                    with lock:
                        counts[kind] += 1
                        latencies.append(took)
                        if problem:
                            errors[kind] += 1
                            if len(samples) < 20:
                                samples.append(f"{kind}: {problem}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(connections)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 60)
    wall = time.monotonic() - started
    latencies.sort()
    total = sum(counts.values())
    return {
        "requests": total,
        "by_kind": dict(counts),
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
        "error_samples": samples,
        "requests_per_second": round(total / wall, 1) if wall else 0,
        "latency_p50_ms": round(latencies[len(latencies) // 2] * 1000, 1) if latencies else None,
        "latency_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1) if latencies else None,
        "stuck_workers": sum(t.is_alive() for t in threads),
    }


# -- the soak around a running proxy (in the test process or the CLI) --------------------
def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def soak(lab, proxy, duration: float, connections: int, kinds: Sequence[str] = tuple(KINDS)) -> dict:
    """Drive `proxy` (an e2e ProxyProcess running SPEC) and sample its RSS once a second."""
    bundle = proxy.dir / "soak-ca.pem"
    bundle.write_text(proxy.ca.read_text() + lab.upstream_ca.read_text())
    pid = proxy.proc.pid
    cmd = [
        "ip", "netns", "exec", lab.proxy_ns, sys.executable, str(Path(__file__).resolve()), "drive",
        "--proxy", proxy.url, "--cafile", str(bundle), "--duration", str(duration), "--connections", str(connections),
        "--kinds", ",".join(kinds),
    ]  # fmt: skip
    rss: list[tuple[float, int]] = [(0.0, rss_kib(pid))]
    started = time.monotonic()
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while driver.poll() is None:
        time.sleep(1)
        if proxy.proc.poll() is not None:
            break
        rss.append((round(time.monotonic() - started, 1), rss_kib(pid)))
    out, err = driver.communicate(timeout=120)
    if driver.returncode != 0:
        raise RuntimeError(f"soak driver failed ({driver.returncode}): {err[-2000:]}")
    result = json.loads(out)
    warmup = max(5.0, duration * 0.2)
    after_warmup = [kib for t, kib in rss if t >= warmup]
    baseline = after_warmup[0] if after_warmup else rss[-1][1]
    end = statistics.median(kib for _, kib in rss[-3:])
    result.update(
        duration_s=duration,
        connections=connections,
        kinds=kinds,
        proxy_alive=proxy.proc.poll() is None,
        ready_after=proxy.get_ops("/readyz")[0] if proxy.proc.poll() is None else 0,
        rss_start_kib=rss[0][1],
        rss_after_warmup_kib=baseline,
        rss_end_kib=end,
        rss_max_kib=max(kib for _, kib in rss),
        rss_growth_after_warmup_pct=round((end - baseline) * 100 / baseline, 1),
        rss_samples=[[t, kib] for t, kib in rss],
    )
    return result


def start_proxy(lab):
    return lab.start_proxy(SPEC, env={"EGRESS_SOAK_TOKEN": TOKEN}, name="soak.yaml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    d = sub.add_parser("drive", help="(internal) run the load from inside the proxy namespace")
    d.add_argument("--proxy", required=True)
    d.add_argument("--cafile", required=True)
    d.add_argument("--duration", type=float, required=True)
    d.add_argument("--connections", type=int, required=True)
    d.add_argument("--kinds", required=True)
    parser.add_argument("--duration", type=float, default=60)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--out", help="also write the JSON summary here")
    args = parser.parse_args(argv)
    if args.command == "drive":
        print(json.dumps(drive(args.proxy, args.cafile, args.duration, args.connections, args.kinds.split(","))))
        return 0

    if os.geteuid() != 0:
        print("soak: needs root (it creates network namespaces)", file=sys.stderr)
        return 2
    from e2e.support.lab import Lab

    with tempfile.TemporaryDirectory(prefix="egress-soak-") as tmp:
        lab = Lab(Path(tmp))
        try:
            lab.start()
            proxy = start_proxy(lab)
            result = soak(lab, proxy, args.duration, args.connections, args.kinds.split(","))
            proxy.stop()
            leaked = TOKEN in proxy.stdout() + proxy.stderr()
            result["token_in_logs"] = leaked
        finally:
            lab.stop()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    ok = result["errors"] == 0 and result["proxy_alive"] and not result["token_in_logs"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
