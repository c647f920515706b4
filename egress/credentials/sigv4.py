"""Re-signing a client's AWS request with the proxy's keys (SigV4, botocore's signer).

The sandbox's SDK signs with a placeholder key; that signature is dropped and the
request signed again:
- region and service come from the client's credential scope
  (`Credential=AKID/DATE/REGION/SERVICE/aws4_request`), else from the host
  (`SERVICE.REGION.amazonaws.com`, `BUCKET.s3.REGION.amazonaws.com`);
- the headers signed are those the client signed (its `SignedHeaders`), so what
  the SDK meant to protect stays protected;
- the payload hash is the client's `x-amz-content-sha256` when it sent one
  (a hex digest, `UNSIGNED-PAYLOAD`, `STREAMING-UNSIGNED-PAYLOAD-TRAILER`), else
  computed over the body, which the caller holds (bounded);
- refused (`Unsignable`): presigned URLs (the signature is in the query: re-signing
  would need the URL rewritten, forwarding it would be half-signed) and
  `STREAMING-AWS4-HMAC-SHA256-*` bodies, whose chunk signatures chain from the
  seed signature the client made with its placeholder key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from urllib.parse import unquote_plus

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from egress.credentials.aws_sigv4 import AwsKeys
from egress.policy import reasons

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Streaming forms whose chunks carry no signature of their own: the seed signature is all.
STREAMING_UNSIGNED = frozenset({"STREAMING-UNSIGNED-PAYLOAD-TRAILER"})
_SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")
_SIGNED = re.compile(r"SignedHeaders=([a-z0-9;\-]+)")
_HOST = re.compile(r"(?:.*\.)?(?P<service>[a-z0-9-]+)[.-](?P<region>[a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d)\.amazonaws\.com(?:\.cn)?")
# Dropped from the client's request: the proxy sets its own.
_REPLACED = frozenset({"authorization", "x-amz-date", "x-amz-security-token"})
_DEFAULT_SIGNED = ("host", "content-type", "content-md5")


class Unsignable(Exception):
    """A request the proxy cannot re-sign; `reason` is a reason code, the message says why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


# The reasons these refusals carry (defined with every other reason code).
PRESIGNED = reasons.PRESIGNED_URL
UNSIGNABLE = reasons.UNSIGNABLE_REQUEST


def is_presigned(query: str) -> bool:
    names = {unquote_plus(item.partition("=")[0]).lower() for item in query.split("&") if item}
    # SigV4 query auth, and S3's older SigV2 form (`AWSAccessKeyId`, `Signature`, `Expires`).
    return bool(names & {"x-amz-signature", "x-amz-credential"}) or {"awsaccesskeyid", "signature"} <= names


def scope(authorization: str | None, host: str) -> tuple[str, str]:
    """(region, service) for the request; Unsignable when neither the client nor the host says."""
    if authorization and (m := _SCOPE.search(authorization)):
        return m.group(1), m.group(2)
    if m := _HOST.fullmatch(host.lower()):
        return m.group("region"), m.group("service")
    raise Unsignable(UNSIGNABLE, "region and service unknown: the client's Authorization has no SigV4 credential scope and the host is not SERVICE.REGION.amazonaws.com")


def needs_body(headers: Sequence[tuple[str, str]]) -> bool:
    """The payload hash must be computed over the body (the client sent none)."""
    return not any(name.lower() == "x-amz-content-sha256" for name, _ in headers)


def resign(
    method: str,
    url: str,
    headers: Sequence[tuple[str, str]],
    body: bytes | None,
    keys: AwsKeys,
    region: str,
    service: str,
) -> tuple[dict[str, str], frozenset[str]]:
    """The headers to set on the request (Authorization, X-Amz-Date, ...) and the names to drop."""
    lowered = [(name.lower(), value) for name, value in headers]
    authorization = next((v for n, v in lowered if n == "authorization"), "")
    signed = _SIGNED.search(authorization)
    names = set(signed.group(1).split(";")) if signed else set(_DEFAULT_SIGNED)
    names |= {n for n, _ in lowered if n.startswith("x-amz-")}
    names -= _REPLACED
    chosen = {n: v for n, v in lowered if n in names}
    payload = chosen.get("x-amz-content-sha256")
    if payload is not None:
        if payload.startswith("STREAMING-") and payload not in STREAMING_UNSIGNED:
            raise Unsignable(UNSIGNABLE, f"payload {payload}: its chunk signatures chain from the client's signature; "
                             "use UNSIGNED-PAYLOAD or the checksum trailer (recent SDKs over HTTPS do)")  # fmt: skip
    elif service == "s3":  # S3 requires the header; other services hash the body themselves
        chosen["x-amz-content-sha256"] = payload = hashlib.sha256(body or b"").hexdigest()
    elif body is None:
        raise Unsignable(UNSIGNABLE, "the body is needed to sign the request and was not read")
    request = AWSRequest(method=method, url=url, headers=chosen, data=body or b"")
    signer = (_S3Signer if service == "s3" else SigV4Auth)(
        ReadOnlyCredentials(keys.access_key, keys.secret_key, keys.token), service, region
    )
    signer.add_auth(request)
    out = {
        name: request.headers[name]
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token")
        if name in request.headers
    }
    if payload is not None:
        out["X-Amz-Content-SHA256"] = payload
    drop = frozenset({"x-amz-security-token"} if keys.token is None else ())
    return out, drop


class _S3Signer(SigV4Auth):
    """SigV4 with S3's canonical URI (the path as sent, not encoded again). botocore's
    S3SigV4Auth would also recompute the payload hash, replacing the client's."""

    def _normalize_url_path(self, path: str) -> str:
        return path
