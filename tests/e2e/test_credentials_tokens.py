"""End-to-end: token sources (OAuth2, Google service account, GitHub App) through the real
proxy, against token servers that verify what the proxy sends with the real libraries
(google-auth, PyJWT) and issue tokens that expire in seconds; `query` and `replace`;
echoes masked; a token server that is down answers 502 credential_unavailable, then recovers.

The echo upstream (upstream_server.py) answers every request with what it received, so
each request is an echo attempt: the sandbox must never read a canary back."""

from __future__ import annotations

import base64
import json
import secrets
import time

import pytest

from e2e.support.clients import client_ca_bundle, curl, upstream_hits
from e2e.support.credentials_lab import add_host, rsa_key_pair, start_in_upstream, token_server_cmd
from e2e.support.lab import HOSTS, Lab, _terminate

CANARY = "canary" + secrets.token_hex(8)
MAPS_KEY = "maps-" + CANARY
TG_TOKEN = "123456:tg-" + CANARY
LIFETIME = 3.0
TOKEN_HOST, TOKEN_ADDRESS = "token.example.test", "198.18.0.60"  # .30-.34: test_reliability.py
DOWN_HOST, DOWN_ADDRESS = "down.example.test", "198.18.0.61"
GIT_HOST = "git.example.test"  # the token server's git http-backend, Basic auth required


@pytest.fixture(scope="module")
def keys(lab: Lab) -> dict:
    directory = lab.dir / "credkeys"
    directory.mkdir(exist_ok=True)
    google_key, google_pub = rsa_key_pair(directory, "google")
    github_key, github_pub = rsa_key_pair(directory, "github")
    client_secret = directory / "client-secret"
    client_secret.write_text("cs-" + CANARY)
    key_file = directory / "vertex.json"
    key_file.write_text(json.dumps({
        "type": "service_account", "client_email": "egress@project.iam.gserviceaccount.com",
        "private_key": google_key.read_text(), "private_key_id": "kid1",
        "token_uri": f"https://{TOKEN_HOST}:9443/google/token",
    }))  # fmt: skip
    return {"google_pub": google_pub, "github_key": github_key, "github_pub": github_pub,
            "client_secret": client_secret, "key_file": key_file, "dir": directory}  # fmt: skip


@pytest.fixture(scope="module")
def token_server(lab: Lab, keys):
    add_host(lab, TOKEN_HOST, TOKEN_ADDRESS)
    add_host(lab, DOWN_HOST, DOWN_ADDRESS)
    add_host(lab, GIT_HOST, TOKEN_ADDRESS)
    log = keys["dir"] / "tokens.jsonl"
    proc = start_in_upstream(lab, token_server_cmd(lab, f"{TOKEN_ADDRESS}:9443", log, CANARY, keys, LIFETIME))
    yield log
    _terminate(proc)


def fetches(log, kind: str) -> list[dict]:
    if not log.exists():
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def proxy(lab: Lab, keys, token_server):
    spec = f"""
network:
  allowCidrs: ["198.18.0.0/15"]
  credentials:
    corp: {{type: oauth2, tokenUrl: "https://{TOKEN_HOST}:9443/oauth/token", clientId: egress,
           clientSecret: "${{file:{keys['client_secret']}}}", scope: api.read}}
    vertex: {{type: gcp_service_account, keyFile: {keys['key_file']},
             scopes: ["https://www.googleapis.com/auth/cloud-platform"]}}
    gh: {{type: github_app, appId: 4242, installationId: 7, privateKey: "${{file:{keys['github_key']}}}",
         apiUrl: "https://{TOKEN_HOST}:9443/api/v3"}}
    down: {{type: oauth2, tokenUrl: "https://{DOWN_HOST}:9443/oauth/token", clientId: egress,
           clientSecret: "${{file:{keys['client_secret']}}}"}}
  allowlist:
    - domain: api.example.test
      transform: {{Authorization: "Bearer ${{credential:corp}}"}}
    - domain: a.example.test
      transform: {{Authorization: "Bearer ${{credential:vertex}}"}}
    - domain: example.test
      transform: {{Authorization: "Basic ${{base64:x-access-token:${{credential:gh}}}}"}}
    - domain: other.test
      query: {{key: "${{env:MAPS_KEY}}"}}
      replace: {{EGRESS_PLACEHOLDER_TG: "${{env:TG_TOKEN}}"}}
    - domain: {GIT_HOST}
      transform: {{Authorization: "Basic ${{base64:x-access-token:${{credential:gh}}}}"}}
    - domain: telemetry.example.test
      transform: {{Authorization: "Bearer ${{credential:down}}"}}
"""
    proxy = lab.start_proxy(spec, "--connect-timeout", "3", env={"MAPS_KEY": MAPS_KEY, "TG_TOKEN": TG_TOKEN})
    yield proxy
    proxy.stop()
    everything = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    assert CANARY not in everything  # audit log, the proxy's own log, metrics


def received(lab: Lab, host: str, since: float) -> list[dict]:
    return [r for r in upstream_hits(lab, HOSTS[host]) if r["time"] >= since]


def header(record: dict, name: str) -> str:
    return next((v for k, v in record["headers"] if k.lower() == name.lower()), "")


def test_oauth2_one_fetch_per_lifetime_across_expiries_and_echo_masked(lab, proxy, token_server):
    started = time.time()
    seen = set()
    while time.time() - started < 4 * LIFETIME:
        status, headers, body = curl(lab, proxy, "https://api.example.test/v1/data")
        assert status == 200, body
        assert CANARY not in body and CANARY not in json.dumps(headers)
        assert '["Authorization", "Bearer *****' in body  # the echo came back, the token masked
        time.sleep(0.1)
    for record in received(lab, "api.example.test", started):
        value = header(record, "Authorization")
        assert value.startswith(f"Bearer oat-{CANARY}-"), value
        seen.add(value)
    ok = [f for f in fetches(token_server, "oauth2") if f["ok"] and f["time"] >= started - 1]
    # Refreshed at 3/4 of each lifetime, in the background: 12 s / 2.25 s -> about 5-6 fetches.
    assert 3 <= len(ok) <= 8, ok
    assert len(seen) >= 3  # several tokens in turn, each expiring after 3 s
    assert all(f["detail"] == "api.read" for f in ok)
    metrics = proxy.get_ops("/metrics")[1]
    assert 'egress_credential_fetches_total{credential="corp",outcome="ok"}' in metrics
    assert 'egress_secret_echoes_total{rule="api.example.test"}' in metrics


def test_gcp_service_account_assertion_verified_by_google_auth(lab, proxy, token_server):
    started = time.time()
    status, _, body = curl(lab, proxy, "https://a.example.test/v1/projects/p/locations/us/models")
    assert status == 200 and CANARY not in body
    (record,) = received(lab, "a.example.test", started)
    assert header(record, "Authorization").startswith(f"Bearer ya29.{CANARY}-")
    assert any(f["ok"] and f["detail"] == "egress@project.iam.gserviceaccount.com" for f in fetches(token_server, "google"))


def test_git_clone_and_fetch_with_a_github_app_token_in_basic(lab, proxy, token_server, tmp_path):
    started = time.time()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "https_proxy": proxy.url,
           "GIT_SSL_CAINFO": client_ca_bundle(lab, proxy), "GIT_TERMINAL_PROMPT": "0"}  # fmt: skip
    out = lab.exec("git", "clone", "-q", "https://example.test/static/repo.git", str(tmp_path / "clone"), env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "clone" / "README").read_text() == "hello through the proxy\n"
    out = lab.exec("git", "-C", str(tmp_path / "clone"), "fetch", "-q", "origin", env=env)
    assert out.returncode == 0, out.stderr
    records = received(lab, "example.test", started)
    assert records
    for record in records:
        scheme, _, value = header(record, "Authorization").partition(" ")
        assert scheme == "Basic" and base64.b64decode(value).decode().startswith(f"x-access-token:ghs_{CANARY}-")
    assert any(f["ok"] for f in fetches(token_server, "github"))


def test_query_and_placeholder_in_path_query_and_header(lab, proxy):
    started = time.time()
    status, headers, body = curl(
        lab, proxy, "https://other.test/botEGRESS_PLACEHOLDER_TG/getMe?key=client-value&chat=EGRESS_PLACEHOLDER_TG",
        "-H", "X-Token: EGRESS_PLACEHOLDER_TG", "-u", "bot:EGRESS_PLACEHOLDER_TG",
    )  # fmt: skip
    assert status == 200 and CANARY not in body, body
    (record,) = received(lab, "other.test", started)
    assert record["path"] == f"/bot{TG_TOKEN}/getMe?chat={TG_TOKEN}&key={MAPS_KEY}"
    assert header(record, "X-Token") == TG_TOKEN
    assert base64.b64decode(header(record, "Authorization").split()[1]).decode() == f"bot:{TG_TOKEN}"


def test_token_server_down_is_502_credential_unavailable_then_recovers(lab, proxy, keys):
    started = time.monotonic()
    status, headers, body = curl(lab, proxy, "https://telemetry.example.test/")
    assert time.monotonic() - started < 3 + 2  # within the connect timeout (refused at once here)
    assert status == 502 and headers["x-egress-error"] == "credential_unavailable"
    assert json.loads(body) == {"error": "credential_unavailable", "credential": "down", "host": "telemetry.example.test"}
    assert not received(lab, "telemetry.example.test", time.time() - 10)  # never sent without it
    log = keys["dir"] / "down.jsonl"
    proc = start_in_upstream(lab, token_server_cmd(lab, f"{DOWN_ADDRESS}:9443", log, CANARY, keys, 60))
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status, _, body = curl(lab, proxy, "https://telemetry.example.test/")
            if status == 200:
                break
            time.sleep(0.3)
        assert status == 200 and CANARY not in body
    finally:
        _terminate(proc)
    assert 'egress_credential_fetches_total{credential="down",outcome="error"}' in proxy.get_ops("/metrics")[1]


def test_git_clone_and_fetch_from_git_http_backend_requiring_basic(lab, proxy, token_server, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "https_proxy": proxy.url,
           "GIT_SSL_CAINFO": client_ca_bundle(lab, proxy), "GIT_TERMINAL_PROMPT": "0"}  # fmt: skip
    url = f"https://{GIT_HOST}:9443/git/repo.git"
    out = lab.exec("git", "clone", "-q", url, str(tmp_path / "smart"), env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "smart" / "README").read_text() == "hello through the proxy\n"
    time.sleep(LIFETIME + 0.5)  # the installation token has expired: fetch gets the next one
    out = lab.exec("git", "-C", str(tmp_path / "smart"), "fetch", "origin", env=env)
    assert out.returncode == 0, out.stderr
    assert CANARY not in out.stdout + out.stderr
    calls = [f for f in fetches(token_server, "git")]
    assert calls and all(f["ok"] for f in calls), calls  # every request carried a live token
    # Without the proxy's credential the same server refuses (the sandbox has none).
    direct = lab.exec("git", "ls-remote", url, env={**env, "https_proxy": "", "GIT_SSL_CAINFO": str(lab.upstream_ca)})
    assert direct.returncode != 0


def test_streamed_echo_masked_across_chunks(lab, proxy):
    size = 3 * 1024 * 1024 + 17  # streamed (over 64 KiB), many chunks, secrets across their boundaries
    status, headers, body = curl(lab, proxy, f"https://{GIT_HOST}:9443/echo-large/{size}")
    assert status == 200 and len(body) == size and headers["content-length"] == str(size)
    assert CANARY not in body
    assert body.count("x-access-token") == 0  # the whole Basic value was an injected secret
    assert body.startswith("Basic ****")
