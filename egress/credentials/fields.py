"""Reading one credential source's fields with precise problems: which source, which
field, why. Secret fields take `${env:}` / `${file:}` references; values are never echoed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from egress.policy import secrets


class Fields:
    def __init__(self, raw: Mapping[str, Any], where: str, problems: list[str], environ: Mapping[str, str] | None):
        self.raw = raw
        self.where = where
        self.problems = problems
        self.environ = environ
        self._start = len(problems)

    @property
    def ok(self) -> bool:
        return len(self.problems) == self._start

    def problem(self, key: str, text: str) -> None:
        self.problems.append(f"{self.where}.{key}: {text}")

    def allowed(self, names: set[str]) -> None:
        for key in sorted(set(self.raw) - names, key=str):
            self.problem(str(key), f"unknown field (expected one of {', '.join(sorted(names))})")

    def string(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        value = self.raw.get(key)
        if value is None:
            if required:
                self.problem(key, "missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            self.problem(key, f"must be a string, not {type(value).__name__}")
            return default
        value = str(value)
        if not value or not value.isprintable():
            self.problem(key, "must be non-empty printable text")
            return default
        return value

    def integer(self, key: str, required: bool = False, default: int | None = None, low: int = 1) -> int | None:
        value = self.raw.get(key)
        if value is None:
            if required:
                self.problem(key, "missing")
            return default
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            self.problem(key, f"must be an integer >= {low}")
            return default
        return value

    def secret(self, key: str, required: bool = False) -> secrets.Secret | None:
        value = self.raw.get(key)
        if value is None:
            if required:
                self.problem(key, "missing")
            return None
        if not isinstance(value, str):
            self.problem(key, f"must be a string (a value or a ${{env:}}/${{file:}} reference), not {type(value).__name__}")
            return None
        try:
            secret = secrets.expand(value, self.environ)
        except secrets.SecretReferenceError as exc:
            self.problem(key, str(exc))
            return None
        if not secret.reveal().strip():
            self.problem(key, "is empty")
            return None
        return secret

    def https_url(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        value = self.string(key, default=None, required=required)
        if value is None:
            return default
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises for a bad port
        except ValueError:
            self.problem(key, "is not a URL")
            return default
        if parts.scheme != "https" or not parts.hostname:
            self.problem(key, "must be an https:// URL (the proxy's token calls verify TLS)")
            return default
        if parts.username or parts.password:
            self.problem(key, "must not hold credentials (use the source's secret fields)")
            return default
        return value

    def strings(self, key: str, required: bool = False, split: bool = True) -> tuple[str, ...]:
        value = self.raw.get(key)
        if value is None:
            if required:
                self.problem(key, "missing")
            return ()
        if isinstance(value, str) and split:
            value = value.split()
        if not isinstance(value, list) or not all(isinstance(v, str) and v and v.isprintable() for v in value):
            self.problem(key, "must be a list of non-empty strings")
            return ()
        return tuple(value)

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.raw.get(key, default)
        if value not in options:
            self.problem(key, f"{value!r} is not one of {', '.join(options)}")
            return default
        return value
