"""One gateway, many environments (`--spec-dir`): proof of environment, isolation, reload, metrics.

Three environments share one real egress-proxy:
- env-a and env-b both allowlist api.example.test, each with its own injected
  canary secret (env-b's proxy token comes from a file),
- env-c allowlists only other.test (token from the environment).
Real clients (curl, requests, httpx, git, raw sockets) use `http://ENV:TOKEN@proxy`.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import ssl
import subprocess
import time
import types
from pathlib import Path

import httpx
import pytest
import requests
from http_head import recv_head

from e2e.support.clients import as_received, client_ca_bundle, curl, upstream_hits
from e2e.support.lab import EGRESS_PROXY, HOSTS, Lab, in_netns, raw_request
from e2e.test_operations import prometheus, promql, wait_for  # noqa: F401  (prometheus is a fixture)

CANARY_A = "canary-a-" + secrets.token_hex(8)
CANARY_B = "canary-b-" + secrets.token_hex(8)
TOKEN_A = "tok-a-" + secrets.token_hex(8)
TOKEN_B = "tok-b-" + secrets.token_hex(8)
TOKEN_C = "tok-c-" + secrets.token_hex(8)
SECRETS = (CANARY_A, CANARY_B, TOKEN_A, TOKEN_B, TOKEN_C)


def env_a_spec(canary: str = CANARY_A) -> str:
    return f"""network:
  proxyToken: {TOKEN_A}
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: api.example.test
      transform: {{Authorization: "Bearer {canary}"}}
    - domain: plain.test
    - domain: a.example.test
    - domain: telemetry.example.test
"""


def write_environments(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "env-a.yaml").write_text(env_a_spec())
    (directory / "token-b").write_text(TOKEN_B + "\n")  # not a spec (no spec suffix): ignored
    (directory / "env-b.json").write_text(json.dumps({"network": {
        "proxyToken": f"${{file:{directory / 'token-b'}}}", "allowCidrs": ["198.18.0.0/15"],
        "allowlist": [{"domain": "api.example.test", "transform": {"Authorization": f"Bearer {CANARY_B}"}},
                      {"domain": "plain.test"},
                      # git clones through it (a host of its own: other tests count api.example.test's repo.git hits)
                      {"domain": "telemetry.example.test", "transform": {"Authorization": f"Bearer {CANARY_B}"}}]}}))  # fmt: skip
    (directory / "env-c.yml").write_text(
        # env-c may reach other.test's address only: env-a's wider allowCidrs must not apply to it.
        "network:\n  proxyToken: ${env:GW_TOKEN_C}\n  allowCidrs: [198.18.0.14/32]\n"
        "  allowlist:\n    - domain: other.test\n    - domain: telemetry.example.test\n"
    )
    # Skipped: a dotfile (broken on purpose) and a ConfigMap's `..data` directory.
    (directory / ".env-x.yaml").write_text("network: [broken")
    (directory / "..data").mkdir(exist_ok=True)
    (directory / "README.md").write_text("not an environment\n")


def as_user(proxy, user: str, token: str):
    """The same proxy, addressed with credentials in the proxy URL (as a sandbox's HTTPS_PROXY)."""
    return types.SimpleNamespace(url=f"http://{user}:{token}@127.0.0.1:{proxy.port}", dir=proxy.dir, ca=proxy.ca, port=proxy.port)


def basic(user: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def parse(raw: bytes) -> tuple[int, dict, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return (int(lines[0].split()[1]) if lines[0] else 0), headers, body


def assert_auth_required(status: int, headers: dict, body: bytes | str, host: str) -> None:
    assert status == 407, (status, body)
    assert headers.get("proxy-authenticate") == 'Basic realm="egress"'
    assert headers.get("x-egress-denied") == "proxy_auth_required"
    assert json.loads(body) == {"error": "egress_denied", "reason": "proxy_auth_required", "host": host}


def assert_no_secret_leaked(proxy) -> None:
    everything = proxy.stdout() + proxy.stderr() + proxy.get_ops("/metrics")[1]
    for value in SECRETS:
        assert value not in everything


@pytest.fixture(scope="module")
def gateway(lab: Lab):
    directory = lab.dir / f"envs-{lab.free_port()}"
    write_environments(directory)
    proxy = lab.start_proxy(None, spec_dir=directory, env={"GW_TOKEN_C": TOKEN_C})
    yield proxy
    proxy.stop()
    assert_no_secret_leaked(proxy)


def echoed_headers(lab: Lab, body: str) -> dict:
    """The headers the upstream received for the request this echo answered."""
    return {k.lower(): v for k, v in as_received(lab, json.loads(body))["headers"]}


# -- each environment gets its own policy and secret ----------------------------------


def test_each_environment_sees_only_its_own_secret(lab, gateway):
    a, b, c = as_user(gateway, "env-a", TOKEN_A), as_user(gateway, "env-b", TOKEN_B), as_user(gateway, "env-c", TOKEN_C)
    status, _, body = curl(lab, a, "https://api.example.test/a")
    assert status == 200 and echoed_headers(lab, body)["authorization"] == f"Bearer {CANARY_A}"
    status, _, body = curl(lab, b, "https://api.example.test/b")
    assert status == 200 and echoed_headers(lab, body)["authorization"] == f"Bearer {CANARY_B}"
    # env-c does not allowlist the host env-a and env-b share.
    status, headers, body = curl(lab, c, "https://api.example.test/c")
    assert status == 403 and headers["x-egress-denied"] == "not_allowlisted"
    status, _, body = curl(lab, c, "http://other.test/c")
    assert status == 200 and json.loads(body)["local"] == HOSTS["other.test"]
    # allowCidrs are per environment too.
    assert curl(lab, a, "http://telemetry.example.test/a")[0] == 200
    status, headers, _ = curl(lab, c, "http://telemetry.example.test/c")
    assert status == 403 and headers["x-egress-denied"] == "forbidden_address"
    # ...and env-a does not get env-c's host.
    status, headers, _ = curl(lab, a, "http://other.test/a")
    assert status == 403 and headers["x-egress-denied"] == "not_allowlisted"

    hits = upstream_hits(lab, HOSTS["api.example.test"])
    by_path = {r["path"]: dict(r["headers"]) for r in hits}
    assert by_path["/a"]["Authorization"] == f"Bearer {CANARY_A}"
    assert by_path["/b"]["Authorization"] == f"Bearer {CANARY_B}"
    assert "/c" not in by_path
    # No upstream ever saw the other environment's canary with a path of this environment, nor a proxy credential.
    for r in lab.upstream_requests():
        text = json.dumps(r)
        assert "Proxy-Authorization" not in text and "proxy-authorization" not in text
        assert not (r["path"] == "/a" and CANARY_B in text) and not (r["path"] == "/b" and CANARY_A in text)
        assert TOKEN_A not in text and TOKEN_B not in text and TOKEN_C not in text


def test_same_host_on_one_connection_each_keeps_its_secret(lab, gateway):
    """Keep-alive clients of two environments to one host: upstream connections are never shared."""
    ctx_a = httpx.Client(proxy=as_user(gateway, "env-a", TOKEN_A).url, verify=ssl.create_default_context(cafile=str(gateway.ca)), trust_env=False, timeout=10)
    ctx_b = httpx.Client(proxy=as_user(gateway, "env-b", TOKEN_B).url, verify=ssl.create_default_context(cafile=str(gateway.ca)), trust_env=False, timeout=10)
    with in_netns(lab.proxy_ns), ctx_a as client_a, ctx_b as client_b:
        for i in range(3):
            ra = client_a.get(f"https://api.example.test/ka-{i}")
            rb = client_b.get(f"https://api.example.test/kb-{i}")
            assert ra.status_code == rb.status_code == 200
            assert {k.lower(): v for k, v in as_received(lab, ra.json())["headers"]}["authorization"] == f"Bearer {CANARY_A}"
            assert {k.lower(): v for k, v in as_received(lab, rb.json())["headers"]}["authorization"] == f"Bearer {CANARY_B}"


def test_plain_http_carries_no_proxy_credentials_upstream(lab, gateway):
    for user, token in (("env-a", TOKEN_A), ("env-b", TOKEN_B)):
        status, _, body = curl(lab, as_user(gateway, user, token), f"http://plain.test/plain-{user}")
        assert status == 200
        assert "proxy-authorization" not in echoed_headers(lab, body)
    hits = [r for r in upstream_hits(lab, HOSTS["plain.test"]) if r["path"].startswith("/plain-env-")]
    assert len(hits) == 2
    assert all("proxy-authorization" not in {k.lower() for k, _ in r["headers"]} for r in hits)


def test_passthrough_tunnel_for_an_environment(lab, gateway):
    status, _, body = curl(lab, as_user(gateway, "env-a", TOKEN_A), "https://a.example.test/pass")
    assert status == 200 and json.loads(body)["path"] == "/pass"
    status, headers, _ = curl(lab, as_user(gateway, "env-b", TOKEN_B), "https://a.example.test/pass")
    assert status == 403 and headers["x-egress-denied"] == "not_allowlisted"


# -- proving the environment ------------------------------------------------------------


@pytest.mark.parametrize(
    "credentials",
    [None, ("env-a", "wrong"), ("env-a", TOKEN_B), ("env-z", TOKEN_A), ("", TOKEN_A), ("env-a", ""), ("ENV-A", TOKEN_A)],
    ids=["none", "wrong-token", "other-envs-token", "unknown-env", "no-user", "no-token", "case"],
)
def test_without_proof_407(lab, gateway, credentials):
    extra = f"Proxy-Authorization: {basic(*credentials)}\r\n" if credentials else ""
    raw = raw_request(lab, gateway.port, f"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n{extra}\r\n".encode())
    assert_auth_required(*parse(raw), host="api.example.test")
    raw = raw_request(lab, gateway.port, f"GET http://plain.test/x HTTP/1.1\r\nHost: plain.test\r\n{extra}\r\n".encode())
    assert_auth_required(*parse(raw), host="plain.test")


@pytest.mark.parametrize(
    "header",
    ["Bearer abc", "Basic", "Basic !!!notbase64", "Basic " + base64.b64encode(b"no-colon").decode(),
     "Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(), "basic " + "A" * 5000],
    ids=["bearer", "empty", "bad-base64", "no-colon", "not-utf8", "long"],
)  # fmt: skip
def test_malformed_proof_407(lab, gateway, header):
    raw = raw_request(lab, gateway.port, f"GET http://plain.test/m HTTP/1.1\r\nHost: plain.test\r\nProxy-Authorization: {header}\r\n\r\n".encode())
    assert_auth_required(*parse(raw), host="plain.test")


def test_curl_without_credentials_gets_407(lab, gateway):
    status, headers, body = curl(lab, gateway, "http://plain.test/")
    assert_auth_required(status, headers, body, "plain.test")
    status, headers, body = curl(lab, as_user(gateway, "env-a", "nope"), "http://plain.test/")
    assert_auth_required(status, headers, body, "plain.test")


def test_environment_without_token_refuses_everyone(lab, tmp_path):
    directory = tmp_path / "envs"
    directory.mkdir()
    (directory / "open.yaml").write_text("network:\n  allowCidrs: [198.18.0.0/15]\n  allowlist:\n    - domain: plain.test\n")
    proxy = lab.start_proxy(None, spec_dir=directory)
    try:
        for token in ("", "x", "anything"):
            status, headers, body = curl(lab, as_user(proxy, "open", token), "http://plain.test/")
            assert_auth_required(status, headers, body, "plain.test")
    finally:
        proxy.stop()


def _read_response(sock: socket.socket) -> bytes:
    data = recv_head(sock)
    if b"\r\n\r\n" not in data:
        return data  # EOF before a whole head
    status, headers, body = parse(data)
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return data.partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + body


def test_connection_that_switches_credentials_is_refused_and_closed(lab, gateway):
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        request = "GET http://plain.test/{path} HTTP/1.1\r\nHost: plain.test\r\nProxy-Authorization: {auth}\r\n\r\n"
        sock.sendall(request.format(path="first", auth=basic("env-a", TOKEN_A)).encode())
        status, _, _ = parse(_read_response(sock))
        assert status == 200
        sock.sendall(request.format(path="second", auth=basic("env-a", TOKEN_A)).encode())
        assert parse(_read_response(sock))[0] == 200
        # Valid credentials, but of another environment: refused, and the connection ends.
        sock.sendall(request.format(path="switched", auth=basic("env-b", TOKEN_B)).encode())
        status, headers, body = parse(_read_response(sock))
        assert_auth_required(status, headers, body, "plain.test")
        sock.settimeout(5)
        assert sock.recv(65536) == b""
    finally:
        sock.close()
    assert not [r for r in upstream_hits(lab, HOSTS["plain.test"]) if r["path"] == "/switched"]


def test_connection_that_drops_credentials_is_refused_and_closed(lab, gateway):
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        sock.sendall(f"GET http://plain.test/ok HTTP/1.1\r\nHost: plain.test\r\nProxy-Authorization: {basic('env-b', TOKEN_B)}\r\n\r\n".encode())
        assert parse(_read_response(sock))[0] == 200
        sock.sendall(b"GET http://plain.test/anon HTTP/1.1\r\nHost: plain.test\r\n\r\n")
        assert parse(_read_response(sock))[0] == 407
        sock.settimeout(5)
        assert sock.recv(65536) == b""
    finally:
        sock.close()


# -- real clients with user:token@ proxy URLs ----------------------------------------------


def test_requests_httpx_and_git_with_credentials_in_the_proxy_url(lab, gateway):
    a = as_user(gateway, "env-a", TOKEN_A)
    with in_netns(lab.proxy_ns):
        r = requests.get("https://api.example.test/requests", proxies={"https": a.url, "http": a.url},
                         verify=client_ca_bundle(lab, gateway), timeout=10)  # fmt: skip
        plain = requests.get("http://plain.test/requests", proxies={"http": as_user(gateway, "env-b", TOKEN_B).url}, timeout=10)
        with httpx.Client(proxy=a.url, verify=ssl.create_default_context(cafile=str(gateway.ca)), trust_env=False, timeout=10) as client:
            rx = client.get("https://api.example.test/httpx")
    assert r.status_code == 200 and {k.lower(): v for k, v in as_received(lab, r.json())["headers"]}["authorization"] == f"Bearer {CANARY_A}"
    assert plain.status_code == 200 and "proxy-authorization" not in {k.lower() for k, _ in plain.json()["headers"]}
    assert rx.status_code == 200 and {k.lower(): v for k, v in as_received(lab, rx.json())["headers"]}["authorization"] == f"Bearer {CANARY_A}"

    target = lab.dir / f"clone-gw-{gateway.port}"
    out = lab.exec(
        "git", "-c", f"http.proxy={as_user(gateway, 'env-b', TOKEN_B).url}", "-c", f"http.sslCAInfo={gateway.ca}",
        "clone", "-q", "https://telemetry.example.test/static/repo.git", str(target),
        env={"PATH": "/usr/bin:/bin", "HOME": str(lab.dir), "GIT_TERMINAL_PROMPT": "0"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.replace(TOKEN_B, "<token>")
    assert (target / "README").read_text() == "hello through the proxy\n"
    git_hits = [r for r in upstream_hits(lab, HOSTS["telemetry.example.test"]) if "repo.git" in r["path"]]
    assert git_hits and all(dict(r["headers"]).get("Authorization") == f"Bearer {CANARY_B}" for r in git_hits)
    # git without credentials is refused at the CONNECT.
    out = lab.exec(
        "git", "-c", f"http.proxy={gateway.url}", "-c", f"http.sslCAInfo={gateway.ca}",
        "clone", "-q", "https://telemetry.example.test/static/repo.git", str(target) + "-anon",
        env={"PATH": "/usr/bin:/bin", "HOME": str(lab.dir), "GIT_TERMINAL_PROMPT": "0"},
    )  # fmt: skip
    assert out.returncode != 0 and "407" in out.stderr


# -- audit and metrics ---------------------------------------------------------------------


def test_audit_lines_and_metrics_carry_the_environment(lab, gateway):
    assert curl(lab, as_user(gateway, "env-c", TOKEN_C), "http://other.test/audit-c")[0] == 200
    assert curl(lab, as_user(gateway, "env-z", "x"), "http://plain.test/audit-z")[0] == 407
    lines = wait_for(lambda: [e for e in gateway.audit() if e["host"] == "plain.test" and e["reason"] == "proxy_auth_required"] and gateway.audit(), timeout=5)
    assert all("environment" in line for line in lines)
    assert any(e["environment"] == "env-c" and e["host"] == "other.test" for e in lines)
    # An unknown (claimed) environment is never a label or an audit value.
    _, exposition = gateway.get_ops("/metrics")
    assert "env-z" not in exposition and "env-z" not in gateway.stdout()
    assert 'egress_environments 3.0' in exposition
    assert 'environment="env-c",reason="",rule="other.test"' in exposition or (
        'rule="other.test"' in exposition and 'environment="env-c"' in exposition
    )
    assert 'egress_requests_total{decision="blocked",environment="",reason="proxy_auth_required",rule=""}' in exposition
    assert 'egress_credential_injections_total{environment="env-a",rule="api.example.test"}' in exposition


def test_prometheus_scrapes_per_environment_counts(lab, prometheus, tmp_path):  # noqa: F811
    directory = tmp_path / "envs"
    write_environments(directory)
    proxy = lab.start_proxy(None, spec_dir=directory, env={"GW_TOKEN_C": TOKEN_C})
    try:
        base = prometheus(proxy.metrics_port)
        a, b, c = as_user(proxy, "env-a", TOKEN_A), as_user(proxy, "env-b", TOKEN_B), as_user(proxy, "env-c", TOKEN_C)
        for i in range(2):
            assert curl(lab, a, f"https://api.example.test/p{i}")[0] == 200
        for i in range(3):
            assert curl(lab, b, f"https://api.example.test/p{i}")[0] == 200
        assert curl(lab, c, "http://plain.test/")[0] == 403
        assert curl(lab, proxy, "http://plain.test/")[0] == 407
        expected = {
            ("env-a", "allowed", ""): 2,
            ("env-b", "allowed", ""): 3,
            ("env-c", "blocked", "not_allowlisted"): 1,
            ("", "blocked", "proxy_auth_required"): 1,
        }

        def scraped():
            rows = promql(lab, base, "sum by (environment, decision, reason) (egress_requests_total)")
            got = {(r["metric"].get("environment", ""), r["metric"].get("decision", ""), r["metric"].get("reason", "")): int(float(r["value"][1])) for r in rows}
            return got if got == expected else None

        assert wait_for(scraped, timeout=20, interval=0.5), promql(lab, base, "egress_requests_total")
        injections = promql(lab, base, "sum by (environment) (egress_credential_injections_total)")
        assert {r["metric"]["environment"]: int(float(r["value"][1])) for r in injections} == {"env-a": 2, "env-b": 3}
        assert promql(lab, base, "egress_environments")[0]["value"][1] == "3"
        status, exposition = proxy.get_ops("/metrics")
        check = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        proxy.stop()
    assert_no_secret_leaked(proxy)


# -- reload per file -------------------------------------------------------------------------


def test_reload_add_change_break_remove(lab, tmp_path):
    directory = tmp_path / "envs"
    write_environments(directory)
    proxy = lab.start_proxy(None, spec_dir=directory, env={"GW_TOKEN_C": TOKEN_C})
    a = as_user(proxy, "env-a", TOKEN_A)
    token_d = "tok-d-" + secrets.token_hex(8)
    d = as_user(proxy, "env-d", token_d)

    def metric(name: str) -> float:
        for line in proxy.get_ops("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    try:
        assert curl(lab, d, "http://plain.test/")[0] == 407
        # Added: serves at once (next poll).
        (directory / "env-d.yaml").write_text(f"network:\n  proxyToken: {token_d}\n  allowCidrs: [198.18.0.0/15]\n  allowlist:\n    - domain: plain.test\n")
        assert wait_for(lambda: curl(lab, d, "http://plain.test/d1")[0] == 200, timeout=10)
        assert metric("egress_environments") == 4
        # Changed: env-d swaps; env-a is untouched.
        (directory / "env-d.yaml").write_text(f"network:\n  proxyToken: {token_d}\n  allowCidrs: [198.18.0.0/15]\n  allowlist:\n    - domain: other.test\n")
        assert wait_for(lambda: curl(lab, d, "http://plain.test/d2")[0] == 403, timeout=10)
        assert curl(lab, d, "http://other.test/d2")[0] == 200
        assert curl(lab, a, "http://plain.test/a2")[0] == 200
        # Changed secret in env-a: the new canary goes upstream from the next request.
        new_canary = "canary-a2-" + secrets.token_hex(8)
        (directory / "env-a.yaml").write_text(env_a_spec(new_canary))
        assert wait_for(
            lambda: echoed_headers(lab, curl(lab, a, "https://api.example.test/a3")[2]).get("authorization") == f"Bearer {new_canary}",
            timeout=10,
        )
        # Broken: env-d keeps its last good spec, the failure is counted with it.
        (directory / "env-d.yaml").write_text("network:\n  allowlist: [\n")
        assert wait_for(lambda: metric('egress_environment_reloads_total{environment="env-d",result="failure"}') == 1, timeout=10)
        assert curl(lab, d, "http://other.test/d3")[0] == 200
        assert curl(lab, d, "http://plain.test/d3")[0] == 403
        assert "environment_reload_failed" in proxy.stderr()
        # Removed: new connections of env-d get 407; the others keep serving.
        (directory / "env-d.yaml").unlink()
        assert wait_for(lambda: curl(lab, d, "http://other.test/d4")[0] == 407, timeout=10)
        assert metric("egress_environments") == 3
        assert curl(lab, a, "http://plain.test/a4")[0] == 200
        assert curl(lab, as_user(proxy, "env-c", TOKEN_C), "http://other.test/c4")[0] == 200
        # SIGHUP rescans at once: a file added just before is served without waiting for a poll.
        (directory / "env-e.yaml").write_text(f"network:\n  proxyToken: {token_d}\n  allowCidrs: [198.18.0.0/15]\n  allowlist:\n    - domain: plain.test\n")
        proxy.proc.send_signal(1)
        assert wait_for(lambda: curl(lab, as_user(proxy, "env-e", token_d), "http://plain.test/e")[0] == 200, timeout=5)
        # A file with a name that is no environment id is refused, counted, never served.
        (directory / "Bad Name.yaml").write_text(f"network:\n  proxyToken: {token_d}\n  allowCidrs: [198.18.0.0/15]\n  allowlist: []\n")
        assert wait_for(lambda: 'file": "Bad Name.yaml"' in proxy.stderr(), timeout=10)
    finally:
        proxy.stop()
    everything = proxy.stdout() + proxy.stderr()
    assert token_d not in everything and new_canary not in everything


def test_existing_tunnel_of_a_removed_environment_gets_407(lab, tmp_path):
    directory = tmp_path / "envs"
    write_environments(directory)
    proxy = lab.start_proxy(None, spec_dir=directory, env={"GW_TOKEN_C": TOKEN_C})
    try:
        with in_netns(lab.proxy_ns), httpx.Client(proxy=as_user(proxy, "env-b", TOKEN_B).url, verify=ssl.create_default_context(cafile=str(proxy.ca)), trust_env=False, timeout=10) as client:
            assert client.get("https://api.example.test/before").status_code == 200
            (directory / "env-b.json").unlink()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                response = client.get("https://api.example.test/after")
                if response.status_code == 407:
                    break
                time.sleep(0.2)
            assert response.status_code == 407 and response.headers["x-egress-denied"] == "proxy_auth_required"
    finally:
        proxy.stop()


# -- start-up and usage ------------------------------------------------------------------------


def test_spec_dir_start_refuses_broken_files_naming_them(lab, tmp_path):
    directory = tmp_path / "envs"
    write_environments(directory)
    (directory / "Env_Upper.yaml").write_text("network: {allowlist: []}\n")
    out = subprocess.run(
        [EGRESS_PROXY, "check", "--spec-dir", str(directory)],
        capture_output=True, text=True, env={"GW_TOKEN_C": TOKEN_C, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [f"{directory / 'Env_Upper.yaml'}: file name is not a valid environment id "
                                                "(lower-case letters, digits, '.', '_', '-'; starting with a letter or digit; at most 63 characters)"]  # fmt: skip
    with pytest.raises(RuntimeError, match="Env_Upper.yaml"):
        lab.start_proxy(None, spec_dir=directory, env={"GW_TOKEN_C": TOKEN_C})


# -- hooks through the gateway -------------------------------------------------------------------

HOOK_CANARY = "hook-canary-" + secrets.token_hex(8)
HOOK_TOKEN = "tok-hooks-" + secrets.token_hex(8)
HOOKS = {"audit-logging": {"post_tool_execution": [{"matcher": "*", "hooks": [
    {"type": "http", "url": "https://telemetry.example.test/api/v1/gateway-hook-events", "timeout": 10}]}]}}  # fmt: skip
HOOK_EVENT = {"tool_call": {"name": "write_file", "args": {"path": "/w/x"}}, "environment_id": "hooks-env"}


def test_hooks_send_proxy_credentials_from_https_proxy(lab, tmp_path):
    directory = tmp_path / "envs"
    directory.mkdir()
    (directory / "hooks-env.yaml").write_text(
        f"network:\n  proxyToken: {HOOK_TOKEN}\n  allowCidrs: [198.18.0.0/15]\n  allowlist:\n"
        f"    - domain: telemetry.example.test\n      transform: {{Authorization: 'Bearer {HOOK_CANARY}'}}\n"
    )
    proxy = lab.start_proxy(None, spec_dir=directory)
    config = tmp_path / "hooks.json"
    config.write_text(json.dumps(HOOKS))
    hooks_bin = str(Path(EGRESS_PROXY).with_name("egress-hooks"))

    def dispatch(proxy_url: str, *args: str) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "HTTPS_PROXY": proxy_url, "HTTP_PROXY": proxy_url, "SSL_CERT_FILE": str(proxy.ca)}
        return subprocess.run(
            ["ip", "netns", "exec", lab.proxy_ns, hooks_bin, "dispatch", "post_tool_execution", "--config", str(config), *args],
            input=json.dumps(HOOK_EVENT), capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip

    def hits() -> list[dict]:
        return [r for r in upstream_hits(lab, HOSTS["telemetry.example.test"]) if HOOK_CANARY in json.dumps(r)]

    try:
        out = dispatch(as_user(proxy, "hooks-env", HOOK_TOKEN).url)
        assert out.returncode == 0 and json.loads(out.stdout) == {}, out.stderr
        assert len(hits()) == 1
        assert "proxy-authorization" not in {k.lower() for k, _ in hits()[0]["headers"]}
        # `--proxy URL` with credentials works the same.
        out = dispatch("http://127.0.0.1:1", "--proxy", as_user(proxy, "hooks-env", HOOK_TOKEN).url)
        assert out.returncode == 0 and len(hits()) == 2, out.stderr
        # Without (or with wrong) credentials the gateway answers 407: the hook fails open, logged.
        for url in (proxy.url, as_user(proxy, "hooks-env", "wrong-" + HOOK_TOKEN).url):
            out = dispatch(url)
            assert out.returncode == 0 and json.loads(out.stdout) == {}
            assert len(hits()) == 2
            assert HOOK_TOKEN not in out.stdout + out.stderr
        assert any(e["reason"] == "proxy_auth_required" and e["environment"] == "hooks-env" for e in proxy.audit())
    finally:
        proxy.stop()
    assert HOOK_CANARY not in proxy.stdout() + proxy.stderr() and HOOK_TOKEN not in proxy.stdout() + proxy.stderr()


# -- per-environment connection cap and workers --------------------------------------------------


def _bound_connection(lab, port: int, user: str, token: str) -> socket.socket:
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET http://plain.test/cap HTTP/1.1\r\nHost: plain.test\r\nProxy-Authorization: {basic(user, token)}\r\n\r\n".encode())
    return sock


def test_connections_per_environment_are_capped(lab, tmp_path):
    directory = tmp_path / "envs"
    write_environments(directory)
    proxy = lab.start_proxy(None, "--max-connections-per-environment", "2", spec_dir=directory, env={"GW_TOKEN_C": TOKEN_C})
    held = []
    try:
        for _ in range(2):
            held.append(_bound_connection(lab, proxy.port, "env-a", TOKEN_A))
            assert parse(_read_response(held[-1]))[0] == 200
        # env-a is at its cap: a third connection is refused; env-b is not affected.
        third = _bound_connection(lab, proxy.port, "env-a", TOKEN_A)
        status, headers, body = parse(_read_response(third))
        third.close()
        assert status == 429 and headers["x-egress-denied"] == "connection_limit", body
        other = _bound_connection(lab, proxy.port, "env-b", TOKEN_B)
        assert parse(_read_response(other))[0] == 200
        other.close()
        # A closed connection frees its slot.
        held.pop().close()
        assert wait_for(lambda: curl(lab, as_user(proxy, "env-a", TOKEN_A), "http://plain.test/after")[0] == 200, timeout=5)
        _, exposition = proxy.get_ops("/metrics")
        assert 'egress_connections_refused_total{limit="per_environment"} 1.0' in exposition
    finally:
        for sock in held:
            sock.close()
        proxy.stop()


def test_spec_dir_with_workers(lab, tmp_path):
    directory = tmp_path / "envs"
    write_environments(directory)
    proxy = lab.start_proxy(None, "--workers", "2", spec_dir=directory, env={"GW_TOKEN_C": TOKEN_C})
    try:
        for _ in range(4):
            status, _, body = curl(lab, as_user(proxy, "env-b", TOKEN_B), "https://api.example.test/w")
            assert status == 200 and echoed_headers(lab, body)["authorization"] == f"Bearer {CANARY_B}"
            assert curl(lab, as_user(proxy, "env-b", TOKEN_A), "http://plain.test/w")[0] == 407
        _, exposition = proxy.get_ops("/metrics")
        assert "egress_environments 3.0" in exposition
        assert 'egress_credential_injections_total{environment="env-b",rule="api.example.test"} 4.0' in exposition
    finally:
        proxy.stop()


def test_a_fault_in_the_environment_gate_fails_closed(lab, tmp_path):
    directory = tmp_path / "envs"
    write_environments(directory)
    env = {"GW_TOKEN_C": TOKEN_C, "EGRESS_TEST_FAULT": "EnvironmentGate.requestheaders,EnvironmentGate.http_connect"}
    proxy = lab.start_proxy(None, spec_dir=directory, env=env)
    try:
        a = as_user(proxy, "env-a", TOKEN_A)
        status, headers, _ = curl(lab, a, "http://plain.test/fault")
        assert status == 403 and headers["x-egress-denied"] == "internal_error"
        status, headers, _ = curl(lab, a, "https://api.example.test/fault")
        assert status == 403 and headers["x-egress-denied"] == "internal_error"
        assert not [r for r in lab.upstream_requests() if r["path"] == "/fault"]
    finally:
        proxy.stop()


def test_wrong_credentials_end_the_connection_absent_ones_do_not(lab, gateway):
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        request = "GET http://plain.test/{path} HTTP/1.1\r\nHost: plain.test\r\n{auth}\r\n"
        sock.sendall(request.format(path="challenge", auth="").encode())
        assert parse(_read_response(sock))[0] == 407
        sock.sendall(request.format(path="proved", auth=f"Proxy-Authorization: {basic('env-a', TOKEN_A)}\r\n").encode())
        assert parse(_read_response(sock))[0] == 200  # same connection, after the challenge
    finally:
        sock.close()
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        sock.sendall(request.format(path="guess", auth=f"Proxy-Authorization: {basic('env-a', 'guess')}\r\n").encode())
        status, headers, _ = parse(_read_response(sock))
        assert status == 407 and headers.get("connection") == "close"
        sock.settimeout(5)
        assert sock.recv(65536) == b""
    finally:
        sock.close()
