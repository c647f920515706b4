"""`egress-hooks`: the dispatcher as commands (SPEC §6, §8).

    egress-hooks dispatch EVENT [--config FILE] [--workspace DIR] [--operator-config FILE]
                                [--no-workspace-hooks] [--budget SECONDS] [--proxy URL] [--ca-file FILE]
    egress-hooks dispatch EVENT --server ADDR [--fail-closed]
    egress-hooks serve --listen unix:PATH|HOST:PORT [the options of dispatch but --server]
    egress-hooks check [--config FILE] [--workspace DIR] [--operator-config FILE] [--no-workspace-hooks]

`dispatch` reads the event on stdin and prints the decision on stdout; it
exits 0 whatever the hooks did (hook failures fail open, or closed where a
handler says `"onError": "deny"`, and are logged on stderr). A malformed
*event* is different: that is a bug in the runtime that called us, and
answering "allow" would hide it, so it is a usage error (exit 2, one line on
stderr) - the runtime decides what a failed hook call means.

The operator's `/.agents/hooks.json` (`--operator-config`) is always loaded
first; the workspace's `.agents/hooks.json` (or `--config FILE` in its place)
only adds groups to it (`egress.hooks.layers`).

Exit codes: 0 ok; 1 `check` found problems, `serve` could not listen (or an
internal error); 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from egress import __version__
from egress.hooks import EVENTS

if TYPE_CHECKING:
    from pathlib import Path

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: callers are programs and logs.
        raise UsageError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="egress-hooks", description="Run .agents/hooks.json hooks (SPEC §4, §8).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add_config_options(sub: argparse.ArgumentParser) -> None:
        # Where the configuration comes from: (flag, metavar, help), in --help order.
        for flag, metavar, help_text in (
            ("--config", "FILE", "hooks.json to use in place of the workspace's (the operator's still applies)"),
            ("--workspace", "DIR", "the workspace: DIR/.agents/hooks.json is loaded after the operator's file; also "
             "the cwd of command hooks (default: the current directory)"),
            ("--operator-config", "FILE", "the operator's hooks.json, loaded first and never overridden by the "
             f"workspace's (default: {ROOT_CONFIG})"),
        ):  # fmt: skip
            sub.add_argument(flag, metavar=metavar, help=help_text)
        sub.add_argument(
            "--no-workspace-hooks",
            action="store_true",
            help="load only the operator's file: workspace hooks.json files add nothing",
        )

    def add_run_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--budget",
            metavar="SECONDS",
            type=_budget,
            help="total time for one event's handlers; handlers it leaves no time for are skipped "
            "(default: the sum of their timeouts, at most 600)",
        )
        sub.add_argument("--proxy", metavar="URL", help="proxy for HTTP hooks (default: HTTPS_PROXY/HTTP_PROXY/NO_PROXY)")
        sub.add_argument("--ca-file", metavar="FILE", help="CA bundle for HTTP hooks (default: SSL_CERT_FILE)")

    dispatch = commands.add_parser("dispatch", help="dispatch one event read from stdin")
    dispatch.add_argument("event", metavar="EVENT", choices=EVENTS, help=" or ".join(EVENTS))
    add_config_options(dispatch)
    add_run_options(dispatch)
    dispatch.add_argument(
        "--server", metavar="ADDR", help="send the event to `egress-hooks serve` at unix:PATH or HOST:PORT instead"
    )
    dispatch.add_argument(
        "--fail-closed",
        action="store_true",
        help="with --server: deny a pre_tool_execution event when the server gives no answer (default: allow, as a "
        "failed hook does)",
    )

    serve = commands.add_parser("serve", help="hold one snapshot of the configuration and answer dispatches over a socket")
    serve.add_argument(
        "--listen", metavar="ADDR", required=True, help="unix:PATH (created mode 0600) or HOST:PORT on loopback"
    )
    add_config_options(serve)
    add_run_options(serve)

    check = commands.add_parser("check", help="validate hooks.json: one line per problem")
    add_config_options(check)
    return parser


ROOT_CONFIG = "/.agents/hooks.json"


def _budget(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0 or value > 600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 600 seconds, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _build_parser().parse_args(argv)
        if args.command == "check":
            return _check(args)
        if args.command == "serve":
            return _serve(args)
        if args.server is not None:
            return _dispatch_via_server(args)
        return _dispatch(args)
    except UsageError as exc:
        print(f"egress-hooks: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug here must still read as one line, not a traceback
        print(f"egress-hooks: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS


def _workspace_path(args: argparse.Namespace) -> Path:
    """The workspace file: --config, or WORKSPACE/.agents/hooks.json."""
    from pathlib import Path

    from egress.hooks.layers import workspace_default

    if args.workspace is not None and not Path(args.workspace).is_dir():
        raise UsageError(f"--workspace {args.workspace}: no such directory")
    if args.config is not None:
        _check_config_file("--config", args.config)
        return Path(args.config)
    return workspace_default(args.workspace)


def _check_config_file(flag: str, value: str) -> None:
    from pathlib import Path

    path = Path(value)
    if path.is_dir():
        raise UsageError(f"{flag} {value}: is a directory, not a hooks.json file")
    if not path.exists():
        raise UsageError(f"{flag} {value}: no such file")
    if not path.is_file():
        raise UsageError(f"{flag} {value}: not a regular file")


def _operator_path(args: argparse.Namespace) -> Path | None:
    from pathlib import Path

    # Named on the command line: it must be there (a typo would drop the operator's
    # gate). The default may be absent: then only the workspace file applies.
    if args.operator_config is None:
        return None
    _check_config_file("--operator-config", args.operator_config)
    return Path(args.operator_config)


def _layers(args: argparse.Namespace, *, absolute: bool = True):
    from egress.hooks.layers import load_layers

    # Log lines get absolute paths, so they say which file whatever the reader's
    # directory; `check` prints the paths as the operator typed them.
    operator = _operator_path(args)
    workspace = _workspace_path(args)
    if absolute:
        operator = operator.absolute() if operator is not None else None
        workspace = workspace.absolute()
    return lambda: load_layers(operator, workspace, workspace_hooks=not args.no_workspace_hooks)


def _check_proxy_url(url: str) -> None:
    """--proxy: checked before any hook runs, since a hook that cannot reach its
    endpoint fails open (SPEC §4): a typo here would silently allow every call."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed `[`; the message holds no part of the URL
        raise UsageError(f"--proxy: not a valid URL ({exc})") from None
    # The URL may carry the sandbox's proxy token (http://ENV_ID:TOKEN@gateway:8080):
    # never echo the credentials.
    shown = repr(parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl())
    try:
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"--proxy {shown}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--proxy {shown}: expected http://HOST:PORT (or https://)")
    if port == 0:
        raise UsageError(f"--proxy {shown}: port 0 is not a port to connect to")


def _check_ca_file(ca_file: str) -> None:
    import ssl
    from pathlib import Path

    path = Path(ca_file)
    if path.is_dir():
        raise UsageError(f"--ca-file {ca_file}: is a directory, not a PEM bundle")
    if not path.exists():
        raise UsageError(f"--ca-file {ca_file}: no such file")
    try:
        ssl.create_default_context(cafile=ca_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or "no certificate in it"
        raise UsageError(f"--ca-file {ca_file}: not a PEM CA bundle ({reason})") from None


def _check(args: argparse.Namespace) -> int:
    layered = _layers(args, absolute=False)()
    present = [f for f in layered.files if f.config is not None]
    if not present:
        where = ", ".join(f.path for f in layered.files)
        print(f"no hooks.json found (looked for {where})")
        return EXIT_PROBLEMS
    # One file: its problems as they are; two: each line says which file it is about.
    prefix = len(present) > 1
    for layer, source, problem in layered.problems:
        print(f"{source} ({layer}): {problem}" if prefix else problem)
    for layer, source, note in layered.notes:
        print(f"note: {source} ({layer}): {note}")
    if layered.problems:
        return EXIT_PROBLEMS
    for file in present:
        assert file.config is not None
        groups = [g for g in layered.config.groups if g.source == file.path]
        print(f"{file.path}: ok ({len(groups)} groups{', ' + file.layer if prefix else ''})")
    return EXIT_OK


def _read_event() -> tuple[bytes, dict]:
    from egress.hooks.events import EventError, parse_event

    raw = sys.stdin.buffer.read()
    try:
        return raw, parse_event(raw)
    except EventError as exc:
        raise UsageError(str(exc)) from None


def _write_decision(decision_json: dict) -> None:
    # Bytes, not text: the reason must reach the runtime as UTF-8 whatever the locale.
    sys.stdout.buffer.write(json.dumps(decision_json, ensure_ascii=False).encode("utf-8") + b"\n")
    sys.stdout.flush()


def _dispatch(args: argparse.Namespace) -> int:
    from egress.hooks.dispatcher import DispatchSettings, dispatch, log_problems
    from egress.hooks.events import allow_json

    if args.fail_closed:
        raise UsageError('--fail-closed applies to --server (a handler fails closed with "onError": "deny")')
    if args.proxy is not None:
        _check_proxy_url(args.proxy)
    if args.ca_file is not None:
        _check_ca_file(args.ca_file)
    load = _layers(args)
    _, event = _read_event()
    layered = load()
    log_problems(layered.problems, _log, layered.notes)
    config = layered.config
    tool_name = event["tool_call"]["name"]
    if not any(rule.handlers for _, rule in config.matching_rules(args.event, tool_name)):
        _write_decision(allow_json(args.event))
        return EXIT_OK
    import asyncio  # ~45 ms of the cold start, so only when a hook will run

    from egress.hooks.reaper import Reaper, become_subreaper

    # Orphans of the hooks come back to this process, to be killed (egress.hooks.reaper).
    become_subreaper()
    reaper = Reaper()
    # No metrics: this process exits after one event and nothing scrapes it.
    settings = DispatchSettings(
        cwd=args.workspace, proxy=args.proxy, ca_file=args.ca_file, record_metrics=False, budget=args.budget, reaper=reaper
    )
    decision = asyncio.run(dispatch(config, args.event, event, settings))
    _write_decision(decision.as_json())
    # The runtime has its answer; what the hooks left running goes now, before we exit.
    sys.stdout.close()
    reaper.sweep_until_quiet()
    return EXIT_OK


def _log(record: dict) -> None:
    from egress.hooks.log import log_to_stderr

    log_to_stderr(record)


def _dispatch_via_server(args: argparse.Namespace) -> int:
    """The thin client: nothing of the dispatcher is imported (egress.hooks.client)."""
    from egress.hooks import client

    for flag in ("--config", "--workspace", "--operator-config", "--budget", "--proxy", "--ca-file"):
        if getattr(args, flag.removeprefix("--").replace("-", "_")) is not None:  # argparse's dest for the flag
            raise UsageError(f"{flag} cannot be used with --server: the server holds the configuration")
    if args.no_workspace_hooks:
        raise UsageError("--no-workspace-hooks cannot be used with --server: the server holds the configuration")
    try:
        address = client.parse_address(args.server)
    except ValueError as exc:
        raise UsageError(f"--server {exc}") from None
    raw, _ = _read_event()
    try:
        decision = client.decide(address, args.event, raw)
    except client.EventRefused as exc:
        raise UsageError(str(exc)) from None
    except client.ServerUnavailable as exc:
        decision = client.fallback(args.event, address, str(exc), args.fail_closed, _log)
    _write_decision(decision)
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from egress.hooks import client

    try:
        address = client.parse_address(args.listen)
    except ValueError as exc:
        raise UsageError(f"--listen {exc}") from None
    if not address.is_unix and not client.is_loopback(address.host or ""):
        raise UsageError(f"--listen {args.listen}: TCP listens on loopback only (127.0.0.1, ::1, localhost); "
                         "use unix:PATH to reach the server from elsewhere on this machine")  # fmt: skip
    if args.proxy is not None:
        _check_proxy_url(args.proxy)
    if args.ca_file is not None:
        _check_ca_file(args.ca_file)
    load = _layers(args)

    from egress.hooks.dispatcher import DispatchSettings
    from egress.hooks.reaper import Reaper, become_subreaper
    from egress.hooks.server import HookServer, ListenError, serve

    become_subreaper()
    workspace = str(Path(args.workspace or ".").resolve())
    settings = DispatchSettings(
        cwd=workspace, proxy=args.proxy, ca_file=args.ca_file, record_metrics=False, budget=args.budget, reaper=Reaper()
    )
    server = HookServer(load, settings, _log)
    try:
        asyncio.run(serve(address, server))
    except ListenError as exc:
        print(f"egress-hooks: error: --listen {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    except OSError as exc:
        print(f"egress-hooks: error: --listen {args.listen}: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
