"""network.credentials and the entry fields that place credentials: parsing and `check` errors."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from egress.credentials import references
from egress.credentials.spec import EntryCredentials
from egress.policy.spec import SpecError, parse_spec


def _pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


PEM = _pem()


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text, environ=environ or {})
    return [p.removeprefix("<spec>: ") for p in info.value.problems]


def test_full_example_parses(tmp_path):
    key = tmp_path / "vertex.json"
    key.write_text(json.dumps({"type": "service_account", "client_email": "sa@p.iam", "private_key": PEM,
                               "private_key_id": "k1", "token_uri": "https://oauth2.example/token"}))  # fmt: skip
    pem = tmp_path / "gh.pem"
    pem.write_text(PEM)
    spec = parse_spec(f"""
network:
  credentials:
    corp:   {{type: oauth2, tokenUrl: "https://login.corp.example/token", clientId: egress,
             clientSecret: "${{env:CORP_SECRET}}", scope: "api.read"}}
    vertex: {{type: gcp_service_account, keyFile: {key}, scopes: ["https://www.googleapis.com/auth/cloud-platform"]}}
    ghapp:  {{type: github_app, appId: 123, installationId: 456, privateKey: "${{file:{pem}}}"}}
    aws:    {{type: aws_sigv4, accessKeyId: "${{env:AK}}", secretAccessKey: "${{env:SK}}"}}
  allowlist:
    - domain: api.corp.example
      transform: {{Authorization: "Bearer ${{credential:corp}}"}}
    - domain: github.com
      transform: {{Authorization: "Basic ${{base64:x-access-token:${{credential:ghapp}}}}"}}
    - domain: bedrock-runtime.us-east-1.amazonaws.com
      sign: aws
    - domain: maps.example.com
      query: {{key: "${{env:MAPS_KEY}}"}}
    - domain: api.telegram.org
      replace: {{"EGRESS_PLACEHOLDER_TG": "${{env:TG_TOKEN}}"}}
    - domain: static.example.com
      transform: {{X-Key: "${{base64:user:${{env:MAPS_KEY}}}}"}}
""", environ={"CORP_SECRET": "cs", "AK": "AKIA", "SK": "sk", "MAPS_KEY": "mk", "TG_TOKEN": "123:abc"})  # fmt: skip
    by_rule = {e.rule: e for e in spec.entries}
    corp = by_rule["api.corp.example"]
    assert corp.transform == {} and corp.injects and corp.intercepted
    assert isinstance(corp.credentials, EntryCredentials)
    assert [s.name for s in corp.credentials.sources] == ["corp"]
    gh = dict(by_rule["github.com"].credentials.headers)["Authorization"]
    assert gh.render({"ghapp": "TOKEN"}) == "Basic eC1hY2Nlc3MtdG9rZW46VE9LRU4="  # base64("x-access-token:TOKEN")
    assert by_rule["bedrock-runtime.us-east-1.amazonaws.com"].credentials.sign.name == "aws"
    assert by_rule["maps.example.com"].injects and by_rule["api.telegram.org"].intercepted
    # ${base64:} without a credential is static: rendered at load, a plain transform value.
    assert by_rule["static.example.com"].transform["X-Key"].reveal() == "dXNlcjptaw=="
    assert by_rule["static.example.com"].credentials is None
    assert str(pem) in spec.secret_files and str(key) in spec.secret_files


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{type: oauth2, tokenUrl: 'http://x/t', clientId: a, clientSecret: b}",
         "network.credentials.s.tokenUrl: must be an https:// URL"),
        ("{type: oauth2, tokenUrl: 'https://x/t', clientSecret: b}", "network.credentials.s.clientId: missing"),
        ("{type: oauth2, tokenUrl: 'https://x/t', clientId: a}", "network.credentials.s.clientSecret: missing"),
        ("{type: oauth2, tokenUrl: 'https://x/t', clientId: a, clientSecret: b, grant: refresh_token}",
         "network.credentials.s.refreshToken: missing"),
        ("{type: oauth2, tokenUrl: 'https://x/t', clientId: a, clientSecret: b, clientAuth: jwt}",
         "network.credentials.s.clientAuth: 'jwt' is not one of basic, body"),
        ("{type: oauth2, tokenUrl: 'https://u:p@x/t', clientId: a, clientSecret: b}",
         "network.credentials.s.tokenUrl: must not hold credentials"),
        ("{type: oauth2, tokenUrl: 'https://x/t', clientId: a, clientSecret: '${env:NOPE}'}",
         "network.credentials.s.clientSecret: ${env:NOPE}: environment variable NOPE is not set"),
        ("{type: kerberos}", "network.credentials.s.type: 'kerberos' is not a source type"),
        ("{tokenUrl: x}", "network.credentials.s.type: missing"),
        ("{type: github_app, appId: 1, installationId: x, privateKey: abc}",
         "network.credentials.s.installationId: must be an integer >= 1"),
        ("{type: github_app, appId: 1, installationId: 2, privateKey: abc}",
         "network.credentials.s.privateKey: is not an unencrypted PEM private key"),
        ("{type: gcp_service_account, keyFile: /nonexistent/key.json, scopes: [a]}",
         "network.credentials.s.keyFile: /nonexistent/key.json: cannot read"),
        ("{type: gcp_service_account, keyFile: /k.json}", "network.credentials.s.scopes: missing"),
        ("{type: aws_sigv4, accessKeyId: a}", "network.credentials.s.secretAccessKey: missing"),
        ('{type: aws_sigv4, accessKeyId: "AKIA\\r\\nX-Evil: 1", secretAccessKey: b}',
         "network.credentials.s.accessKeyId: must be visible ASCII"),
        ("{type: aws_sigv4, accessKeyId: a, secretAccessKey: b, durationSeconds: 900}",
         "network.credentials.s.durationSeconds: only with roleArn"),
        ("{type: aws_sigv4, accessKeyId: a, secretAccessKey: b, roleArn: role}",
         "network.credentials.s.roleArn: must be a role ARN"),
        ("{type: oauth2, tokenUrl: 'https://x/t', clientId: a, clientSecret: b, colour: red}",
         "network.credentials.s.colour: unknown field"),
    ],
)  # fmt: skip
def test_source_problems_name_source_and_field(source, expected):
    found = problems(f"network:\n  credentials:\n    s: {source}\n  allowlist: []\n")
    assert any(p.startswith(expected) for p in found), found


def test_gcp_key_file_problems(tmp_path):
    key = tmp_path / "k.json"
    key.write_text(json.dumps({"type": "authorized_user"}))
    found = problems(f"network:\n  credentials:\n    v: {{type: gcp_service_account, keyFile: {key}, scopes: [a]}}\n  allowlist: []\n")
    assert found == [f"network.credentials.v.keyFile: {key}: not a service account key (its `type` must be service_account)"]
    key.write_text(json.dumps({"type": "service_account", "client_email": "a", "private_key": "x", "token_uri": "https://t"}))
    found = problems(f"network:\n  credentials:\n    v: {{type: gcp_service_account, keyFile: {key}, scopes: [a]}}\n  allowlist: []\n")
    assert found == [f"network.credentials.v.keyFile: {key}: private_key is not an unencrypted PEM private key"]


SOURCES = """
network:
  allowCidrs: []
  credentials:
    corp: {type: oauth2, tokenUrl: "https://login.example/token", clientId: a, clientSecret: b}
    aws: {type: aws_sigv4, accessKeyId: a, secretAccessKey: b}
  allowlist:
"""


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("{domain: a.test, transform: {Authorization: 'Bearer ${credential:nope}'}}",
         "network.allowlist[0].transform.Authorization: ${credential:nope}: no credential source 'nope'"),
        ("{domain: a.test, transform: {Authorization: 'Bearer ${credential:aws}'}}",
         "network.allowlist[0].transform.Authorization: ${credential:aws}: an aws_sigv4 source signs requests"),
        ("{domain: a.test, sign: corp}", "network.allowlist[0].sign: 'corp' is a oauth2 source; sign takes an aws_sigv4 one"),
        ("{domain: a.test, sign: nope}", "network.allowlist[0].sign: no credential source 'nope'"),
        ("{domain: a.test, sign: aws, transform: {Authorization: x}}",
         "network.allowlist[0].transform.Authorization: cannot be set on an entry that is signed"),
        ("{domain: '*', query: {key: v}}", "network.allowlist[0]: query, replace and sign are not allowed on '*'"),
        ("{domain: a.test, replace: {short: v}}", "network.allowlist[0].replace: placeholder 'short' must match"),
        ("{domain: a.test, query: {key: '${base64:x'}}", "network.allowlist[0].query.key: ${base64:...}: unterminated"),
        ("{domain: a.test, query: {key: '${vault:x}'}}", "network.allowlist[0].query.key: ${vault:x}: unknown reference"),
        ("{domain: a.test, query: []}", "network.allowlist[0].query: must be a non-empty mapping"),
        ("{domain: a.test, transform: {X: \"a${credential:corp}\\nb\"}}",
         "network.allowlist[0].transform.X: value contains CR or LF"),
        ("{domain: a.test, signed: aws}", "network.allowlist[0].signed: unknown field (expected domain, query, replace, requests, sign, transform)"),
    ],
)  # fmt: skip
def test_entry_problems(entry, expected):
    found = problems(SOURCES + f"    - {entry}\n")
    assert any(p.startswith(expected) for p in found), found


def test_problems_never_echo_secrets():
    found = problems(SOURCES.replace("clientSecret: b", "clientSecret: s3cr3t-value, grant: bogus") + "    - {domain: a.test}\n")
    assert found and not any("s3cr3t" in p for p in found)


def test_references_render_and_escape():
    t = references.parse("a $${literal} ${base64:${credential:x}:${env:E}} z", {"E": "e"})
    assert t.credentials == {"x"}
    assert t.render({"x": "tok"}) == "a ${literal} dG9rOmU= z"
    assert "tok" not in repr(t) and "e" not in repr(t).replace("template", "").replace("credentials", "")
    assert references.referenced_files("${base64:${file:/a}} ${file:/b} $${file:/c}") == ["/a", "/b"]


def test_check_command_reports_credential_problems_one_line_each(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "network:\n"
        "  credentials:\n"
        "    corp: {type: oauth2, tokenUrl: 'http://login.example/token', clientId: a, clientSecret: hunter2-secret}\n"
        "    gh: {type: github_app, appId: 1, installationId: 2, privateKey: not-a-key-secret}\n"
        "  allowlist:\n"
        "    - {domain: api.example.com, transform: {Authorization: 'Bearer ${credential:crop}'}}\n"
    )
    done = subprocess.run(
        [str(Path(sys.executable).with_name("egress-proxy")), "check", "--spec", str(spec)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert f"{spec}: network.credentials.corp.tokenUrl: must be an https:// URL" in output
    assert f"{spec}: network.credentials.gh.privateKey: is not an unencrypted PEM private key" in output
    assert f"{spec}: network.allowlist[0].transform.Authorization: ${{credential:crop}}: no credential source 'crop'" in output
    assert "Traceback" not in output and "hunter2" not in output and "not-a-key" not in output
