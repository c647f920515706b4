"""Request-rules benchmark: intercepted HTTPS with a 20-item rule list against the same entry without rules.

    sudo .venv/bin/python bench/request_rules_bench.py          # ~4 min, writes docs/benchmarks-request-rules.md
    sudo .venv/bin/python bench/request_rules_bench.py --smoke --output /tmp/r.md

Two egress-proxy processes on the bench lab (bench/benchlab.py), the same realistic
spec; in one the intercepted entry (`inject.bench.test`, with a transform) also has
`requests`: 20 items, the one that matches the benchmarked `GET /small` last, so every
request is held to all of them. hey at 16 connections (HTTP/1.1 keep-alive, CONNECT
through `-x`), rounds interleaved (A B B A ...) so drift on a shared machine hits both.
Target: rules >= 0.95x without. Also the pure cost of one `RequestRules.check`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlab
import proxy_bench
from benchlab import BenchLab, start_egress

from egress.policy.request_rules import parse_requests

ROOT = benchlab.ROOT
TARGET = 0.95
# 19 items that do not match `GET /small` (other methods, other paths, `*` and `**`),
# then the one that does.
RULES = [
    *({"methods": ["POST"], "paths": [f"/repos/acme/*/issues/{i}", f"/v{i}/**/comments"]} for i in range(10)),
    *({"methods": ["GET", "HEAD"], "paths": [f"/api/v{i}/**", f"/repos/*/r{i}/contents/**"]} for i in range(9)),
    {"methods": ["GET", "HEAD"], "paths": ["/small", "/large"]},
]


def write_specs(workdir: Path) -> tuple[Path, Path]:
    """The realistic spec of bench/proxy_bench.py, without and with the rules on the intercepted entry."""
    entries = [dict(e) for e in (*proxy_bench.BENCH_ENTRIES, *proxy_bench.REALISTIC_ENTRIES)]
    doc = {"network": {"allowCidrs": ["198.18.0.0/15"], "allowlist": entries}}
    plain, ruled = workdir / "spec-no-rules.yaml", workdir / "spec-rules.yaml"
    plain.write_text(proxy_bench._yaml(doc))
    next(e for e in entries if e["domain"] == "inject.bench.test")["requests"] = RULES
    ruled.write_text(proxy_bench._yaml(doc))
    return plain, ruled


def check_cost() -> dict[str, float]:
    """Microseconds per `RequestRules.check` of the 20-item list (best of 5)."""
    rules, problems = parse_requests(RULES)
    assert rules is not None and not problems
    out = {}
    for name, (method, target) in {
        "GET /small (matches item 20)": (b"GET", b"/small"),
        "GET /other/path?q=1 (matches none)": (b"GET", b"/other/path?q=1"),
        "POST /repos/acme/x/../y/issues/3 (dot segments)": (b"POST", b"/repos/acme/x/../y/issues/3"),
    }.items():
        n = 20000
        best = min(timeit.repeat(lambda m=method, t=target: rules.check(m, t), number=n, repeat=5))
        out[name] = best / n * 1e6
    return out


def sanity(lab: BenchLab, proxy) -> str:
    """The ruled proxy really holds requests to the rules: a POST is refused."""
    done, _ = lab.exec(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %header{x-egress-denied}", "-x", proxy.url,
         "--cacert", str(proxy.ca), "-X", "POST", "https://inject.bench.test/small"],
        timeout=30,
    )  # fmt: skip
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--output", default=str(ROOT / "docs" / "benchmarks-request-rules.md"))
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--repeat", type=int, default=6, help="rounds per proxy (interleaved)")
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--calibrate", action="store_true", help="A/A: the second proxy gets the spec without rules too")
    args = p.parse_args(argv)
    if args.smoke:
        args.duration, args.repeat = 1.0, 1
    if os.geteuid() != 0:
        print("request_rules_bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    costs = check_cost()
    load_before = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    workdir = Path(tempfile.mkdtemp(prefix="egress-rules-bench-"))
    lab = BenchLab(workdir)
    runs: dict[str, list] = {"no rules": [], "20-item rules": []}
    refused = ""
    started = time.monotonic()
    try:
        lab.start()
        plain_spec, ruled_spec = write_specs(workdir)
        if args.calibrate:
            ruled_spec = plain_spec
        env = {"BENCH_TOKEN": proxy_bench.TOKEN}
        proxies = {"no rules": start_egress(lab, "plain", plain_spec, env=env),
                   "20-item rules": start_egress(lab, "ruled", ruled_spec, env=env)}  # fmt: skip
        refused = sanity(lab, proxies["20-item rules"])
        for name, proxy in proxies.items():  # warm-up: certificates generated, connections pooled
            proxy_bench.measure(lab, "warmup", "inject", name, proxy, "small", args.conns, 1.0, 0)
        order = list(proxies)
        for rnd in range(1, args.repeat + 1):
            for name in order if rnd % 2 else reversed(order):
                runs[name].append(proxy_bench.measure(lab, "rules", "inject", name, proxies[name], "small", args.conns,
                                                      args.duration, rnd))  # fmt: skip
    finally:
        lab.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.monotonic() - started
    Path(args.output).write_text(render(args, runs, costs, refused, load_before, wall))
    raw = Path(args.output).with_suffix(".json")
    raw.write_text(json.dumps({k: [r.__dict__ for r in v] for k, v in runs.items()}, indent=1))
    print(f"wrote {args.output}")
    return 0


def render(args, runs, costs, refused, load_before, wall) -> str:
    base = [r.rps for r in runs["no rules"] if r.valid]
    ruled = [r.rps for r in runs["20-item rules"] if r.valid]
    ratio_mean = statistics.mean(ruled) / statistics.mean(base) if base and ruled else 0.0
    ratio_median = statistics.median(ruled) / statistics.median(base) if base and ruled else 0.0
    verdict = "met" if ratio_mean >= TARGET else "NOT met"
    # Requests per CPU second of the proxy process: what the rules cost the proxy itself,
    # less sensitive than req/s to other load on a shared machine.
    eff = {k: sum(r.requests for r in v if r.valid) / max(1e-9, sum(r.proxy_cpu for r in v if r.valid)) for k, v in runs.items()}
    eff_ratio = eff["20-item rules"] / eff["no rules"] if eff["no rules"] else 0.0
    info = proxy_bench.machine()
    lines = [
        "# Benchmark: request rules",
        "",
        f"Generated by `bench/request_rules_bench.py` ({'smoke run' if args.smoke else 'full run'}; "
        f"{args.repeat} interleaved rounds of {args.duration:g} s per proxy, hey at {args.conns} connections, "
        f"intercepted HTTPS with injection, `GET /small` (100 B)). Wall time {wall:.0f} s.",
        "",
        "Both proxies run the same realistic spec; in one the intercepted entry also has a 20-item `requests`",
        "list whose only matching item is the last, so every request is checked against all 20.",
        f"Sanity: a `POST` through the ruled proxy answered `{refused}`.",
        "",
        f"**Target: rules >= {TARGET}x without rules: {verdict}** "
        f"(mean {ratio_mean:.3f}x, median {ratio_median:.3f}x). Requests per CPU second of the proxy: "
        f"{eff['no rules']:.0f} without rules, {eff['20-item rules']:.0f} with ({eff_ratio:.3f}x).",
        "",
        "| round | no rules (req/s) | 20-item rules (req/s) | ratio | other CPU busy (s, no rules / rules) |",
        "|---|---|---|---|---|",
    ]
    for a, b in zip(runs["no rules"], runs["20-item rules"], strict=False):
        lines.append(f"| {a.round} | {a.rps:.1f} | {b.rps:.1f} | {b.rps / a.rps if a.rps else 0:.3f} "
                     f"| {a.other_cpu:.1f} / {b.other_cpu:.1f} |")  # fmt: skip
    if base and ruled:
        lines.append(f"| mean | {statistics.mean(base):.1f} | {statistics.mean(ruled):.1f} | {ratio_mean:.3f} | |")
        lines.append(f"| median | {statistics.median(base):.1f} | {statistics.median(ruled):.1f} | {ratio_median:.3f} | |")
    p99 = {k: statistics.median([r.p99_ms for r in v]) for k, v in runs.items() if v}
    lines += [
        "",
        "p99 latency (median over rounds): " + ", ".join(f"{k} {v:.2f} ms" for k, v in p99.items()) + ".",
        "",
        "## One `RequestRules.check` of the 20-item list (pure function, best of 5)",
        "",
        "| request | µs |",
        "|---|---|",
        *(f"| `{k}` | {v:.1f} |" for k, v in costs.items()),
        "",
        "## Machine",
        "",
        f"- load average before: {load_before} (2 cores shared with other work: figures are noisy, rounds interleaved)",
        *(f"- {k}: {v}" for k, v in info.items()),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
