"""Proxy decisions (SPEC §3) as pure functions: name verdict, address choice, deny body."""

from __future__ import annotations

import ipaddress
import json

import pytest

from egress.policy import decisions as policy
from egress.policy.spec import parse_spec

ip = ipaddress.ip_address


def make_spec(mode="enforce", allow_cidrs=(), allowlist=None):
    allowlist = allowlist or [
        {"domain": "api.example.com", "transform": {"Authorization": "Bearer t"}},
        {"domain": "*.example.com"},
        {"domain": "*.deep.example.com"},
        {"domain": "198.51.100.7"},
    ]
    network = {"mode": mode, "allowCidrs": list(allow_cidrs), "allowlist": allowlist}
    return parse_spec(json.dumps({"network": network}), source="s.json")


ENFORCE = make_spec()
REPORT = make_spec(mode="report")
WITH_ANY = make_spec(allowlist=[{"domain": "*.example.com"}, {"domain": "*"}])
REPORT_ANY = make_spec(mode="report", allowlist=[{"domain": "*"}])


def never_self(_address):
    return False


# --- check_name -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "raw", "host", "reason", "rule", "label"),
    [
        (
            ENFORCE,
            "api.example.com",
            "api.example.com",
            "",
            "api.example.com",
            "allowed",
        ),
        (
            ENFORCE,
            "API.Example.COM.",
            "api.example.com",
            "",
            "api.example.com",
            "allowed",
        ),
        (ENFORCE, "www.example.com", "www.example.com", "", "*.example.com", "allowed"),
        (
            ENFORCE,
            "a.deep.example.com",
            "a.deep.example.com",
            "",
            "*.deep.example.com",
            "allowed",
        ),
        (
            ENFORCE,
            "deep.example.com",
            "deep.example.com",
            "",
            "*.example.com",
            "allowed",
        ),
        (ENFORCE, "example.com", "example.com", "not_allowlisted", "", "blocked"),
        (
            ENFORCE,
            "evilexample.com",
            "evilexample.com",
            "not_allowlisted",
            "",
            "blocked",
        ),
        (
            ENFORCE,
            "example.com.evil.test",
            "example.com.evil.test",
            "not_allowlisted",
            "",
            "blocked",
        ),
        (ENFORCE, "198.51.100.7", "198.51.100.7", "", "198.51.100.7", "allowed"),
        (ENFORCE, "0xc6336407", "198.51.100.7", "", "198.51.100.7", "allowed"),
        (ENFORCE, "198.51.100.8", "198.51.100.8", "not_allowlisted", "", "blocked"),
        (ENFORCE, "a..b", "a..b", "not_allowlisted", "", "blocked"),
        # loopback at the name level, whatever the allowlist says
        (WITH_ANY, "localhost", "localhost", "loopback", "", "blocked"),
        (WITH_ANY, "LOCALHOST.", "localhost", "loopback", "", "blocked"),
        (WITH_ANY, "a.localhost", "a.localhost", "loopback", "", "blocked"),
        (WITH_ANY, "127.0.0.2", "127.0.0.2", "loopback", "", "blocked"),
        (WITH_ANY, "127.1", "127.0.0.1", "loopback", "", "blocked"),
        (WITH_ANY, "2130706433", "127.0.0.1", "loopback", "", "blocked"),
        (WITH_ANY, "0x7f000001", "127.0.0.1", "loopback", "", "blocked"),
        (WITH_ANY, "0177.0.0.1", "127.0.0.1", "loopback", "", "blocked"),
        (WITH_ANY, "0x7f.1", "127.0.0.1", "loopback", "", "blocked"),
        (WITH_ANY, "[::1]", "::1", "loopback", "", "blocked"),
        (WITH_ANY, "[::ffff:127.0.0.1]", "::ffff:127.0.0.1", "loopback", "", "blocked"),
        (WITH_ANY, "0.0.0.0", "0.0.0.0", "loopback", "", "blocked"),
        (WITH_ANY, "127.1.", "127.0.0.1", "loopback", "", "blocked"),
        # Other forbidden literals pass the name check; pick_address judges the address.
        (WITH_ANY, "169.254.169.254", "169.254.169.254", "", "*", "allowed"),
        (WITH_ANY, "other.test", "other.test", "", "*", "allowed"),
        (WITH_ANY, "a.example.com", "a.example.com", "", "*.example.com", "allowed"),
        # report mode
        (REPORT, "other.test", "other.test", "not_allowlisted", "", "reported"),
        (REPORT, "localhost", "localhost", "loopback", "", "blocked"),
        (REPORT, "127.0.0.1", "127.0.0.1", "loopback", "", "blocked"),
        (REPORT, "[::1]", "::1", "loopback", "", "blocked"),
        (
            REPORT,
            "api.example.com",
            "api.example.com",
            "",
            "api.example.com",
            "allowed",
        ),
    ],
)
def test_check_name(spec, raw, host, reason, rule, label):
    decision = policy.check_name(spec, raw)
    assert (decision.host, decision.reason, decision.rule, decision.label) == (
        host,
        reason,
        rule,
        label,
    )
    assert decision.allowed is (label != "blocked")


def test_transform_only_for_allowed_decision():
    allowed = policy.check_name(ENFORCE, "api.example.com")
    assert allowed.transform["Authorization"].reveal() == "Bearer t"
    assert policy.check_name(ENFORCE, "www.example.com").transform == {}
    blocked = policy.with_reason(ENFORCE, allowed, policy.PLAINTEXT_CREDENTIALS)
    assert blocked.reason == "plaintext_credentials" and not blocked.allowed
    assert blocked.rule == "api.example.com"
    assert blocked.transform == {}


def test_unparsable_host_is_truncated():
    decision = policy.check_name(ENFORCE, "a" * 1000)
    assert decision.reason == "not_allowlisted"
    assert len(decision.host) == 255


@pytest.mark.parametrize(
    ("spec", "reason", "label"),
    [
        (ENFORCE, "host_mismatch", "blocked"),
        (REPORT, "host_mismatch", "reported"),
        (REPORT, "plaintext_credentials", "reported"),
        (REPORT, "proxy_self", "blocked"),
        (REPORT, "loopback", "blocked"),
    ],
)
def test_with_reason(spec, reason, label):
    decision = policy.with_reason(
        spec, policy.check_name(spec, "api.example.com"), reason
    )
    assert (decision.reason, decision.label) == (reason, label)


# --- pick_address -----------------------------------------------------------------

PROXY_ADDRESSES = {ip("10.0.0.5"), ip("203.0.113.9")}


def is_proxy(address):
    return address in PROXY_ADDRESSES


@pytest.mark.parametrize(
    ("spec", "addresses", "picked", "reason", "label"),
    [
        (ENFORCE, ["93.184.216.34"], "93.184.216.34", "", "allowed"),
        (ENFORCE, ["93.184.216.34", "1.1.1.1"], "93.184.216.34", "", "allowed"),
        (ENFORCE, ["2606:2800:220:1::1"], "2606:2800:220:1::1", "", "allowed"),
        # forbidden addresses are dropped, not fatal
        (ENFORCE, ["127.0.0.1", "93.184.216.34"], "93.184.216.34", "", "allowed"),
        (ENFORCE, ["10.1.1.1", "::1", "8.8.4.4"], "8.8.4.4", "", "allowed"),
        # none left: the worst reason
        (ENFORCE, ["127.0.0.1"], None, "loopback", "blocked"),
        (ENFORCE, ["10.1.1.1", "127.0.0.1"], None, "loopback", "blocked"),
        (ENFORCE, ["169.254.169.254", "::ffff:127.0.0.1"], None, "loopback", "blocked"),
        (ENFORCE, ["169.254.169.254"], None, "forbidden_address", "blocked"),
        (ENFORCE, ["64:ff9b::a9fe:a9fe"], None, "forbidden_address", "blocked"),
        (ENFORCE, ["198.18.0.10", "10.1.1.1"], None, "forbidden_address", "blocked"),
        (ENFORCE, ["203.0.113.9"], None, "proxy_self", "blocked"),
        (ENFORCE, ["10.0.0.5", "192.168.0.1"], None, "proxy_self", "blocked"),
        (ENFORCE, ["::ffff:10.0.0.5"], None, "proxy_self", "blocked"),  # embedded self
        (ENFORCE, ["10.0.0.5", "127.0.0.1"], None, "loopback", "blocked"),
        (ENFORCE, [], None, "resolve_failed", "blocked"),
        # report mode lets "forbidden" through, never loopback or the proxy itself
        (REPORT, ["10.1.1.1"], "10.1.1.1", "forbidden_address", "reported"),
        (REPORT, ["127.0.0.1", "10.1.1.1"], None, "loopback", "blocked"),
        (REPORT, ["127.0.0.1"], None, "loopback", "blocked"),
        (REPORT, ["::"], None, "loopback", "blocked"),
        (REPORT, ["203.0.113.9"], None, "proxy_self", "blocked"),
        (REPORT, ["203.0.113.9", "10.1.1.1"], None, "proxy_self", "blocked"),
        (REPORT, ["127.0.0.1", "93.184.216.34"], "93.184.216.34", "", "allowed"),
        (REPORT, [], None, "resolve_failed", "blocked"),
    ],
)
def test_pick_address(spec, addresses, picked, reason, label):
    named = policy.check_name(spec, "api.example.com")
    address, decision = policy.pick_address(
        spec, named, [ip(a) for a in addresses], is_proxy
    )
    assert address == (ip(picked) if picked else None)
    assert (decision.reason, decision.label) == (reason, label)
    assert (
        decision.rule == "api.example.com"
    )  # the matched rule survives, for the metrics label
    assert decision.allowed is (address is not None)


@pytest.mark.parametrize(
    ("addresses", "picked", "reason"),
    [
        # benchmarking range opened by allowCidrs; loopback is dropped, the permitted one picked
        (["127.0.0.1", "198.18.0.10"], "198.18.0.10", ""),
        (["198.18.0.10", "127.0.0.1"], "198.18.0.10", ""),
        (["::ffff:198.18.0.10"], "::ffff:198.18.0.10", ""),
        (["10.0.0.1"], None, "forbidden_address"),
        (["169.254.169.254", "127.0.0.1"], None, "loopback"),
        (
            ["198.18.0.20"],
            None,
            "proxy_self",
        ),  # allowed range, but the proxy's own address
    ],
)
def test_pick_address_with_allow_cidrs(addresses, picked, reason):
    spec = make_spec(allow_cidrs=["198.18.0.0/15"])
    named = policy.check_name(spec, "a.example.com")
    address, decision = policy.pick_address(
        spec, named, [ip(a) for a in addresses], lambda a: a == ip("198.18.0.20")
    )
    assert address == (ip(picked) if picked else None)
    assert decision.reason == reason


def test_pick_address_nothing_resolved():
    for spec in (ENFORCE, REPORT):
        address, decision = policy.pick_address(
            spec, policy.check_name(spec, "api.example.com"), [], is_proxy
        )
        assert address is None
        assert decision.reason == "resolve_failed"
        # Nothing resolved, nothing to let through: blocked even in report mode.
        assert decision.label == "blocked" and not decision.allowed


def test_pick_address_consumes_iterators():
    named = policy.check_name(ENFORCE, "a.example.com")
    address, decision = policy.pick_address(
        ENFORCE, named, iter([ip("127.0.0.1"), ip("8.8.8.8")]), never_self
    )
    assert address == ip("8.8.8.8") and decision.allowed


def test_is_self_asked_about_every_candidate():
    asked = []

    def record(address):
        asked.append(address)
        return False

    named = policy.check_name(ENFORCE, "a.example.com")
    policy.pick_address(ENFORCE, named, [ip("10.1.1.1"), ip("8.8.8.8")], record)
    assert ip("10.1.1.1") in asked and ip("8.8.8.8") in asked


def test_report_mode_keeps_not_allowlisted_reason_when_address_is_fine():
    named = policy.check_name(REPORT, "other.test")
    address, decision = policy.pick_address(REPORT, named, [ip("8.8.8.8")], never_self)
    assert address == ip("8.8.8.8")
    assert (decision.reason, decision.label) == ("not_allowlisted", "reported")


def test_reason_codes_are_the_public_ones():
    public = {
        "not_allowlisted",
        "loopback",
        "forbidden_address",
        "resolve_failed",
        "host_mismatch",
        "plaintext_credentials",
        "proxy_self",
        "no_sni",
    }
    assert public <= set(policy.REASONS)
    assert policy.NEVER_REPORTED == {"loopback", "proxy_self", "resolve_failed"}
