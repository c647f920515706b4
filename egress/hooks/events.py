"""The event a runtime sends: `{"tool_call": {"name": ..., "args": ...}, "environment_id": ...}`.

Shared by `egress-hooks dispatch` (stdin), the dispatch server (request body)
and its thin client, so a malformed event is refused with the same words
everywhere. Only `json` is imported: the thin client must start fast.
"""

from __future__ import annotations

import json
from typing import Any


class EventError(ValueError):
    """The event is malformed: a bug in the runtime that sent it, not a hook failure."""


def parse_event(raw: bytes, where: str = "event on stdin") -> dict[str, Any]:
    try:
        event = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise EventError(f"{where} is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise EventError(f"{where} is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise EventError(f"{where} is not JSON (nested too deeply)") from None
    if not isinstance(event, dict):
        raise EventError(f"{where} must be a JSON object")
    tool_call = event.get("tool_call")
    if not isinstance(tool_call, dict) or not isinstance(tool_call.get("name"), str):
        raise EventError(f'{where} has no "tool_call": {{"name": "..."}}')
    return event


def allow_json(event_name: str) -> dict[str, str]:
    """What the seed answers when no hook says otherwise: allow for pre, `{}` for post."""
    from egress.hooks import PRE_TOOL_EXECUTION

    return {"decision": "allow"} if event_name == PRE_TOOL_EXECUTION else {}
