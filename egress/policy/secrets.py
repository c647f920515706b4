"""Secret references in transform values: `${env:NAME}`, `${file:/path}`, `$${` escapes.

A resolved value is wrapped in `Secret`, whose repr and str never show it, so a
secret that strays into a log line, an exception or a test failure prints as
`<secret>` instead of itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

_TOKEN = re.compile(r"\$\$\{|\$\{(?P<body>[^}]*)\}|\$\{")


class SecretReferenceError(ValueError):
    """A reference that cannot be resolved; the message names it, never a value."""


class Secret:
    """A header value that must not be printed."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


# A token, a password or a certificate-sized credential; a header value far beyond
# this would be refused by every server anyway.
_MAX_SECRET_CHARS = 64 * 1024


def _read_file(path: str) -> str:
    if not os.path.isabs(path):
        raise SecretReferenceError(f"${{file:{path}}}: path must be absolute")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(_MAX_SECRET_CHARS + 1)
    except FileNotFoundError:
        raise SecretReferenceError(f"${{file:{path}}}: file not found") from None
    except PermissionError:
        raise SecretReferenceError(f"${{file:{path}}}: permission denied") from None
    except UnicodeDecodeError:
        raise SecretReferenceError(f"${{file:{path}}}: not UTF-8 text") from None
    except OSError as exc:
        raise SecretReferenceError(f"${{file:{path}}}: cannot read ({exc.strerror})") from None
    except ValueError:  # NUL byte or lone surrogate: no such path can exist
        raise SecretReferenceError(f"${{file:{path}}}: not a valid path") from None
    if len(text) > _MAX_SECRET_CHARS:  # e.g. ${file:/dev/zero}: never read it whole
        raise SecretReferenceError(f"${{file:{path}}}: larger than {_MAX_SECRET_CHARS} characters, not a secret")
    # Secret files written by `echo` or editors end in a newline that is not part of the token.
    return text.removesuffix("\n").removesuffix("\r")


def referenced_files(value: str) -> list[str]:
    """Paths of the `${file:}` references in `value` (to watch them for rotation)."""
    return [
        m.group("body")[len("file:") :]
        for m in _TOKEN.finditer(value)
        if m.group("body") and m.group("body").startswith("file:")
    ]


def expand(value: str, environ: Mapping[str, str] | None = None) -> Secret:
    """Resolve every reference in `value`; raises SecretReferenceError naming the bad one."""
    env = os.environ if environ is None else environ
    out: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(value):
        out.append(value[pos : m.start()])
        pos = m.end()
        token = m.group(0)
        if token == "$${":
            out.append("${")
            continue
        body = m.group("body")
        if body is None:
            raise SecretReferenceError("unterminated '${' (write '$${' for a literal '${')")
        kind, _, arg = body.partition(":")
        if kind == "env" and arg:
            try:
                out.append(env[arg])
            except (KeyError, ValueError):  # os.environ raises ValueError for unencodable names
                raise SecretReferenceError(f"${{env:{arg}}}: environment variable {arg} is not set") from None
        elif kind == "file" and arg:
            out.append(_read_file(arg))
        else:
            raise SecretReferenceError(
                f"${{{body}}}: unknown reference (use ${{env:NAME}} or ${{file:/path}}; '$${{' for a literal '${{')"
            )
    out.append(value[pos:])
    return Secret("".join(out))
