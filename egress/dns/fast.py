"""Read the common DNS query straight from its bytes (pure, no I/O): the listener's fast path.

Nearly every query a sandbox sends has one shape: a standard query (QR=0, opcode
QUERY) with one question written without compression pointers, plain ASCII labels,
no answer or authority records, and at most one additional record, an EDNS OPT
record on the root name. For that shape this module builds the same
`dns_policy.Query` that `egress.addons.dns_filter.read_query` builds from
mitmproxy's parsed message, at a fraction of the cost (no `DNSMessage`, no
`ResourceRecord` objects).

Anything else returns None and takes the full path through mitmproxy's parser:
punycode (`xn--`) or non-ASCII labels (mitmproxy decodes those through IDNA, and
the policy's IDNA cases are tested against that), a label holding a dot, a
compressed question, another record type, trailing bytes, a response. So a packet
is decided from these bytes only when they read the same under both parsers;
tests/unit/dns/test_dns_fast.py holds the two equal over a corpus of packets.
"""

from __future__ import annotations

import struct

from egress.dns import policy as dp
from egress.dns import wire as dns_wire

_HEADER = struct.Struct("!HHHHHH")
_QUESTION_TAIL = struct.Struct("!HH")
_RR_TAIL = struct.Struct("!HHIH")  # TYPE, CLASS, TTL, RDLENGTH
_QR, _OPCODE = 0x8000, 0x7800
_ACE_PREFIX = b"xn--"


def read_simple_query(packet: bytes) -> tuple[dp.Query, int] | None:
    """(the query, the UDP size its OPT record advertises, 0 without one), or None for any other shape."""
    if len(packet) < _HEADER.size:
        return None
    _, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(packet)
    if flags & (_QR | _OPCODE) or qdcount != 1 or ancount or nscount or arcount > 1:
        return None
    labels: list[str] = []
    offset = _HEADER.size
    end = len(packet)
    while True:
        if offset >= end:
            return None
        size = packet[offset]
        if size == 0:
            offset += 1
            break
        if size >= 64 or offset + 1 + size > end:
            return None  # a compression pointer, a reserved label type, or cut short
        label = packet[offset + 1 : offset + 1 + size]
        if not label.isascii() or b"." in label or label[:4].lower() == _ACE_PREFIX:
            return None
        labels.append(label.decode("ascii"))
        offset += 1 + size
    if offset + _QUESTION_TAIL.size > end:
        return None
    qtype, qclass = _QUESTION_TAIL.unpack_from(packet, offset)
    offset += _QUESTION_TAIL.size
    advertised, edns_version, dnssec_ok = 0, 0, False
    if arcount:
        # The root name (one zero byte), then an OPT record's fixed fields and its data.
        if offset + 1 + _RR_TAIL.size > end or packet[offset] != 0:
            return None
        rtype, advertised, ttl, rdlength = _RR_TAIL.unpack_from(packet, offset + 1)
        offset += 1 + _RR_TAIL.size + rdlength
        if rtype != dp.OPT:
            return None
        edns_version = (ttl >> 16) & 0xFF
        dnssec_ok = bool(ttl & dns_wire.DO)
    if offset != end:
        return None
    query = dp.Query(
        questions=((".".join(labels), qtype, qclass),),
        opt_records=arcount,
        edns_version=edns_version,
        dnssec_ok=dnssec_ok,
    )
    return query, advertised
