"""`egress-hooks`: the dispatcher as commands (SPEC §6).

    egress-hooks dispatch EVENT [--config FILE] [--workspace DIR] [--proxy URL] [--ca-file FILE]
    egress-hooks check [--config FILE] [--workspace DIR]

`dispatch` reads the event on stdin and prints the decision on stdout; it
exits 0 whatever the hooks did (hook failures fail open and are logged on
stderr). A malformed *event* is different: that is a bug in the runtime that
called us, and answering "allow" would hide it, so it is a usage error (exit
2, one line on stderr) - the runtime decides what a failed hook call means.

Exit codes: 0 ok; 1 `check` found problems (or an internal error); 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from egress import __version__
from egress.hooks import EVENTS, PRE_TOOL_EXECUTION

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
    parser = _Parser(prog="egress-hooks", description="Run .agents/hooks.json hooks (SPEC §4).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add_config_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--config", metavar="FILE", help="hooks.json to use instead of discovering one")
        sub.add_argument(
            "--workspace",
            metavar="DIR",
            help="look for DIR/.agents/hooks.json before /.agents/hooks.json; also the cwd of command hooks "
            "(default: the current directory)",
        )

    dispatch = commands.add_parser("dispatch", help="dispatch one event read from stdin")
    dispatch.add_argument("event", metavar="EVENT", choices=EVENTS, help=" or ".join(EVENTS))
    add_config_options(dispatch)
    dispatch.add_argument("--proxy", metavar="URL", help="proxy for HTTP hooks (default: HTTPS_PROXY/HTTP_PROXY/NO_PROXY)")
    dispatch.add_argument("--ca-file", metavar="FILE", help="CA bundle for HTTP hooks (default: SSL_CERT_FILE)")

    check = commands.add_parser("check", help="validate hooks.json: one line per problem")
    add_config_options(check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _build_parser().parse_args(argv)
        if args.command == "check":
            return _check(args)
        return _dispatch(args)
    except UsageError as exc:
        print(f"egress-hooks: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug here must still read as one line, not a traceback
        print(f"egress-hooks: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS


def _config_path(args: argparse.Namespace) -> Path | None:
    from egress.hooks.config import discover_config

    if args.workspace is not None and not Path(args.workspace).is_dir():
        raise UsageError(f"--workspace {args.workspace}: no such directory")
    if args.config is not None:
        path = Path(args.config)
        if path.is_dir():
            raise UsageError(f"--config {args.config}: is a directory, not a hooks.json file")
        if not path.exists():
            raise UsageError(f"--config {args.config}: no such file")
        if not path.is_file():
            raise UsageError(f"--config {args.config}: not a regular file")
        return path
    return discover_config(args.workspace or ".")


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
    from egress.hooks.config import CONFIG_RELATIVE_PATH, ROOT_CONFIG_PATH, load_config

    path = _config_path(args)
    if path is None:
        where = Path(args.workspace or ".") / CONFIG_RELATIVE_PATH
        print(f"no hooks.json found (looked for {where} and {ROOT_CONFIG_PATH})")
        return EXIT_PROBLEMS
    config = load_config(path)
    for problem in config.problems:
        print(problem)
    if config.problems:
        return EXIT_PROBLEMS
    print(f"{path}: ok ({len(config.groups)} groups)")
    return EXIT_OK


def _read_event() -> dict:
    raw = sys.stdin.buffer.read()
    try:
        event = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"event on stdin is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"event on stdin is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    if not isinstance(event, dict):
        raise UsageError("event on stdin must be a JSON object")
    tool_call = event.get("tool_call")
    if not isinstance(tool_call, dict) or not isinstance(tool_call.get("name"), str):
        raise UsageError('event on stdin has no "tool_call": {"name": "..."}')
    return event


def _dispatch(args: argparse.Namespace) -> int:
    from egress.hooks.dispatcher import DispatchSettings, dispatch, load_hooks

    if args.proxy is not None:
        _check_proxy_url(args.proxy)
    if args.ca_file is not None:
        _check_ca_file(args.ca_file)
    path = _config_path(args)
    event = _read_event()
    config = load_hooks(path) if path is not None else None
    tool_name = event["tool_call"]["name"]
    if config is None or not any(rule.handlers for _, rule in config.matching_rules(args.event, tool_name)):
        decision_json = {"decision": "allow"} if args.event == PRE_TOOL_EXECUTION else {}
    else:
        import asyncio  # ~45 ms of the cold start, so only when a hook will run

        # No metrics: this process exits after one event and nothing scrapes it.
        settings = DispatchSettings(cwd=args.workspace, proxy=args.proxy, ca_file=args.ca_file, record_metrics=False)
        decision = asyncio.run(dispatch(config, args.event, event, settings))
        decision_json = decision.as_json()
    # Bytes, not text: the reason must reach the runtime as UTF-8 whatever the locale.
    sys.stdout.buffer.write(json.dumps(decision_json, ensure_ascii=False).encode("utf-8") + b"\n")
    sys.stdout.flush()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
