"""`type: aws_sigv4`: AWS keys the proxy signs requests with (`sign: NAME` entries).

Static keys (`accessKeyId`, `secretAccessKey`, optional `sessionToken`), or with
`roleArn` the role's temporary keys from STS AssumeRole (signed with the static
keys by botocore), fetched and refreshed like any token (`durationSeconds`,
default 3600; `stsUrl` for a regional or private STS endpoint).
"""

from __future__ import annotations

import datetime
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from urllib.parse import urlencode

from egress.credentials.fields import Fields
from egress.credentials.http import FetchFailed, TokenClient
from egress.credentials.lifecycle import Token
from egress.policy.addresses import IPNetwork
from egress.policy.secrets import Secret

KIND = "aws_sigv4"
FIELDS = {
    "type", "accessKeyId", "secretAccessKey", "sessionToken", "roleArn", "roleSessionName", "externalId",
    "durationSeconds", "stsUrl", "stsRegion",
}  # fmt: skip
STS_URL = "https://sts.amazonaws.com/"
_NS = "{https://sts.amazonaws.com/doc/2011-06-15/}"


@dataclass(frozen=True)
class AwsKeys:
    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:
        return "<aws keys>"

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.secret_key, self.token) if s)


@dataclass(frozen=True)
class AwsSigV4Source:
    name: str
    access_key_id: Secret
    secret_access_key: Secret
    session_token: Secret | None = None
    role_arn: str | None = None
    role_session_name: str = "egress-proxy"
    external_id: str | None = None
    duration_seconds: int = 3600
    sts_url: str = STS_URL
    sts_region: str = "us-east-1"

    def static_keys(self) -> AwsKeys:
        token = self.session_token.reveal() if self.session_token else None
        return AwsKeys(self.access_key_id.reveal(), self.secret_access_key.reveal(), token)

    async def fetch(self, client: TokenClient, allow_cidrs: tuple[IPNetwork, ...]) -> Token:
        if self.role_arn is None:
            return Token(self.static_keys(), expires_at=None)
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import ReadOnlyCredentials

        params = {
            "Action": "AssumeRole",
            "Version": "2011-06-15",
            "RoleArn": self.role_arn,
            "RoleSessionName": self.role_session_name,
            "DurationSeconds": str(self.duration_seconds),
        }
        if self.external_id:
            params["ExternalId"] = self.external_id
        body = urlencode(params).encode()
        request = AWSRequest("POST", self.sts_url, data=body, headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
        keys = self.static_keys()
        SigV4Auth(ReadOnlyCredentials(keys.access_key, keys.secret_key, keys.token), "sts", self.sts_region).add_auth(request)
        started = time.monotonic()
        headers = {k: v for k, v in request.headers.items()}
        reply = await client.post(self.sts_url, body=body, headers={**headers, "Accept": "text/xml"}, allow_cidrs=allow_cidrs)
        if not 200 <= reply.status < 300:
            raise FetchFailed(f"STS AssumeRole answered {reply.status}{_sts_error(reply.body)}")
        return _assumed(reply.body, started, self.duration_seconds)


def _assumed(body: bytes, started: float, duration: int) -> Token:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise FetchFailed("STS AssumeRole answer is not XML") from None
    found = {tag: root.find(f".//{_NS}{tag}") for tag in ("AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration")}
    values = {tag: (el.text or "").strip() if el is not None else "" for tag, el in found.items()}
    if not (values["AccessKeyId"] and values["SecretAccessKey"] and values["SessionToken"]):
        raise FetchFailed("STS AssumeRole answer holds no credentials")
    lifetime = float(duration)
    try:
        expiration = datetime.datetime.fromisoformat(values["Expiration"].replace("Z", "+00:00"))
        if expiration.tzinfo is not None:
            lifetime = max(1.0, expiration.timestamp() - time.time())
    except ValueError:
        pass
    if not all(_visible_ascii(values[k]) for k in ("AccessKeyId", "SecretAccessKey", "SessionToken")):
        raise FetchFailed("STS AssumeRole answer holds credentials that are not visible ASCII")
    keys = AwsKeys(values["AccessKeyId"], values["SecretAccessKey"], values["SessionToken"])
    return Token(keys, expires_at=started + lifetime, fetched_at=started)


def _visible_ascii(text: str) -> bool:
    return bool(text) and all("!" <= c <= "~" for c in text)


def _sts_error(body: bytes) -> str:
    try:
        code = ET.fromstring(body).find(f".//{_NS}Code")
    except ET.ParseError:
        return ""
    text = (code.text or "") if code is not None else ""
    return f" ({text})" if text.isalnum() and len(text) < 64 else ""


def parse(name: str, f: Fields) -> AwsSigV4Source | None:
    f.allowed(FIELDS)
    access_key_id = f.secret("accessKeyId", required=True)
    secret_access_key = f.secret("secretAccessKey", required=True)
    session_token = f.secret("sessionToken")
    role_arn = f.string("roleArn")
    if role_arn is not None and not role_arn.startswith("arn:"):
        f.problem("roleArn", "must be a role ARN (arn:aws:iam::ACCOUNT:role/NAME)")
    session_name = f.string("roleSessionName", default="egress-proxy") or "egress-proxy"
    external_id = f.string("externalId")
    duration = f.integer("durationSeconds", default=3600) or 3600
    sts_url = f.https_url("stsUrl", default=STS_URL) or STS_URL
    sts_region = f.string("stsRegion", default="us-east-1") or "us-east-1"
    if role_arn is None:
        for key in ("roleSessionName", "externalId", "durationSeconds", "stsUrl", "stsRegion"):
            if key in f.raw:
                f.problem(key, "only with roleArn")
    for key, secret in (("accessKeyId", access_key_id), ("secretAccessKey", secret_access_key), ("sessionToken", session_token)):
        if secret is not None and not _visible_ascii(secret.reveal()):
            f.problem(key, "must be visible ASCII (it goes into request headers)")
    if not f.ok or access_key_id is None or secret_access_key is None:
        return None
    return AwsSigV4Source(
        name, access_key_id, secret_access_key, session_token, role_arn, session_name, external_id, duration,
        sts_url, sts_region,
    )  # fmt: skip
