"""End-to-end: SigV4 re-signing. moto (S3, STS, IAM) in server mode with IAM
authentication on, behind TLS in the upstream namespace, verifies every signature
against the keys its IAM issued; boto3 in the sandbox holds placeholder keys.
Through the proxy (`sign:`) everything works; straight to moto it fails on signature."""

from __future__ import annotations

import json
import os
import sys

import pytest

from e2e.support.clients import client_ca_bundle, curl
from e2e.support.credentials_lab import add_host
from e2e.support.lab import HERE, VENV_BIN, Lab, _terminate

ADDRESS, PORT = "198.18.0.62", 9444  # .30-.34 belong to test_reliability.py
S3, STS = f"https://s3.example.test:{PORT}", f"https://sts.example.test:{PORT}"
SQS = f"https://sqs.example.test:{PORT}"
SETUP = """
import boto3, json
iam = boto3.client("iam", endpoint_url="https://iam.example.test:%d", region_name="us-east-1",
                   aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap", verify="%s")
iam.create_user(UserName="egress")
iam.put_user_policy(UserName="egress", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="egress")["AccessKey"]
trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}
role = iam.create_role(RoleName="agent", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
print(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"], "role": role}))
"""


@pytest.fixture(scope="module")
def real_keys(lab: Lab):
    for name in ("s3.example.test", "sts.example.test", "iam.example.test", "sqs.example.test"):
        add_host(lab, name, ADDRESS)
    # The bucket is in the path (path-style): moto must not read `s3` from the host as one.
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4", "MOTO_S3_CUSTOM_ENDPOINTS": S3}
    cmd = [str(VENV_BIN / "moto_server"), "-H", ADDRESS, "-p", str(PORT),
           "-c", str(lab.dir / "upstream.pem"), "-k", str(lab.dir / "upstream.key")]  # fmt: skip
    proc = start_moto(lab, cmd, env)
    out = lab.exec(sys.executable, "-c", SETUP % (PORT, lab.upstream_ca), env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert out.returncode == 0, out.stderr
    yield json.loads(out.stdout)
    _terminate(proc)


def start_moto(lab: Lab, cmd: list[str], env: dict):
    import socket
    import subprocess
    import time

    from e2e.support.lab import in_netns

    proc = subprocess.Popen(["ip", "netns", "exec", lab.upstream_ns, *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    lab._procs.append(proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with in_netns(lab.upstream_ns):
            sock = socket.socket()
        try:
            sock.connect((ADDRESS, PORT))
            return proc
        except OSError:
            time.sleep(0.2)
        finally:
            sock.close()
    raise RuntimeError("moto_server did not start")


@pytest.fixture(scope="module")
def proxy(lab: Lab, real_keys):
    spec = """
network:
  allowCidrs: ["198.18.0.0/15"]
  credentials:
    aws: {type: aws_sigv4, accessKeyId: "${env:REAL_AK}", secretAccessKey: "${env:REAL_SK}"}
  allowlist:
    - {domain: s3.example.test, sign: aws}
    - {domain: sts.example.test, sign: aws}
    - {domain: sqs.example.test, sign: aws}
"""
    proxy = lab.start_proxy(spec, env={"REAL_AK": real_keys["id"], "REAL_SK": real_keys["secret"]})
    yield proxy
    proxy.stop()
    everything = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    assert real_keys["secret"] not in everything


def sandbox(lab: Lab, bucket: str, proxy=None, ca: str | None = None) -> tuple[dict, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "AWS_ACCESS_KEY_ID": "placeholder",
           "AWS_SECRET_ACCESS_KEY": "placeholder", "AWS_CA_BUNDLE": ca or str(lab.upstream_ca)}  # fmt: skip
    if proxy is not None:
        env["HTTPS_PROXY"] = proxy.url
    out = lab.exec(sys.executable, str(HERE / "aws_client.py"), S3, STS, bucket, SQS, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout), out.stdout + out.stderr


def test_boto3_with_placeholder_keys_through_the_proxy(lab, proxy, real_keys):
    result, output = sandbox(lab, "through-proxy", proxy, client_ca_bundle(lab, proxy))
    presigned = result.pop("presigned")
    assert result == {
        "identity": "arn:aws:iam::123456789012:user/egress",
        "keys": ["dir/big name.bin", "multipart.bin", "small.txt"],
        "small": True, "big": True, "multipart": True, "sqs": True,
    }, result  # fmt: skip
    # A presigned URL (signed with the placeholder) is refused, not forwarded half-signed.
    status, headers, body = curl(lab, proxy, presigned)
    assert status == 403 and headers["x-egress-denied"] == "presigned_url", body
    assert real_keys["secret"] not in output
    audit = [line for line in proxy.audit() if line.get("host") == "s3.example.test" and line["method"] == "PUT"]
    assert audit and all("sign" in line["injected"] for line in audit)


def test_the_same_without_the_proxy_fails_on_signature(lab, real_keys):
    result, _ = sandbox(lab, "direct")
    assert result.get("error") in ("InvalidClientTokenId", "SignatureDoesNotMatch", "InvalidAccessKeyId"), result


def test_role_arn_assumed_through_sts(lab, real_keys):
    spec = f"""
network:
  allowCidrs: ["198.18.0.0/15"]
  credentials:
    aws: {{type: aws_sigv4, accessKeyId: "${{env:REAL_AK}}", secretAccessKey: "${{env:REAL_SK}}",
          roleArn: "{real_keys['role']}", stsUrl: "{STS}/", durationSeconds: 900}}
  allowlist:
    - {{domain: sts.example.test, sign: aws}}
    - {{domain: api.example.test, sign: aws}}
"""
    proxy = lab.start_proxy(spec, env={"REAL_AK": real_keys["id"], "REAL_SK": real_keys["secret"]})
    try:
        # The role's keys are fetched (AssumeRole at moto) on a first signed request to the
        # echo upstream: moto_server completes TLS handshakes one at a time in its accept
        # loop, so a sandbox tunnel to it, dialled at CONNECT, would hold up the proxy's own
        # STS call until it timed out.
        status, _, body = curl(lab, proxy, "https://api.example.test/", "--aws-sigv4", "aws:amz:us-east-1:sts",
                               "--user", "placeholder:placeholder")  # fmt: skip
        assert status == 200, body
        assert '"X-Amz-Security-Token", "****' in body  # the session token echoed back, masked
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "AWS_ACCESS_KEY_ID": "placeholder",
               "AWS_SECRET_ACCESS_KEY": "placeholder", "AWS_CA_BUNDLE": client_ca_bundle(lab, proxy),
               "HTTPS_PROXY": proxy.url}  # fmt: skip
        code = (f"import boto3; print(boto3.client('sts', endpoint_url='{STS}', region_name='us-east-1')"
                ".get_caller_identity()['Arn'])")  # fmt: skip
        out = lab.exec(sys.executable, "-c", code, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert ":assumed-role/agent/egress-proxy" in out.stdout
        assert 'egress_credential_fetches_total{credential="aws",outcome="ok"} 1.0' in proxy.get_ops("/metrics")[1]
    finally:
        proxy.stop()
