"""The DNS listener's fast path (egress/dns/fast.py, `DnsFilter.answer_datagram`) decides
exactly what the full path through mitmproxy's parser decides.

Differential: every packet of a corpus (hand-written shapes, then seeded mutations of
them and random bytes) goes through both readers. Where the fast reader accepts a
packet, its `Query` and EDNS size must equal what `read_query` makes of mitmproxy's
parse, and `answer_datagram` must write the very bytes `answer_now` writes, with the
same audit line. The common shapes (what dig, glibc and dnsperf send) must be taken
by the fast path, or the test fails: a fast path that declines everything is a
regression too.
"""

from __future__ import annotations

import io
import ipaddress
import json
import random
import struct

import pytest
from mitmproxy import connection, dns

from egress.addons.dns_filter import DnsFilter, read_query
from egress.dns import fast as dns_fast
from egress.dns import policy as dp
from egress.dns.cache import AddressCache, Entry
from egress.mitm.patches import dns_listener as dns_layer
from egress.ops.audit import DecisionLog
from egress.policy.spec import parse_spec

SPEC = parse_spec(
    json.dumps({"network": {"allowCidrs": ["198.18.0.0/15", "2001:2::/48"],
                          "allowlist": [{"domain": "allowed.test"}, {"domain": "*.wild.test"}]}}),
    source="s.json",
)
CLIENT = "198.18.1.1:5353"


def name(*labels: bytes) -> bytes:
    return b"".join(bytes([len(label)]) + label for label in labels) + b"\x00"


def packet(qname: bytes, qtype=dp.A, qclass=1, flags=0x0100, counts=(1, 0, 0, 0), opt: bytes | None = None, tail=b""):
    qd, an, ns, ar = counts
    if opt is not None and counts == (1, 0, 0, 0):
        ar = 1
    body = qname + struct.pack("!HH", qtype, qclass) + (opt or b"") + tail
    return struct.pack("!HHHHHH", 0x1234, flags, qd, an, ns, ar) + body


def opt(size=1232, version=0, data=b"", owner=b"\x00", rtype=dp.OPT, do=False):
    return owner + struct.pack("!HHIH", rtype, size, version << 16 | (0x8000 if do else 0), len(data)) + data


COOKIE = struct.pack("!HH", 10, 8) + b"\x01" * 8  # dig sends a client cookie
ECS = struct.pack("!HHHBB", 8, 7, 1, 24, 0) + b"\xc6\x12\x01"

# Shapes real clients send: each must be answered by the fast path.
COMMON = [
    packet(name(b"allowed", b"test")),  # glibc getaddrinfo
    packet(name(b"allowed", b"test"), dp.AAAA),
    packet(name(b"allowed", b"test"), opt=opt(data=COOKIE)),  # dig
    packet(name(b"AlLoWeD", b"TeSt"), opt=opt(size=4096)),  # 0x20 case randomisation
    packet(name(b"c2VjcmV0", b"attacker", b"example"), dp.TXT),  # exfiltration attempt
    packet(name(b"x" * 63, b"y" * 63, b"attacker", b"example"), dp.TXT, opt=opt(data=ECS)),
    packet(name(b"a", b"wild", b"test"), dp.HTTPS),
    packet(name(b"localhost")),
    packet(name(b"foo", b"localhost"), dp.AAAA),
    packet(name(b"1", b"1", b"18", b"198", b"in-addr", b"arpa"), dp.PTR),
    packet(name(b"allowed", b"test"), dp.MX),
    packet(name(b"allowed", b"test"), dp.ANY, opt=opt()),
    packet(name(b"allowed", b"test"), 10),  # NULL (iodine)
    packet(name(b"allowed", b"test"), dp.AXFR),
    packet(name(b"version", b"bind"), dp.TXT, qclass=3),  # CHAOS
    packet(name(b"allowed", b"test"), opt=opt(version=1)),  # BADVERS
    packet(name(b"_sip", b"_tcp", b"allowed", b"test"), dp.SRV),
    packet(name(b"under_score", b"test")),
    packet(name(b"sp ace", b"test")),
    packet(name(b"ctl\x00\x1f\x7f", b"test")),
    packet(name(b"-lead", b"test")),
    packet(name(b"axn--b", b"test")),  # "xn--" inside a label, not its prefix
    packet(b"\x00"),  # the root
    packet(b"\x00", dp.OPT),
    packet(name(b"allowed", b"test"), flags=0x0130),  # AD and CD set
    packet(name(b"allowed", b"test"), flags=0x0000),  # RD clear
    packet(name(b"allowed", b"test"), flags=0x0110, opt=opt(data=COOKIE, do=True)),  # dig +dnssec +cdflag
    packet(name(b"x", b"attacker", b"example"), opt=opt(do=True)),  # kdig +dnssec, blocked
]

# Shapes the fast reader leaves to the full path.
UNUSUAL = [
    packet(name(b"xn--bcher-kva", b"test")),
    packet(name(b"XN--bcher-kva", b"test")),
    packet(name(b"xn--zz", b"test")),
    packet(name("bücher".encode(), b"test")),
    packet(name(b"a.b", b"test")),
    packet(name(b"allowed", b"test"), flags=0x8100),  # a response
    packet(name(b"allowed", b"test"), flags=0x2900),  # opcode UPDATE
    packet(name(b"allowed", b"test"), counts=(2, 0, 0, 0)),
    packet(name(b"allowed", b"test"), counts=(0, 0, 0, 0)),
    packet(name(b"allowed", b"test"), counts=(1, 1, 0, 0)),
    packet(name(b"allowed", b"test"), counts=(1, 0, 1, 0)),
    packet(name(b"allowed", b"test"), counts=(1, 0, 0, 2), tail=opt() + opt()),
    packet(name(b"allowed", b"test"), opt=opt(rtype=250)),  # TSIG-like
    packet(name(b"allowed", b"test"), opt=opt(owner=b"\x01a\x00")),
    packet(name(b"allowed", b"test"), opt=opt(owner=b"\xc0\x0c")),
    packet(name(b"allowed", b"test"), tail=b"\x00"),  # trailing byte
    packet(b"\x07allowed\xc0\x0c"),  # pointer loop
    packet(name(b"allowed", b"test"))[:-1],  # cut short
    packet(name(b"allowed", b"test"), opt=opt(data=COOKIE))[:-3],
    b"\x12\x34\x01\x00",
    b"",
]


def mitmproxy_query(data: bytes) -> tuple[dp.Query, int]:
    msg = dns_layer.parse(data)
    opt_rr = next((rr for rr in msg.additionals if rr.type == dp.OPT), None)
    return read_query(msg), opt_rr.class_ if opt_rr is not None else 0


def corpus() -> list[bytes]:
    rng = random.Random(20261201)
    out = COMMON + UNUSUAL
    seeds = COMMON + UNUSUAL[:-2]
    for _ in range(4000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            if not data:
                break
            i = rng.randrange(len(data))
            match rng.randrange(4):
                case 0:
                    data[i] ^= 1 << rng.randrange(8)
                case 1:
                    data[i] = rng.choice((0, 1, 0x2E, 0x41, 0x3F, 0x40, 0xC0, 0xFF, rng.randrange(256)))
                case 2:
                    del data[i]
                case 3:
                    data.insert(i, rng.randrange(256))
        out.append(bytes(data))
    # A byte of the name replaced: the shape mostly stays, the name's text changes.
    for _ in range(2000):
        data = bytearray(rng.choice(COMMON))
        end = dns_fast._HEADER.size + data[dns_fast._HEADER.size :].index(0)
        if end > dns_fast._HEADER.size:
            data[rng.randrange(dns_fast._HEADER.size + 1, end)] = rng.randrange(256)
        out.append(bytes(data))
    out += [rng.randbytes(rng.randint(0, 80)) for _ in range(500)]
    return out


CORPUS = corpus()


def test_common_shapes_take_the_fast_path_and_unusual_ones_do_not():
    assert [dns_fast.read_simple_query(p) is not None for p in COMMON] == [True] * len(COMMON)
    assert [dns_fast.read_simple_query(p) for p in UNUSUAL] == [None] * len(UNUSUAL)


def test_fast_reader_reads_what_mitmproxy_reads():
    taken = 0
    for data in CORPUS:
        fast = dns_fast.read_simple_query(data)
        if fast is None:
            continue
        taken += 1
        assert fast == mitmproxy_query(data), data
    assert taken > 500  # the mutations keep many packets in the common shape


class Cache(AddressCache):
    """The address cache, primed for every name: the fast path answers allowlisted names only from it."""

    def __init__(self):
        super().__init__(clock=lambda: 1000.0)

    def entry(self, owner, host, family):
        found = ("198.18.0.10", "127.0.0.1") if family == 4 else ("2001:2::10", "::1")
        return Entry(tuple(ipaddress.ip_address(a) for a in found), 1017.0)  # a TTL of 17

    def put(self, *args):
        pass


def full_path(data: bytes) -> tuple[bytes | None, str]:
    out = io.StringIO()
    dnsfilter = DnsFilter(lambda: SPEC, lambda ip: False, DecisionLog(stream=out), cache=Cache())
    client = connection.Client(peername=("198.18.1.1", 5353), sockname=("127.0.0.1", 53), timestamp_start=0)
    client.transport_protocol = "udp"
    flow = dns.DNSFlow(client, connection.Server(address=None))
    flow.request = dns_layer.parse(data)
    assert dnsfilter.answer_now(flow) is True
    wire = None if flow.metadata.get(dns_layer.DROP_KEY) else flow.metadata[dns_layer.WIRE_KEY]
    return wire, out.getvalue()


def fast_path(data: bytes) -> tuple[bytes | None, str]:
    """The fast path's answer and log; asked again under another ID (the answer memo,
    egress/dns/answer_memo.py, serves repeats), it must give the same under that ID."""
    out = io.StringIO()
    dnsfilter = DnsFilter(lambda: SPEC, lambda ip: False, DecisionLog(stream=out), cache=Cache())
    wire = dnsfilter.answer_datagram(data, CLIENT)
    log = out.getvalue()
    if wire is not None:
        flipped = bytes([data[0] ^ 0xFF]) + data[1:]
        again = dnsfilter.answer_datagram(flipped, CLIENT)
        assert again == bytes([wire[0] ^ 0xFF]) + wire[1:], data
        assert without_time(out.getvalue()[len(log) :]) == without_time(log)
    return wire, log


def without_time(log: str) -> str:
    return "\n".join(json.dumps({**json.loads(line), "time": ""}) for line in log.splitlines())


@pytest.mark.parametrize("data", COMMON, ids=range(len(COMMON)))
def test_fast_answer_is_the_full_paths_answer(data):
    fast_wire, fast_log = fast_path(data)
    full_wire, full_log = full_path(data)
    assert fast_wire is not None
    assert fast_wire == full_wire
    assert without_time(fast_log) == without_time(full_log)


def test_fast_answers_equal_full_answers_over_the_corpus():
    answered = 0
    for data in CORPUS:
        fast_wire, fast_log = fast_path(data)
        if fast_wire is None:
            continue
        answered += 1
        full_wire, full_log = full_path(data)
        assert (fast_wire, without_time(fast_log)) == (full_wire, without_time(full_log)), data
    assert answered > 500


def test_blocked_name_answer_and_counted_line():
    wire, log = fast_path(packet(name(b"c2VjcmV0", b"attacker", b"example"), dp.TXT))
    assert wire is not None and wire[3] & 0xF == dp.NXDOMAIN
    line = json.loads(log)
    assert (line["event"], line["name"], line["qtype"], line["reason"]) == (
        "dns", "c2VjcmV0.attacker.example", "TXT", "not_allowlisted",
    )  # fmt: skip


def test_forbidden_cached_addresses_are_dropped_on_the_fast_path():
    wire, _ = fast_path(packet(name(b"allowed", b"test")))
    assert wire is not None
    assert struct.unpack_from("!H", wire, 6)[0] == 1  # only 198.18.0.10, not 127.0.0.1
    assert wire.endswith(ipaddress.ip_address("198.18.0.10").packed)


def test_dnssec_ok_and_checking_disabled_are_copied_on_both_paths():
    """dig +dnssec / kdig +cdflag: the answer carries the query's DO and CD bits."""
    for data in (packet(name(b"allowed", b"test"), flags=0x0110, opt=opt(do=True)),
                 packet(name(b"x", b"attacker", b"example"), flags=0x0110, opt=opt(do=True))):  # fmt: skip
        for wire, _ in (fast_path(data), full_path(data)):
            assert wire is not None
            assert struct.unpack_from("!H", wire, 2)[0] & 0x0010  # CD
            assert wire[-11:-8] == b"\x00\x00\x29" and struct.unpack_from("!I", wire, len(wire) - 6)[0] & 0x8000  # DO
    wire, _ = fast_path(packet(name(b"allowed", b"test"), opt=opt()))
    assert wire is not None and not struct.unpack_from("!H", wire, 2)[0] & 0x0010
    assert not struct.unpack_from("!I", wire, len(wire) - 6)[0] & 0x8000
