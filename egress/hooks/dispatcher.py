"""Dispatch one event to every matching handler (SPEC §4, §8), as a library.

    config = load_hooks(workspace="/workspace")        # logs config problems once
    decision = await dispatch(config, "pre_tool_execution", event)
    decision.as_json()   # {"decision": "allow"} / {"decision": "deny", "reason": ...} / {}

The operator's groups run first, then the workspace's (`egress.hooks.layers`);
groups in file order, handlers in declared order, one at a time (a pre
decision depends on the order). For `pre_tool_execution` the first deny
stops everything after it; for `post_tool_execution` every handler runs and
its output is ignored. A handler with `"onError": "deny"` turns its failure
into a deny (`egress.hooks.fail_closed`). The event has a time budget
(default: the sum of its handlers' timeouts, at most 600 s): each handler
gets at most what is left, and handlers it leaves no time for are skipped,
failing open or closed as each one says. Each run is counted in
`egress_hook_runs_total`; each fail-open, fail-closed and skip is logged as
one JSON line.

Command hooks see, besides the event on stdin, `HOOK_EVENT`, `HOOK_TOOL_NAME`
and `HOOK_ENVIRONMENT_ID` in their environment, and run in the workspace.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from egress.hooks import EVENTS, PRE_TOOL_EXECUTION
from egress.hooks.config import (
    MAX_TIMEOUT_SECONDS,
    CommandHandler,
    Group,
    Handler,
    HooksConfig,
    HttpHandler,
    Rule,
)
from egress.hooks.decisions import ERROR, TIMEOUT, HandlerOutcome, judge_command, judge_http
from egress.hooks.fail_closed import BUDGET_EXHAUSTED, SKIPPED, apply_on_error, deny_reason, fails_closed, hook_label
from egress.hooks.log import LogSink, log_to_stderr
from egress.hooks.reaper import RUN_TOKEN_VARIABLE, Reaper

_MAX_LOGGED_STDERR = 1000
# The default budget of an event is the sum of its handlers' timeouts, capped here.
MAX_BUDGET_SECONDS = MAX_TIMEOUT_SECONDS
# What a handler that times out may take beyond its timeout (SIGTERM grace and
# drain in the command runner), counted into the default budget.
_STOP_ALLOWANCE_SECONDS = 0.3
# A handler cut short by the budget is killed without the usual grace.
_BUDGET_STOP_GRACE_SECONDS = 0.05


@dataclass(frozen=True)
class DispatchSettings:
    # Working directory of command hooks (the workspace the config came from).
    cwd: str | None = None
    # HTTP hooks: explicit proxy URL / CA bundle; None = standard env variables.
    proxy: str | None = None
    ca_file: str | None = None
    record_metrics: bool = True
    log: LogSink = field(default=log_to_stderr)
    # Total seconds for one event; None: the sum of its handlers' timeouts (capped).
    budget: float | None = None
    # Kills what a dispatch's command hooks leave running; None: one per dispatch
    # call, swept when it ends (the CLI and the server pass their own).
    reaper: Reaper | None = None


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
    operator_path: str | Path | None = None,
    workspace_hooks: bool = True,
) -> HooksConfig:
    """Load the operator's `/.agents/hooks.json` and the workspace's file (or
    `config_path` in its place); no file means no hooks.

    Problems are logged here, once per load, not on every dispatch.
    """
    from egress.hooks.layers import load_layers, workspace_default

    layered = load_layers(
        operator_path,
        Path(config_path) if config_path is not None else workspace_default(workspace),
        workspace_hooks=workspace_hooks,
    )
    log_problems(layered.problems, log, layered.notes)
    return layered.config


def log_problems(
    problems: tuple[tuple[str, str, str], ...], log: LogSink, notes: tuple[tuple[str, str, str], ...] = ()
) -> None:
    for layer, source, problem in problems:
        log({"msg": "hook_config_problem", "layer": layer, "source": source, "problem": problem})
    for layer, source, note in notes:
        log({"msg": "hook_config_note", "layer": layer, "source": source, "note": note})


async def dispatch(
    config: HooksConfig,
    event_name: str,
    event: Mapping[str, Any],
    settings: DispatchSettings = DEFAULT_SETTINGS,
) -> Decision:
    if event_name not in EVENTS:
        raise ValueError(f"unknown hook event {event_name!r}; expected one of {', '.join(EVENTS)}")
    tool_name = _tool_name(event)
    plan = [(group, rule, handler) for group, rule in config.matching_rules(event_name, tool_name) for handler in rule.handlers]
    if not plan:
        return Decision(event_name)
    budget = settings.budget if settings.budget is not None else default_budget(handler for _, _, handler in plan)
    deadline = time.monotonic() + budget
    # Serialised once, and only when something will read it.
    payload = _serialise(event)
    reaper = settings.reaper or Reaper()
    env = handler_environment(event_name, event, tool_name)
    try:
        return await _run_plan(plan, event_name, tool_name, payload, env, deadline, budget, settings, reaper)
    finally:
        # Our own reaper (HTTP hooks start no process, so only after commands): the
        # /proc scan (~1 ms) runs beside the caller, not before the decision returns.
        # (A caller's event loop waits for it at shutdown: asyncio.run does.)
        if settings.reaper is None and any(isinstance(handler, CommandHandler) for _, _, handler in plan):
            import asyncio  # already loaded: a coroutine of ours is running

            asyncio.get_running_loop().run_in_executor(None, reaper.sweep)


async def _run_plan(
    plan: list[tuple[Group, Rule, Handler]],
    event_name: str,
    tool_name: str,
    payload: bytes,
    env: dict[str, str],
    deadline: float,
    budget: float,
    settings: DispatchSettings,
    reaper: Reaper,
) -> Decision:
    for position, (group, rule, handler) in enumerate(plan):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _skip_rest(plan[position:], event_name, tool_name, budget, settings)
        label = hook_label(group.name, group.layer, event_name, rule.index, handler)
        timeout = min(handler.timeout, remaining)
        cut = timeout < handler.timeout
        # Each command handler's processes carry a token of their own, so what one
        # leaves running is killed before the next one starts.
        token = reaper.start() if isinstance(handler, CommandHandler) else None
        try:
            run_env = {**env, RUN_TOKEN_VARIABLE: token} if token is not None else env
            run = _HandlerRun(event_name, group.name, payload, settings, timeout, run_env, cut)
            outcome, duration_ms = await _run_handler(handler, run)
        finally:
            if token is not None:
                reaper.finish(token)
        if token is not None and any(isinstance(h, CommandHandler) for _, _, h in plan[position + 1 :]):
            import asyncio  # already loaded: this coroutine runs in its loop

            # Tagged processes only: the idle-time orphan rules belong to the caller's sweep.
            await asyncio.get_running_loop().run_in_executor(None, reaper.sweep, True)
        if cut and outcome.outcome == TIMEOUT:
            outcome = HandlerOutcome(TIMEOUT, failure=BUDGET_EXHAUSTED, details={**outcome.details, "budget_s": budget})
        outcome = apply_on_error(outcome, event_name, label, handler, handler.timeout, budget)
        if settings.record_metrics:
            _record(event_name, handler.type, outcome.outcome)
        if outcome.failure is not None:
            settings.log(_failure_record(event_name, tool_name, group, rule.index, handler, outcome, duration_ms))
        if outcome.denied and event_name == PRE_TOOL_EXECUTION:
            return Decision(event_name, denied=True, reason=outcome.deny_reason)
    return Decision(event_name)


def _skip_rest(
    rest: list[tuple[Group, Rule, Handler]], event_name: str, tool_name: str, budget: float, settings: DispatchSettings
) -> Decision:
    """The budget is spent: log every handler not run; the first fail-closed one denies."""
    denial: str | None = None
    for group, rule, handler in rest:
        closed = fails_closed(event_name, handler)
        record = _identity(event_name, tool_name, group, rule.index, handler)
        record.update(msg="hook_skipped", failure=SKIPPED, budget_s=budget, on_error=handler.on_error)
        settings.log(record)
        if closed and denial is None:
            label = hook_label(group.name, group.layer, event_name, rule.index, handler)
            denial = deny_reason(label, SKIPPED, {}, handler.timeout, budget)
    if denial is not None:
        return Decision(event_name, denied=True, reason=denial)
    return Decision(event_name)


def default_budget(handlers: Any) -> float:
    total = sum(handler.timeout + _STOP_ALLOWANCE_SECONDS for handler in handlers)
    return min(total, MAX_BUDGET_SECONDS)


def handler_environment(event_name: str, event: Mapping[str, Any], tool_name: str) -> dict[str, str]:
    """The dispatcher's environment plus what the hook is being run for (the run
    token is added per command handler)."""
    environment_id = event.get("environment_id")
    return {
        **os.environ,
        "HOOK_EVENT": event_name,
        "HOOK_TOOL_NAME": _env_safe(tool_name),
        "HOOK_ENVIRONMENT_ID": _env_safe(environment_id) if isinstance(environment_id, str) else "",
    }


def _env_safe(value: str) -> str:
    # An environment string cannot hold NUL; a lone surrogate has no bytes.
    return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


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


@dataclass(frozen=True)
class _HandlerRun:
    """What one handler run needs besides the handler: the event, its budgeted timeout and environment."""

    event_name: str
    group: str
    payload: bytes
    settings: DispatchSettings
    timeout: float
    env: dict[str, str]
    cut: bool  # the event's budget, not the handler's own timeout, set `timeout`


async def _run_handler(handler: Handler, run: _HandlerRun) -> tuple[HandlerOutcome, float]:
    try:
        if isinstance(handler, CommandHandler):
            return await _run_command_handler(handler, run)
        return await _run_http_handler(handler, run)
    except Exception as exc:  # noqa: BLE001 - a dispatcher bug must fail open, not crash the runtime's call
        return HandlerOutcome(ERROR, failure="internal_error", details={"error": f"{type(exc).__name__}: {exc}"[:300]}), 0.0


async def _run_command_handler(handler: CommandHandler, run: _HandlerRun) -> tuple[HandlerOutcome, float]:
    from egress.hooks.runners.command import TERMINATE_GRACE_SECONDS, run_command

    grace = _BUDGET_STOP_GRACE_SECONDS if run.cut else TERMINATE_GRACE_SECONDS
    result = await run_command(handler.command, run.payload, run.timeout, cwd=run.settings.cwd, env=run.env, grace=grace)
    outcome = judge_command(
        run.event_name,
        run.group,
        exit_code=result.exit_code,
        stdout=result.stdout,
        stdout_truncated=result.stdout_truncated,
        timed_out=result.timed_out,
        spawn_error=result.spawn_error,
        stderr=result.stderr_tail,
    )
    if outcome.failure is not None and result.stderr_tail:
        stderr = result.stderr_tail.decode("utf-8", "replace")[-_MAX_LOGGED_STDERR:]
        outcome = HandlerOutcome(outcome.outcome, outcome.deny_reason, outcome.failure, {**outcome.details, "stderr": stderr})
    return outcome, result.duration_ms


async def _run_http_handler(handler: HttpHandler, run: _HandlerRun) -> tuple[HandlerOutcome, float]:
    from egress.hooks.runners.http import post_event

    settings = run.settings
    result = await post_event(handler.url, run.payload, handler.headers, run.timeout, proxy=settings.proxy, ca_file=settings.ca_file)
    status, body, truncated = result.status, result.body, result.body_truncated
    outcome = judge_http(run.event_name, run.group, status=status, body=body, body_truncated=truncated,
                         timed_out=result.timed_out, error=result.error)  # fmt: skip
    return outcome, result.duration_ms


def _record(event_name: str, handler_type: str, outcome: str) -> None:
    from egress.hooks.metrics import record_hook_run

    record_hook_run(event_name, handler_type, outcome)


def _identity(event_name: str, tool_name: str, group: Group, rule_index: int, handler: Handler) -> dict[str, Any]:
    record: dict[str, Any] = {
        "event": event_name,
        "tool": tool_name,
        "group": group.name,
        "layer": group.layer,
        "rule": rule_index,
        "handler": handler.index,
        "type": handler.type,
    }
    if isinstance(handler, HttpHandler):
        # Host only: the path or query of a webhook URL is often its secret.
        record["host"] = urlsplit(handler.url).hostname
    return record


def _failure_record(
    event_name: str,
    tool_name: str,
    group: Group,
    rule_index: int,
    handler: Handler,
    outcome: HandlerOutcome,
    duration_ms: float,
) -> dict[str, Any]:
    record: dict[str, Any] = {"msg": "hook_fail_closed" if outcome.closed else "hook_fail_open"}
    record.update(_identity(event_name, tool_name, group, rule_index, handler))
    record.update(
        outcome=outcome.outcome,
        failure=outcome.failure,
        duration_ms=duration_ms,
        timeout_s=handler.timeout,
        on_error=handler.on_error,
    )
    record.update(outcome.details)
    return record
