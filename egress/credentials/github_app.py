"""`type: github_app`: a GitHub App installation access token.

The app JWT (RS256, PyJWT; issued 60 s in the past against clock drift, valid 9
minutes, GitHub's limit is 10) is exchanged at
`POST {apiUrl}/app/installations/{installationId}/access_tokens` for a token that
GitHub gives one hour; `apiUrl` points at GitHub Enterprise Server
(`https://ghe.example/api/v3`).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

import jwt

from egress.credentials.fields import Fields
from egress.credentials.http import FetchFailed, TokenClient
from egress.credentials.lifecycle import Token
from egress.credentials.oauth2 import token_answer
from egress.policy.addresses import IPNetwork
from egress.policy.secrets import Secret

KIND = "github_app"
FIELDS = {"type", "appId", "installationId", "privateKey", "apiUrl"}
API_URL = "https://api.github.com"


@dataclass(frozen=True)
class GithubAppSource:
    name: str
    app_id: str
    installation_id: int
    private_key: Secret
    api_url: str = API_URL

    def app_jwt(self, now: int) -> str:
        claims = {"iat": now - 60, "exp": now + 540, "iss": self.app_id}
        return jwt.encode(claims, self.private_key.reveal(), algorithm="RS256")

    async def fetch(self, client: TokenClient, allow_cidrs: tuple[IPNetwork, ...]) -> Token:
        started = time.monotonic()
        url = f"{self.api_url.rstrip('/')}/app/installations/{self.installation_id}/access_tokens"
        headers = {
            "Authorization": f"Bearer {self.app_jwt(int(time.time()))}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        }
        reply = await client.post(url, headers=headers, allow_cidrs=allow_cidrs, body=b"")
        data = token_answer(reply)
        token = data.get("token")
        if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
            raise FetchFailed("GitHub's answer has no token")
        return Token(token, expires_at=started + _lifetime(data.get("expires_at")), fetched_at=started)


def _lifetime(expires_at: object) -> float:
    """Seconds left on GitHub's `expires_at` (ISO 8601 UTC); an hour if it cannot be read."""
    if isinstance(expires_at, str):
        try:
            when = datetime.datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
            if when.tzinfo is not None:
                return max(1.0, when.timestamp() - time.time())
        except ValueError:
            pass
    return 3600.0


def parse(name: str, f: Fields) -> GithubAppSource | None:
    f.allowed(FIELDS)
    app_id = f.string("appId", required=True)
    installation_id = f.integer("installationId", required=True)
    private_key = f.secret("privateKey", required=True)
    api_url = f.https_url("apiUrl", default=API_URL)
    if private_key is not None:
        try:
            from cryptography.hazmat.primitives.asymmetric import rsa
            from cryptography.hazmat.primitives.serialization import load_pem_private_key

            if not isinstance(load_pem_private_key(private_key.reveal().encode(), password=None), rsa.RSAPrivateKey):
                f.problem("privateKey", "is not an RSA key (GitHub Apps sign RS256)")
        except (ValueError, TypeError):
            f.problem("privateKey", "is not an unencrypted PEM private key (the .pem GitHub generated)")
    if not f.ok or app_id is None or installation_id is None or private_key is None or api_url is None:
        return None
    return GithubAppSource(name, app_id, installation_id, private_key, api_url)
