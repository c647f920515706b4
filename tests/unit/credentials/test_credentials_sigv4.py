"""SigV4 re-signing: the result verifies with botocore's own signer over the same request."""

from __future__ import annotations

import hashlib

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from egress.credentials import sigv4
from egress.credentials.aws_sigv4 import AwsKeys

REAL = AwsKeys("AKIAREAL", "real-secret-key-0123456789")


def client_signed(url: str, body: bytes, headers: dict[str, str], service="bedrock", region="us-east-1"):
    request = AWSRequest("POST", url, data=body, headers=headers)
    SigV4Auth(ReadOnlyCredentials("placeholder", "placeholder", None), service, region).add_auth(request)
    return list(request.headers.items())


def test_scope_from_client_or_host():
    auth = "AWS4-HMAC-SHA256 Credential=placeholder/20260101/eu-west-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=ab"
    assert sigv4.scope(auth, "whatever.test") == ("eu-west-1", "bedrock")
    assert sigv4.scope(None, "bedrock-runtime.us-east-1.amazonaws.com") == ("us-east-1", "bedrock-runtime")
    assert sigv4.scope(None, "bucket.s3.us-west-2.amazonaws.com") == ("us-west-2", "s3")
    with pytest.raises(sigv4.Unsignable):
        sigv4.scope(None, "example.com")


def test_presigned_detected():
    assert sigv4.is_presigned("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=a%2Fb&X-Amz-Signature=00")
    assert sigv4.is_presigned("AWSAccessKeyId=placeholder&Signature=abc%3D&Expires=1")  # S3's SigV2 form
    assert not sigv4.is_presigned("list-type=2&prefix=a")


def test_resigned_request_matches_botocore_with_the_real_keys(monkeypatch):
    url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude/invoke"
    body = b'{"prompt": "hi"}'
    headers = client_signed(url, body, {"Content-Type": "application/json", "Host": "bedrock-runtime.us-east-1.amazonaws.com"})
    out, _ = sigv4.resign("POST", url, headers, body, REAL, "us-east-1", "bedrock")
    assert "placeholder" not in out["Authorization"] and out["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAREAL/")
    # Recompute independently with botocore, same date.
    expected = AWSRequest("POST", url, data=body, headers={"Content-Type": "application/json", "Host": "bedrock-runtime.us-east-1.amazonaws.com"})
    signer = SigV4Auth(ReadOnlyCredentials(REAL.access_key, REAL.secret_key, None), "bedrock", "us-east-1")
    expected.context["timestamp"] = out["X-Amz-Date"]
    expected.headers["X-Amz-Date"] = out["X-Amz-Date"]
    canonical = signer.canonical_request(expected)
    signature = signer.signature(signer.string_to_sign(expected, canonical), expected)
    assert out["Authorization"].endswith(f"Signature={signature}")


def test_client_payload_hash_is_kept_and_streaming_signed_refused():
    url = "https://s3.example.test/bucket/key"
    for payload in ("UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER", hashlib.sha256(b"x").hexdigest()):
        headers = [("Host", "s3.example.test"), ("x-amz-content-sha256", payload), ("Authorization", "AWS4-HMAC-SHA256 Credential=p/20260101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=00")]
        out, _ = sigv4.resign("PUT", url, headers, None, REAL, "us-east-1", "s3")
        assert out["X-Amz-Content-SHA256"] == payload
        assert "SignedHeaders=host;x-amz-content-sha256;x-amz-date," in out["Authorization"]
    with pytest.raises(sigv4.Unsignable) as info:
        sigv4.resign("PUT", url, [("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")], None, REAL, "us-east-1", "s3")
    assert info.value.reason == "unsignable_request"


def test_session_token_set_or_dropped():
    url = "https://sts.amazonaws.com/"
    headers = [("Host", "sts.amazonaws.com"), ("X-Amz-Security-Token", "client-placeholder")]
    out, drop = sigv4.resign("POST", url, headers, b"Action=GetCallerIdentity", AwsKeys("A", "S", "session"), "us-east-1", "sts")
    assert out["X-Amz-Security-Token"] == "session" and not drop
    out, drop = sigv4.resign("POST", url, headers, b"Action=GetCallerIdentity", REAL, "us-east-1", "sts")
    assert "X-Amz-Security-Token" not in out and drop == {"x-amz-security-token"}
