"""`type: gcp_service_account`: a Google OAuth access token minted from a service
account key (the JWT-bearer grant, RFC 7523, as google-auth does it).

The key file (JSON, as `gcloud iam service-accounts keys create` writes it) is read
at load: `egress-proxy check` says what is wrong with it, and a rotated file reloads
the spec (it is watched like a `${file:}`). The assertion is signed RS256 with PyJWT
and posted to the key's own `token_uri`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import jwt

from egress.credentials.fields import Fields
from egress.credentials.http import TokenClient
from egress.credentials.lifecycle import Token
from egress.credentials.oauth2 import bearer_token, token_answer
from egress.policy.addresses import IPNetwork
from egress.policy.secrets import Secret

KIND = "gcp_service_account"
FIELDS = {"type", "keyFile", "scopes", "subject"}
GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ASSERTION_LIFETIME = 3600  # Google's maximum
MAX_KEY_FILE = 64 * 1024


@dataclass(frozen=True)
class GcpServiceAccountSource:
    name: str
    key_file: str
    client_email: str
    private_key: Secret
    private_key_id: str
    token_uri: str
    scopes: tuple[str, ...]
    subject: str | None = None  # domain-wide delegation: the user to act as

    def assertion(self, now: int) -> str:
        claims = {
            "iss": self.client_email,
            "scope": " ".join(self.scopes),
            "aud": self.token_uri,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME,
        }
        if self.subject:
            claims["sub"] = self.subject
        headers = {"kid": self.private_key_id} if self.private_key_id else None
        return jwt.encode(claims, self.private_key.reveal(), algorithm="RS256", headers=headers)

    async def fetch(self, client: TokenClient, allow_cidrs: tuple[IPNetwork, ...]) -> Token:
        started = time.monotonic()
        form = {"grant_type": GRANT, "assertion": self.assertion(int(time.time()))}
        reply = await client.post(self.token_uri, form=form, allow_cidrs=allow_cidrs)
        return bearer_token(token_answer(reply), started)


def parse(name: str, f: Fields) -> GcpServiceAccountSource | None:
    f.allowed(FIELDS)
    key_file = f.string("keyFile", required=True)
    scopes = f.strings("scopes", required=True)
    subject = f.string("subject")
    if key_file is None or not f.ok:
        return None
    key = _read_key(key_file, f)
    if key is None:
        return None
    return GcpServiceAccountSource(name, key_file, *key, scopes=scopes, subject=subject)


def _read_key(path: str, f: Fields) -> tuple[str, Secret, str, str] | None:
    if not path.startswith("/"):
        f.problem("keyFile", "path must be absolute")
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEY_FILE + 1)
    except OSError as exc:
        f.problem("keyFile", f"{path}: cannot read ({exc.strerror or type(exc).__name__})")
        return None
    if len(data) > MAX_KEY_FILE:
        f.problem("keyFile", f"{path}: larger than {MAX_KEY_FILE} bytes, not a service account key")
        return None
    try:
        info = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        f.problem("keyFile", f"{path}: not JSON (expected a service account key file)")
        return None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        f.problem("keyFile", f"{path}: not a service account key (its `type` must be service_account)")
        return None
    missing = [k for k in ("client_email", "private_key", "token_uri") if not isinstance(info.get(k), str) or not info[k]]
    if missing:
        f.problem("keyFile", f"{path}: missing {', '.join(missing)}")
        return None
    token_uri = info["token_uri"]
    if urlsplit(token_uri).scheme != "https":
        f.problem("keyFile", f"{path}: token_uri must be an https:// URL")
        return None
    try:
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        key = load_pem_private_key(info["private_key"].encode(), password=None)
    except (ValueError, TypeError):
        f.problem("keyFile", f"{path}: private_key is not an unencrypted PEM private key")
        return None
    if not isinstance(key, rsa.RSAPrivateKey):
        f.problem("keyFile", f"{path}: private_key is not an RSA key")
        return None
    key_id = info.get("private_key_id")
    return str(info["client_email"]), Secret(info["private_key"]), key_id if isinstance(key_id, str) else "", str(token_uri)
