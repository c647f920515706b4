"""What the DNS listener's unit tests share: a spec from domains, a settable clock, query and answer bytes."""

from __future__ import annotations

import ipaddress
import json
import struct

from egress.dns import policy as dp
from egress.policy.spec import parse_spec


def make_spec(*domains: str, allow_cidrs=("198.18.0.0/15",)):
    network = {"allowCidrs": list(allow_cidrs), "allowlist": [{"domain": d} for d in domains]}
    return parse_spec(json.dumps({"network": network}), source="s.json")


class Clock:
    """Stands in for `time.monotonic`: TTL expiry without waiting."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def query_bytes(name: str, qtype: int = dp.A, ident: int = 0x1234, edns: int | None = None) -> bytes:
    """A standard query for one name (with an EDNS OPT record of UDP size `edns` if given)."""
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    opt = b"" if edns is None else b"\x00" + struct.pack("!HHIH", dp.OPT, edns, 0, 0)
    header = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 1 if opt else 0)
    return header + labels + b"\x00" + struct.pack("!HH", qtype, 1) + opt


def answer_records(wire: bytes) -> list[tuple[int, str]]:
    """(TTL, address) of each A/AAAA record of one of our answers (records point at the question)."""
    ancount = struct.unpack_from("!H", wire, 6)[0]
    offset = 12
    while wire[offset]:
        offset += 1 + wire[offset]
    offset += 5
    found = []
    for _ in range(ancount):
        _, _, _, ttl, size = struct.unpack_from("!HHHIH", wire, offset)
        found.append((ttl, str(ipaddress.ip_address(wire[offset + 12 : offset + 12 + size]))))
        offset += 12 + size
    return found
