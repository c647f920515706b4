"""A small cache of the proxy resolver's addresses for allowlisted names (DNS listener).

Resolving an allowlisted A/AAAA query costs a getaddrinfo call in a thread, several
times what a locally answered query costs (docs/benchmarks-dns.md); a sandbox asks
the same few names over and over. What is cached is the resolver's answer, before
any policy: every hit is still filtered (`dns_policy.filter_addresses`) under the
spec in force, so a forbidden address is dropped however it got in. The cache
belongs to one spec object: a reload (a new `Spec`) empties it before the next
lookup, so a name taken off the allowlist stops resolving at once (the policy says
NXDOMAIN before the cache is even asked, and nothing cached under the old spec is
served under the new one).

Bounded in size (oldest entry out first) and in time (`ttl` seconds, 30 by default:
the TTL the listener already puts on its answers, so a client's own cache holds an
answer that long anyway). getaddrinfo does not say the record's own TTL, so that is
the cap. Only answers with addresses are kept; failures are asked again each time.

`generation` changes whenever an entry is added, replaced, expired or dropped (or
the owner changes): what was built from the entries (the listener's memo of whole
answers, egress/dns/answer_memo.py) is valid only while it stays the same.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from egress.policy.addresses import IPAddress

DEFAULT_TTL_SECONDS = 30.0
DEFAULT_MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Entry:
    addresses: tuple[IPAddress, ...]
    expires: float  # monotonic seconds


class AddressCache:
    def __init__(
        self,
        ttl: float = DEFAULT_TTL_SECONDS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self.generation = 0
        self._owner: object | None = None  # the spec the entries were resolved under
        self._entries: dict[tuple[str, int], Entry] = {}

    def _for(self, owner: object) -> dict[tuple[str, int], Entry]:
        if owner is not self._owner:  # a reload: nothing from the old spec is served
            self._entries = {}
            self._owner = owner
            self.generation += 1
        return self._entries

    def get(self, owner: object, host: str, family: int) -> tuple[tuple[IPAddress, ...], int] | None:
        """(addresses, seconds left, at least 1) for a live entry, else None."""
        entry = self.entry(owner, host, family)
        if entry is None:
            return None
        return entry.addresses, max(1, math.ceil(entry.expires - self.clock()))

    def entry(self, owner: object, host: str, family: int) -> Entry | None:
        """The live entry itself (its `expires` on this cache's clock), else None."""
        entries = self._for(owner)
        entry = entries.get((host, family))
        if entry is None:
            return None
        if entry.expires - self.clock() <= 0:
            del entries[(host, family)]
            self.generation += 1
            return None
        return entry

    def put(self, owner: object, host: str, family: int, addresses: list[IPAddress]) -> None:
        if not addresses or self.ttl <= 0 or self.max_entries <= 0:
            return
        if self._owner is not None and owner is not self._owner:
            return  # resolved under a spec that has been replaced since
        entries = self._for(owner)
        entries.pop((host, family), None)
        while len(entries) >= self.max_entries:
            del entries[next(iter(entries))]  # oldest first (dicts keep insertion order)
        entries[(host, family)] = Entry(tuple(addresses), self.clock() + self.ttl)
        self.generation += 1

    def __len__(self) -> int:
        return len(self._entries)
