"""End-to-end: credential sources per environment (`--spec-dir`: never shared, even when
two environments define the same source), and the proxy's own token calls through
`--upstream-proxy` (a real squid that requires Basic auth, as in test_parent_proxy)."""

from __future__ import annotations

import json
import time
import types

import pytest

from e2e.support.clients import curl
from e2e.support.lab import HOSTS, Lab, run
from e2e.test_credentials_tokens import (  # noqa: F401  (fixtures)
    CANARY,
    TOKEN_HOST,
    fetches,
    header,
    keys,
    received,
    token_server,
)
from e2e.test_parent_proxy import PASSWORD, SQUID_SOURCE, USER, Squid

SPEC = """
network:
  allowCidrs: ["198.18.0.0/15"]
  proxyToken: {token}
  credentials:
    corp: {{type: oauth2, tokenUrl: "https://{host}:9443/oauth/token", clientId: egress,
           clientSecret: "${{file:{secret}}}", scope: "{scope}"}}
  allowlist:
    - domain: api.example.test
      transform: {{Authorization: "Bearer ${{credential:corp}}"}}
"""


def as_env(proxy, env: str, token: str):
    return types.SimpleNamespace(url=f"http://{env}:{token}@127.0.0.1:{proxy.port}", dir=proxy.dir, ca=proxy.ca, port=proxy.port)


def test_spec_dir_environments_never_share_a_token(lab: Lab, keys, token_server, tmp_path):  # noqa: F811
    directory = tmp_path / "envs"
    directory.mkdir()
    for env in ("alpha", "beta"):
        (directory / f"{env}.yaml").write_text(
            SPEC.format(token=f"tok-{env}-1234", host=TOKEN_HOST, secret=keys["client_secret"], scope=f"scope.{env}")
        )
    proxy = lab.start_proxy(None, spec_dir=directory)
    try:
        started = time.time()
        for env in ("alpha", "beta", "alpha", "beta"):
            status, _, body = curl(lab, as_env(proxy, env, f"tok-{env}-1234"), f"https://api.example.test/{env}")
            assert status == 200 and CANARY not in body, body
        tokens = {}
        for record in received(lab, "api.example.test", started):
            tokens.setdefault(record["path"], set()).add(header(record, "Authorization"))
        assert len(tokens["/alpha"]) == 1 and len(tokens["/beta"]) == 1
        assert tokens["/alpha"] != tokens["/beta"]
        scopes = [f["detail"] for f in fetches(token_server, "oauth2") if f["time"] >= started - 1]
        assert sorted(scopes) == ["scope.alpha", "scope.beta"]  # one fetch per environment
    finally:
        proxy.stop()
    assert CANARY not in proxy.stdout() + proxy.stderr()


@pytest.fixture(scope="module")
def squid(lab: Lab, token_server):  # noqa: F811  (after token_server: squid reads the hosts file once)
    run(["ip", "netns", "exec", lab.proxy_ns, "ip", "addr", "add", f"{SQUID_SOURCE}/24", "dev", f"vp{lab.id}"], check=False)
    parent = Squid(lab, lab.proxy_ns)
    parent.start()
    yield parent
    parent.stop()


def test_token_calls_go_through_the_upstream_proxy(lab: Lab, keys, token_server, squid):  # noqa: F811
    password = lab.dir / "parent-password-creds"
    password.write_text(PASSWORD + "\n")
    spec = SPEC.replace("  proxyToken: {token}\n", "").format(host=TOKEN_HOST, secret=keys["client_secret"], scope="via.parent")
    proxy = lab.start_proxy(spec, "--upstream-proxy", f"http://127.0.0.1:{squid.port}",
                            "--upstream-proxy-auth", f"{USER}:${{file:{password}}}")  # fmt: skip
    try:
        status, _, body = curl(lab, proxy, "https://api.example.test/via-parent")
        assert status == 200 and CANARY not in body, body
        token_calls = [line for line in squid.log() if line[1] == "CONNECT" and line[2] == f"{TOKEN_HOST}:9443"]
        assert token_calls and token_calls[-1][3:] == ["200", USER]
        assert any(f["ok"] and f["detail"] == "via.parent" for f in fetches(token_server, "oauth2"))
        assert [r for r in received(lab, "api.example.test", 0) if r["path"] == "/via-parent"][-1]["peer"] == SQUID_SOURCE
    finally:
        proxy.stop()
    assert PASSWORD not in proxy.stdout() + proxy.stderr() + json.dumps(proxy.audit())
    assert HOSTS  # the lab's names are in use
