"""The nftables script of `egress-proxy redirect-rules` (pure text) and its CLI errors."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from egress.cli import main as cli
from egress.net.redirect_rules import RulesError, render_rules


def chains(script: str) -> dict[str, list[str]]:
    """Rule lines per chain, comments and hook lines left out."""
    found: dict[str, list[str]] = {}
    current = None
    for raw in script.splitlines():
        line = raw.strip()
        if line.startswith("chain "):
            current = line.split()[1]
            found[current] = []
        elif line == "}" or not line or line.startswith(("#", "type ")):
            current = None if line == "}" else current
        elif current:
            found[current].append(line)
    return found


def test_table_is_deleted_and_recreated_in_one_script():
    script = render_rules(proxy_uid=1337)
    lines = [line for line in script.splitlines() if line.startswith(("table", "delete"))]
    assert lines == [
        "table inet egress_redirect",
        "delete table inet egress_redirect",
        "table inet egress_redirect {",
    ]


def test_nat_redirects_tcp_except_the_proxy_and_dns():
    rules = chains(render_rules(proxy_port=15001, proxy_uid=1337, proxy_mark=0x539, dns=["10.96.0.10", "fd00::a"]))
    assert rules["nat_output"] == [
        "meta skuid 1337 return",
        "meta mark 0x00000539 return",
        "ip daddr 127.0.0.0/8 tcp dport 15001 return",
        "ip6 daddr ::1 tcp dport 15001 return",
        "ip daddr 10.96.0.10 tcp dport 53 return",
        "ip6 daddr fd00::a tcp dport 53 return",
        "meta l4proto tcp redirect to :15001",
    ]


def test_filter_drops_udp_except_dns_to_the_resolvers():
    rules = chains(render_rules(proxy_uid=0, dns=["10.96.0.10", "10.96.0.11", "10.96.0.10"]))["filter_output"]
    assert rules[:3] == ['oif != "lo" ip saddr 127.0.0.0/8 drop', 'oif != "lo" ip6 saddr ::1 drop', "ct direction reply accept"]
    assert "meta skuid 0 accept" in rules
    assert "ip daddr { 10.96.0.10, 10.96.0.11 } meta l4proto { tcp, udp } th dport 53 accept" in rules
    assert not any(r.startswith("ip6 daddr") for r in rules)  # no IPv6 resolver given: no IPv6 DNS
    # Default drop: after the accepts for sockets, anything a process sends is dropped, and of
    # the kernel's socketless packets only the proxy's closing TCP and IPv6 ND/MLD pass.
    drop = rules.index("meta skuid 0-4294967295 counter drop")
    assert rules.index("ip daddr { 10.96.0.10, 10.96.0.11 } meta l4proto { tcp, udp } th dport 53 accept") < drop
    assert rules[drop + 1 :] == [
        "meta l4proto tcp ct state established ct direction original accept",
        "icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept",
        "icmpv6 type { mld-listener-report, mld2-listener-report } ip6 hoplimit 1 accept",
        "counter drop",
    ]


def test_filter_policy_is_drop_and_nothing_is_dropped_by_protocol_name():
    """Default drop, not a denylist: no rule names a protocol to drop (a list always misses one:
    GRE, IPIP, ESP, ICMP echo replies, raw IPv6...)."""
    script = render_rules(proxy_uid=0, dns_port=5353)
    assert "type filter hook output priority 0; policy drop;" in script
    rules = chains(script)["filter_output"]
    assert [r for r in rules if r.endswith("drop")] == [
        'oif != "lo" ip saddr 127.0.0.0/8 drop',
        'oif != "lo" ip6 saddr ::1 drop',
        "meta skuid 0-4294967295 counter drop",
        "counter drop",
    ]
    assert rules[-1] == "counter drop"
    assert not any(("icmp " in r or "echo" in r) for r in rules)  # no ICMP type accepted from a process


def test_proxy_dns_queries_get_their_own_conntrack_zone_only_with_dns_port():
    rules = chains(render_rules(proxy_uid=1337, proxy_mark=0x539, dns_port=5353))
    # the original direction only: the answers must still find the entry in the default zone
    assert rules["zone_output"] == [
        "meta skuid 1337 udp dport 53 ct original zone set 17735",
        "meta mark 0x00000539 udp dport 53 ct original zone set 17735",
    ]
    script = render_rules(proxy_uid=1337, dns_port=5353)
    assert "type filter hook output priority raw; policy accept;" in script
    assert script.index("chain zone_output") < script.index("chain nat_output")
    # without --dns-port no UDP is redirected: nothing to keep apart
    assert "zone_output" not in render_rules(proxy_uid=1337, dns=["10.96.0.10"])


def test_no_resolver_means_no_dns_exemption():
    script = render_rules(proxy_mark=1)
    assert "dport 53" not in script
    assert "meta mark 0x00000001 accept" in script
    assert not any(line.strip().startswith("meta skuid") and "drop" not in line for line in script.splitlines())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "--proxy-uid or --proxy-mark is required"),
        ({"proxy_uid": 0, "proxy_port": 0}, "--proxy-port: 0 is out of range"),
        ({"proxy_uid": 0, "proxy_port": 65536}, "--proxy-port: 65536 is out of range"),
        ({"proxy_mark": 0}, "--proxy-mark: 0 is out of range"),
        ({"proxy_mark": 2**32}, "--proxy-mark"),
        ({"proxy_uid": 0, "dns": ["resolver.local"]}, "--dns: 'resolver.local' is not an IPv4 or IPv6 address"),
        ({"proxy_uid": 0, "dns": ["fe80::1%eth0"]}, "--dns"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(RulesError, match=message.replace("[", r"\[")):
        render_rules(**kwargs)


def test_cli_prints_the_script(capsys):
    assert cli.main(["redirect-rules", "--proxy-uid", "1337", "--dns", "[fd00::a]"]) == 0
    out = capsys.readouterr().out
    assert out == render_rules(proxy_uid=1337, dns=["fd00::a"])


def test_cli_needs_an_exemption(capsys):
    assert cli.main(["redirect-rules", "--dns", "10.0.0.1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "--proxy-uid or --proxy-mark is required" in captured.err


def test_cli_accepts_hex_marks(capsys):
    assert cli.main(["redirect-rules", "--proxy-mark", "0x1e"]) == 0
    assert "meta mark 0x0000001e return" in capsys.readouterr().out


def test_cli_apply_failure_is_one_line(capsys, monkeypatch, tmp_path):
    fake = tmp_path / "nft"
    fake.write_text("#!/bin/sh\necho 'Error: Could not process rule: Operation not permitted' >&2\necho detail >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["redirect-rules", "--proxy-uid", "0", "--apply"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("egress-proxy: redirect-rules --apply: nft failed (exit 1): Error: Could not process rule")


def test_cli_apply_without_nft_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["redirect-rules", "--proxy-uid", "0", "--apply"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot run nft" in err


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft not installed")
def test_script_is_valid_nft_syntax(tmp_path):
    script = tmp_path / "rules.nft"
    script.write_text(render_rules(proxy_uid=0, proxy_mark=7, dns=["192.0.2.53", "2001:db8::53"]))
    checked = subprocess.run(["nft", "--check", "-f", str(script)], check=False, capture_output=True, text=True, timeout=30)
    if "Operation not permitted" in checked.stderr:
        pytest.skip("nft --check needs CAP_NET_ADMIN")
    assert checked.returncode == 0, checked.stderr


# --- --dns-port: all DNS to the proxy's listener (issue 11) ---------------------------


def test_dns_port_redirects_every_dns_packet_before_the_tcp_redirect():
    rules = chains(render_rules(proxy_port=15001, proxy_uid=1337, proxy_mark=0x539, dns_port=15053))
    assert rules["nat_output"] == [
        "meta skuid 1337 return",
        "meta mark 0x00000539 return",
        "ip daddr 127.0.0.0/8 tcp dport 15001 return",
        "ip6 daddr ::1 tcp dport 15001 return",
        # no address match: 127.0.0.53 stubs, other resolvers, IPv6 all covered
        "meta l4proto { tcp, udp } th dport 53 redirect to :15053",
        "meta l4proto tcp redirect to :15001",
    ]
    filter_ = rules["filter_output"]
    # no resolver is reachable on port 53 directly; redirected DNS passes as dnat
    assert not any("dport 53" in r for r in filter_)
    assert filter_.index("ct status dnat accept") < filter_.index("meta skuid 0-4294967295 counter drop")
    assert filter_.index("meta skuid 1337 accept") < filter_.index("meta skuid 0-4294967295 counter drop")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"proxy_uid": 0, "dns_port": 0}, "--dns-port: 0 is out of range"),
        ({"proxy_uid": 0, "dns_port": 70000}, "--dns-port: 70000 is out of range"),
        ({"proxy_uid": 0, "dns_port": 8080}, "--dns-port: 8080 is the proxy port"),
        ({"proxy_uid": 0, "dns_port": 5353, "dns": ["10.0.0.1"]}, "--dns and --dns-port exclude each other"),
        ({"dns_port": 5353}, "--proxy-uid or --proxy-mark is required"),
    ],
)
def test_dns_port_bad_arguments(kwargs, message):
    with pytest.raises(RulesError, match=message):
        render_rules(**kwargs)


def test_cli_dns_port(capsys):
    assert cli.main(["redirect-rules", "--proxy-uid", "1337", "--dns-port", "15053"]) == 0
    assert capsys.readouterr().out == render_rules(proxy_uid=1337, dns_port=15053)


def test_cli_dns_port_with_dns_is_one_line(capsys):
    assert cli.main(["redirect-rules", "--proxy-uid", "1", "--dns-port", "5353", "--dns", "10.0.0.1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "--dns and --dns-port exclude each other" in captured.err


def test_cli_dns_port_not_a_number(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["redirect-rules", "--proxy-uid", "1", "--dns-port", "fifty"])
    assert exited.value.code == 2
    assert "--dns-port" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft not installed")
def test_dns_port_script_is_valid_nft_syntax(tmp_path):
    script = tmp_path / "rules.nft"
    script.write_text(render_rules(proxy_uid=0, proxy_mark=7, dns_port=15053))
    checked = subprocess.run(["nft", "--check", "-f", str(script)], check=False, capture_output=True, text=True, timeout=30)
    if "Operation not permitted" in checked.stderr:
        pytest.skip("nft --check needs CAP_NET_ADMIN")
    assert checked.returncode == 0, checked.stderr
