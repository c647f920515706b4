"""Values that name credentials: `${credential:NAME}` and `${base64:TEXT}` beside the
`${env:}` / `${file:}` references of `egress.policy.secrets`.

A value is parsed once, at load, into a `Template`: literal text (with `${env:}` and
`${file:}` already resolved, so it is secret), the names of credential sources whose
current token goes in at request time, and `${base64:...}` groups encoded after what
is inside them is expanded (`Basic ${base64:x-access-token:${credential:gh}}`).
A template without a credential is static: it is rendered at load, like a transform
value always was.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass

from egress.policy import secrets

SecretReferenceError = secrets.SecretReferenceError
SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_FORMS = "${env:NAME}, ${file:/path}, ${credential:NAME}, ${base64:TEXT}; '$${' for a literal '${'"


@dataclass(frozen=True)
class CredentialRef:
    name: str


@dataclass(frozen=True)
class Base64:
    inner: Template


Part = str | CredentialRef | Base64


@dataclass(frozen=True)
class Template:
    """A parsed value; its repr never shows the secret text it holds."""

    parts: tuple[Part, ...]

    def __repr__(self) -> str:
        return f"<template credentials={sorted(self.credentials)}>"

    @property
    def credentials(self) -> frozenset[str]:
        names: set[str] = set()
        for part in self.parts:
            if isinstance(part, CredentialRef):
                names.add(part.name)
            elif isinstance(part, Base64):
                names |= part.inner.credentials
        return frozenset(names)

    @property
    def static(self) -> bool:
        return not self.credentials

    def sample(self) -> str:
        """The value rendered with a stand-in token for each credential: what checks of its form look at."""
        return self.render(dict.fromkeys(self.credentials, "token"))

    def render(self, tokens: Mapping[str, str]) -> str:
        """The value with each credential's current token; KeyError for a missing one."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, CredentialRef):
                out.append(tokens[part.name])
            else:
                out.append(base64.b64encode(part.inner.render(tokens).encode()).decode("ascii"))
        return "".join(out)


def parse(value: str, environ: Mapping[str, str] | None = None) -> Template:
    """Parse and resolve `value`; raises SecretReferenceError naming the bad reference (never a value)."""
    template, end = _parse(value, 0, environ, nested=False)
    assert end == len(value)
    return template


def _parse(value: str, pos: int, environ: Mapping[str, str] | None, nested: bool) -> tuple[Template, int]:
    parts: list[Part] = []
    text: list[str] = []
    while pos < len(value):
        if value.startswith("$${", pos):
            text.append("${")
            pos += 3
        elif value.startswith("${", pos):
            part, pos = _reference(value, pos + 2, environ)
            if isinstance(part, str):
                text.append(part)
            else:
                if text:
                    parts.append("".join(text))
                    text = []
                parts.append(part)
        elif nested and value[pos] == "}":
            break
        else:
            text.append(value[pos])
            pos += 1
    if text:
        parts.append("".join(text))
    return Template(tuple(parts)), pos


def _reference(value: str, pos: int, environ: Mapping[str, str] | None) -> tuple[Part, int]:
    """The reference whose body starts at `pos` (after `${`), and the position after its `}`."""
    kind, colon, _ = value[pos:].partition(":")
    if colon and kind == "base64":
        inner, end = _parse(value, pos + len("base64:"), environ, nested=True)
        if end >= len(value):
            raise SecretReferenceError("${base64:...}: unterminated (no closing '}')")
        return Base64(inner), end + 1
    end = value.find("}", pos)
    if end < 0:
        raise SecretReferenceError("unterminated '${' (write '$${' for a literal '${')")
    body = value[pos:end]
    kind, _, arg = body.partition(":")
    if kind == "credential":
        if not SOURCE_NAME.fullmatch(arg):
            raise SecretReferenceError(f"${{{body}}}: not a credential source name")
        return CredentialRef(arg), end + 1
    if kind in ("env", "file") and arg:
        return secrets.expand("${" + body + "}", environ).reveal(), end + 1
    raise SecretReferenceError(f"${{{body}}}: unknown reference (use {_FORMS})")


_FILE_REFERENCE = re.compile(r"\$\{file:([^}]*)\}")


def referenced_files(value: str) -> list[str]:
    """Paths of the `${file:}` references in `value`, nested ones included (to watch them)."""
    return [m.group(1) for m in _FILE_REFERENCE.finditer(value.replace("$${", ""))]
