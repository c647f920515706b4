"""Where a secret goes on the wire, as pure functions over strings.

- `set_query`: parameters set on the wire, replacing any of the same name the
  client sent; the client's other parameters are kept byte for byte.
- `replace_in_target` / `replace_in_header`: placeholders the sandbox holds are
  swapped for the secret in the path, the query and header values, including
  inside the base64 of a `Basic` credential (git, curl -u).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from urllib.parse import quote, unquote_plus

_PATH_SAFE = "-._~!$&'()*+,;=:@"
_QUERY_SAFE = "-._~!$'()*,;:@/?"


def set_query(query: str, params: Sequence[tuple[str, str]]) -> str:
    names = {name for name, _ in params}
    kept = [item for item in query.split("&") if item and unquote_plus(item.partition("=")[0]) not in names]
    kept += [f"{quote(name, safe='')}={quote(value, safe='-._~')}" for name, value in params]
    return "&".join(kept)


def replace_in_target(target: str, pairs: Sequence[tuple[str, str]]) -> tuple[str, int]:
    """The request target (path and query) with placeholders replaced; and how many were."""
    path, mark, query = target.partition("?")
    count = 0
    for placeholder, secret in pairs:
        count += path.count(placeholder) + query.count(placeholder)
        path = path.replace(placeholder, quote(secret, safe=_PATH_SAFE))
        query = query.replace(placeholder, quote(secret, safe=_QUERY_SAFE))
    return path + mark + query, count


def replace_in_header(value: str, pairs: Sequence[tuple[str, str]]) -> str:
    """A header value with placeholders replaced (also inside `Basic <base64>`)."""
    scheme, space, credentials = value.partition(" ")
    if space and scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        if decoded and any(p in decoded for p, _ in pairs):
            for placeholder, secret in pairs:
                decoded = decoded.replace(placeholder, secret)
            return f"{scheme} {base64.b64encode(decoded.encode()).decode('ascii')}"
    for placeholder, secret in pairs:
        value = value.replace(placeholder, secret)
    return value
