"""Spec parsing for credentials: `network.credentials` sources, and the allowlist entry
fields that place them (`query`, `replace`, `sign`, `${credential:}` in `transform`).

Pure: reads the document, resolves `${env:}`/`${file:}` references, reads key files,
and reports each problem as "which source or entry, which field, why". No network.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from egress.credentials import aws_sigv4, gcp_service_account, github_app, oauth2, references
from egress.credentials.fields import Fields
from egress.credentials.references import SOURCE_NAME, Template

__all__ = [
    "EntryCredentials", "Source", "Template",
    "parse_entry", "parse_sources", "parse_value", "referenced_files", "transform_value",
]  # fmt: skip
from egress.policy import secrets

Source = (
    oauth2.OAuth2Source
    | gcp_service_account.GcpServiceAccountSource
    | github_app.GithubAppSource
    | aws_sigv4.AwsSigV4Source
)
_PARSERS = {
    oauth2.KIND: oauth2.parse,
    gcp_service_account.KIND: gcp_service_account.parse,
    github_app.KIND: github_app.parse,
    aws_sigv4.KIND: aws_sigv4.parse,
}
ENTRY_FIELDS = ("query", "replace", "sign")
# A placeholder travels unchanged through a path, a query and base64-decoded Basic
# credentials, and is long enough never to match ordinary text by accident.
PLACEHOLDER = re.compile(r"[A-Za-z0-9_.~-]{8,128}")
_QUERY_NAME = re.compile(r"[A-Za-z0-9_.~\-\[\]]{1,128}")


@dataclass(frozen=True)
class EntryCredentials:
    """What an allowlist entry puts on the wire beyond static `transform` headers."""

    headers: tuple[tuple[str, Template], ...] = ()  # transform values that name a credential
    query: tuple[tuple[str, Template], ...] = ()
    replace: tuple[tuple[str, Template], ...] = ()  # placeholder -> value
    sign: aws_sigv4.AwsSigV4Source | None = None
    sources: tuple[Source, ...] = ()  # the token sources its templates name, fetched per request

    def __bool__(self) -> bool:
        return bool(self.headers or self.query or self.replace or self.sign)


def parse_sources(
    raw: Any, where: str, problems: list[str], environ: Mapping[str, str] | None
) -> dict[str, Source]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: must be a mapping of source name to source")
        return {}
    sources: dict[str, Source] = {}
    for name, body in raw.items():
        source_where = f"{where}.{name}"
        if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name):
            problems.append(f"{where}: source name {name!r} must be letters, digits, '_', '.', '-' (at most 63)")
            continue
        if not isinstance(body, dict):
            problems.append(f"{source_where}: must be a mapping with a `type`")
            continue
        kind = body.get("type")
        if kind not in _PARSERS:
            shown = "missing" if kind is None else f"{kind!r} is not a source type"
            problems.append(f"{source_where}.type: {shown} (expected one of {', '.join(_PARSERS)})")
            continue
        source = _PARSERS[kind](name, Fields(body, source_where, problems, environ))
        if source is not None:
            sources[name] = source
    return sources


def parse_value[Parsed](
    value: Any,
    where: str,
    problems: list[str],
    environ: Mapping[str, str] | None,
    parse: Callable[[str, Mapping[str, str] | None], Parsed],
) -> Parsed | None:
    """`value` parsed by `parse`; None, with the problem appended, when it is not a string or a reference in it
    does not resolve. Shared by the credential templates here and the spec's static header values."""
    if not isinstance(value, str):
        problems.append(f"{where}: value must be a string, not {type(value).__name__}")
        return None
    try:
        return parse(value, environ)
    except secrets.SecretReferenceError as exc:
        problems.append(f"{where}: {exc}")
        return None


def transform_value(value: str, environ: Mapping[str, str] | None) -> secrets.Secret | Template:
    """A transform value: a `Secret` when it names no credential (rendered now), else its `Template`."""
    template = references.parse(value, environ)
    return secrets.Secret(template.render({})) if template.static else template


def parse_entry(
    raw: dict,
    any_host: bool,
    where: str,
    problems: list[str],
    environ: Mapping[str, str] | None,
    sources: Mapping[str, Source],
    headers: Mapping[str, Template],
    transform_names: set[str],
) -> EntryCredentials | None:
    """The entry's credential placement; problems appended; None when it has none."""
    start = len(problems)
    if any_host and any(k in raw for k in ENTRY_FIELDS):
        problems.append(f"{where}: query, replace and sign are not allowed on '*' (they would send a secret to every host)")
        return None
    query = _templates(raw.get("query"), f"{where}.query", _QUERY_NAME, "parameter name", problems, environ)
    replace = _templates(raw.get("replace"), f"{where}.replace", PLACEHOLDER, "placeholder", problems, environ)
    sign = None
    if "sign" in raw:
        name = raw["sign"]
        source = sources.get(name) if isinstance(name, str) else None
        if not isinstance(name, str):
            problems.append(f"{where}.sign: must name an aws_sigv4 source under network.credentials")
        elif source is None:
            problems.append(f"{where}.sign: no credential source {name!r} under network.credentials")
        elif not isinstance(source, aws_sigv4.AwsSigV4Source):
            problems.append(f"{where}.sign: {name!r} is a {_kind(source)} source; sign takes an aws_sigv4 one")
        else:
            sign = source
        if "authorization" in transform_names:
            problems.append(f"{where}.transform.Authorization: cannot be set on an entry that is signed (sign)")
    used: dict[str, Source] = {}
    for field_where, template in [
        *((f"{where}.transform.{n}", t) for n, t in headers.items()),
        *((f"{where}.query.{n}", t) for n, t in query),
        *((f"{where}.replace.{n}", t) for n, t in replace),
    ]:
        for name in sorted(template.credentials):
            source = sources.get(name)
            if source is None:
                problems.append(f"{field_where}: ${{credential:{name}}}: no credential source {name!r} under network.credentials")
            elif isinstance(source, aws_sigv4.AwsSigV4Source):
                problems.append(f"{field_where}: ${{credential:{name}}}: an aws_sigv4 source signs requests (sign: {name}), it has no token")
            else:
                used[name] = source
    if len(problems) > start:
        return None
    found = EntryCredentials(tuple(headers.items()), query, replace, sign, tuple(used.values()))
    return found or None


def _kind(source: Source) -> str:
    return {
        oauth2.OAuth2Source: oauth2.KIND,
        gcp_service_account.GcpServiceAccountSource: gcp_service_account.KIND,
        github_app.GithubAppSource: github_app.KIND,
        aws_sigv4.AwsSigV4Source: aws_sigv4.KIND,
    }[type(source)]


def _templates(
    raw: Any, where: str, key_pattern: re.Pattern[str], what: str, problems: list[str], environ: Mapping[str, str] | None
) -> tuple[tuple[str, Template], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        problems.append(f"{where}: must be a non-empty mapping of {what} to value")
        return ()
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not key_pattern.fullmatch(key):
            problems.append(f"{where}: {what} {key!r} must match {key_pattern.pattern}")
            continue
        template = parse_value(value, f"{where}.{key}", problems, environ, references.parse)
        if template is None:
            continue
        sample = template.sample()
        if not sample or any(ord(c) < 0x20 or ord(c) == 0x7F for c in sample):
            problems.append(f"{where}.{key}: value is empty or contains a control character")
            continue
        out.append((key, template))
    return tuple(out)


def referenced_files(network: Mapping[str, Any]) -> list[str]:
    """Files a change to which changes the credentials: `${file:}` references anywhere in
    sources and in transform/query/replace values (nested ones too), and key files."""
    found: set[str] = set()

    def strings(node: Any):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from strings(v)
        elif isinstance(node, list):
            for v in node:
                yield from strings(v)

    credentials = network.get("credentials")
    if isinstance(credentials, dict):
        for body in credentials.values():
            for text in strings(body):
                found.update(references.referenced_files(text))
            if isinstance(body, dict) and isinstance(body.get("keyFile"), str):
                found.add(body["keyFile"])
    entries = network.get("allowlist")
    if isinstance(entries, list):
        for raw in entries:
            if isinstance(raw, dict):
                for key in ("transform", *ENTRY_FIELDS):
                    for text in strings(raw.get(key)):
                        found.update(references.referenced_files(text))
    return sorted(found)
