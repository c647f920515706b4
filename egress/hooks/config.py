"""`.agents/hooks.json`: discovery, parsing and validation (SPEC §4).

Parsing never raises. Every problem becomes one line naming the group, event,
rule index, handler index and field, and the parser keeps going, so one
`egress-hooks check` run shows them all. At dispatch time the usable rest of
the file still runs: a typo in one group must not switch off the security
gate in another. Where a field is broken the fallback is the one that keeps
hooks running (see `_parse_enabled`, `_parse_timeout`), because a hook that
silently stops running is the failure this module exists to make visible.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from egress.hooks import EVENTS
from egress.hooks.matching import Matcher, compile_matcher

CONFIG_RELATIVE_PATH = Path(".agents") / "hooks.json"
ROOT_CONFIG_PATH = Path("/") / CONFIG_RELATIVE_PATH
DEFAULT_TIMEOUT_SECONDS = 30.0
# Above this a handler's timeout is a problem and this is used: the agent waits on
# every pre-tool hook synchronously, and nothing a hook does should hold a tool call
# for longer than ten minutes.
MAX_TIMEOUT_SECONDS = 600.0
ON_ERROR_ALLOW = "allow"  # the seed's fail-open
ON_ERROR_DENY = "deny"
# Operator and workspace file (see `egress.hooks.layers`).
OPERATOR = "operator"
WORKSPACE = "workspace"
# A top-level key that is not a group: it starts with `$`, which the seed's group
# names never do. Read from the operator's file only.
SETTINGS_KEY = "$settings"

_GROUP_FIELDS = ("enabled", *EVENTS)
_RULE_FIELDS = ("matcher", "hooks")
_HANDLER_FIELDS = {
    "command": ("type", "command", "timeout", "onError"),
    "http": ("type", "url", "headers", "timeout", "onError"),
}
_SETTINGS_FIELDS = ("workspaceHooks",)
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # fullmatch: `$` would pass a final newline
_HEADER_VALUE_FORBIDDEN = re.compile(r"[\r\n\x00]")


@dataclass(frozen=True)
class CommandHandler:
    index: int
    command: str
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    on_error: str = ON_ERROR_ALLOW
    type: str = field(default="command", init=False)


@dataclass(frozen=True)
class HttpHandler:
    index: int
    url: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    on_error: str = ON_ERROR_ALLOW
    type: str = field(default="http", init=False)


Handler = CommandHandler | HttpHandler


@dataclass(frozen=True)
class Rule:
    index: int
    matcher: Matcher
    handlers: tuple[Handler, ...]


@dataclass(frozen=True)
class Group:
    name: str
    enabled: bool
    rules: dict[str, tuple[Rule, ...]]
    # Which file it came from: OPERATOR or WORKSPACE (set by `egress.hooks.layers`).
    layer: str = WORKSPACE
    source: str | None = None


@dataclass(frozen=True)
class Settings:
    """`"$settings"` of the operator's file. None: not said (the default applies)."""

    workspace_hooks: bool | None = None


@dataclass(frozen=True)
class HooksConfig:
    groups: tuple[Group, ...] = ()
    problems: tuple[str, ...] = ()
    source: str | None = None
    settings: Settings = Settings()
    # False when the file could not be read or parsed at all (no group came from it).
    readable: bool = True

    def matching_rules(self, event: str, tool_name: str) -> Iterator[tuple[Group, Rule]]:
        """Enabled groups' rules for `event` that match `tool_name`, in file order."""
        for group in self.groups:
            if not group.enabled:
                continue
            for rule in group.rules.get(event, ()):
                if rule.matcher.matches(tool_name):
                    yield group, rule


def discover_config(workspace: str | Path | None) -> Path | None:
    """The seed's discovery: `.agents/hooks.json` under the workspace, else
    `/.agents/hooks.json`, else None. The dispatcher no longer uses it alone (the
    first file found would let the workspace's replace the operator's); it loads
    both through `egress.hooks.layers`."""
    candidates = []
    if workspace is not None:
        candidates.append(Path(workspace) / CONFIG_RELATIVE_PATH)
    candidates.append(ROOT_CONFIG_PATH)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


def load_config(path: str | Path, *, settings_allowed: bool = False) -> HooksConfig:
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        return HooksConfig(problems=(f"{path}: cannot read: {exc.strerror or exc}",), source=str(path), readable=False)
    if len(data) > MAX_CONFIG_BYTES:
        problem = f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB, not a hooks.json"
        return HooksConfig(problems=(problem,), source=str(path), readable=False)
    return parse_config(data, source=str(path), settings_allowed=settings_allowed)


# Read on every tool call: a few kilobytes in practice, and never read whole when it is
# some other (large) file.
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def parse_config(data: str | bytes, source: str | None = None, *, settings_allowed: bool = False) -> HooksConfig:
    """`settings_allowed`: the file is the operator's, whose `"$settings"` is read."""
    where = source or "hooks.json"
    if isinstance(data, bytes):
        try:
            # utf-8-sig: editors on some platforms save JSON with a BOM.
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            problem = f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})"
            return HooksConfig(problems=(problem,), source=source, readable=False)
    try:
        document = json.loads(data, object_pairs_hook=_JsonObject)
    except json.JSONDecodeError as exc:
        return HooksConfig(
            problems=(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",),
            source=source,
            readable=False,
        )
    except RecursionError:  # json recurses per nesting level
        return HooksConfig(problems=(f"{where}: invalid JSON: nested too deeply",), source=source, readable=False)
    parser = _Parser(settings_allowed=settings_allowed)
    groups = parser.parse_document(document)
    return HooksConfig(
        groups=tuple(groups), problems=tuple(parser.problems), source=source, settings=parser.settings
    )


class _JsonObject(dict):
    """A JSON object that remembers every key/value pair, duplicates included.

    `json` keeps only the last value of a repeated key; with two groups of the
    same name that would silently drop one of them.
    """

    def __init__(self, pairs: list[tuple[str, Any]]):
        super().__init__(pairs)
        self.pairs = pairs

    def duplicate_keys(self) -> list[str]:
        seen: set[str] = set()
        duplicates = []
        for key, _ in self.pairs:
            if key in seen and key not in duplicates:
                duplicates.append(key)
            seen.add(key)
        return duplicates


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class _Parser:
    def __init__(self, settings_allowed: bool = False) -> None:
        self.problems: list[str] = []
        self.settings_allowed = settings_allowed
        self.settings = Settings()

    def problem(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def parse_document(self, document: Any) -> list[Group]:
        if not isinstance(document, _JsonObject):
            self.problem("top level", f"must be an object of named groups, got {_type_name(document)}")
            return []
        groups = []
        for name in document.duplicate_keys():
            self.problem(
                f"group {json.dumps(name)}",
                "duplicate group name (a JSON parser would silently keep only the last one); "
                "every copy is run, in file order",
            )
        occurrences: dict[str, int] = {}
        for name, body in document.pairs:
            if name == SETTINGS_KEY:
                self.parse_settings(body)
                continue
            occurrences[name] = occurrences.get(name, 0) + 1
            label = f"group {json.dumps(name)}"
            if occurrences[name] > 1:
                label += f" (copy {occurrences[name]})"
            group = self.parse_group(name, label, body)
            if group is not None:
                groups.append(group)
        return groups

    def parse_settings(self, body: Any) -> None:
        where = json.dumps(SETTINGS_KEY)
        if not self.settings_allowed:
            self.problem(where, "settings are read from the operator's /.agents/hooks.json only; ignored")
            return
        if not isinstance(body, _JsonObject):
            self.problem(where, f"must be an object, got {_type_name(body)}; ignored")
            return
        self.check_fields(where, body, _SETTINGS_FIELDS)
        if "workspaceHooks" in body:
            value = body["workspaceHooks"]
            if not isinstance(value, bool):
                # Said, but not plainly: read as the stricter choice, since the
                # operator wrote the key to change the default.
                self.problem(
                    f"{where}.workspaceHooks",
                    f"must be true or false, got {json.dumps(value)}; workspace hooks.json files are not loaded",
                )
                value = False
            self.settings = Settings(workspace_hooks=value)

    def parse_group(self, name: str, where: str, body: Any) -> Group | None:
        if not isinstance(body, _JsonObject):
            self.problem(where, f"must be an object, got {_type_name(body)}")
            return None
        self.check_fields(where, body, _GROUP_FIELDS)
        enabled = self.parse_enabled(where, body)
        rules: dict[str, tuple[Rule, ...]] = {}
        for event in EVENTS:
            if event in body:
                rules[event] = tuple(self.parse_rules(f"{where}: {event}", body[event]))
        return Group(name=name, enabled=enabled, rules=rules)

    def parse_enabled(self, where: str, body: dict) -> bool:
        value = body.get("enabled", True)
        if isinstance(value, bool):
            return value
        # "false" (a string) probably meant false, but guessing could switch a
        # gate off; the group keeps running until the file says so plainly.
        self.problem(f"{where}: enabled", f"must be true or false, got {json.dumps(value)}; the group stays enabled")
        return True

    def parse_rules(self, where: str, value: Any) -> Iterator[Rule]:
        if not isinstance(value, list):
            self.problem(where, f"must be an array of rules, got {_type_name(value)}")
            return
        for index, body in enumerate(value):
            rule = self.parse_rule(f"{where}[{index}]", index, body)
            if rule is not None:
                yield rule

    def parse_rule(self, where: str, index: int, body: Any) -> Rule | None:
        if not isinstance(body, _JsonObject):
            self.problem(where, f"must be an object, got {_type_name(body)}")
            return None
        self.check_fields(where, body, _RULE_FIELDS)
        matcher = self.parse_matcher(f"{where}.matcher", body)
        if "hooks" not in body:
            self.problem(f"{where}.hooks", "missing (an array of handlers)")
            handlers: tuple[Handler, ...] = ()
        elif not isinstance(body["hooks"], list):
            self.problem(f"{where}.hooks", f"must be an array of handlers, got {_type_name(body['hooks'])}")
            handlers = ()
        else:
            handlers = tuple(
                handler
                for position, item in enumerate(body["hooks"])
                if (handler := self.parse_handler(f"{where}.hooks[{position}]", position, item)) is not None
            )
        return Rule(index=index, matcher=matcher, handlers=handlers)

    def parse_matcher(self, where: str, body: dict) -> Matcher:
        if "matcher" not in body:
            self.problem(where, 'missing; treated as "*" (every tool) - write "*" to say so')
            return compile_matcher("*")
        pattern = body["matcher"]
        if not isinstance(pattern, str):
            self.problem(where, f"must be a string, got {_type_name(pattern)}; the rule matches nothing")
            return Matcher(pattern=str(pattern), error="not a string")
        matcher = compile_matcher(pattern)
        if matcher.error is not None:
            self.problem(where, f"{json.dumps(pattern)} is an {matcher.error}; the rule matches nothing")
        return matcher

    def parse_handler(self, where: str, index: int, body: Any) -> Handler | None:
        if not isinstance(body, _JsonObject):
            self.problem(where, f"must be an object, got {_type_name(body)}; skipped")
            return None
        handler_type = body.get("type")
        if handler_type not in _HANDLER_FIELDS:
            got = "missing" if "type" not in body else f"got {json.dumps(handler_type)}"
            self.problem(f"{where}.type", f'must be "command" or "http", {got}; skipped')
            return None
        self.check_fields(where, body, _HANDLER_FIELDS[handler_type])
        timeout = self.parse_timeout(f"{where}.timeout", body)
        on_error = self.parse_on_error(f"{where}.onError", body)
        if handler_type == "command":
            command = body.get("command")
            if not isinstance(command, str) or not command.strip():
                self.problem(f"{where}.command", f"must be a non-empty string, {self.describe(body, 'command')}; skipped")
                return None
            return CommandHandler(index=index, command=command, timeout=timeout, on_error=on_error)
        url = body.get("url")
        url_problem = _url_problem(url) if "url" in body else "missing"
        if url_problem is not None:
            self.problem(f"{where}.url", f"{url_problem}; skipped")
            return None
        assert isinstance(url, str)  # _url_problem refused anything else
        headers = self.parse_headers(f"{where}.headers", body["headers"]) if "headers" in body else ()
        return HttpHandler(index=index, url=url, headers=headers, timeout=timeout, on_error=on_error)

    def parse_on_error(self, where: str, body: dict) -> str:
        value = body.get("onError", ON_ERROR_ALLOW)
        if value in (ON_ERROR_ALLOW, ON_ERROR_DENY):
            return value
        # Whoever wrote onError wanted something other than the default fail-open;
        # a typo ("Deny", "block") must not quietly leave the gate open.
        self.problem(where, f'must be "allow" or "deny", got {json.dumps(value)}; "deny" is used')
        return ON_ERROR_DENY

    def parse_timeout(self, where: str, body: dict) -> float:
        if "timeout" not in body:
            return DEFAULT_TIMEOUT_SECONDS
        value = body["timeout"]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            if value > MAX_TIMEOUT_SECONDS:
                self.problem(
                    where, f"{value:g} s is above the maximum of {MAX_TIMEOUT_SECONDS:g} s; {MAX_TIMEOUT_SECONDS:g} s is used"
                )
                return MAX_TIMEOUT_SECONDS
            return float(value)
        self.problem(
            where,
            f"must be a positive number of seconds, got {json.dumps(value)}; "
            f"the default {DEFAULT_TIMEOUT_SECONDS:g} s is used",
        )
        return DEFAULT_TIMEOUT_SECONDS

    def parse_headers(self, where: str, value: Any) -> tuple[tuple[str, str], ...]:
        if not isinstance(value, _JsonObject):
            self.problem(where, f"must be an object of header names to strings, got {_type_name(value)}; ignored")
            return ()
        headers = []
        for name, header_value in value.pairs:
            # Header *values* are never echoed: the page says not to put
            # secrets there, but someone will.
            if not _HEADER_NAME.fullmatch(name):
                # repr() when unprintable: a newline in the name must not split the problem line.
                shown = name if name.isprintable() else repr(name)
                self.problem(f"{where}.{shown}", "not a valid header name; header not sent")
            elif not isinstance(header_value, str):
                self.problem(f"{where}.{name}", f"value must be a string, got {_type_name(header_value)}; header not sent")
            elif _HEADER_VALUE_FORBIDDEN.search(header_value):
                self.problem(f"{where}.{name}", "value contains CR, LF or NUL; header not sent")
            else:
                headers.append((name, header_value))
        return tuple(headers)

    def check_fields(self, where: str, body: _JsonObject, known: tuple[str, ...]) -> None:
        for key in body.duplicate_keys():
            self.problem(f"{where}.{key}", "appears more than once; the last value is used")
        for key in body:
            if key not in known:
                expected = ", ".join(known)
                self.problem(f"{where}.{key}", f"unknown field (expected {expected}); ignored")

    @staticmethod
    def describe(body: dict, key: str) -> str:
        return "missing" if key not in body else f"got {_type_name(body[key])}"


def _url_problem(url: Any) -> str | None:
    if not isinstance(url, str):
        return f"must be a string, got {_type_name(url)}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "has no host"
    if any(ch in url for ch in "\r\n\x00 "):
        return "contains whitespace or control characters"
    return None
