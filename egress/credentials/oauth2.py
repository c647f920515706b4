"""`type: oauth2`: an access token from an OAuth 2.0 token endpoint (RFC 6749).

Grants: `client_credentials` (default, §4.4) and `refresh_token` (§6; a rotated
refresh token in the answer replaces the configured one until the source changes).
Client authentication (§2.3.1): `clientAuth: basic` (default, HTTP Basic of the
form-encoded id and secret) or `body` (client_id / client_secret form fields).
`scope` and `audience` are sent when set.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from urllib.parse import quote

from egress.credentials.fields import Fields
from egress.credentials.http import FetchFailed, Reply, TokenClient
from egress.credentials.lifecycle import DEFAULT_LIFETIME, Token
from egress.policy.addresses import IPNetwork
from egress.policy.secrets import Secret

KIND = "oauth2"
FIELDS = {"type", "tokenUrl", "clientId", "clientSecret", "grant", "refreshToken", "scope", "audience", "clientAuth"}
GRANTS = ("client_credentials", "refresh_token")


@dataclass(frozen=True)
class OAuth2Source:
    name: str
    token_url: str
    client_id: str
    client_secret: Secret | None
    grant: str = "client_credentials"
    refresh_token: Secret | None = None
    scope: str | None = None
    audience: str | None = None
    client_auth: str = "basic"
    # The refresh token the server rotated to (RFC 6749 §6): state, not definition.
    rotated: list[Secret] = field(default_factory=list, compare=False, hash=False, repr=False)

    async def fetch(self, client: TokenClient, allow_cidrs: tuple[IPNetwork, ...]) -> Token:
        form: dict[str, str] = {"grant_type": self.grant}
        if self.grant == "refresh_token":
            assert self.refresh_token is not None
            form["refresh_token"] = (self.rotated[-1] if self.rotated else self.refresh_token).reveal()
        if self.scope:
            form["scope"] = self.scope
        if self.audience:
            form["audience"] = self.audience
        headers = {}
        secret = self.client_secret.reveal() if self.client_secret else ""
        if self.client_auth == "basic" and self.client_secret is not None:
            pair = f"{quote(self.client_id, safe='')}:{quote(secret, safe='')}"  # §2.3.1: form-encoded first
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form["client_id"] = self.client_id
            if self.client_secret is not None:
                form["client_secret"] = secret
        started = time.monotonic()
        reply = await client.post(self.token_url, form=form, headers=headers, allow_cidrs=allow_cidrs)
        data = token_answer(reply)
        if isinstance(data.get("refresh_token"), str) and data["refresh_token"]:
            self.rotated[:] = [Secret(data["refresh_token"])]
        return bearer_token(data, started)


def token_answer(reply: Reply) -> dict:
    """The JSON of a 2xx answer; FetchFailed naming the status and OAuth `error` code otherwise."""
    if not 200 <= reply.status < 300:
        code = ""
        try:
            error = reply.json().get("error")
        except FetchFailed:
            error = None
        if isinstance(error, str) and error.replace("_", "").isalnum() and len(error) < 64:
            code = f" ({error})"  # RFC 6749 §5.2 codes: `invalid_client`, ... never a secret
        raise FetchFailed(f"token endpoint answered {reply.status}{code}")
    return reply.json()


def bearer_token(data: dict, started: float, value_key: str = "access_token") -> Token:
    value = data.get(value_key)
    if not isinstance(value, str) or not value:
        raise FetchFailed(f"token endpoint's answer has no {value_key}")
    if not value.isascii() or not value.isprintable():
        raise FetchFailed(f"token endpoint's {value_key} is not printable ASCII")
    lifetime = data.get("expires_in", DEFAULT_LIFETIME)
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)
    if isinstance(lifetime, bool) or not isinstance(lifetime, (int, float)) or lifetime <= 0:
        lifetime = DEFAULT_LIFETIME
    return Token(value, expires_at=started + float(lifetime), fetched_at=started)


def parse(name: str, f: Fields) -> OAuth2Source | None:
    f.allowed(FIELDS)
    token_url = f.https_url("tokenUrl", required=True)
    client_id = f.string("clientId", required=True)
    client_secret = f.secret("clientSecret")
    grant = f.choice("grant", GRANTS, "client_credentials")
    refresh_token = f.secret("refreshToken", required=grant == "refresh_token")
    if grant != "refresh_token" and "refreshToken" in f.raw:
        f.problem("refreshToken", "only with grant: refresh_token")
    if grant == "client_credentials" and client_secret is None and "clientSecret" not in f.raw:
        f.problem("clientSecret", "missing (the client_credentials grant authenticates the client)")
    # A space-separated string (RFC 6749 §3.3) or a list of scopes.
    scope = " ".join(f.strings("scope")) if isinstance(f.raw.get("scope"), list) else f.string("scope")
    audience = f.string("audience")
    client_auth = f.choice("clientAuth", ("basic", "body"), "basic")
    if not f.ok or token_url is None or client_id is None:
        return None
    return OAuth2Source(
        name, token_url, client_id, client_secret, grant, refresh_token, scope or None, audience, client_auth
    )
