"""Whole answers to repeated allowlisted queries, kept for at most a second (DNS listener).

A sandbox asks the same few allowlisted names over and over, and the fast path
(`DnsFilter.answer_datagram`) answered each one from the address cache by running
the whole decision again: read the query, normalise and match the name, classify
every cached address, write the answer. A profile of that path at saturation spent
about three quarters of a query there (docs/benchmarks-dns.md). This memo keeps the
answer those steps wrote, keyed by the query's bytes after its 2-byte ID (so the
same question, case, flags and EDNS record), and the next identical query gets the
same bytes under its own ID.

The memo never decides anything itself; an entry is only what the full decision
wrote a moment ago, and it is served only while every input of that decision is
unchanged:
- the spec in force is the same object (a reload makes a new one);
- the address cache's `generation` is the same (no entry added, replaced, expired
  or dropped since: egress/dns/cache.py);
- the answer's TTL would still be the same (an answer from the cache counts down),
  and at most `MAX_AGE` seconds have passed (the proxy's own addresses, which the
  filtering also reads, are refreshed on their own schedule).

Only answers built from the address cache are kept (an allowlisted name's A/AAAA);
blocked names, which a flood makes unique, never enter it. Bounded in entries and in
the size of each (MAX_QUERY_BYTES).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from egress.dns.policy import Verdict

MAX_AGE = 1.0  # seconds
MAX_ENTRIES = 4096
# Queries are keyed by their bytes: a common query is under 100 bytes (one name, an
# OPT record with a cookie). A longer one (an OPT record padded towards 64 KiB) is
# answered but not kept, so the memo stays within MAX_ENTRIES x ~1 KiB whatever a
# sandbox sends.
MAX_QUERY_BYTES = 512


@dataclass(frozen=True, slots=True)
class Memo:
    spec: object  # the spec in force when it was written
    generation: int  # the address cache's generation then
    valid_until: float  # on the address cache's clock
    tail: bytes  # the answer without its ID
    verdict: Verdict  # counted again for every query served
    name: str
    qtype: str  # the counter's label


class AnswerMemo:
    def __init__(self, clock: Callable[[], float], max_entries: int = MAX_ENTRIES):
        self._clock = clock
        self.max_entries = max_entries
        self._entries: dict[bytes, Memo] = {}

    def get(self, packet: bytes, spec: object, generation: int) -> Memo | None:
        """The memo for this query if all its inputs are unchanged, else None."""
        memo = self._entries.get(packet[2:])
        if memo is None:
            return None
        if memo.spec is not spec or memo.generation != generation or self._clock() >= memo.valid_until:
            del self._entries[packet[2:]]
            return None
        return memo

    def put(
        self,
        packet: bytes,
        answer: bytes,
        *,
        spec: object,
        generation: int,
        verdict: Verdict,
        name: str,
        qtype: str,
        expires: float,
        ttl: int,
    ) -> None:
        """Keep `answer` (to `packet`) while its TTL stays `ttl`: the cache entry expires at `expires`."""
        if self.max_entries <= 0 or len(answer) < 2 or len(packet) > MAX_QUERY_BYTES:
            return
        now = self._clock()
        # The TTL written is ceil(expires - now); it stays `ttl` until expires - now
        # reaches ttl - 1.
        valid_until = min(now + MAX_AGE, expires - (ttl - 1))
        if valid_until <= now:
            return
        entries = self._entries
        if len(entries) >= self.max_entries:
            entries.clear()  # a burst of new shapes: start again rather than track age
        entries[packet[2:]] = Memo(spec, generation, valid_until, answer[2:], verdict, name, qtype)

    def __len__(self) -> int:
        return len(self._entries)
