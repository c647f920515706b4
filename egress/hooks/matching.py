"""Matchers: RE2 patterns fully matched, case-sensitively, against a tool name.

RE2 rather than `re` because the pattern comes from a file the agent may be
able to write: RE2 runs in linear time, so no pattern can stall the dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import re2

# `*` is not a valid regex, but the seed page documents it (with `.*` and "")
# as the catch-all, so it is special-cased before compiling.
_MATCH_ALL_PATTERNS = frozenset({"*", ""})


def _re2_options() -> Any:
    options = re2.Options()
    # RE2 otherwise prints parse errors straight to stderr through absl, which
    # would corrupt the dispatcher's one-JSON-object-per-line log.
    options.log_errors = False
    return options


_OPTIONS = _re2_options()


@dataclass(frozen=True)
class Matcher:
    """A compiled matcher. An invalid pattern keeps its `error` and matches nothing."""

    pattern: str
    _regex: Any = None
    match_all: bool = False
    error: str | None = None

    def matches(self, tool_name: str) -> bool:
        if self.match_all:
            return True
        if self._regex is None:
            return False
        return self._regex.fullmatch(tool_name) is not None


def compile_matcher(pattern: str) -> Matcher:
    if pattern in _MATCH_ALL_PATTERNS:
        return Matcher(pattern, match_all=True)
    try:
        regex = re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        return Matcher(pattern, error=_error_text(exc))
    return Matcher(pattern, _regex=regex)


def _error_text(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else exc
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    return f"invalid RE2 pattern: {detail}"
