"""Which environment a client proves (`--spec-dir`): `Proxy-Authorization: Basic base64(ENV_ID:TOKEN)`.

Pure functions: the header in, the environment (or why not) out. The token is
compared in constant time, and an unknown environment costs the same comparison
as a known one, so neither timing nor the answer tells a client which ids exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from egress.policy.spec import Spec

REALM = "egress"
HEADER = "Proxy-Authorization"
# Compared against when the environment is unknown or has no token, so that path takes as long.
_NO_TOKEN = b"\x00" * 32


@dataclass(frozen=True)
class AuthResult:
    environment: str | None  # the environment proven, or None
    # A configured environment the client named (even with a wrong token): a bounded
    # value that may go into a metric label and the audit line. Never a name only claimed.
    named: str = ""


def parse_basic(value: str | None) -> tuple[str, str] | None:
    """(user, password) of a Basic credential, or None if absent or malformed."""
    if not value:
        return None
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded.strip():
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(":")
    if not sep:
        return None
    return user, password


def authenticate(header: str | None, spec_of: Callable[[str], Spec | None]) -> AuthResult:
    credentials = parse_basic(header)
    if credentials is None:
        return AuthResult(None)
    environment, given = credentials
    spec = spec_of(environment)
    token = spec.proxy_token if spec is not None else None
    expected = token.reveal().encode() if token is not None else _NO_TOKEN
    # compare_digest's time does not depend on where the bytes differ; comparing digests
    # makes the lengths equal too, so the time does not tell the token's length either.
    given_bytes = given.encode("utf-8", "surrogateescape")
    matches = hmac.compare_digest(hashlib.sha256(expected).digest(), hashlib.sha256(given_bytes).digest())
    named = environment if spec is not None else ""
    if token is None or not matches:
        return AuthResult(None, named)
    return AuthResult(environment, named)
