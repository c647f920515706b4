"""What a handler's run means: allow, deny, or a logged fail-open (SPEC §4).

Pure functions over what the runners observed. The rule the page sets is
narrow on purpose: only `{"decision": "deny"}` (that exact value, from a run
that otherwise succeeded) denies; anything else allows. Every allow that was
not an explicit, well-formed `{"decision": "allow"}` from a successful run is
a *fail-open* and carries a `failure` code so the dispatcher logs it - a gate
that crashes or prints garbage must not look like a gate that said yes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from egress.hooks import PRE_TOOL_EXECUTION

MAX_OUTPUT_BYTES = 1 << 20  # stdout / response body kept for parsing

# Metric outcomes (`egress_hook_runs_total{outcome}`).
ALLOW = "allow"
DENY = "deny"
ERROR = "error"
TIMEOUT = "timeout"

_BOM = "\ufeff"
_EXIT_COMMAND_NOT_FOUND = 127
_EXIT_NOT_EXECUTABLE = 126
_EXIT_FOREIGN_BLOCK = 2


@dataclass(frozen=True)
class ParsedOutput:
    """A decision read from hook output. `problem` is set when it was not one."""

    deny: bool = False
    reason: str | None = None
    problem: str | None = None
    # A block in another agent's hook format (see `_foreign_block`): what it said.
    foreign_reason: str | None = None


@dataclass(frozen=True)
class HandlerOutcome:
    outcome: str
    deny_reason: str | None = None
    # Short machine-readable code for a fail-open; None when the handler
    # worked as designed.
    failure: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # A failure turned into a deny by the handler's `"onError": "deny"`.
    closed: bool = False

    @property
    def denied(self) -> bool:
        return self.outcome == DENY or self.closed


def default_deny_reason(group: str) -> str:
    return f"Tool call denied by hook group {json.dumps(group)}."


def parse_decision_output(raw: bytes, truncated: bool = False) -> ParsedOutput:
    """Read a decision from hook stdout / an HTTP body."""
    if truncated:
        # The end of the output is missing, so whatever it said is unknown.
        return ParsedOutput(problem="output_too_large")
    # Decoded once, at the end, so a multi-byte character split across reads
    # cannot turn into garbage; invalid bytes become U+FFFD instead of failing.
    text = raw.decode("utf-8", "replace").lstrip(_BOM).strip()
    if not text:
        return ParsedOutput(problem="empty_output")
    try:
        document = json.loads(text, object_pairs_hook=_DecisionObject)
    except (json.JSONDecodeError, RecursionError):
        return ParsedOutput(problem="unparsable_output")
    if not isinstance(document, _DecisionObject):  # every JSON object is one (object_pairs_hook)
        return ParsedOutput(problem="not_a_json_object")
    # `{"decision": "allow", "decision": "deny"}`: a JSON parser would keep the
    # last value; an ambiguous answer from a gate is read as the deny it contains.
    if "deny" in document.decision_values:
        reason = document.get("reason")
        return ParsedOutput(deny=True, reason=reason.strip() if isinstance(reason, str) and reason.strip() else None)
    decision = document.get("decision")
    if decision == "allow":
        return ParsedOutput()
    foreign = _foreign_block(document)
    if foreign is not None:
        return ParsedOutput(problem=foreign[0], foreign_reason=foreign[1])
    if "decision" not in document:
        return ParsedOutput(problem="no_decision")
    return ParsedOutput(problem="unrecognised_decision")


_FOREIGN_REASON_CHARS = 300


def _foreign_block(document: dict) -> tuple[str, str] | None:
    """A "block" in another agent's format, as (failure code, its reason text).

    Claude Code's `permissionDecision` (top level or in `hookSpecificOutput`),
    `"decision": "block"` (Claude Code, Codex), Cursor's `"permission"`. The
    seed reads each as an allow; it stays one, but the log says which format it
    was, so an operator sees why a gate written for another agent did not hold.
    """
    specific = document.get("hookSpecificOutput")
    for body in (document, specific if isinstance(specific, dict) else {}):
        if body.get("permissionDecision") in ("deny", "ask"):
            return "foreign_permission_decision", _text(body.get("permissionDecisionReason"))
    if document.get("decision") == "block":
        return "foreign_decision_block", _text(document.get("reason"))
    if document.get("permission") in ("deny", "ask"):
        return "foreign_permission", _text(document.get("agent_message") or document.get("user_message"))
    return None


def _text(value: Any) -> str:
    return value[:_FOREIGN_REASON_CHARS] if isinstance(value, str) else ""


class _DecisionObject(dict):
    """A JSON object that remembers every `decision` value, repeats included."""

    def __init__(self, pairs: list[tuple[str, Any]]):
        super().__init__(pairs)
        self.decision_values = [value for key, value in pairs if key == "decision"]


def judge_command(
    event: str,
    group: str,
    *,
    exit_code: int | None,
    stdout: bytes,
    stdout_truncated: bool,
    timed_out: bool,
    spawn_error: str | None = None,
    stderr: bytes = b"",
) -> HandlerOutcome:
    if spawn_error is not None:
        return HandlerOutcome(ERROR, failure="spawn_failed", details={"error": spawn_error})
    if timed_out:
        return HandlerOutcome(TIMEOUT, failure="timeout", details={"exit_code": exit_code})
    details: dict[str, Any] = {"exit_code": exit_code}
    if exit_code != 0:
        if event == PRE_TOOL_EXECUTION and parse_decision_output(stdout, stdout_truncated).deny:
            # The page: a crash is an allow. A deny from a script that then
            # failed is still a crash; logged distinctly so it is noticed.
            return HandlerOutcome(ERROR, failure="deny_with_nonzero_exit", details=details)
        if exit_code == _EXIT_FOREIGN_BLOCK and stderr.strip():
            # Claude Code's "exit 2, reason on stderr" block: a crash to the seed.
            reason = stderr.decode("utf-8", "replace").strip()[-_FOREIGN_REASON_CHARS:]
            return HandlerOutcome(ERROR, failure="foreign_exit_status_2", details={**details, "foreign_reason": reason})
        return HandlerOutcome(ERROR, failure=_exit_failure(exit_code), details=details)
    if event != PRE_TOOL_EXECUTION:
        return HandlerOutcome(ALLOW, details=details)
    return _judge_output(group, stdout, stdout_truncated, details)


def judge_http(
    event: str,
    group: str,
    *,
    status: int | None,
    body: bytes,
    body_truncated: bool,
    timed_out: bool,
    error: str | None = None,
) -> HandlerOutcome:
    if timed_out:
        return HandlerOutcome(TIMEOUT, failure="timeout", details={"status": status})
    if error is not None or status is None:
        return HandlerOutcome(ERROR, failure="request_failed", details={"error": error})
    details: dict[str, Any] = {"status": status}
    if 300 <= status < 400:
        # Redirects are not followed: the target would be chosen by the
        # server, not by hooks.json and the allowlist reviewer.
        return HandlerOutcome(ERROR, failure="redirect", details=details)
    if not 200 <= status < 300:
        return HandlerOutcome(ERROR, failure="http_status", details=details)
    if event != PRE_TOOL_EXECUTION:
        return HandlerOutcome(ALLOW, details=details)
    return _judge_output(group, body, body_truncated, details)


def _judge_output(group: str, output: bytes, truncated: bool, details: dict[str, Any]) -> HandlerOutcome:
    parsed = parse_decision_output(output, truncated)
    if parsed.deny:
        return HandlerOutcome(DENY, deny_reason=parsed.reason or default_deny_reason(group), details=details)
    if parsed.problem is not None:
        if parsed.foreign_reason is not None:
            details = {**details, "foreign_reason": parsed.foreign_reason}
        return HandlerOutcome(ERROR, failure=parsed.problem, details=details)
    return HandlerOutcome(ALLOW, details=details)


def _exit_failure(exit_code: int | None) -> str:
    if exit_code == _EXIT_COMMAND_NOT_FOUND:
        return "command_not_found"
    if exit_code == _EXIT_NOT_EXECUTABLE:
        return "command_not_executable"
    if exit_code is not None and exit_code < 0:
        return "killed_by_signal"
    return "nonzero_exit"
