"""egress.addons.gc_pacing: when a full garbage collection runs, and how often at most."""

from __future__ import annotations

import asyncio

import pytest

from egress.addons.gc_pacing import PacedCollection


class FakeGC:
    def __init__(self, took: float = 0.002):
        self.now = 100.0
        self.took = took
        self.promoted = 0
        self.collections = 0

    def clock(self) -> float:
        return self.now

    def collect(self) -> int:
        self.collections += 1
        self.now += self.took
        self.promoted = 0  # a full collection resets the count of younger collections
        return 0

    def paced(self, **kw) -> PacedCollection:
        return PacedCollection(collect=self.collect, promotions=lambda: self.promoted, clock=self.clock, **kw)


def test_an_idle_proxy_never_collects():
    gc = FakeGC()
    paced = gc.paced()
    assert [paced.tick() for _ in range(5)] == [1.0] * 5
    assert gc.collections == 0


def test_promotions_since_the_last_full_collection_make_one_run():
    gc = FakeGC()
    paced = gc.paced()
    gc.promoted = 3
    assert paced.tick() == 1.0
    assert gc.collections == 1
    paced.tick()
    assert gc.collections == 1  # nothing new since


def test_a_closed_connection_alone_makes_one_run():
    """Its objects were promoted long ago: they become garbage with no younger collection to tell."""
    gc = FakeGC()
    paced = gc.paced()
    paced.client_disconnected(None)  # type: ignore[arg-type]
    paced.tick()
    paced.tick()
    assert gc.collections == 1


def test_a_slow_collection_pushes_the_next_one_back():
    """At most 1/cost_factor of the time goes to collections, however large the live heap."""
    gc = FakeGC(took=0.1)
    paced = gc.paced(cost_factor=50)
    gc.promoted = 1
    assert paced.tick() == pytest.approx(0.1 * 50)


def test_the_addon_collects_while_the_proxy_runs_and_stops_when_it_is_done():
    gc = FakeGC()

    async def scenario() -> tuple[int, int]:
        paced = gc.paced(min_interval=0.01)
        paced.running()
        gc.promoted = 1
        await asyncio.sleep(0.2)
        during = gc.collections
        paced.done()
        gc.promoted = 1
        await asyncio.sleep(0.1)
        return during, gc.collections

    during, after = asyncio.run(scenario())
    assert during == 1 and after == 1
