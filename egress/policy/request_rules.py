"""Request rules of an allowlist entry (SPEC §8): which methods and paths pass.

A pure module: the spec parser builds `RequestRules` from the entry's `requests`
value (`parse_requests`, precise problems), the guard asks `RequestRules.check`
with the request's method and target bytes exactly as they arrived.

Matching is done once, on one normalised form of the path, and refuses what cannot
be normalised without guessing how the upstream reads it:
- the target is split at the first `?`; the query is not part of the path match
  (only git-read's `info/refs` looks at one parameter of it);
- a fragment (`#`), a raw `\\` or `;` (a path parameter: Tomcat/Spring read `..;` as
  `..`), invalid percent-encoding, an encoded `/`, `\\`, NUL or control character, an
  encoded `%` followed by two hex digits (double encoding), bytes that are not
  UTF-8 (overlong forms included) or a character Unicode compatibility folding turns
  into `/`, `\\`, `.`, `;` or `%` are refused;
- percent-encoded unreserved characters (RFC 3986 §2.3) are decoded, other escapes
  kept with upper-case hex (§6.2.2); raw bytes above 0x7F count as their escape;
- repeated slashes are merged, as nginx (merge_slashes on, its default), Apache
  and Go's path cleaning read them; a path with both a repeated slash and a dot
  segment is refused, because there the merging and the non-merging readings
  (RFC 3986) remove different segments;
- dot segments are removed (RFC 3986 §5.2.4); a `..` above the root is refused (nginx
  answers 400 to it).
The request goes upstream as the client sent it: the rule is decided on the same
path the upstream routes on, not rewritten.

One item reads a body too: git-read's LFS batch must ask for `download` (`body_problem`),
checked by the guard once the whole body is in and before any of it is sent upstream.

Methods are tokens compared exactly (RFC 9110 §9.1: case-sensitive): `get` is not
`GET`. Patterns: `*` is one non-empty segment, `**` any number of segments (none
included); a literal segment is compared after the same normalisation.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

# IANA HTTP Method Registry (RFC 9110 §16.1), without CONNECT (the tunnel, decided on its
# own) and PRI (the HTTP/2 preface). Method names are case-sensitive.
KNOWN_METHODS = frozenset(
    """ACL BASELINE-CONTROL BIND CHECKIN CHECKOUT COPY DELETE GET HEAD LABEL LINK LOCK MERGE
    MKACTIVITY MKCALENDAR MKCOL MKREDIRECTREF MKWORKSPACE MOVE OPTIONS ORDERPATCH PATCH POST
    PROPFIND PROPPATCH PUT QUERY REBIND REPORT SEARCH TRACE UNBIND UNCHECKOUT UNLINK UNLOCK
    UPDATE UPDATEREDIRECTREF VERSION-CONTROL""".split()
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset(b"0123456789abcdefABCDEF")
# What a path pattern may hold besides `/`: pchar (RFC 3986 §3.3) without `;` (refused in
# paths) and `%` (escapes are checked on their own).
_PATTERN_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,=:@%]*")
_DOUBLE_ENCODED = re.compile(r"%25[0-9A-Fa-f]{2}")
_FOLDED_AWAY = frozenset("/\\.;%")
_MAX_SHOWN = 255


class PathError(ValueError):
    """A request path that cannot be normalised: refused rather than guessed."""


class RuleError(ValueError):
    """A `requests` value that cannot be used; the message says why (the caller says where)."""


def normalize_path(target: bytes) -> tuple[str, bytes]:
    """The normalised path of a request target and its raw query (b"" without one).

    Raises PathError (a short reason, never the path itself) for what cannot be
    normalised. `OPTIONS *` has the path `*`.
    """
    path, _, query = target.partition(b"?")
    if b"#" in target:
        raise PathError("a fragment ('#') in the request target")
    if path == b"*":
        return "*", query
    if not path.startswith(b"/"):
        raise PathError("not an absolute path")
    if b"\\" in path:
        raise PathError("a backslash in the path")
    if b";" in path:
        raise PathError("a ';' path parameter")
    segments = [_normalize_segment(raw) for raw in path[1:].split(b"/")]
    merged = [s for s in segments[:-1] if s] + segments[-1:]
    dots = any(s in (".", "..") for s in merged)
    if dots and len(merged) != len(segments):
        raise PathError("a repeated '/' together with a dot segment")
    if not dots:
        return "/" + "/".join(merged), query
    out: list[str] = []
    for index, segment in enumerate(merged):
        last = index == len(merged) - 1
        if segment == ".":
            if last:
                out.append("")
        elif segment == "..":
            if not out or out == [""]:
                raise PathError("a '..' above the root")
            out.pop()
            if last:
                out.append("")
        else:
            out.append(segment)
    return "/" + "/".join(out), query


def _normalize_segment(raw: bytes) -> str:
    if b"%" not in raw and raw.isascii():
        return raw.decode("ascii")
    out: list[str] = []
    decoded = bytearray()  # the segment fully decoded, to check it is UTF-8
    i, n = 0, len(raw)
    while i < n:
        byte = raw[i]
        if byte == 0x25:  # %
            if i + 2 >= n or raw[i + 1] not in _HEX or raw[i + 2] not in _HEX:
                raise PathError("invalid percent-encoding")
            value = int(raw[i + 1 : i + 3], 16)
            i += 3
            if value == 0x2F:
                raise PathError("an encoded '/' (%2F) in the path")
            if value == 0x5C:
                raise PathError("an encoded '\\' (%5C) in the path")
            if value < 0x20 or value == 0x7F:
                raise PathError("an encoded NUL or control character in the path")
        else:
            value = byte
            i += 1
        decoded.append(value)
        if value in _UNRESERVED or (value < 0x80 and byte != 0x25):
            out.append(chr(value))
        else:
            out.append(f"%{value:02X}")
    try:
        text = decoded.decode("utf-8")  # strict: overlong forms and surrogates are errors
    except UnicodeDecodeError:
        raise PathError("percent-encoded bytes that are not UTF-8 (an overlong form?)") from None
    if not text.isascii() and _FOLDED_AWAY & set(unicodedata.normalize("NFKC", text)) - set(text):
        raise PathError("a character that Unicode folding turns into '/', '\\', '.', ';' or '%'")
    segment = "".join(out)
    if "%25" in segment and _DOUBLE_ENCODED.search(segment):  # `%25%41%41` too: `%25AA` once decoded
        raise PathError("double percent-encoding (%25 followed by hex digits)")
    return segment


def shown_path(target: bytes) -> str:
    """The request's path for a refusal body or a log line: the query left out, at most
    255 characters, every byte outside visible ASCII percent-encoded (never raw)."""
    path = target.partition(b"?")[0].partition(b"#")[0][: _MAX_SHOWN]
    return "".join(chr(b) if 0x21 <= b <= 0x7E else f"%{b:02X}" for b in path)


# -- patterns -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PathPattern:
    text: str
    segments: tuple[str, ...]  # normalised literals, "*" and "**"

    def matches(self, segments: list[str]) -> bool:
        """Glob over segments, in O(len(pattern) * len(path)) at worst: `**` backtracks
        to its last use only (a regex of several `**` would backtrack exponentially)."""
        pattern = self.segments
        p = s = 0
        star, mark = -1, 0
        while s < len(segments):
            if p < len(pattern) and pattern[p] == "**":
                star, mark = p, s
                p += 1
            elif p < len(pattern) and (pattern[p] == segments[s] or pattern[p] == "*" and segments[s]):
                p += 1
                s += 1
            elif star >= 0:
                p, mark = star + 1, mark + 1
                s = mark
            else:
                return False
        while p < len(pattern) and pattern[p] == "**":
            p += 1
        return p == len(pattern)


def parse_path_pattern(text: Any) -> PathPattern:
    """A `paths` item; raises RuleError."""
    if not isinstance(text, str):
        raise RuleError(f"must be a string, not {type(text).__name__}")
    if not text.startswith("/"):
        raise RuleError(f"{text!r} is not an absolute path (it must start with '/')")
    for char, why in (
        ("?", "a query ('?') is not supported (the query is not part of the match)"),
        ("#", "a fragment ('#') is not supported (requests with one are refused)"),
        ("\\", "a backslash is not supported (requests with one are refused)"),
        (";", "a ';' parameter is not supported (requests with one are refused)"),
    ):
        if char in text:
            raise RuleError(f"{text!r}: {why}")
    parts: list[str] = []
    segments = text[1:].split("/")
    for index, segment in enumerate(segments):
        if segment in ("*", "**"):
            parts.append(segment)
            continue
        if "*" in segment:
            raise RuleError(f"{text!r}: '*' must be a whole segment ('*' one segment, '**' any number)")
        if segment == "" and index != len(segments) - 1:
            raise RuleError(f"{text!r}: empty segment ('//'); repeated slashes are merged before matching")
        if segment in (".", ".."):
            raise RuleError(f"{text!r}: dot segments are removed before matching and cannot be matched")
        if not _PATTERN_CHARS.fullmatch(segment):
            raise RuleError(f"{text!r}: unsupported character in {segment!r} (use percent-encoding)")
        try:
            normalized = _normalize_segment(segment.encode("ascii"))
        except PathError as exc:
            raise RuleError(f"{text!r}: {exc}") from None
        if normalized in (".", ".."):
            raise RuleError(f"{text!r}: dot segments are removed before matching and cannot be matched")
        parts.append(normalized)
    return PathPattern(text, tuple(parts))


# -- items, presets, rules -------------------------------------------------------------------


@dataclass(frozen=True)
class RequestItem:
    """One item of `requests`: passes a request whose method and path it both matches."""

    label: str  # what the audit line names: `requests[1]`, `git-read/upload-pack`
    methods: frozenset[str] | None = None  # None: every method
    paths: tuple[PathPattern, ...] | None = None  # None: every path (and `*`)
    # A query parameter that must appear exactly once with one of these values (None in
    # the set: may also be absent).
    query: tuple[str, frozenset[str | None]] | None = None
    upgrades: bool = True  # may a protocol upgrade (WebSocket) pass under this item?
    body: str = ""  # a check of the request body too (`body_problem`), once it has arrived

    def matches(self, method: str, segments: list[str] | None, query: bytes, upgrade: bool) -> bool:
        """`segments`: of the normalised path, None for `*` (matched by no pattern)."""
        if self.methods is not None and method not in self.methods:
            return False
        if upgrade and not self.upgrades:
            return False
        if self.paths is not None and (segments is None or not any(p.matches(segments) for p in self.paths)):
            return False
        return self.query is None or _query_value(query, self.query[0]) in self.query[1]


_ABSENT = object()


def _query_value(query: bytes, name: str) -> str | None | object:
    """The only value of `name` in the query, None when absent, `_ABSENT` (never in an
    allowed set) when it is given twice or is not readable."""
    found: list[str] = []
    for pair in query.split(b"&") if query else ():
        key, _, value = pair.partition(b"=")
        try:
            key_text, value_text = _decode_query(key), _decode_query(value)
        except PathError:
            return _ABSENT
        if key_text == name:
            found.append(value_text)
    if not found:
        return None
    return found[0] if len(found) == 1 else _ABSENT


def _decode_query(raw: bytes) -> str:
    if not re.fullmatch(rb"(?:[^%]|%[0-9A-Fa-f]{2})*", raw):
        raise PathError("invalid percent-encoding")
    try:
        return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        raise PathError("not UTF-8") from None


def _preset_paths(*texts: str) -> tuple[PathPattern, ...]:
    return tuple(parse_path_pattern(t) for t in texts)


_READ = frozenset({"GET", "HEAD"})
LFS_DOWNLOAD = "lfs-download"
_DECIMAL = re.compile(r"[0-9]{1,18}")  # ASCII digits only: `int()` also reads "１２" and rejects "²"
# A body is checked only when the proxy holds all of it before anything is sent upstream:
# a declared length up to mitmproxy's streaming threshold (`stream_large_bodies`, 64 KiB,
# egress/mitm/master.py); a larger or undeclared body would already be on its way.
MAX_CHECKED_BODY = 64 * 1024


def body_problem(check: str, declared_length: str | None, content: bytes | None, limit: int = MAX_CHECKED_BODY) -> str | None:
    """Why a body fails the item's check, or None. With `content` None only the declared
    length is judged (at the request's headers); `limit` is the streaming threshold."""
    digits = declared_length is not None and _DECIMAL.fullmatch(declared_length) is not None
    length = int(declared_length) if digits and declared_length is not None else None
    if length is None or length > min(limit, MAX_CHECKED_BODY):
        return f"the body must have a Content-Length of at most {min(limit, MAX_CHECKED_BODY)} bytes to be checked"
    if content is None:
        return None
    if check == LFS_DOWNLOAD:
        try:
            batch = json.loads(content)
        except (ValueError, UnicodeDecodeError):
            return "the LFS batch body is not JSON"
        if not isinstance(batch, dict) or batch.get("operation") != "download":
            return "the LFS batch does not ask for operation 'download'"
        return None
    return f"unknown body check {check!r}"  # fail closed
PRESETS: dict[str, tuple[RequestItem, ...]] = {
    # Codex's "limited" mode: nothing that changes state (RFC 9110 §9.2.1 safe methods,
    # TRACE left out), and no protocol upgrade: a WebSocket carries data both ways.
    "read-only": (RequestItem("read-only", frozenset({"GET", "HEAD", "OPTIONS"}), upgrades=False),),
    # What `git clone` / `git fetch` send over HTTP(S), never `git-receive-pack` (push):
    "git-read": (
        # smart HTTP ref advertisement for fetch; without `service` it is the dumb
        # protocol's static ref list. `service=git-receive-pack` (push) never matches.
        RequestItem(
            "git-read/refs", _READ, _preset_paths("/**/info/refs"),
            query=("service", frozenset({"git-upload-pack", None})), upgrades=False,
        ),
        RequestItem("git-read/upload-pack", frozenset({"POST"}), _preset_paths("/**/git-upload-pack"), upgrades=False),
        # Git LFS download: the batch API, whose body must ask for `download` (an `upload`
        # batch hands out upload URLs), and the legacy per-object download.
        RequestItem(
            "git-read/lfs", frozenset({"POST"}), _preset_paths("/**/info/lfs/objects/batch"), upgrades=False,
            body=LFS_DOWNLOAD,
        ),
        RequestItem("git-read/lfs", _READ, _preset_paths("/**/info/lfs/objects/*"), upgrades=False),
        # dumb HTTP: HEAD, the loose objects and packs, alternates
        RequestItem("git-read/dumb", _READ, _preset_paths("/**/HEAD", "/**/objects/**"), upgrades=False),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    item: str  # the label of the item that let it pass ("" when none did)
    path: str  # what refusals and log lines show: the normalised path, else `shown_path`
    problem: str = ""  # why the path could not be normalised (or the body failed its check)
    body: str = ""  # the matching item's body check, still to be done once the body is in


@dataclass(frozen=True)
class RequestRules:
    items: tuple[RequestItem, ...]
    text: str  # the preset name, or "list" for a list of items

    def check(self, method: bytes, target: bytes, upgrade: bool = False) -> Verdict:
        """Does a request with this method and target (as received) pass?"""
        try:
            path, query = normalize_path(target)
        except PathError as exc:
            return Verdict(False, "", shown_path(target), str(exc))
        method_text = method.decode("latin-1")
        segments = None if path == "*" else path[1:].split("/")
        for item in self.items:
            if item.matches(method_text, segments, query, upgrade):
                return Verdict(True, item.label, path, body=item.body)
        return Verdict(False, "", path[:_MAX_SHOWN])


def parse_requests(raw: Any) -> tuple[RequestRules | None, list[tuple[str, str]]]:
    """The `requests` value of an entry: rules and problems as (field suffix, why) pairs,
    e.g. ("[1].methods[0]", "'get' is not ..."). Rules are None when there is a problem."""
    problems: list[tuple[str, str]] = []
    if isinstance(raw, str):
        if raw not in PRESETS:
            problems.append(("", _unknown_preset(raw)))
            return None, problems
        return RequestRules(PRESETS[raw], raw), problems
    if not isinstance(raw, list):
        problems.append(("", f"must be a preset name ({', '.join(PRESETS)}) or a list of items, not {type(raw).__name__}"))
        return None, problems
    if not raw:
        problems.append(("", "is empty: it would refuse every request (remove the entry instead)"))
        return None, problems
    items: list[RequestItem] = []
    for index, item in enumerate(raw):
        items.extend(_parse_item(item, index, problems))
    if problems:
        return None, problems
    return RequestRules(tuple(items), "list"), problems


def _unknown_preset(name: str) -> str:
    return f"unknown preset {name!r} (expected one of {', '.join(PRESETS)}, or a list of items)"


_ITEM_FIELDS = ("methods", "paths")


def _parse_item(raw: Any, index: int, problems: list[tuple[str, str]]) -> Iterable[RequestItem]:
    where = f"[{index}]"
    if isinstance(raw, str):
        if raw in PRESETS:
            return PRESETS[raw]
        problems.append((where, _unknown_preset(raw)))
        return ()
    if not isinstance(raw, dict):
        problems.append((where, "must be a mapping with `methods` and/or `paths`, or a preset name"))
        return ()
    start = len(problems)
    for key in sorted(set(raw) - set(_ITEM_FIELDS), key=str):
        problems.append((f"{where}.{key}", "unknown field (expected methods, paths)"))
    if not set(raw) & set(_ITEM_FIELDS):
        problems.append((where, "needs `methods` and/or `paths`"))
    methods = _parse_list(raw, "methods", where, _parse_method, problems)
    paths = _parse_list(raw, "paths", where, parse_path_pattern, problems)
    if len(problems) > start:
        return ()
    return (RequestItem(f"requests{where}", frozenset(methods) if methods is not None else None,
                        tuple(paths) if paths is not None else None),)  # fmt: skip


def _parse_list(raw: dict, key: str, where: str, parse, problems: list[tuple[str, str]]) -> list | None:
    if key not in raw:
        return None
    values = raw[key]
    if not isinstance(values, list) or not values:
        problems.append((f"{where}.{key}", "must be a non-empty list"))
        return None
    out = []
    for index, value in enumerate(values):
        try:
            out.append(parse(value))
        except RuleError as exc:
            problems.append((f"{where}.{key}[{index}]", str(exc)))
    return out


def _parse_method(value: Any) -> str:
    if not isinstance(value, str):
        raise RuleError(f"must be a string, not {type(value).__name__}")
    if not _TOKEN.fullmatch(value):
        raise RuleError(f"{value!r} is not an HTTP method token (RFC 9110 section 9.1)")
    if value in ("CONNECT", "PRI"):
        raise RuleError(f"{value} is not a request inside a tunnel (CONNECT is decided by the allowlist)")
    if value not in KNOWN_METHODS:
        hint = f"; methods are case-sensitive: did you mean {value.upper()}?" if value.upper() in KNOWN_METHODS else ""
        raise RuleError(f"{value!r} is not a registered HTTP method (IANA){hint}")
    return value
