"""Full garbage collections at a steady pace, instead of when CPython gets round to one.

Finished flows and closed connections leave reference cycles behind (mitmproxy's
layers, flows and connection objects, and with them pyOpenSSL's `Connection`, which
holds OpenSSL's buffers), and only a full collection frees them. CPython runs one
only once the objects promoted since the last full collection exceed a quarter of
those that survived it; the proxy's long-lived heap (mitmproxy, the spec: half a
million objects with a 100,000-entry allowlist) sets that bar high, so the garbage of
hundreds of connections piles up first. Measured with hey, intercepted HTTPS, 1 MiB
bodies, 64 connections per round (bench/benchmarks-notes.md): RSS went from 125 to
270 MB over about 500 connections and stayed there; with a full collection every
2 s it stayed at 125-129 MB, at no loss of throughput.

`gc.freeze()` (egress.cli.main) keeps the long-lived heap out of these collections, so
each one walks only what the live connections hold. The pause grows with that: the
next collection waits at least COST_FACTOR times as long as the last one took, so
collections never take more than 1/COST_FACTOR of the time however many connections
are open, and at least MIN_INTERVAL. A full collection runs only when younger ones
have run since the last (`gc.get_count()[2]`) or a client connection has closed: a
connection's objects, long since promoted, become garbage when it closes, with no
younger collection to tell. An idle proxy does nothing.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

from mitmproxy import connection

MIN_INTERVAL = 1.0
COST_FACTOR = 50  # collections take at most 2 % of the time


class PacedCollection:
    def __init__(
        self,
        *,
        min_interval: float = MIN_INTERVAL,
        cost_factor: float = COST_FACTOR,
        collect: Callable[[], object] = gc.collect,
        promotions: Callable[[], int] = lambda: gc.get_count()[2],
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.min_interval = min_interval
        self.cost_factor = cost_factor
        self._collect = collect
        self._promotions = promotions
        self._clock = clock
        self._task: asyncio.Task | None = None
        self._closed = 0

    def client_disconnected(self, client: connection.Client) -> None:
        self._closed += 1

    def tick(self) -> float:
        """Collect if the oldest generation may hold garbage; seconds until the next tick."""
        if self._promotions() == 0 and self._closed == 0:
            return self.min_interval
        self._closed = 0
        start = self._clock()
        self._collect()
        return max(self.min_interval, (self._clock() - start) * self.cost_factor)

    async def _run(self) -> None:
        wait = self.min_interval
        while True:
            await asyncio.sleep(wait)
            wait = self.tick()

    def running(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
