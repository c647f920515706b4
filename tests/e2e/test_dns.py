"""End-to-end: the proxy's DNS listener. A sandbox beside the proxy, with the
rules of `redirect-rules --dns-port` applied, real clients as `nobody` (getent, Python,
curl, dig) and real resolvers (dnsmasq) that log every query they get.

The property: no name the allowlist does not match reaches any resolver, however the
sandbox asks (every query type, TCP, another resolver, a loopback stub, a host that
is no resolver, reverse lookups); allowlisted names still resolve, through the
proxy's resolver, and work end to end.
"""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from e2e.support.dns_lab import PUBLIC_RESOLVER_V4, SINK_V4, STUB_V4, DnsSandbox, redirected_sandbox
from e2e.support.lab import Lab, in_netns
from e2e.support.transparent_lab import RESOLVER_V4, RESOLVER_V6, SYSTEM_PYTHON

SPEC = """
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: dnsonly.example.test
    - domain: mixed.dns.example.test
    - domain: internal.example.test
    - domain: loop.example.test
    - domain: many.example.test
    - domain: "*.wild.example.test"
"""
RELOADED = SPEC + "    - domain: reload.example.test\n"


@pytest.fixture(scope="module")
def box(lab: Lab):
    with redirected_sandbox(lab, SPEC) as sandbox:
        yield sandbox


def token() -> str:
    return "x" + uuid.uuid4().hex[:12]


def dig(box: DnsSandbox, *args: str) -> tuple[str, str]:
    """(status, answer section) of a real `dig` as `nobody` in the sandbox."""
    out = box.exec("dig", "+tries=2", "+time=3", "+nocookie", *args)  # one retry: a loaded CI machine can lose a datagram
    status = re.search(r"status: (\w+)", out.stdout)
    answers = out.stdout.partition(";; ANSWER SECTION:\n")[2].partition("\n\n")[0]
    return (status.group(1) if status else f"no answer: {out.stdout[-300:]} {out.stderr[-300:]}"), answers


def metric(proxy, name: str, **labels: str) -> float:
    text = proxy.get_ops("/metrics")[1]
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match:
            have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(match.group(2))
    return total


def assert_never_left(box: DnsSandbox, name: str) -> None:
    logged = box.all_queries()
    assert name not in logged, f"{name} reached a resolver:\n{logged}"
    assert not any(name.encode() in b"".join(part.split(b"\x00")) or name.split(".")[0].encode() in part
                   for part in box.sink.received), box.sink.received  # fmt: skip


# -- the positive control: allowlisted names resolve, through the proxy ---------------


def test_allowlisted_name_resolves_and_the_resolver_log_shows_it(box: DnsSandbox):
    status, answers = dig(box, "dnsonly.example.test", "A")
    assert status == "NOERROR" and "198.18.0.10" in answers
    # The query reached the cluster resolver, asked by the proxy (the sandbox's address:
    # the proxy is beside it): the log records forwarded queries, so its silence counts.
    assert re.search(r"query\[A\] dnsonly\.example\.test from 198\.18\.1\.1", box.cluster.queries())
    # Asked again at once: answered from the proxy's cache, the resolver is not asked twice.
    asked = box.cluster.queries().count("query[A] dnsonly.example.test")
    assert dig(box, "dnsonly.example.test", "A")[0] == "NOERROR"
    assert box.cluster.queries().count("query[A] dnsonly.example.test") == asked


def test_aaaa_of_an_ipv4_only_name_is_empty_not_nxdomain(box: DnsSandbox):
    # NXDOMAIN here would tell caches the name does not exist at all.
    assert dig(box, "dnsonly.example.test", "AAAA") == ("NOERROR", "")
    assert "query[AAAA] dnsonly.example.test" in box.cluster.queries()


def test_curl_https_to_an_allowlisted_name_with_the_sandboxs_own_dns(box: DnsSandbox, lab: Lab):
    path = f"/dns/{uuid.uuid4().hex}"
    status, _, body = box.curl(f"https://dnsonly.example.test{path}")
    assert status == 200, body
    assert [r["local"] for r in lab.upstream_requests() if r["path"] == path] == ["198.18.0.10"]


def test_getent_and_getaddrinfo_resolve_allowlisted(box: DnsSandbox):
    out = box.exec("getent", "ahosts", "dnsonly.example.test")
    assert out.returncode == 0 and "198.18.0.10" in out.stdout
    out = box.exec(SYSTEM_PYTHON, "-c", "import socket; print(socket.getaddrinfo('dnsonly.example.test', 443)[0][4][0])")
    assert out.stdout.strip() == "198.18.0.10", out.stderr


def test_forbidden_addresses_are_dropped_from_answers(box: DnsSandbox):
    assert "198.18.0.12" in dig(box, "mixed.dns.example.test")[1]
    answers = dig(box, "mixed.dns.example.test")[1]
    assert "127.0.0.1" not in answers and "169.254.169.254" not in answers
    before = metric(box.proxy, "egress_dns_queries_total", decision="blocked", reason="forbidden_address")
    assert dig(box, "internal.example.test") == ("NOERROR", "")
    assert dig(box, "loop.example.test") == ("NOERROR", "")
    assert metric(box.proxy, "egress_dns_queries_total", decision="blocked", reason="forbidden_address") == before + 1
    assert metric(box.proxy, "egress_dns_queries_total", decision="blocked", reason="loopback", qtype="A") >= 1


def test_https_records_are_empty_even_for_allowlisted(box: DnsSandbox):
    assert dig(box, "dnsonly.example.test", "HTTPS") == ("NOERROR", "")
    assert dig(box, "dnsonly.example.test", "TYPE64") == ("NOERROR", "")
    assert "query[HTTPS]" not in box.cluster.queries() and "query[TYPE65]" not in box.cluster.queries()


def test_large_answer_is_truncated_and_retried_over_tcp(box: DnsSandbox):
    # 40 A records do not fit 512 bytes: TC over UDP, then dig retries over TCP.
    status, answers = dig(box, "+noedns", "many.example.test")
    assert status == "NOERROR" and len(answers.splitlines()) == 40
    status, answers = dig(box, "+noedns", "+ignore", "many.example.test")
    # The truncated UDP answer itself: the records that fit in 512 bytes (musl before
    # 1.2.4 and busybox use them: they never retry over TCP; test_dns_clients.py).
    assert status == "NOERROR" and 0 < len(answers.splitlines()) < 40
    out = box.exec("dig", "+tries=1", "+time=3", "+noedns", "+ignore", "many.example.test")
    assert " tc " in out.stdout or " tc;" in out.stdout or "flags: qr tc" in out.stdout, out.stdout
    # With EDNS the client's size is respected: 40 records fit in 4096.
    status, answers = dig(box, "+bufsize=4096", "+ignore", "many.example.test")
    assert status == "NOERROR" and len(answers.splitlines()) == 40


# -- the property: nothing else leaves -----------------------------------------------


def test_getent_getaddrinfo_curl_never_leave(box: DnsSandbox):
    names = {tool: f"{token()}.attacker.test" for tool in ("hosts", "ahosts", "python", "curl")}
    assert box.exec("getent", "hosts", names["hosts"]).returncode == 2
    assert box.exec("getent", "ahosts", names["ahosts"]).returncode == 2
    out = box.exec(SYSTEM_PYTHON, "-c", f"import socket; socket.getaddrinfo('{names['python']}', 443)")
    assert "Name or service not known" in out.stderr, out.stderr
    out = box.exec("curl", "-sS", "--max-time", "10", f"https://{names['curl']}/")
    assert out.returncode == 6, out.stderr  # could not resolve host
    for name in names.values():
        assert_never_left(box, name)


@pytest.mark.parametrize(
    "args",
    [
        ["A"], ["AAAA"], ["TXT"], ["MX"], ["ANY"], ["HTTPS"], ["SVCB"], ["CNAME"], ["NS"], ["SRV"], ["TYPE65280"],
        ["+tcp", "A"], ["+tcp", "TXT"], ["+noedns", "TXT"],
        [f"@{RESOLVER_V4}", "A"], [f"@{RESOLVER_V6}", "AAAA"], [f"@{PUBLIC_RESOLVER_V4}", "TXT"],
        [f"@{PUBLIC_RESOLVER_V4}", "+tcp", "A"], [f"@{STUB_V4}", "A"], [f"@{STUB_V4}", "+tcp", "TXT"],
        [f"@{SINK_V4}", "A"], [f"@{SINK_V4}", "+tcp", "A"], ["@127.0.0.1", "-p", "53", "A"], ["@198.51.100.1", "A"],
    ],
    ids=lambda a: "-".join(a).replace("@", "at-"),
)  # fmt: skip
def test_dig_never_leaves(box: DnsSandbox, args: list[str]):
    name = f"{token()}.attacker.test"
    *opts, qtype = args
    status, answers = dig(box, *opts, name, qtype)
    assert (status, answers) == ("NXDOMAIN", "")
    assert_never_left(box, name)


def test_dig_to_ipv6_public_address_never_leaves(box: DnsSandbox):
    name = f"{token()}.attacker.test"
    # No route to this address at all; the redirect answers before routing matters.
    assert dig(box, "@2001:2::54", name, "TXT") == ("NXDOMAIN", "")
    assert_never_left(box, name)


def test_reverse_lookups_never_leave(box: DnsSandbox):
    before = box.cluster.queries()
    assert dig(box, "-x", "198.18.0.13")[0] == "NXDOMAIN"
    assert dig(box, "-x", "2001:2::10")[0] == "NXDOMAIN"
    data = token()
    assert dig(box, f"{data}.13.0.18.198.in-addr.arpa", "PTR")[0] == "NXDOMAIN"
    assert box.exec("getent", "hosts", "198.18.0.99").returncode == 2  # not in the hosts file: DNS
    assert "in-addr.arpa" not in box.all_queries() and "ip6.arpa" not in box.all_queries()
    assert box.cluster.queries() == before
    assert_never_left(box, data)


def test_localhost_is_answered_locally(box: DnsSandbox):
    assert dig(box, "localhost", "A")[1].split()[-1] == "127.0.0.1"
    assert dig(box, "db.localhost", "AAAA")[1].split()[-1] == "::1"
    assert "localhost" not in box.all_queries()


def test_wildcard_entry_resolves_through_the_resolver(box: DnsSandbox):
    # Labels under an allowlisted wildcard do reach that domain's resolver (docs/dns.md says so).
    name = f"{token()}.wild.example.test"
    # No such name: an empty answer (getaddrinfo cannot tell it from "no address")
    assert dig(box, name) == ("NOERROR", "")
    assert name in box.cluster.queries()


# -- malformed input -----------------------------------------------------------------

RAW_CLIENT = r"""
import socket, struct, sys, json
def wire(*labels): return b"".join(bytes([len(l)]) + l for l in labels) + b"\0"
def hdr(ident, flags=0x0100, qd=1, an=0, ns=0, ar=0): return struct.pack("!HHHHHH", ident, flags, qd, an, ns, ar)
Q = b"\0\1\0\1"
cases = {
  "garbage": b"\xde\xad\x01\x00" + b"\xff" * 16,
  "garbage_qr": b"\xde\xad\xbe\xef" * 5,
  "short": b"\x12",
  "header_only": hdr(1),
  "truncated_question": hdr(2) + b"\x07exam",
  "compression_loop": hdr(3) + b"\xc0\x0c" + Q,
  "pointer_forward": hdr(4) + b"\xc0\xff" + Q,
  "qdcount0": hdr(5, qd=0),
  "qdcount2": hdr(6, qd=2) + wire(b"a", b"attacker", b"test") + Q + wire(b"b", b"attacker", b"test") + Q,
  "bad_punycode": hdr(7) + wire(b"xn--zz", b"attacker", b"test") + Q,
  "high_bytes": hdr(8) + wire(b"\xe2\x98\x83", b"attacker", b"test") + Q,
  "nul_in_label": hdr(9) + wire(b"a\x00b", b"attacker", b"test") + Q,
  "dot_in_label": hdr(10) + wire(b"x.dnsonly", b"example", b"test") + Q,
  "dot_label_wildcard": hdr(21) + wire(b"dotted.label", b"wild", b"example", b"test") + Q,
  "dot_label_exact": hdr(22) + wire(b"dnsonly.example", b"test") + Q,
  "opcode_notify": hdr(11, flags=0x2000) + wire(b"attacker", b"test") + Q,
  "opcode_update": hdr(12, flags=0x2800) + wire(b"attacker", b"test") + Q,
  "chaos": hdr(13) + wire(b"version", b"bind") + b"\0\x10\0\x03",
  "axfr": hdr(14) + wire(b"dnsonly", b"example", b"test") + b"\0\xfc\0\1",
  "response": hdr(15, flags=0x8180) + wire(b"attacker", b"test") + Q,
  "oversized": hdr(16) + wire(b"attacker", b"test") + Q + b"\0" * 4000,
  "ancount_lies": hdr(17, an=50) + wire(b"attacker", b"test") + Q,
  "two_opt": hdr(18, ar=2) + wire(b"attacker", b"test") + Q + (b"\0\0\x29\x10\0\0\0\0\0\0\0") * 2,
  "edns_version1": hdr(19, ar=1) + wire(b"attacker", b"test") + Q + b"\0\0\x29\x10\0\0\1\0\0\0\0",
  "long_name": hdr(20) + wire(*([b"a" * 63] * 4)) + Q,
}
out = {}
target = (sys.argv[1], 53)
for name, packet in cases.items():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.5)
    s.sendto(packet, target)
    try:
        data = s.recv(65536)
        out[name] = {"rcode": data[3] & 15, "qr": data[2] >> 7, "qd": struct.unpack("!H", data[4:6])[0],
                     "an": struct.unpack("!H", data[6:8])[0], "len": len(data), "id": struct.unpack("!H", data[:2])[0],
                     "ext": data[-6] if len(data) > 12 and data[-10:-8] == b"\0\x29" else None}
    except socket.timeout:
        out[name] = None
    s.close()
# TCP: garbage framing, a zero length, a truncated message, then a good query on a fresh connection.
for name, payload in {"tcp_zero_length": b"\0\0", "tcp_garbage": b"\0\x05hello", "tcp_half": b"\0\x40\0\1"}.items():
    c = socket.create_connection(target, timeout=3)
    c.sendall(payload)
    c.shutdown(socket.SHUT_WR)
    try:
        out[name] = c.recv(65536).hex()
    except OSError as e:
        out[name] = type(e).__name__
    c.close()
print(json.dumps(out))
"""


def test_malformed_packets_get_local_answers_and_the_listener_keeps_answering(box: DnsSandbox):
    import json

    script = box.public / "raw_dns.py"
    script.write_text(RAW_CLIENT)
    script.chmod(0o644)
    before = metric(box.proxy, "egress_dns_queries_total", reason="malformed")
    out = box.exec(SYSTEM_PYTHON, "-I", str(script), RESOLVER_V4, timeout=90)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    formerr = {k for k, v in got.items() if isinstance(v, dict) and v["rcode"] == 1}
    assert formerr >= {"header_only", "truncated_question", "compression_loop", "pointer_forward", "qdcount0",
                       "qdcount2", "bad_punycode", "high_bytes", "oversized", "ancount_lies", "two_opt"}  # fmt: skip
    for name in ("opcode_notify", "opcode_update", "chaos", "axfr"):
        assert got[name]["rcode"] == 5, (name, got[name])  # REFUSED
    for name in ("nul_in_label", "dot_in_label", "long_name", "dot_label_wildcard", "dot_label_exact"):
        assert got[name]["rcode"] == 3, (name, got[name])  # NXDOMAIN
    assert got["edns_version1"]["rcode"] == 0 and got["edns_version1"]["ext"] == 1  # BADVERS = 16
    assert got["garbage"]["rcode"] == 1 and got["garbage"]["id"] == 0xDEAD
    for name in ("short", "response", "garbage_qr"):  # no header / a response: never answered
        assert got[name] is None, (name, got[name])
    assert all(v["qr"] == 1 and v["len"] <= 512 for v in got.values() if isinstance(v, dict))
    assert metric(box.proxy, "egress_dns_queries_total", reason="malformed") >= before + 13
    # The listener still answers, over UDP and TCP, and nothing reached a resolver.
    assert dig(box, "dnsonly.example.test")[0] == "NOERROR"
    assert dig(box, "+tcp", "dnsonly.example.test")[0] == "NOERROR"
    logged = box.all_queries()
    assert "attacker.test" not in logged and "version.bind" not in logged and "aaaaaaaa" not in logged
    assert "dotted" not in logged  # a label holding a dot never reaches the resolver, wildcard or not
    assert box.proxy.proc.poll() is None


# -- metrics, audit, reload ----------------------------------------------------------


def test_each_blocked_query_is_counted_and_logged(box: DnsSandbox):
    before = metric(box.proxy, "egress_dns_queries_total", decision="blocked", reason="not_allowlisted", qtype="TXT")
    lines = len(box.proxy.audit())
    names = [f"{token()}.attacker.test" for _ in range(3)]
    for name in names:
        assert dig(box, name, "TXT")[0] == "NXDOMAIN"
    after = metric(box.proxy, "egress_dns_queries_total", decision="blocked", reason="not_allowlisted", qtype="TXT")
    assert after == before + 3
    dns_lines = [line for line in box.proxy.audit()[lines:] if line.get("event") == "dns"]
    assert [line["name"] for line in dns_lines] == names
    assert {(line["decision"], line["reason"], line["qtype"]) for line in dns_lines} == {("blocked", "not_allowlisted", "TXT")}
    # qtype is from a fixed set; the name is never a label
    assert metric(box.proxy, "egress_dns_queries_total", qtype="other") >= 1
    assert names[0] not in box.proxy.get_ops("/metrics")[1]


def ask_listener(box: DnsSandbox, packet: bytes, family=socket.AF_INET, host="127.0.0.1") -> bytes:
    """One raw UDP query straight to the listener (as root, from inside the namespace)."""
    with in_netns(box.proxy_ns):
        sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.settimeout(3)
        sock.sendto(packet, (host, box.dns_port))
        return sock.recv(65536)
    finally:
        sock.close()


def test_audit_name_is_truncated(box: DnsSandbox):
    # Longer than any legal name (mitmproxy's parser does not check the 255-byte limit).
    labels = [(token() + "a" * 50).encode() for _ in range(8)] + [b"attacker", b"test"]
    name = ".".join(label.decode() for label in labels)
    packet = struct.pack("!HHHHHH", 0x99, 0x0100, 1, 0, 0, 0)
    packet += b"".join(bytes([len(label)]) + label for label in labels) + b"\0\0\1\0\1"
    lines = len(box.proxy.audit())
    answer = ask_listener(box, packet)
    assert answer[3] & 15 == 3  # NXDOMAIN
    logged = [line for line in box.proxy.audit()[lines:] if line.get("event") == "dns"]
    assert len(logged) == 1 and len(logged[0]["name"]) == 253 and name.startswith(logged[0]["name"])
    assert labels[0].decode() not in box.all_queries()


def test_reload_that_adds_a_name_makes_it_resolve(box: DnsSandbox):
    assert dig(box, "reload.example.test") == ("NXDOMAIN", "")
    assert "reload.example.test" not in box.all_queries()
    box.proxy.spec_path.write_text(RELOADED)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, answers = dig(box, "reload.example.test")
        if status == "NOERROR":
            break
        time.sleep(0.3)
    assert (status, answers.split()[-1]) == ("NOERROR", "198.18.0.11")
    box.proxy.spec_path.write_text(SPEC)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and dig(box, "reload.example.test")[0] != "NXDOMAIN":
        time.sleep(0.3)
    assert dig(box, "reload.example.test")[0] == "NXDOMAIN"


def wait_for_reload(box: DnsSandbox, before: float) -> None:
    deadline = time.monotonic() + 10
    while metric(box.proxy, "egress_config_reloads_total", result="success") <= before:
        assert time.monotonic() < deadline, "the spec was not reloaded"
        time.sleep(0.1)


def test_reload_that_removes_a_cached_name_stops_it_resolving_at_once(box: DnsSandbox):
    """The answer cache belongs to the spec it was filled under: the first query after
    the reload that removes a name gets NXDOMAIN, though its addresses were cached."""
    before = metric(box.proxy, "egress_config_reloads_total", result="success")
    box.proxy.spec_path.write_text(RELOADED)
    wait_for_reload(box, before)
    for _ in range(2):  # the second one from the cache
        status, answers = dig(box, "reload.example.test")
        assert (status, answers.split()[-1]) == ("NOERROR", "198.18.0.11")
    before = metric(box.proxy, "egress_config_reloads_total", result="success")
    box.proxy.spec_path.write_text(SPEC)
    wait_for_reload(box, before)
    assert dig(box, "reload.example.test") == ("NXDOMAIN", "")


def test_allowlisted_answers_are_cached_and_still_filtered(box: DnsSandbox):
    """Repeated queries for an allowlisted name reach the resolver at most once per
    TTL (30 s); a cached answer counts down its TTL and still leaves out the forbidden
    addresses (loopback, metadata) the resolver returned."""
    asked = box.cluster.queries().count("query[A] mixed.dns.example.test")
    ttls = []
    for _ in range(3):
        status, answers = dig(box, "mixed.dns.example.test")
        assert status == "NOERROR"
        assert answers.split()[-1] == "198.18.0.12" and len(answers.splitlines()) == 1, answers
        ttls.append(int(answers.split()[1]))
        time.sleep(1.1)
    assert box.cluster.queries().count("query[A] mixed.dns.example.test") <= asked + 1
    assert ttls == sorted(ttls, reverse=True) and ttls[-1] < ttls[0] <= 30, ttls


def test_listener_answers_on_ipv6_loopback(box: DnsSandbox):
    query = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + b"\x08attacker\x04test\x00\x00\x01\x00\x01"
    answer = ask_listener(box, query, socket.AF_INET6, "::1")
    assert answer[:2] == b"\x42\x42" and answer[3] & 15 == 3


def test_workers_one_of_them_serves_dns(lab: Lab):
    dns_port = lab.free_port()
    proxy = lab.start_proxy(SPEC, "--workers", "2", "--dns-listen", f"127.0.0.1:{dns_port}")
    try:
        for transport in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
            with in_netns(lab.proxy_ns):
                sock = socket.socket(socket.AF_INET, transport)
            try:
                sock.settimeout(5)
                query = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\x08attacker\x04test\x00\x00\x10\x00\x01"
                if transport == socket.SOCK_STREAM:
                    sock.connect(("127.0.0.1", dns_port))
                    sock.sendall(struct.pack("!H", len(query)) + query)
                    answer = sock.recv(65536)[2:]
                else:
                    sock.sendto(query, ("127.0.0.1", dns_port))
                    answer = sock.recv(65536)
            finally:
                sock.close()
            assert answer[:2] == b"\x00\x07" and answer[3] & 15 == 3
        assert metric(proxy, "egress_dns_queries_total", decision="blocked", qtype="TXT") == 2
        assert proxy.stderr().count(f"DNS on 127.0.0.1:{dns_port}") == 1
    finally:
        proxy.stop()


def test_report_mode_forwards_and_counts_reported(box: DnsSandbox):
    from e2e.support.lab import ProxyProcess

    dns_port = box.free_port()
    report = ProxyProcess(box, SPEC.replace("network:\n", "network:\n  mode: report\n"),
                          ["--dns-listen", f"127.0.0.1:{dns_port}"], env=None, name="report.yaml")  # fmt: skip
    report.start()
    try:
        name = f"{token()}.attacker.test"
        query = struct.pack("!HHHHHH", 0x77, 0x0100, 1, 0, 0, 0)
        query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0\0\1\0\1"
        with in_netns(box.proxy_ns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.settimeout(5)
            sock.sendto(query, ("127.0.0.1", dns_port))
            answer = sock.recv(65536)
        finally:
            sock.close()
        assert answer[:2] == b"\x00\x77" and answer[3] & 15 == 0 and answer.endswith(bytes([198, 18, 0, 13]))
        assert name in box.cluster.queries()  # forwarded: report mode lets it pass, like connections
        assert metric(report, "egress_dns_queries_total", decision="reported", reason="not_allowlisted") == 1
        assert [line["decision"] for line in report.audit() if line.get("event") == "dns"] == ["reported"]
        # PTR never leaves, not even in report mode.
        ptr = struct.pack("!HHHHHH", 0x78, 0x0100, 1, 0, 0, 0) + b"\x0299\x010\x0218\x03198\x07in-addr\x04arpa\x00\x00\x0c\x00\x01"
        with in_netns(box.proxy_ns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.settimeout(5)
            sock.sendto(ptr, ("127.0.0.1", dns_port))
            assert sock.recv(65536)[3] & 15 == 3
        finally:
            sock.close()
        assert "in-addr.arpa" not in box.all_queries()
    finally:
        report.stop()


# -- gateway pattern: the sandbox in its own namespace, the proxy's DNS over a veth -----

GATEWAY_V4, GATEWAY_CLIENT_V4 = "198.18.5.1", "198.18.5.2"
# What the chart's sandbox NetworkPolicy allows: the gateway's proxy and DNS ports, nothing else.
CLIENT_RULES = """table inet egress_test_policy {{
    chain output {{
        type filter hook output priority 0; policy drop;
        oif "lo" accept
        ct state established,related accept
        ip daddr {gw} tcp dport {{ {proxy_port}, 53 }} accept
        ip daddr {gw} udp dport 53 accept
    }}
}}
"""


@pytest.fixture(scope="module")
def gateway(box: DnsSandbox, lab: Lab):
    from e2e.support.lab import ProxyProcess, run

    client_ns, vc, vg = f"egc-{lab.id}", f"vc{lab.id}", f"vg{lab.id}"
    etc = Path("/etc/netns") / client_ns
    run(["ip", "netns", "del", client_ns], check=False)
    proxy = None
    try:
        run(["ip", "netns", "add", client_ns])
        run(["ip", "link", "add", vc, "type", "veth", "peer", "name", vg])
        run(["ip", "link", "set", vc, "netns", client_ns])
        run(["ip", "link", "set", vg, "netns", box.proxy_ns])
        cns, gns = ["ip", "netns", "exec", client_ns], ["ip", "netns", "exec", box.proxy_ns]
        run([*cns, "ip", "link", "set", "lo", "up"])
        run([*cns, "ip", "addr", "add", f"{GATEWAY_CLIENT_V4}/24", "dev", vc])
        run([*gns, "ip", "addr", "add", f"{GATEWAY_V4}/24", "dev", vg])
        run([*cns, "ip", "link", "set", vc, "up"])
        run([*gns, "ip", "link", "set", vg, "up"])
        run([*cns, "ip", "route", "add", "default", "via", GATEWAY_V4])
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n")
        # dnsPolicy: None, the gateway's Service address as the only nameserver.
        (etc / "resolv.conf").write_text(f"options timeout:2 attempts:1\nnameserver {GATEWAY_V4}\n")
        proxy = ProxyProcess(box, SPEC, ["--dns-listen", f"{GATEWAY_V4}:53"], env=None, name="gateway.yaml")
        proxy.start()
        rules = CLIENT_RULES.format(gw=GATEWAY_V4, proxy_port=proxy.port)
        applied = subprocess.run([*cns, "nft", "-f", "-"], input=rules, capture_output=True, text=True, timeout=30)
        assert applied.returncode == 0, applied.stderr
        yield client_ns, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        run(["ip", "netns", "del", client_ns], check=False)
        shutil.rmtree(etc, ignore_errors=True)


def in_client(client_ns: str, *cmd: str) -> subprocess.CompletedProcess:
    from e2e.support.transparent_lab import CLIENT_ENV, NOBODY

    return subprocess.run(["ip", "netns", "exec", client_ns, *NOBODY, *cmd],
                          capture_output=True, text=True, timeout=30, env=CLIENT_ENV)  # fmt: skip


def test_gateway_sandbox_resolves_only_allowlisted_names(box: DnsSandbox, gateway):
    client_ns, proxy = gateway
    out = in_client(client_ns, "getent", "hosts", "dnsonly.example.test")
    assert out.returncode == 0 and "198.18.0.10" in out.stdout, out.stderr
    assert re.search(r"query\[A\] dnsonly\.example\.test from 198\.18\.1\.1", box.cluster.queries())
    names = []
    for args in (["A"], ["TXT"], ["+tcp", "ANY"], ["HTTPS"], ["MX"]):
        name = f"{token()}.attacker.test"
        names.append(name)
        out = in_client(client_ns, "dig", "+tries=1", "+time=3", *args[:-1], name, args[-1])
        assert "status: NXDOMAIN" in out.stdout, out.stdout
    name = f"{token()}.attacker.test"
    names.append(name)
    assert in_client(client_ns, "getent", "ahosts", name).returncode == 2
    out = in_client(client_ns, "dig", "+tries=1", "+time=3", "-x", "198.18.0.77")
    assert "status: NXDOMAIN" in out.stdout
    # Straight to a resolver: the policy drops it (no answer at all).
    name = f"{token()}.attacker.test"
    names.append(name)
    out = in_client(client_ns, "dig", "+tries=1", "+time=2", f"@{RESOLVER_V4}", name)
    assert "timed out" in out.stdout or "no servers could be reached" in out.stdout, out.stdout
    for name in names:
        assert_never_left(box, name)
    assert "77.5.18.198" not in box.all_queries() and "in-addr.arpa" not in box.all_queries()
    assert metric(proxy, "egress_dns_queries_total", decision="blocked", reason="not_allowlisted") >= 6


def test_many_lookups_from_new_sockets_are_all_answered(box: DnsSandbox):
    """A stub resolver opens a new socket per lookup, and each is a session in mitmproxy
    for 20 s: 400 in a row must all be answered, and must not use up the client's
    connection budget (--max-connections-per-client, 256) for HTTP."""
    answered = 0
    for i in range(400):
        query = struct.pack("!HHHHHH", i, 0x0100, 1, 0, 0, 0) + b"\x08attacker\x04test\x00\x00\x01\x00\x01"
        try:
            answered += ask_listener(box, query)[:2] == struct.pack("!H", i)
        except TimeoutError:
            pass
    assert answered == 400
    status, _, body = box.curl(f"https://dnsonly.example.test/dns/{uuid.uuid4().hex}")
    assert status == 200, body


def test_an_error_in_the_hook_fails_closed(box: DnsSandbox):
    """EGRESS_TEST_FAULT makes the dns_request hook raise: the query gets SERVFAIL,
    nothing is forwarded, the error is counted and the listener keeps answering. The
    fault fires in the layer's synchronous half (`answer_now`, guarded as the hook):
    an allowlisted name and a blocked one, each counted once, never twice."""
    from e2e.support.lab import ProxyProcess

    dns_port = box.free_port()
    faulty = ProxyProcess(box, SPEC, ["--dns-listen", f"127.0.0.1:{dns_port}"],
                          env={"EGRESS_TEST_FAULT": "DnsFilter.dns_request"}, name="faulty.yaml")  # fmt: skip
    faulty.start()
    try:
        for i, name in enumerate((b"\x07dnsonly\x07example\x04test\x00", b"\x01x\x08attacker\x04test\x00")):
            query = struct.pack("!HHHHHH", 0x50 + i, 0x0100, 1, 0, 0, 0)
            query += name + b"\x00\x01\x00\x01"
            with in_netns(box.proxy_ns):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.settimeout(5)
                sock.sendto(query, ("127.0.0.1", dns_port))
                answer = sock.recv(65536)
            finally:
                sock.close()
            assert answer[:2] == struct.pack("!H", 0x50 + i) and answer[3] & 15 == 2  # SERVFAIL
        assert metric(faulty, "egress_internal_errors_total", hook="dns_request") == 2
        assert faulty.proc.poll() is None
    finally:
        faulty.stop()


def test_spec_dir_gateway_answers_no_environments_names(lab: Lab, tmp_path: Path):
    """A DNS query carries no proof of environment: with --spec-dir the listener answers
    from no environment's allowlist, so even a name every environment allowlists is
    NXDOMAIN (the sandboxes of such a gateway use it as their proxy, which resolves),
    and the query is counted with an empty environment label."""
    spec_dir = tmp_path / "envs"
    spec_dir.mkdir()
    (spec_dir / "team-a.yaml").write_text(SPEC + '  proxyToken: "tok-team-a-0123456789"\n', encoding="utf-8")
    dns_port = lab.free_port()
    proxy = lab.start_proxy(None, "--dns-listen", f"127.0.0.1:{dns_port}", spec_dir=spec_dir)
    try:
        with in_netns(lab.proxy_ns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.settimeout(5)
            query = struct.pack("!HHHHHH", 9, 0x0100, 1, 0, 0, 0) + b"\x07dnsonly\x07example\x04test\x00\x00\x01\x00\x01"
            sock.sendto(query, ("127.0.0.1", dns_port))
            answer = sock.recv(65536)
        finally:
            sock.close()
        assert answer[:2] == b"\x00\x09" and answer[3] & 15 == 3  # NXDOMAIN
        assert metric(proxy, "egress_dns_queries_total", decision="blocked", reason="not_allowlisted", environment="") == 1
        assert "tok-team-a" not in proxy.stderr()
    finally:
        proxy.stop()
