"""Each source kind's token call, against a fake token endpoint: what it sends (checked
with the reference libraries: PyJWT, google-auth) and how it reads the answer."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import time
from urllib.parse import parse_qsl

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt as google_jwt

from egress.credentials import aws_sigv4, gcp_service_account, github_app, oauth2
from egress.credentials.http import FetchFailed, Reply
from egress.policy.secrets import Secret

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
PUBLIC = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class FakeClient:
    def __init__(self, *answers: Reply):
        self.answers = list(answers)
        self.calls: list[dict] = []

    async def post(self, url, *, form=None, json_body=None, headers=None, allow_cidrs=(), body=None):
        self.calls.append({"url": url, "form": form, "headers": headers or {}, "body": body})
        return self.answers.pop(0)


def ok(data: dict, status: int = 200) -> Reply:
    return Reply(status, json.dumps(data).encode())


def fetch(source, client):
    return asyncio.run(source.fetch(client, ()))


def test_oauth2_client_credentials_basic_auth_scope_audience():
    source = oauth2.OAuth2Source("corp", "https://t/token", "my id", Secret("s:cret"), scope="a b", audience="api")
    client = FakeClient(ok({"access_token": "at1", "expires_in": 60}))
    token = fetch(source, client)
    assert token.value == "at1" and 59 < token.expires_at - time.monotonic() <= 60
    call = client.calls[0]
    assert call["form"] == {"grant_type": "client_credentials", "scope": "a b", "audience": "api"}
    # RFC 6749 §2.3.1: id and secret form-encoded before Basic.
    assert base64.b64decode(call["headers"]["Authorization"].split()[1]) == b"my%20id:s%3Acret"


def test_oauth2_client_auth_in_body_and_refresh_token_rotation():
    source = oauth2.OAuth2Source("corp", "https://t/token", "id", Secret("sec"), grant="refresh_token",
                                 refresh_token=Secret("rt0"), client_auth="body")  # fmt: skip
    client = FakeClient(ok({"access_token": "at1", "refresh_token": "rt1"}), ok({"access_token": "at2"}))
    assert fetch(source, client).value == "at1"
    assert fetch(source, client).value == "at2"
    first, second = (c["form"] for c in client.calls)
    assert first == {"grant_type": "refresh_token", "refresh_token": "rt0", "client_id": "id", "client_secret": "sec"}
    assert second["refresh_token"] == "rt1"  # the rotated one
    assert "Authorization" not in client.calls[0]["headers"]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (ok({"error": "invalid_client"}, 401), "token endpoint answered 401 (invalid_client)"),
        (ok({"error": "x\nsecret"}, 400), "token endpoint answered 400"),
        (Reply(200, b"<html>"), "not JSON"),
        (ok({"token_type": "Bearer"}), "has no access_token"),
        (ok({"access_token": "a\nb"}), "not printable ASCII"),
    ],
)
def test_oauth2_bad_answers_are_fetch_failures_without_secrets(reply, message):
    source = oauth2.OAuth2Source("corp", "https://t/token", "id", Secret("sec"))
    with pytest.raises(FetchFailed) as info:
        fetch(source, FakeClient(reply))
    assert message in str(info.value) and "secret" not in str(info.value) and "sec" not in str(info.value).replace("answered", "")


def test_gcp_assertion_verifies_with_google_auth():
    source = gcp_service_account.GcpServiceAccountSource(
        "vertex", "/k.json", "sa@p.iam.gserviceaccount.com", Secret(PEM), "kid-1", "https://oauth2.test/token",
        ("https://www.googleapis.com/auth/cloud-platform",),
    )  # fmt: skip
    client = FakeClient(ok({"access_token": "ya29.x", "expires_in": 3599}))
    assert fetch(source, client).value == "ya29.x"
    form = client.calls[0]["form"]
    assert client.calls[0]["url"] == "https://oauth2.test/token"
    assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    claims = google_jwt.decode(form["assertion"], certs=PUBLIC, audience="https://oauth2.test/token")
    assert claims["iss"] == "sa@p.iam.gserviceaccount.com" and claims["scope"].endswith("/cloud-platform")
    assert jwt.get_unverified_header(form["assertion"])["kid"] == "kid-1"


def test_github_app_jwt_and_installation_token():
    source = github_app.GithubAppSource("gh", "4242", 77, Secret(PEM), "https://ghe.test/api/v3/")
    expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    client = FakeClient(ok({"token": "ghs_abc", "expires_at": expires}, 201))
    token = fetch(source, client)
    assert token.value == "ghs_abc" and 3500 < token.expires_at - time.monotonic() < 3601
    call = client.calls[0]
    assert call["url"] == "https://ghe.test/api/v3/app/installations/77/access_tokens"
    claims = jwt.decode(call["headers"]["Authorization"].removeprefix("Bearer "), PUBLIC, algorithms=["RS256"])
    assert claims["iss"] == "4242" and claims["exp"] - claims["iat"] == 600


def test_aws_static_keys_and_assume_role():
    static = aws_sigv4.AwsSigV4Source("aws", Secret("AKIA"), Secret("sk"), Secret("st"))
    token = fetch(static, FakeClient())
    assert token.expires_at is None and token.value == aws_sigv4.AwsKeys("AKIA", "sk", "st")
    role = aws_sigv4.AwsSigV4Source("aws", Secret("AKIA"), Secret("sk"), role_arn="arn:aws:iam::1:role/r",
                                    duration_seconds=900, sts_url="https://sts.test/")  # fmt: skip
    expiration = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=900)).strftime("%Y-%m-%dT%H:%M:%SZ")
    xml = f"""<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials>
      <AccessKeyId>ASIATEMP</AccessKeyId><SecretAccessKey>tempsecret</SecretAccessKey><SessionToken>tok</SessionToken>
      <Expiration>{expiration}</Expiration></Credentials></AssumeRoleResult></AssumeRoleResponse>"""
    client = FakeClient(Reply(200, xml.encode()))
    token = fetch(role, client)
    assert token.value == aws_sigv4.AwsKeys("ASIATEMP", "tempsecret", "tok") and 890 < token.expires_at - time.monotonic() <= 900
    call = client.calls[0]
    assert dict(parse_qsl(call["body"].decode()))["RoleArn"] == "arn:aws:iam::1:role/r"
    assert call["headers"]["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIA/") and "/us-east-1/sts/" in call["headers"]["Authorization"]
    denied = b'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Code>AccessDenied</Code></Error></ErrorResponse>'
    with pytest.raises(FetchFailed, match=r"STS AssumeRole answered 403 \(AccessDenied\)"):
        fetch(role, FakeClient(Reply(403, denied)))
