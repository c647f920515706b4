"""Dispatch one event to every matching handler (SPEC §4), as a library.

    config = load_hooks(workspace="/workspace")        # logs config problems once
    decision = await dispatch(config, "pre_tool_execution", event)
    decision.as_json()   # {"decision": "allow"} / {"decision": "deny", "reason": ...} / {}

Groups run in file order, handlers in declared order, one at a time (a pre
decision depends on the order). For `pre_tool_execution` the first deny
stops everything after it; for `post_tool_execution` every handler runs and
its output is ignored. Each run is counted in `egress_hook_runs_total`;
each fail-open is logged as one JSON line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from egress.hooks import EVENTS, PRE_TOOL_EXECUTION
from egress.hooks.config import (
    CommandHandler,
    Handler,
    HooksConfig,
    HttpHandler,
    discover_config,
    load_config,
)
from egress.hooks.decisions import ERROR, HandlerOutcome, judge_command, judge_http
from egress.hooks.log import LogSink, log_to_stderr

_MAX_LOGGED_STDERR = 1000


@dataclass(frozen=True)
class DispatchSettings:
    # Working directory of command hooks (the workspace the config came from).
    cwd: str | None = None
    # HTTP hooks: explicit proxy URL / CA bundle; None = standard env variables.
    proxy: str | None = None
    ca_file: str | None = None
    record_metrics: bool = True
    log: LogSink = field(default=log_to_stderr)


DEFAULT_SETTINGS = DispatchSettings()  # frozen, so one shared default is safe


@dataclass(frozen=True)
class Decision:
    event: str
    denied: bool = False
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        if self.event != PRE_TOOL_EXECUTION:
            return {}
        if self.denied:
            return {"decision": "deny", "reason": self.reason}
        return {"decision": "allow"}


def load_hooks(
    config_path: str | Path | None = None,
    *,
    workspace: str | Path | None = None,
    log: LogSink = log_to_stderr,
) -> HooksConfig:
    """Load the explicit or discovered hooks.json; no file means no hooks.

    Problems are logged here, once per load, not on every dispatch.
    """
    path = Path(config_path) if config_path is not None else discover_config(workspace)
    if path is None:
        return HooksConfig()
    config = load_config(path)
    for problem in config.problems:
        log({"msg": "hook_config_problem", "source": config.source, "problem": problem})
    return config


async def dispatch(
    config: HooksConfig,
    event_name: str,
    event: Mapping[str, Any],
    settings: DispatchSettings = DEFAULT_SETTINGS,
) -> Decision:
    if event_name not in EVENTS:
        raise ValueError(f"unknown hook event {event_name!r}; expected one of {', '.join(EVENTS)}")
    tool_name = _tool_name(event)
    payload: bytes | None = None
    for group, rule in config.matching_rules(event_name, tool_name):
        for handler in rule.handlers:
            if payload is None:
                # Serialised once, and only when something will read it.
                payload = _serialise(event)
            outcome, duration_ms = await _run_handler(handler, event_name, group.name, payload, settings)
            if settings.record_metrics:
                _record(event_name, handler.type, outcome.outcome)
            if outcome.failure is not None:
                settings.log(_fail_open_record(event_name, tool_name, group.name, rule.index, handler, outcome, duration_ms))
            if outcome.denied and event_name == PRE_TOOL_EXECUTION:
                return Decision(event_name, denied=True, reason=outcome.deny_reason)
    return Decision(event_name)


def _serialise(event: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (JSON allows "\ud800") has no UTF-8 form; escaped
        # output is plain ASCII and still the same JSON value.
        return json.dumps(event, separators=(",", ":")).encode("ascii")


def _tool_name(event: Mapping[str, Any]) -> str:
    tool_call = event.get("tool_call")
    name = tool_call.get("name") if isinstance(tool_call, Mapping) else None
    if not isinstance(name, str):
        raise ValueError("event has no tool_call.name string")  # noqa: TRY004 - bad input value, whatever its type
    return name


async def _run_handler(
    handler: Handler, event_name: str, group: str, payload: bytes, settings: DispatchSettings
) -> tuple[HandlerOutcome, float]:
    try:
        if isinstance(handler, CommandHandler):
            return await _run_command_handler(handler, event_name, group, payload, settings)
        return await _run_http_handler(handler, event_name, group, payload, settings)
    except Exception as exc:  # noqa: BLE001 - a dispatcher bug must fail open, not crash the runtime's call
        return HandlerOutcome(ERROR, failure="internal_error", details={"error": f"{type(exc).__name__}: {exc}"[:300]}), 0.0


async def _run_command_handler(
    handler: CommandHandler, event_name: str, group: str, payload: bytes, settings: DispatchSettings
) -> tuple[HandlerOutcome, float]:
    from egress.hooks.runners.command import run_command

    result = await run_command(handler.command, payload, handler.timeout, cwd=settings.cwd)
    outcome = judge_command(
        event_name,
        group,
        exit_code=result.exit_code,
        stdout=result.stdout,
        stdout_truncated=result.stdout_truncated,
        timed_out=result.timed_out,
        spawn_error=result.spawn_error,
    )
    if outcome.failure is not None and result.stderr_tail:
        stderr = result.stderr_tail.decode("utf-8", "replace")[-_MAX_LOGGED_STDERR:]
        outcome = HandlerOutcome(outcome.outcome, outcome.deny_reason, outcome.failure, {**outcome.details, "stderr": stderr})
    return outcome, result.duration_ms


async def _run_http_handler(
    handler: HttpHandler, event_name: str, group: str, payload: bytes, settings: DispatchSettings
) -> tuple[HandlerOutcome, float]:
    from egress.hooks.runners.http import post_event

    result = await post_event(
        handler.url, payload, handler.headers, handler.timeout, proxy=settings.proxy, ca_file=settings.ca_file
    )
    outcome = judge_http(
        event_name,
        group,
        status=result.status,
        body=result.body,
        body_truncated=result.body_truncated,
        timed_out=result.timed_out,
        error=result.error,
    )
    return outcome, result.duration_ms


def _record(event_name: str, handler_type: str, outcome: str) -> None:
    from egress.hooks.metrics import record_hook_run

    record_hook_run(event_name, handler_type, outcome)


def _fail_open_record(
    event_name: str,
    tool_name: str,
    group: str,
    rule_index: int,
    handler: Handler,
    outcome: HandlerOutcome,
    duration_ms: float,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "msg": "hook_fail_open",
        "event": event_name,
        "tool": tool_name,
        "group": group,
        "rule": rule_index,
        "handler": handler.index,
        "type": handler.type,
        "outcome": outcome.outcome,
        "failure": outcome.failure,
        "duration_ms": duration_ms,
        "timeout_s": handler.timeout,
    }
    if isinstance(handler, HttpHandler):
        # Host only: the path or query of a webhook URL is often its secret.
        record["host"] = urlsplit(handler.url).hostname
    record.update(outcome.details)
    return record
