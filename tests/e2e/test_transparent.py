"""End-to-end: transparent mode (issue 5). A sandbox namespace with no proxy settings,
the rules of `egress-proxy redirect-rules --apply`, real curl and a Python client
running as `nobody`, and the proxy beside them in the same namespace (sidecar
pattern) as root, whose traffic the rules exempt by uid.

The proxy never trusts the address a client connected to: the destination is the
TLS SNI or the HTTP Host header, resolved and checked by the proxy."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from tls_hello import hello_body, records, sni_extension

from e2e.support.clients import as_received
from e2e.support.lab import HOSTS, TEST_CIDRS_DUAL, Lab, allowlist_spec, bearer
from e2e.support.transparent_lab import RESOLVER_V4, RESOLVER_V6, Sandbox

SECRET = "transparent-secret-4e81d2"
SPEC = allowlist_spec(
    ("api.example.test", bearer("EGRESS_TEST_TOKEN")), "a.example.test", "plain.test", "v6only.test", cidrs=TEST_CIDRS_DUAL
)
# Not on the allowlist: the "attacker's" hosts whose addresses clients try to reach.
ATTACKER = HOSTS["evilexample.test"]  # 198.18.0.13
ATTACKER_V6 = HOSTS[
    "v6only.test"
]  # allowlisted by name, but only ever reached *as* v6only.test


@pytest.fixture(scope="module")
def sandbox(lab: Lab):
    box = Sandbox(lab)
    try:
        box.start()
        proxy = box.start_proxy(SPEC, env={"EGRESS_TEST_TOKEN": SECRET})
        rules = [
            "--proxy-port",
            str(proxy.port),
            "--proxy-uid",
            "0",
            "--dns",
            RESOLVER_V4,
            "--dns",
            RESOLVER_V6,
        ]
        for _ in range(
            2
        ):  # applying twice replaces the table instead of stacking rules
            applied = box.redirect_rules(*rules, "--apply")
            assert applied.returncode == 0, applied.stderr
        yield box
    finally:
        box.stop()
    outputs = proxy.stdout() + proxy.stderr()
    assert SECRET not in outputs


def new_path() -> str:
    return f"/transparent/{uuid.uuid4().hex}"


def reached(lab: Lab, path: str) -> list[str]:
    """Upstream addresses that received a request for `path`."""
    return [r["local"] for r in lab.upstream_requests() if r["path"] == path]


def audit_since(proxy, count: int) -> list[dict]:
    return proxy.audit()[count:]


def metric(proxy, name: str, **labels: str) -> float:
    text = proxy.get_ops("/metrics")[1]
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == want:
            total += float(match.group(2))
    return total


# -- the rules ----------------------------------------------------------------------


def test_rules_installed_once(sandbox: Sandbox):
    listed = sandbox.exec(
        "nft", "list", "table", "inet", "egress_redirect", as_root=True
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("redirect to :") == 1
    # nat and filter exemption, once each
    assert listed.stdout.count("meta skuid 0 return") == 1
    assert listed.stdout.count("meta skuid 0 accept") == 1
    assert "policy drop;" in listed.stdout


def test_rules_refuse_without_exemption(sandbox: Sandbox):
    out = sandbox.redirect_rules("--apply")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "--proxy-uid or --proxy-mark" in out.stderr


# -- TLS: the name comes from SNI -------------------------------------------------


def test_https_with_injection(lab: Lab, sandbox: Sandbox):
    path = new_path()
    status, _, body = sandbox.curl(
        f"https://api.example.test{path}", "-H", "Authorization: Bearer sandbox-guess"
    )
    assert status == 200, body
    echo = json.loads(body)
    assert echo["local"] == HOSTS["api.example.test"]
    assert [v for k, v in as_received(sandbox.lab, echo)["headers"] if k.lower() == "authorization"] == [
        f"Bearer {SECRET}"
    ]
    assert SECRET not in sandbox.proxy.stdout()


def test_passthrough_is_not_intercepted(lab: Lab, sandbox: Sandbox):
    path = new_path()
    answer = sandbox.client(
        "https",
        "a.example.test",
        "443",
        "--sni",
        "a.example.test",
        "--ca",
        sandbox.ca_bundle,
        "--path",
        path,
    )
    assert answer.get("status") == 200, answer
    assert (
        answer["issuer"] == "egress test upstream CA"
    )  # the upstream's own certificate
    assert reached(lab, path) == [HOSTS["a.example.test"]]
    entry = [e for e in sandbox.proxy.audit() if e["host"] == "a.example.test" and e["event"] == "tunnel"][-1]
    assert (entry["decision"], entry["method"], entry["event"]) == (
        "allowed",
        "TLS",
        "tunnel",
    )


def test_blocked_name_is_closed(lab: Lab, sandbox: Sandbox):
    seen = len(sandbox.proxy.audit())
    path = new_path()
    status, _, err = sandbox.curl(f"https://other.test{path}")
    assert status == 0, err
    assert reached(lab, path) == []
    [entry] = [e for e in audit_since(sandbox.proxy, seen) if e["host"] == "other.test"]
    assert (entry["decision"], entry["reason"], entry["method"]) == (
        "blocked",
        "not_allowlisted",
        "TLS",
    )


@pytest.mark.parametrize(
    "sni, expect",
    [
        ("a.example.test", HOSTS["a.example.test"]),  # passthrough entry
        (
            "api.example.test",
            HOSTS["api.example.test"],
        ),  # intercepted entry, credentials go to A only
    ],
)
def test_sni_spoof_reaches_the_named_host_never_the_address(
    lab: Lab, sandbox: Sandbox, sni: str, expect: str
):
    path = new_path()
    answer = sandbox.client(
        "https",
        ATTACKER,
        "443",
        "--sni",
        sni,
        "--ca",
        sandbox.ca_bundle,
        "--path",
        path,
    )
    assert answer.get("status") == 200, answer
    assert json.loads(answer["body"])["local"] == expect
    assert reached(lab, path) == [expect]


def test_sni_spoof_with_curl(lab: Lab, sandbox: Sandbox):
    path = new_path()
    status, _, body = sandbox.curl(
        f"https://a.example.test{path}", "--resolve", f"a.example.test:443:{ATTACKER}"
    )
    assert status == 200, body
    assert reached(lab, path) == [HOSTS["a.example.test"]]


def test_sni_of_a_blocked_name_at_an_allowed_address(lab: Lab, sandbox: Sandbox):
    path = new_path()
    allowed_address = HOSTS["a.example.test"]
    answer = sandbox.client(
        "https",
        allowed_address,
        "443",
        "--sni",
        "evilexample.test",
        "--ca",
        sandbox.ca_bundle,
        "--path",
        path,
    )
    assert "error" in answer, answer
    assert reached(lab, path) == []


def test_host_header_must_agree_with_sni(lab: Lab, sandbox: Sandbox):
    path = new_path()
    answer = sandbox.client(
        "https", ATTACKER, "443", "--sni", "api.example.test", "--host", "evilexample.test",
        "--ca", sandbox.ca_bundle, "--path", path,
    )  # fmt: skip
    assert answer.get("status") == 403, answer
    assert answer["headers"]["x-egress-denied"] == "host_mismatch"
    assert reached(lab, path) == []


def test_no_sni_is_closed_and_counted(lab: Lab, sandbox: Sandbox):
    before = metric(
        sandbox.proxy,
        "egress_requests_total",
        decision="blocked",
        reason="no_sni",
        rule="",
        environment="",
    )
    seen = len(sandbox.proxy.audit())
    path = new_path()
    answer = sandbox.client(
        "https",
        HOSTS["a.example.test"],
        "443",
        "--no-sni",
        "--ca",
        sandbox.ca_bundle,
        "--path",
        path,
    )
    assert "error" in answer, answer
    assert reached(lab, path) == []
    [entry] = [e for e in audit_since(sandbox.proxy, seen) if e["reason"] == "no_sni"]
    assert (entry["host"], entry["decision"], entry["port"]) == ("", "blocked", 443)
    assert (
        metric(
            sandbox.proxy,
            "egress_requests_total",
            decision="blocked",
            reason="no_sni",
            rule="",
            environment="",
        )
        == before + 1
    )


@pytest.mark.parametrize(
    "name",
    [b"a.example.test@127.0.0.1", b"127.0.0.1:80;a.example.test:80", b"a.example.test%00", b"a.example.test\x00", b""],
    ids=repr,
)
def test_invalid_server_name_is_no_sni(lab: Lab, sandbox: Sandbox, name: bytes):
    """A raw ClientHello whose server_name is no host name names no destination (issue 12)."""
    before = metric(sandbox.proxy, "egress_requests_total", decision="blocked", reason="no_sni", rule="", environment="")
    seen = len(sandbox.proxy.audit())
    hello = records(hello_body(sni_extension(name)))
    answer = sandbox.client("raw", ATTACKER, "443", "--send-hex", hello.hex())
    assert answer["closed"] and answer["received"] == "", answer
    [entry] = [e for e in audit_since(sandbox.proxy, seen) if e["reason"] == "no_sni"]
    assert (entry["host"], entry["decision"], entry["method"]) == ("", "blocked", "TLS")
    assert metric(sandbox.proxy, "egress_requests_total", decision="blocked", reason="no_sni", rule="", environment="") == before + 1


def test_raw_hello_with_valid_name_is_relayed_to_the_named_host(lab: Lab, sandbox: Sandbox):
    """Sent to the attacker's address, relayed to a.example.test, whose TLS server answers."""
    seen = len(sandbox.proxy.audit())
    hello = records(hello_body(sni_extension(b"A.Example.Test.")))
    answer = sandbox.client("raw", ATTACKER, "443", "--send-hex", hello.hex())
    assert answer["received"] != "", answer  # the upstream's ServerHello (or alert)
    entries = [e for e in audit_since(sandbox.proxy, seen) if e["event"] == "tunnel"]
    assert [(e["host"], e["decision"], e["method"]) for e in entries] == [("a.example.test", "allowed", "TLS")]


def test_unreachable_upstream_is_closed_and_counted(lab: Lab, sandbox: Sandbox):
    """No CONNECT to answer: the connection is closed, counted and logged with the reason."""
    before = metric(sandbox.proxy, "egress_upstream_errors_total", reason="upstream_refused")
    seen = len(sandbox.proxy.audit())
    hello = records(hello_body(sni_extension(b"a.example.test")))
    answer = sandbox.client("raw", ATTACKER, "9", "--send-hex", hello.hex())  # nothing listens on :9
    assert answer["closed"] and answer["received"] == "", answer
    assert metric(sandbox.proxy, "egress_upstream_errors_total", reason="upstream_refused") == before + 1
    [entry] = [e for e in audit_since(sandbox.proxy, seen) if e.get("error")]
    assert (entry["host"], entry["port"], entry["error"]) == ("a.example.test", 9, "upstream_refused")


# -- plain HTTP: the name comes from the Host header ------------------------------------


def test_http_host_to_another_address_reaches_the_named_host(
    lab: Lab, sandbox: Sandbox
):
    path = new_path()
    answer = sandbox.client(
        "http", ATTACKER, "80", "--host", "plain.test", "--path", path
    )
    assert answer.get("status") == 200, answer
    assert json.loads(answer["body"])["local"] == HOSTS["plain.test"]
    assert reached(lab, path) == [HOSTS["plain.test"]]


def test_http_with_curl(lab: Lab, sandbox: Sandbox):
    path = new_path()
    status, _, body = sandbox.curl(f"http://plain.test{path}")
    assert status == 200, body
    assert reached(lab, path) == [HOSTS["plain.test"]]


@pytest.mark.parametrize(
    "host, reason, shown",
    [
        ("evilexample.test", "not_allowlisted", "evilexample.test"),
        ("api.example.test", "plaintext_credentials", "api.example.test"),
        ("localhost", "loopback", "localhost"),
    ],
)
def test_http_blocked_host(
    lab: Lab, sandbox: Sandbox, host: str, reason: str, shown: str
):
    path = new_path()
    answer = sandbox.client(
        "http", HOSTS["plain.test"], "80", "--host", host, "--path", path
    )
    assert answer.get("status") == 403, answer
    assert answer["headers"]["x-egress-denied"] == reason
    assert json.loads(answer["body"]) == {
        "error": "egress_denied",
        "reason": reason,
        "host": shown,
    }
    assert reached(lab, path) == []


def test_http_without_host_is_refused(lab: Lab, sandbox: Sandbox):
    path = new_path()
    answer = sandbox.client(
        "raw", HOSTS["plain.test"], "80", "--send", f"GET {path} HTTP/1.0\r\n\r\n"
    )
    head, _, body = answer["received"].partition("\r\n\r\n")
    assert head.split()[1] == "403", answer
    assert json.loads(body) == {
        "error": "egress_denied",
        "reason": "not_allowlisted",
        "host": "",
    }
    assert reached(lab, path) == []


# -- neither TLS nor HTTP, UDP ------------------------------------------------------------


def test_raw_tcp_is_closed_and_counted(sandbox: Sandbox):
    labels = {"decision": "blocked", "environment": "", "reason": "not_allowlisted", "rule": ""}
    before = metric(sandbox.proxy, "egress_requests_total", **labels)
    seen = len(sandbox.proxy.audit())
    answer = sandbox.client(
        "raw", HOSTS["a.example.test"], "22", "--send", "SSH-2.0-OpenSSH_9.6\r\n"
    )
    assert answer == {"received": "", "closed": True} or "error" in answer, answer
    [entry] = [e for e in audit_since(sandbox.proxy, seen) if e["method"] == "TCP"]
    assert (entry["host"], entry["port"], entry["reason"]) == (
        "",
        22,
        "not_allowlisted",
    )
    assert metric(sandbox.proxy, "egress_requests_total", **labels) == before + 1


@pytest.mark.parametrize("address", [HOSTS["api.example.test"], "2001:2::10"])
def test_udp_443_gets_no_answer(sandbox: Sandbox, address: str):
    assert sandbox.client("udp", address, "443", "--send", "quic?")["received"] is None
    # The echo is there: the proxy's uid (exempt) gets the answer the sandbox does not.
    assert sandbox.client("udp", address, "443", "--send", "quic?", as_root=True) == {
        "received": "echo:quic?"
    }


def test_dns_only_to_the_configured_resolver(sandbox: Sandbox):
    for resolver in (RESOLVER_V4, RESOLVER_V6):
        assert sandbox.client("udp", resolver, "53", "--send", "q") == {
            "received": "echo:q"
        }
    assert (
        sandbox.client("udp", HOSTS["api.example.test"], "53", "--send", "q")[
            "received"
        ]
        is None
    )


# -- IPv6 --------------------------------------------------------------------------------


def test_ipv6_client(lab: Lab, sandbox: Sandbox):
    path = new_path()
    status, _, body = sandbox.curl(f"https://v6only.test{path}", "-6")
    assert status == 200, body
    assert reached(lab, path) == [HOSTS["v6only.test"]]


def test_ipv6_sni_spoof(lab: Lab, sandbox: Sandbox):
    path = new_path()
    answer = sandbox.client(
        "https",
        ATTACKER_V6,
        "443",
        "--sni",
        "a.example.test",
        "--ca",
        sandbox.ca_bundle,
        "--path",
        path,
    )
    assert answer.get("status") == 200, answer
    assert reached(lab, path) == [HOSTS["a.example.test"]]


def test_ipv6_http_host_spoof_and_no_sni(lab: Lab, sandbox: Sandbox):
    path = new_path()
    answer = sandbox.client(
        "http", ATTACKER_V6, "80", "--host", "plain.test", "--path", path
    )
    assert answer.get("status") == 200, answer
    assert reached(lab, path) == [HOSTS["plain.test"]]
    path = new_path()
    answer = sandbox.client(
        "https",
        ATTACKER_V6,
        "443",
        "--no-sni",
        "--ca",
        sandbox.ca_bundle,
        "--path",
        path,
    )
    assert "error" in answer, answer
    assert reached(lab, path) == []
