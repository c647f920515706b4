"""The sliding-window count behind the HTTP/2 rapid-reset and control-frame limits."""

from __future__ import annotations

from collections import deque

from egress.mitm.patches.h2_floods import WINDOW_SECONDS, too_many_resets


def test_more_than_the_limit_within_the_window_trips():
    times: deque[float] = deque()
    assert not any(too_many_resets(times, 100.0 + i * 0.001, 5) for i in range(5))
    assert too_many_resets(times, 100.01, 5)


def test_events_spread_over_more_than_the_window_never_trip_and_memory_stays_bounded():
    times: deque[float] = deque()
    step = WINDOW_SECONDS / 4  # four per window, limit five
    assert not any(too_many_resets(times, i * step, 5) for i in range(1000))
    assert len(times) <= 6


def test_the_record_never_holds_more_than_limit_plus_one():
    times: deque[float] = deque()
    for i in range(10_000):
        too_many_resets(times, 1.0 + i * 1e-6, 3)
    assert len(times) == 4
