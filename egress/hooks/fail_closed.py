"""`"onError": "deny"`: a handler whose failure denies instead of allowing.

The seed fails open: a gate that crashes, hangs or prints garbage lets the tool
call through, so that a broken linter cannot deadlock the agent. For a gate
that *is* the guardrail (a publish check, a secrets scanner) that is the wrong
way round; a handler opts in with `"onError": "deny"`. Then, for
`pre_tool_execution` only (a post-tool hook runs after the fact and cannot
block), every failure the seed would read as an allow denies, with a reason
that names the group, the hook and what went wrong, so the model and the
operator both see that the gate failed rather than decided.

Pure functions: the dispatcher passes what happened, these say what it means.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from egress.hooks import PRE_TOOL_EXECUTION
from egress.hooks.config import ON_ERROR_DENY, Handler, HttpHandler
from egress.hooks.decisions import MAX_OUTPUT_BYTES, HandlerOutcome

# The handler was cut short because the event's time budget ran out (not its own timeout).
BUDGET_EXHAUSTED = "budget_exhausted"
# Not run at all: the event's time budget was already spent.
SKIPPED = "skipped_budget_spent"


def hook_label(group: str, layer: str, event: str, rule: int, handler: Handler) -> str:
    """`hook group "gate" (operator), pre_tool_execution[0].hooks[1] (command)`."""
    target = f" to {_host(handler)}" if isinstance(handler, HttpHandler) else ""
    return f"hook group {json.dumps(group)} ({layer}), {event}[{rule}].hooks[{handler.index}] ({handler.type}{target})"


def failure_text(failure: str, details: dict[str, Any], timeout: float, budget: float | None = None) -> str:
    """What went wrong, in words, from a failure code and its details."""
    exit_code = details.get("exit_code")
    status = details.get("status")
    texts = {
        "timeout": f"timed out after {timeout:g} s",
        BUDGET_EXHAUSTED: f"was stopped when the event's time budget of {budget or 0:g} s ran out",
        SKIPPED: f"was not run: the event's time budget of {budget or 0:g} s was spent",
        "spawn_failed": f"could not be started ({details.get('error')})",
        "nonzero_exit": f"exited with status {exit_code}",
        "killed_by_signal": f"was killed by signal {-exit_code if isinstance(exit_code, int) else '?'}",
        "command_not_found": "failed: command not found (exit status 127)",
        "command_not_executable": "failed: command not executable (exit status 126)",
        "deny_with_nonzero_exit": f"printed a deny but exited with status {exit_code}",
        "foreign_exit_status_2": "exited with status 2 (another agent's way to block; here a failure)",
        "request_failed": f"request failed ({details.get('error')})",
        "redirect": f"answered with a redirect (HTTP {status}), which is not followed",
        "http_status": f"answered HTTP {status}",
        "output_too_large": f"gave more than {MAX_OUTPUT_BYTES // (1024 * 1024)} MiB of output, so its decision is unknown",
        "empty_output": "gave no output",
        "unparsable_output": "gave output that is not JSON",
        "not_a_json_object": "gave JSON that is not an object",
        "no_decision": 'gave JSON without a "decision"',
        "unrecognised_decision": 'gave a "decision" that is neither "allow" nor "deny"',
        "foreign_permission_decision": 'answered with "permissionDecision" (another agent\'s format)',
        "foreign_decision_block": 'answered "decision": "block" (another agent\'s format)',
        "foreign_permission": 'answered with "permission" (another agent\'s format)',
        "internal_error": f"could not be run ({details.get('error')})",
    }
    return texts.get(failure, f"failed ({failure})")


def deny_reason(label: str, failure: str, details: dict[str, Any], timeout: float, budget: float | None) -> str:
    text = failure_text(failure, details, timeout, budget)
    return f"Tool call denied: {label} {text}, and its onError is \"deny\"."


def fails_closed(event: str, handler: Handler) -> bool:
    return event == PRE_TOOL_EXECUTION and handler.on_error == ON_ERROR_DENY


def apply_on_error(
    outcome: HandlerOutcome, event: str, label: str, handler: Handler, timeout: float, budget: float | None
) -> HandlerOutcome:
    """The outcome, turned into a deny when it is a failure of a fail-closed handler."""
    if outcome.failure is None or outcome.denied or not fails_closed(event, handler):
        return outcome
    reason = deny_reason(label, outcome.failure, outcome.details, timeout, budget)
    return replace(outcome, closed=True, deny_reason=reason)


def _host(handler: HttpHandler) -> str:
    from urllib.parse import urlsplit

    # Host only: the path or query of a webhook URL is often its secret.
    return urlsplit(handler.url).hostname or "?"
