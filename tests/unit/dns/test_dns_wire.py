"""DNS answers in wire format (egress/dns/wire.py), checked with mitmproxy's own parser."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from mitmproxy import dns

from egress.dns import wire as dns_wire

ip = ipaddress.ip_address


def query(name=b"\x07ExAmPlE\x04test\x00", qtype=1, flags=0x0100, opt: int | None = None) -> bytes:
    packet = struct.pack("!HHHHHH", 0xBEEF, flags, 1, 0, 0, 1 if opt else 0) + name + struct.pack("!HH", qtype, 1)
    if opt:
        packet += b"\x00" + struct.pack("!HHIH", 41, opt, 0, 0)
    return packet


def test_answer_echoes_the_question_bytes_and_points_records_at_it():
    wire = dns_wire.answer(query(), rcode=0, qtype=1, addresses=[ip("198.18.0.10"), ip("2001:2::1"), ip("198.18.0.11")])
    msg = dns.DNSMessage.unpack(wire)
    assert (msg.id, msg.query, msg.recursion_desired, msg.recursion_available) == (0xBEEF, False, True, True)
    assert msg.questions[0].name == "ExAmPlE.test"  # case kept (0x20 randomisation)
    assert [str(rr.ipv4_address) for rr in msg.answers] == ["198.18.0.10", "198.18.0.11"]  # no AAAA in an A answer
    assert all(rr.name == "ExAmPlE.test" and rr.ttl == 30 for rr in msg.answers)


@pytest.mark.parametrize("rcode", [1, 3, 5])
def test_error_answers(rcode):
    msg = dns.DNSMessage.unpack(dns_wire.answer(query(), rcode=rcode))
    assert (msg.response_code, msg.answers, len(msg.questions)) == (rcode, [], 1)


def test_without_question_and_with_opt_and_badvers():
    msg = dns.DNSMessage.unpack(dns_wire.answer(query(opt=4096), rcode=16, with_question=False, opt_size=1232))
    assert msg.questions == [] and msg.response_code == 0
    (opt,) = msg.additionals
    assert (opt.type, opt.class_, opt.ttl >> 24) == (41, 1232, 1)  # extended RCODE 1 << 4 = BADVERS


def test_cd_and_do_bits_are_copied_and_ad_is_never_set():
    # RFC 4035 3.2.2 (CD), RFC 3225 3 (DO); AD (0x0020) asked for is not given: nothing is validated.
    wire = dns_wire.answer(query(flags=0x0130, opt=4096), rcode=0, qtype=1, addresses=[ip("198.18.0.10")],
                           opt_size=1232, dnssec_ok=True)  # fmt: skip
    msg = dns.DNSMessage.unpack(wire)
    flags = struct.unpack_from("!H", wire, 2)[0]
    assert flags & 0x0010 and not flags & 0x0020
    (opt,) = msg.additionals
    assert opt.ttl & 0x8000
    plain = dns_wire.answer(query(opt=4096), rcode=3, opt_size=1232)
    assert not struct.unpack_from("!H", plain, 2)[0] & 0x0010
    assert not dns.DNSMessage.unpack(plain).additionals[0].ttl & 0x8000
    many = [ip(f"198.18.2.{i}") for i in range(1, 41)]
    cut = dns_wire.answer(query(flags=0x0110), rcode=0, qtype=1, addresses=many)
    assert struct.unpack_from("!H", cut, 2)[0] & 0x0210 == 0x0210  # TC, CD kept


def test_too_large_is_truncated_to_the_records_that_fit():
    """musl before 1.2.4 and busybox nslookup never retry over TCP: they use the records
    of a truncated answer, as CoreDNS and dnsmasq send them (no records: no address)."""
    many = [ip(f"198.18.2.{i}") for i in range(1, 41)]
    full = dns_wire.answer(query(), rcode=0, qtype=1, addresses=many, limit=65535)
    assert len(dns.DNSMessage.unpack(full).answers) == 40 and len(full) > 512
    wire = dns_wire.answer(query(), rcode=0, qtype=1, addresses=many, limit=512)
    cut = dns.DNSMessage.unpack(wire)
    # 12 (header) + 18 (question) + 31 x 16 = 526 > 512: 30 records, 510 bytes
    assert cut.truncation and len(cut.questions) == 1 and len(wire) <= 512 and len(wire) + 16 > 512
    assert [str(rr.ipv4_address) for rr in cut.answers] == [str(a) for a in many[: len(cut.answers)]]
    with_opt = dns_wire.answer(query(opt=512), rcode=0, qtype=1, addresses=many, opt_size=1232, limit=512)
    msg = dns.DNSMessage.unpack(with_opt)
    assert msg.truncation and len(with_opt) <= 512 and len(with_opt) + 16 > 512 and msg.additionals[0].type == 41
    six = [ip(f"2001:2::{i:x}") for i in range(1, 41)]
    msg = dns.DNSMessage.unpack(dns_wire.answer(query(qtype=28), rcode=0, qtype=28, addresses=six, limit=512))
    assert msg.truncation and 0 < len(msg.answers) < 40


def test_a_question_too_long_to_fit_is_left_out_not_sent_past_the_limit():
    # 100 labels of 63 bytes: no legal name, but the fast reader reads it (NXDOMAIN).
    packet = query(name=b"\x3f" + b"a" * 63 * 1 + (b"\x3f" + b"a" * 63) * 99 + b"\x00")
    for opt_size in (None, 1232):
        wire = dns_wire.answer(packet, rcode=3, opt_size=opt_size)
        msg = dns.DNSMessage.unpack(wire)
        assert len(wire) <= 512 and msg.truncation and msg.questions == [] and msg.response_code == 3


def test_opcode_is_copied_and_question_with_pointer_is_left_out():
    msg = dns.DNSMessage.unpack(dns_wire.answer(query(flags=0x2000), rcode=5))
    assert msg.op_code == 4 and msg.response_code == 5 and not msg.recursion_desired
    assert dns_wire.question_end(query(name=b"\xc0\x0c")) is None
    assert dns_wire.question_end(b"\x00" * 12 + b"\x03abc") is None  # cut short


def test_relayed_takes_the_clients_id_or_truncates():
    upstream = b"\x12\x34" + dns_wire.answer(query(), rcode=0, qtype=1, addresses=[ip("198.18.0.13")])[2:]
    assert dns_wire.relayed(upstream, query(), 512)[:2] == b"\xbe\xef"
    cut = dns.DNSMessage.unpack(dns_wire.relayed(upstream + b"\0" * 600, query(), 512))
    assert cut.truncation and cut.id == 0xBEEF
    with pytest.raises(ValueError):
        dns_wire.relayed(b"\x00", query(), 512)


def test_question_labels_as_sent():
    assert dns_wire.question_labels(query()) == [b"ExAmPlE", b"test"]
    assert dns_wire.question_labels(query(name=b"\x03a.b\x04test\x00")) == [b"a.b", b"test"]
    # A pointer is followed; a loop or a cut-short name is unreadable.
    pointed = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x01x\xc0\x14" + b"\0\1\0\1" + b"\x04test\x00"
    assert dns_wire.question_labels(pointed) == [b"x", b"test"]
    assert dns_wire.question_labels(query(name=b"\xc0\x0c")) is None
    assert dns_wire.question_labels(b"\x00" * 12 + b"\x05ab") is None
