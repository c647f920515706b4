"""The environment spec (SPEC §2): parsing and validation into a `Spec`.

Accepts JSON or YAML, the whole environment object or just its `network`
part. Every problem is reported with the path of the entry and field it is
about (`network.allowlist[2].transform.Authorization: ...`); all problems are
collected before giving up, so one `check` run shows them all.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from egress.credentials import spec as credentials
from egress.policy import secrets, yaml_events
from egress.policy.addresses import IPNetwork, cidr_problem
from egress.policy.domains import Allowlist, DomainPattern, HostError, parse_pattern
from egress.policy.request_rules import RequestRules, parse_requests

# libyaml's parser when PyYAML has it (the wheels do): a 100,000-entry spec parses
# about three times faster than with the pure-Python one. Same safe constructors.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MODES = ("enforce", "report")
_TOKEN_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # fullmatch: `$` would pass a final newline
# Headers whose meaning belongs to the connection or the message framing: injecting
# them would let the spec break the request rather than authenticate it.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
_NETWORK_FIELDS = {"allowlist", "mode", "allowCidrs", "proxyToken", "credentials"}
_ENTRY_FIELDS = {"domain", "transform", "requests", *credentials.ENTRY_FIELDS}


class SpecError(Exception):
    """The spec cannot be used. `problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class AllowlistEntry:
    pattern: DomainPattern
    transform: dict[str, secrets.Secret] = field(default_factory=dict)
    # `requests` (SPEC §8): which methods and paths pass; None lets every request pass.
    requests: RequestRules | None = None
    # `${credential:}` transform values, `query`, `replace`, `sign` (egress.credentials).
    credentials: credentials.EntryCredentials | None = None

    @property
    def rule(self) -> str:
        return self.pattern.text

    @property
    def injects(self) -> bool:
        """Puts a secret on the wire: its requests must be TLS the proxy originates."""
        return bool(self.transform) or bool(self.credentials)

    @property
    def intercepted(self) -> bool:
        """The proxy terminates the client's TLS for this entry (the client trusts the CA):
        to add a credential, or to see each request's method and path."""
        return self.injects or self.requests is not None


@dataclass(frozen=True)
class Spec:
    allowlist: Allowlist[AllowlistEntry]
    mode: str = "enforce"
    allow_cidrs: tuple[IPNetwork, ...] = ()
    entries: tuple[AllowlistEntry, ...] = ()
    # Files the spec's `${file:}` references read: a change to one is a change to the spec.
    secret_files: tuple[str, ...] = ()
    # `network.proxyToken`: what a sandbox proves its environment with (`--spec-dir` only;
    # None refuses every client there). Ignored with `--spec`, which has no proxy auth.
    proxy_token: secrets.Secret | None = None
    # The environment this spec is held to: "" with `--spec`, the file stem with `--spec-dir`.
    # Decisions carry it into audit lines and metric labels.
    environment: str = ""

    @property
    def has_transforms(self) -> bool:
        return any(e.transform for e in self.entries)


def load_spec(path: str | Path, environ: dict[str, str] | None = None) -> Spec:
    """Read and validate a spec file; raises SpecError."""
    path = Path(path)
    return parse_spec(read_spec_text(path), source=str(path), environ=environ)


# A spec of 100,000 allowlist entries with transforms is about 10 MB; anything far
# beyond is a wrong file (a log, an image), and reading it whole would cost its size
# in memory several times over (text, then the parsed document).
MAX_SPEC_BYTES = 32 * 1024 * 1024


def read_spec_text(path: Path) -> str:
    """The text of a spec file, at most MAX_SPEC_BYTES; raises SpecError naming the file."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError([f"{path}: file not found"]) from None
    except IsADirectoryError:
        raise SpecError([f"{path}: is a directory, not a spec file"]) from None
    except OSError as exc:
        raise SpecError([f"{path}: cannot read ({exc.strerror or exc})"]) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([f"{path}: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MiB, not a spec file"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"]) from None


def parse_spec(text: str, source: str = "<spec>", environ: dict[str, str] | None = None) -> Spec:
    data = _parse_document(text, source)
    problems: list[str] = []
    spec = _build(data, problems, environ)
    if problems:
        raise SpecError([_one_line(f"{source}: {p}") for p in problems])
    assert spec is not None
    return spec


def _one_line(problem: str) -> str:
    # Field names and references are echoed as written; a CR/LF in them must not
    # split one problem over several lines of `check` output.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in problem)


_MAX_DEPTH = 100  # a real spec is five levels deep
# Values in the document with YAML aliases expanded (each use of an anchor counted
# again): a 100,000-entry spec with transforms has about 400,000. An alias bomb
# ("billion laughs": nine aliases of nine aliases of ...) is a few hundred bytes that
# libyaml builds as shared objects at once, but anything that walks or prints it
# (validation, an error message echoing a value) would expand billions of them.
_MAX_NODES = 5_000_000


def _parse_document(text: str, source: str) -> Any:
    try:
        document = _parse_syntax(text, source)
    except RecursionError:
        # The JSON and pure-Python YAML parsers recurse per nesting level; a few
        # thousand `[` exhaust the stack.
        raise SpecError([f"{source}: document nested too deeply"]) from None
    # libyaml does not recurse, but what it builds must not reach code that does.
    if (problem := _shape_problem(document)) is not None:
        raise SpecError([f"{source}: {problem}"])
    return document


def _shape_problem(document: Any) -> str | None:
    """Depth and size of the document as code walking it sees them (aliases expanded),
    computed once per distinct object, so a bomb is measured without expanding it."""
    if not isinstance(document, (dict, list)):
        return None
    done: dict[int, tuple[int, int]] = {}  # id -> (values below and including it, depth)
    entered: set[int] = set()
    stack: list[tuple[Any, bool]] = [(document, False)]
    while stack:
        node, finishing = stack.pop()
        key = id(node)
        children = node.values() if isinstance(node, dict) else node
        if finishing:
            entered.discard(key)
            size, depth = 1, 1
            for child in children:
                if isinstance(child, (dict, list)):
                    child_size, child_depth = done[id(child)]
                    size += child_size
                    depth = max(depth, child_depth + 1)
                else:
                    size += 1
            if depth > _MAX_DEPTH:
                return "document nested too deeply"
            if size > _MAX_NODES:
                return f"document too large: more than {_MAX_NODES:,} values once its YAML aliases are expanded"
            done[key] = (size, depth)
        elif key not in done:
            if key in entered:  # reached again before it was finished: it contains itself
                return "document contains itself (a recursive YAML alias)"
            entered.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if isinstance(child, (dict, list)))
    return None


def _parse_syntax(text: str, source: str) -> Any:
    if source.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError([f"{source}: line {exc.lineno} column {exc.colno}: invalid JSON ({exc.msg})"]) from None
    # YAML 1.1 is a superset of JSON for everything a spec contains.
    if (document := yaml_events.load(text, _YAML_LOADER)) is not yaml_events.FALLBACK:
        return document  # a plain document, built without PyYAML's node tree
    try:
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise SpecError([f"{source}: {where}invalid YAML ({problem})"]) from None
    except (ValueError, LookupError, AttributeError, TypeError) as exc:
        # PyYAML's constructors raise plain exceptions, without a position, for a value
        # its tag or form cannot hold: `!!bool x`, `0x_`, `2001-02-30`, `!!int ""`.
        detail = f": {exc}" if isinstance(exc, ValueError) else ""
        raise SpecError([f"{source}: invalid YAML (a value does not fit its YAML type{detail})"]) from None


def _build(data: Any, problems: list[str], environ: dict[str, str] | None) -> Spec | None:
    if data is None:
        problems.append("empty (expected the environment object or its `network` part)")
        return None
    if not isinstance(data, dict):
        problems.append("top level must be a mapping (the environment object or its `network` part)")
        return None
    if "network" in data:
        network, where = data["network"], "network"
    elif "allowlist" in data:
        network, where = data, "network"
    else:
        problems.append("no `network` (or bare `allowlist`) found")
        return None
    if not isinstance(network, dict):
        problems.append(f"{where}: must be a mapping")
        return None
    for key in sorted(set(network) - _NETWORK_FIELDS, key=str):
        problems.append(f"{where}.{key}: unknown field (expected one of {', '.join(sorted(_NETWORK_FIELDS))})")

    mode = network.get("mode", "enforce")
    if mode not in MODES:
        problems.append(f"{where}.mode: {mode!r} is not one of {', '.join(MODES)}")

    allow_cidrs = _parse_cidrs(network.get("allowCidrs", []), f"{where}.allowCidrs", problems)

    raw_entries = network.get("allowlist")
    if raw_entries is None:
        problems.append(f"{where}.allowlist: missing (an empty list blocks everything)")
        raw_entries = []
    elif not isinstance(raw_entries, list):
        problems.append(f"{where}.allowlist: must be a list")
        raw_entries = []

    allowlist: Allowlist[AllowlistEntry] = Allowlist()
    entries: list[AllowlistEntry] = []
    secret_files = sorted(
        {
            path
            for raw in raw_entries
            if isinstance(raw, dict) and isinstance(raw.get("transform"), dict)
            for value in raw["transform"].values()
            if isinstance(value, str)
            for path in secrets.referenced_files(value)
        }
        | set(credentials.referenced_files(network))
    )
    proxy_token = _parse_proxy_token(network.get("proxyToken"), f"{where}.proxyToken", problems, environ)
    if isinstance(network.get("proxyToken"), str):
        secret_files = sorted({*secret_files, *secrets.referenced_files(network["proxyToken"])})
    sources = credentials.parse_sources(network.get("credentials"), f"{where}.credentials", problems, environ)
    seen: dict[tuple[str, str], int] = {}
    for index, raw in enumerate(raw_entries):
        entry = _parse_entry(raw, f"{where}.allowlist[{index}]", problems, environ, sources)
        if entry is None:
            continue
        key = (entry.pattern.kind, entry.pattern.domain)
        if key in seen:
            problems.append(
                f"{where}.allowlist[{index}].domain: {entry.pattern.text!r} repeats allowlist[{seen[key]}]"
            )
            continue
        seen[key] = index
        allowlist.add(entry.pattern, entry)
        entries.append(entry)
    if problems:
        return None
    return Spec(
        allowlist=allowlist,
        mode=mode,
        allow_cidrs=tuple(allow_cidrs),
        entries=tuple(entries),
        secret_files=tuple(secret_files),
        proxy_token=proxy_token,
    )


def _parse_proxy_token(raw: Any, where: str, problems: list[str], environ: dict[str, str] | None) -> secrets.Secret | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        problems.append(f"{where}: must be a string (a value or a ${{file:}}/${{env:}} reference), not {type(raw).__name__}")
        return None
    try:
        token = secrets.expand(raw, environ)
    except secrets.SecretReferenceError as exc:
        problems.append(f"{where}: {exc}")
        return None
    # Never echo the value. Visible ASCII only: it travels in a Basic credential that
    # clients write into a proxy URL, where whitespace and controls do not survive.
    value = token.reveal()
    if not value:
        problems.append(f"{where}: is empty")
    elif not all("!" <= c <= "~" for c in value):
        problems.append(f"{where}: must be visible ASCII (no spaces, control or non-ASCII characters)")
    else:
        return token
    return None


def _parse_cidrs(raw: Any, where: str, problems: list[str]) -> list[IPNetwork]:
    if not isinstance(raw, list):
        problems.append(f"{where}: must be a list of CIDR ranges")
        return []
    networks = []
    for index, item in enumerate(raw):
        try:
            network = ipaddress.ip_network(str(item).strip(), strict=True)
        except ValueError as exc:
            problems.append(f"{where}[{index}]: {item!r} is not a CIDR range ({exc})")
            continue
        if (problem := cidr_problem(network)) is not None:
            problems.append(f"{where}[{index}]: {network} {problem}")
            continue
        networks.append(network)
    return networks


def _parse_entry(
    raw: Any, where: str, problems: list[str], environ: dict[str, str] | None, sources: dict | None = None
) -> AllowlistEntry | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping with a `domain`")
        return None
    start = len(problems)
    for key in sorted(set(raw) - _ENTRY_FIELDS, key=str):
        problems.append(f"{where}.{key}: unknown field (expected {', '.join(sorted(_ENTRY_FIELDS))})")
    if "domain" not in raw:
        problems.append(f"{where}.domain: missing")
        return None
    try:
        pattern = parse_pattern(raw["domain"])
    except HostError as exc:
        problems.append(f"{where}.domain: {exc}")
        return None
    dynamic: dict[str, credentials.Template] = {}
    transform = _parse_transform(raw.get("transform"), pattern, f"{where}.transform", problems, environ, dynamic)
    names = {n.lower() for n in (*transform, *dynamic)}
    placed = credentials.parse_entry(raw, pattern.kind == "any", where, problems, environ, sources or {}, dynamic, names)
    requests, request_problems = parse_requests(raw["requests"]) if "requests" in raw else (None, [])
    problems.extend(f"{where}.requests{suffix}: {why}" for suffix, why in request_problems)
    if len(problems) > start:
        return None
    return AllowlistEntry(pattern=pattern, transform=transform, requests=requests, credentials=placed)


def _parse_transform(
    raw: Any,
    pattern: DomainPattern,
    where: str,
    problems: list[str],
    environ: dict[str, str] | None,
    dynamic: dict[str, credentials.Template] | None = None,
) -> dict[str, secrets.Secret]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping of header name to value")
        return {}
    if pattern.kind == "any" and raw:
        problems.append(f"{where}: not allowed on '*' (it would send the credential to every host)")
        return {}
    result: dict[str, secrets.Secret] = {}
    seen: set[str] = set()
    for name, value in raw.items():
        field_where = f"{where}.{name}"
        if not isinstance(name, str) or not _TOKEN_NAME.fullmatch(name):
            problems.append(f"{where}: header name {name!r} is not a valid RFC 9110 token")
            continue
        if name.lower() in _RESERVED_HEADERS:
            problems.append(f"{field_where}: {name} is a connection/framing header and cannot be injected")
            continue
        if name.lower() in seen:
            problems.append(f"{field_where}: header given twice (names are case-insensitive)")
            continue
        seen.add(name.lower())
        secret = credentials.parse_value(value, field_where, problems, environ, credentials.transform_value)
        if secret is None:
            continue
        if isinstance(secret, credentials.Template):  # names a credential: rendered per request
            sample = secret.sample()
            if (problem := _header_value_problem(sample)) is not None:
                problems.append(f"{field_where}: value {problem}")
            elif dynamic is not None:
                dynamic[name] = secret
            continue
        if (problem := _header_value_problem(secret.reveal())) is not None:
            problems.append(f"{field_where}: value {problem}")
            continue
        result[name] = secret
    return result


def _header_value_problem(value: str) -> str | None:
    # Never echo the value: it is usually a credential.
    if not value:
        return "is empty"
    if "\r" in value or "\n" in value:
        return "contains CR or LF (header injection)"
    if "\0" in value:
        return "contains NUL"
    if any(ord(c) < 0x20 and c != "\t" or ord(c) == 0x7F for c in value):
        return "contains a control character"
    if value != value.strip(" \t"):
        return "has leading or trailing whitespace"
    if not value.isascii():
        return "is not ASCII"
    return None
