"""`egress-proxy`: run the proxy, check a spec (SPEC §6), or print / apply the
nftables rules that send a sandbox namespace through a transparent proxy.

Every failure the user can cause ends in one clear line per problem and a
non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from egress import __version__
from egress.net.limits import DEFAULTS
from egress.ops.metrics_server import DEFAULT_LISTEN as DEFAULT_METRICS_LISTEN
from egress.policy.spec import SpecError, load_spec

DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_CONFDIR = "~/.egress-proxy"
# mitmproxy options whose change would break a guarantee rather than tune behaviour.
_REFUSED_OPTIONS = {
    "ssl_insecure": "upstream certificates are always verified before credentials are sent",
    "mode": "use --mode",
    "listen_host": "use --listen",
    "listen_port": "use --listen",
    "confdir": "use --confdir",
    "connection_strategy": "upstream connections are opened only after the destination is checked",
    "ignore_hosts": "passthrough is decided by the allowlist (entries without transform)",
    "allow_hosts": "the allowlist decides which hosts are reached",
    "upstream_cert": "not supported",
}


# `run` flags for timeouts and connection caps (egress/addons/limits.py) and the options they set.
_LIMIT_FLAGS = (
    ("--connect-timeout", "upstream TCP connect; then 502"),
    ("--read-timeout", "upstream's time to start answering a request; then 504 (502 over TLS)"),
    ("--idle-timeout", "close a connection silent in both directions (mitmproxy's tcp_timeout)"),
    ("--header-timeout", "a client connection with no request in flight must send a full request head"),
    ("--max-connections", "client connections at once, all clients"),
    ("--max-connections-per-client", "client connections at once from one client address"),
    ("--max-connections-per-environment", "--spec-dir: client connections at once bound to one environment"),
)


def _limit_option(flag: str) -> str:
    return "egress_" + flag[2:].replace("-", "_")


def _mitmproxy_option(flag: str) -> str:
    """The mitmproxy option a limit flag ends up in, where it is mitmproxy's own."""
    return "tcp_timeout" if flag == "--idle-timeout" else ""


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative whole number")
    return int(text)


def _workers(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers (1-256)")
    return int(text)


class UsageError(Exception):
    pass


def parse_hostport(text: str, flag: str) -> tuple[str, int]:
    from egress.net.hostport import HostPortError
    from egress.net.hostport import parse_hostport as parse

    try:
        return parse(text, flag)
    except HostPortError as exc:
        raise UsageError(str(exc)) from None


def _check_can_listen(text: str, host: str, port: int, flag: str, transports: tuple[str, ...] = ("tcp",)) -> None:
    from egress.net.hostport import HostPortError, check_can_listen

    try:
        check_can_listen(text, host, port, flag, transports)
    except HostPortError as exc:
        raise UsageError(str(exc)) from None


def parse_set(values: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--set: expected NAME=VALUE, got {item!r}")
        if name in _REFUSED_OPTIONS:
            raise UsageError(f"--set {name}: refused ({_REFUSED_OPTIONS[name]})")
        if flag := next((flag for flag, *_ in _LIMIT_FLAGS if name in (_limit_option(flag), _mitmproxy_option(flag))), None):
            # The flag checks the value (a negative timeout would pass through --set).
            raise UsageError(f"--set {name}: refused (use {flag})")
        options[name] = value
    return options


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming the flag, not argparse's usage block: operators read it in
        # `kubectl logs` and CI output, where a wrapped usage text buries the reason.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# `run`'s optional string flags that name where to listen or connect, in --help order:
# (flag, metavar, help). A table, as with _LIMIT_FLAGS, rather than one add_argument each.
_RUN_ADDRESS_FLAGS = (
    ("--dns-listen", "HOST:PORT",
     "answer DNS (UDP and TCP) here from the same spec: names not allowlisted get NXDOMAIN (default off)"),
    ("--upstream-proxy", "URL",
     "reach the internet through a parent proxy, http://HOST:PORT: every upstream connection is a "
     "CONNECT to the checked IP address through it (default: connect directly)"),
    ("--upstream-proxy-auth", "REF",
     "credentials for the parent proxy by reference, e.g. 'USER:${file:/run/secrets/parent-password}' or "
     "'${env:PARENT_AUTH}' (USER:PASSWORD); "
     "sent to the parent only, as Proxy-Authorization: Basic"),
)  # fmt: skip


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="egress-proxy", description="Egress proxy for AI-agent sandboxes.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the proxy")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", metavar="FILE", help="environment spec (JSON or YAML): one environment, no proxy auth")
    source.add_argument(
        "--spec-dir", metavar="DIR",
        help="one environment per *.yaml/*.yml/*.json in DIR (id = file stem); clients prove theirs with "
        "Proxy-Authorization (http://ENV_ID:TOKEN@proxy)",
    )  # fmt: skip
    run.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"proxy address, IPv6 as [::1]:8080 (default {DEFAULT_LISTEN})"
    )
    run.add_argument(
        "--metrics-listen", default=DEFAULT_METRICS_LISTEN, metavar="HOST:PORT",
        help=f"/metrics, /healthz, /readyz address (default {DEFAULT_METRICS_LISTEN})",
    )
    run.add_argument(
        "--mode", choices=("regular", "transparent"), default="regular",
        help="regular: clients use it as their HTTP(S) proxy; transparent: redirected connections (default regular)",
    )  # fmt: skip
    run.add_argument(
        "--confdir", default=DEFAULT_CONFDIR, metavar="DIR", help=f"holds the CA, mitmproxy-ca-cert.pem (default {DEFAULT_CONFDIR})"
    )
    run.add_argument("--upstream-ca", metavar="FILE", help="extra trust anchors (PEM) for verifying upstream servers")
    run.add_argument("--log-format", choices=("json", "text"), default="json", help="audit log format on stdout")
    run.add_argument(
        "--report-only", action="store_true", help="like `network.mode: report`: log and count would-be blocks, let them pass"
    )
    limits = run.add_argument_group("timeouts and limits (seconds / connections; 0 disables)")
    for flag, help_text in _LIMIT_FLAGS:
        default = DEFAULTS[_limit_option(flag)]
        limits.add_argument(flag, type=_count, default=default, metavar="N", help=f"{help_text} (default {default})")
    run.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="pass a mitmproxy option")
    for flag, metavar, help_text in _RUN_ADDRESS_FLAGS:
        run.add_argument(flag, metavar=metavar, help=help_text)
    run.add_argument(
        "--workers", type=_workers, default=1, metavar="N",
        help="proxy processes sharing the listen port (SO_REUSEPORT), one CA and one /metrics (default 1)",
    )  # fmt: skip

    check = commands.add_parser("check", help="validate a spec (or a spec directory); one line per problem")
    check_source = check.add_mutually_exclusive_group(required=True)
    check_source.add_argument("--spec", metavar="FILE", help="environment spec (JSON or YAML)")
    check_source.add_argument("--spec-dir", metavar="DIR", help="every *.yaml/*.yml/*.json in DIR, one environment each")

    rules = commands.add_parser(
        "redirect-rules", help="print (or --apply) the nftables rules that send a sandbox namespace through the proxy"
    )
    rules.add_argument("--proxy-port", type=int, default=8080, metavar="PORT", help="the proxy's transparent port (default 8080)")
    rules.add_argument("--proxy-uid", type=_uint, metavar="UID", help="uid of the proxy process, whose traffic is exempt")
    rules.add_argument("--proxy-mark", type=_uint, metavar="MARK", help="packet mark of the proxy's traffic, which is exempt")
    rules.add_argument(
        "--dns", action="append", default=[], metavar="IP", help="resolver that may be reached on port 53 (repeatable)"
    )
    rules.add_argument(
        "--dns-port", type=int, metavar="PORT",
        help="redirect all DNS (UDP/TCP port 53, any address) to the proxy's --dns-listen port on loopback",
    )  # fmt: skip
    rules.add_argument("--apply", action="store_true", help="install the rules with `nft -f -`")
    return parser


def _uint(text: str) -> int:
    """Decimal or 0x-hexadecimal, as uids and marks are written."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def cmd_redirect_rules(args: argparse.Namespace) -> int:
    import subprocess

    from egress.net.redirect_rules import RulesError, render_rules

    try:
        script = render_rules(
            proxy_port=args.proxy_port,
            proxy_uid=args.proxy_uid,
            proxy_mark=args.proxy_mark,
            dns=args.dns,
            dns_port=args.dns_port,
        )
    except RulesError as exc:
        raise UsageError(f"redirect-rules: {exc}") from None
    sys.stdout.write(script)
    sys.stdout.flush()
    if not args.apply:
        return 0
    try:
        done = subprocess.run(["nft", "-f", "-"], check=False, input=script, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"egress-proxy: redirect-rules --apply: cannot run nft ({getattr(exc, 'strerror', None) or exc})", file=sys.stderr)
        return 1
    if done.returncode != 0:
        detail = " | ".join(line.strip() for line in done.stderr.splitlines() if line.strip())[:500]
        print(f"egress-proxy: redirect-rules --apply: nft failed (exit {done.returncode}): {detail}", file=sys.stderr)
        return 1
    print("egress-proxy: redirect-rules applied", file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    if args.spec_dir is not None:
        return _check_spec_dir(args.spec_dir)
    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    print(f"{args.spec}: ok ({len(spec.entries)} allowlist entries, mode {spec.mode})")
    return 0


def _check_spec_dir(directory: str) -> int:
    from egress.environments.registry import load_directory

    loaded, problems = load_directory(directory)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    for spec_file, spec in loaded.values():
        if spec.proxy_token is None:
            print(f"{spec_file.path}: note: no network.proxyToken, so this environment refuses every client")
    entries = sum(len(spec.entries) for _, spec in loaded.values())
    print(f"{directory}: ok ({len(loaded)} environments, {entries} allowlist entries)")
    return 0


def _load_policy(args: argparse.Namespace, count_reloads: bool):
    """The one spec (--spec) or the environments (--spec-dir); raises SpecError."""
    from egress.environments.registry import EnvironmentRegistry
    from egress.environments.single import SpecHolder

    if args.spec_dir is not None:
        if args.mode != "regular":
            raise UsageError("--spec-dir needs --mode regular: clients prove their environment with Proxy-Authorization")
        return EnvironmentRegistry(args.spec_dir, report_only=args.report_only, count_reloads=count_reloads)
    return SpecHolder(args.spec, report_only=args.report_only, count_reloads=count_reloads)


def _upstream_bundle(confdir: Path, extra: str) -> str:
    """certifi's roots plus the operator's CA: adding a private CA must not drop the public ones."""
    from egress.addons.upstream_trust import BundleError, write_bundle

    try:
        return write_bundle(confdir, extra)
    except BundleError as exc:
        raise UsageError(str(exc)) from None


def _parent_proxy(args: argparse.Namespace):
    """--upstream-proxy and --upstream-proxy-auth, checked before anything listens."""
    from egress.net.parent_proxy import ParentProxyError, parse

    if args.upstream_proxy is None:
        if args.upstream_proxy_auth is not None:
            raise UsageError("--upstream-proxy-auth needs --upstream-proxy")
        return None
    try:
        return parse(args.upstream_proxy, args.upstream_proxy_auth)
    except ParentProxyError as exc:
        raise UsageError(str(exc)) from None


async def _run(args: argparse.Namespace) -> int:
    from egress.addons.readiness import Readiness
    from egress.mitm import workers
    from egress.mitm.master import build_master
    from egress.ops import metrics
    from egress.ops.audit import DecisionLog
    from egress.ops.metrics_server import serve_metrics

    worker = workers.current()
    try:
        holder = _load_policy(args, count_reloads=worker is None or worker.counts_reloads)
    except SpecError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    listen_host, listen_port = parse_hostport(args.listen, "--listen")
    dns_listen = parse_hostport(args.dns_listen, "--dns-listen") if args.dns_listen is not None else None
    if worker is not None and worker.index != 0:
        # With --workers only the first worker serves DNS: mitmproxy's UDP server cannot
        # share a port (no SO_REUSEPORT), and one process answers far more queries than
        # a sandbox asks (docs/benchmarks-dns.md).
        dns_listen = None
    metrics_host, metrics_port = parse_hostport(args.metrics_listen, "--metrics-listen")
    if worker is None:  # workers share the port (SO_REUSEPORT): their supervisor checked it
        _check_can_listen(args.listen, listen_host, listen_port, "--listen")
        if dns_listen:
            _check_can_listen(args.dns_listen, *dns_listen, "--dns-listen", ("udp", "tcp"))
    extra = {_limit_option(flag): str(getattr(args, flag[2:].replace("-", "_"))) for flag, *_ in _LIMIT_FLAGS}
    extra.update(parse_set(args.set))
    confdir = Path(os.path.expanduser(args.confdir))
    try:
        confdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise UsageError(f"--confdir {confdir}: exists and is not a directory") from None
    except OSError as exc:
        raise UsageError(f"--confdir {confdir}: cannot create ({exc.strerror})") from None
    if args.upstream_ca:  # checked here, before anything listens; UpstreamTrust installs it
        _upstream_bundle(confdir, args.upstream_ca)
    parent = _parent_proxy(args)

    if worker is None and args.workers > 1:
        describe = f"{args.mode} proxy on {args.listen}, metrics on {args.metrics_listen}"
        try:
            return await workers.supervise(args.workers, args.argv, confdir, metrics_host, metrics_port, describe)
        except OSError as exc:
            raise UsageError(f"--metrics-listen {args.metrics_listen}: cannot listen ({exc.strerror})") from None
    readiness = worker.readiness() if worker else Readiness()
    metrics_server = None
    egress_options: dict[str, object] = {
        "egress_spec": args.spec,
        "egress_spec_dir": args.spec_dir,
        "egress_report_only": args.report_only,
        "egress_log_format": args.log_format,
        "egress_dns_listen": args.dns_listen if dns_listen else None,
        "egress_upstream_proxy": args.upstream_proxy,
        "egress_upstream_proxy_auth": args.upstream_proxy_auth,
        "egress_upstream_ca": args.upstream_ca,
        # With --workers the supervisor serves /metrics for all of them.
        "egress_metrics_listen": "" if worker is not None else args.metrics_listen,
        "egress_workers": args.workers,
    }
    if worker is not None:
        workers.listen_with_reuseport()  # the supervisor serves /metrics for all workers
    else:
        try:
            metrics_server = serve_metrics(metrics_host, metrics_port, readiness.ready.is_set)
        except OSError as exc:
            raise UsageError(f"--metrics-listen {args.metrics_listen}: cannot listen ({exc.strerror})") from None
    try:
        m = build_master(
            holder,
            listen_host=listen_host,
            listen_port=listen_port,
            mode=args.mode,
            confdir=str(confdir),
            egress_options=egress_options,
            extra_options=extra,
            log=DecisionLog(args.log_format),
            readiness=readiness,
            dns_listen=dns_listen,
            parent=parent,
            metrics_server=metrics_server,
            count_reloads=worker is None or worker.counts_reloads,
        )
    except Exception as exc:  # mitmproxy reports bad option values as exceptions
        raise UsageError(f"--set: {exc}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, m.shutdown)
    loop.add_signal_handler(signal.SIGHUP, holder.reload, "sighup")
    metrics.set_build_info()
    loaded = holder.summary()
    print(
        f"egress-proxy: {args.mode} proxy on {args.listen}, metrics on {args.metrics_listen}, "
        + (f"DNS on {args.dns_listen}, " if dns_listen else "")
        + (f"through parent proxy {parent.label}{' (with credentials)' if parent.authorization else ''}, " if parent else "")
        + f"{loaded}\n"
        f"egress-proxy: CA certificate: {confdir / 'mitmproxy-ca-cert.pem'}",
        file=sys.stderr,
        flush=True,
    )
    # Everything loaded so far (mitmproxy, the spec: 100,000 allowlist entries are half
    # a million objects) lives as long as the process; keep it out of the cyclic GC's
    # full collections, which otherwise walk all of it every few seconds under load.
    gc.freeze()
    try:
        await m.run()
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
    # errorcheck has already printed what failed (port in use, bad certificate, ...).
    return 1 if m.addons.get("errorcheck").logger.has_errored else 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # --workers starts workers with the same arguments
    try:
        if args.command == "check":
            return cmd_check(args)
        if args.command == "redirect-rules":
            return cmd_redirect_rules(args)
        return asyncio.run(_run(args))
    except UsageError as exc:
        print(f"egress-proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
