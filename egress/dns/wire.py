"""DNS answers in wire format, built from the query's own bytes (pure, no I/O).

The listener answers every query itself, so it writes its answers directly: the
client's question section is copied byte for byte (its letter case included, which
clients that randomise case, RFC draft "0x20", compare), answer records point at it
with a compression pointer, and an answer that does not fit the client's size is
cut to the records that fit with TC set (RFC 1035 4.2.1, RFC 2181 9, RFC 6891 7). The CD
bit and the OPT record's DO bit are copied from the query (RFC 4035 3.2.2, RFC 3225
3): clients that ask with them (`dig +dnssec`, `kdig +cdflag`, validating stubs)
read an answer without them as one from a server that ignored them. AD is never
set: nothing here is validated. This is also several times cheaper than packing a
parsed message again.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from egress.policy.addresses import IPAddress

HEADER = struct.Struct("!HHHHHH")
_RR = struct.Struct("!HHIH")
_QUESTION_TAIL = 4  # QTYPE, QCLASS
OPT = 41
QR, TC, RD, RA, CD = 0x8000, 0x0200, 0x0100, 0x0080, 0x0010
DO = 0x8000  # in the OPT record's TTL field (RFC 3225)
NAME_POINTER_TO_QUESTION = b"\xc0\x0c"


def question_end(packet: bytes) -> int | None:
    """Offset just after the first question, if it is written without compression."""
    offset = HEADER.size
    while offset < len(packet):
        size = packet[offset]
        if size == 0:
            end = offset + 1 + _QUESTION_TAIL
            return end if end <= len(packet) else None
        if size >= 64:  # a pointer (or a reserved label type) in the question
            return None
        offset += 1 + size
    return None


def question_labels(packet: bytes) -> list[bytes] | None:
    """The first question's labels as sent (compression pointers followed), or None if unreadable.

    mitmproxy joins labels with dots, so `a\\.b` (one label holding a dot) and `a.b`
    read the same once parsed; the policy needs the labels themselves.
    """
    labels: list[bytes] = []
    offset, hops = HEADER.size, 0
    while offset < len(packet):
        size = packet[offset]
        if size == 0:
            return labels
        if size >= 0xC0:
            if offset + 1 >= len(packet) or hops > 64:
                return None
            offset, hops = ((size & 0x3F) << 8) | packet[offset + 1], hops + 1
            continue
        if size >= 64 or offset + 1 + size > len(packet):
            return None
        labels.append(packet[offset + 1 : offset + 1 + size])
        offset += 1 + size
    return None


def answer(
    packet: bytes,
    *,
    rcode: int,
    qtype: int = 0,
    addresses: Sequence[IPAddress] = (),
    ttl: int = 30,
    with_question: bool = True,
    opt_size: int | None = None,
    dnssec_ok: bool = False,
    limit: int = 512,
) -> bytes:
    """The response to `packet` (a query whose header is readable).

    `opt_size`: include an OPT record advertising that UDP size (the query had EDNS);
    the extended RCODE bits of `rcode` travel in it, and `dnssec_ok` (the query's DO
    bit) is copied into it. Records of the wrong family for
    `qtype` are left out. Over `limit` bytes: the records that fit, TC set.
    """
    ident, flags = struct.unpack_from("!HH", packet)
    end = question_end(packet) if with_question else None
    question = packet[HEADER.size : end] if end else b""
    records = [
        NAME_POINTER_TO_QUESTION + _RR.pack(qtype, 1, ttl, len(ip.packed)) + ip.packed
        for ip in addresses
        if len(ip.packed) == (4 if qtype == 1 else 16)
    ]
    opt_ttl = (rcode >> 4) << 24 | (DO if dnssec_ok else 0)
    opt = b"\x00" + _RR.pack(OPT, opt_size, opt_ttl, 0) if opt_size is not None else b""
    out_flags = _response_flags(flags, rcode)
    room = limit - HEADER.size - len(question) - len(opt)
    if room < 0:  # a question longer than any legal name (255 bytes): the answer goes without it
        question, records, room, out_flags = b"", [], 0, out_flags | TC
    if records and sum(map(len, records)) > room:
        # As many whole records as fit, TC set: a client without TCP fallback (musl
        # before 1.2.4, busybox nslookup) uses them, as it does CoreDNS's or dnsmasq's
        # truncated answers; the others retry over TCP. (All records have one size.)
        records, out_flags = records[: max(room, 0) // len(records[0])], out_flags | TC
    body = b"".join(records)
    head = HEADER.pack(ident, out_flags, 1 if question else 0, len(records), 0, 1 if opt else 0)
    return head + question + body + opt


def _response_flags(query_flags: int, rcode: int) -> int:
    """An answer's flags: QR, the query's opcode, RD and CD echoed, RA, the rcode's low bits."""
    return QR | (query_flags & 0x7800) | (query_flags & (RD | CD)) | RA | (rcode & 0xF)


def relayed(upstream: bytes, query: bytes, limit: int) -> bytes:
    """An upstream answer (report mode) under the client's id, or TC when too large."""
    if len(upstream) < HEADER.size:
        raise ValueError("upstream answer shorter than a header")
    if len(upstream) <= limit:
        return query[:2] + upstream[2:]
    return _truncated(query, upstream[3] & 0xF)


def _truncated(query: bytes, rcode: int) -> bytes:
    ident, flags = struct.unpack_from("!HH", query)
    end = question_end(query)
    question = query[HEADER.size : end] if end else b""
    out_flags = _response_flags(flags, rcode) | TC
    return HEADER.pack(ident, out_flags, 1 if question else 0, 0, 0, 0) + question
