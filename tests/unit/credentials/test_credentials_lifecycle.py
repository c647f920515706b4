"""Token lifecycle: fetched on first use, shared by concurrent requests, refreshed ahead of
expiry in the background, backoff after failures, per environment."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from egress.credentials import lifecycle
from egress.credentials.http import FetchFailed, TokenClient
from egress.credentials.lifecycle import CredentialStore, CredentialUnavailable, Token
from egress.ops import metrics


@dataclass(eq=False)
class FakeSource:
    name: str = "fake"
    lifetime: float = 1.0
    delay: float = 0.05
    failing: bool = False
    calls: list[float] = field(default_factory=list)

    async def fetch(self, client, allow_cidrs) -> Token:
        self.calls.append(time.monotonic())
        await asyncio.sleep(self.delay)
        if self.failing:
            raise FetchFailed("token endpoint answered 503")
        now = time.monotonic()
        return Token(f"token-{len(self.calls)}", expires_at=now + self.lifetime, fetched_at=now)


def store() -> CredentialStore:
    return CredentialStore(lambda: TokenClient())


def test_concurrent_requests_share_one_fetch():
    async def main():
        s, source = store(), FakeSource()
        tokens = await asyncio.gather(*(s.token("", source) for _ in range(50)))
        assert {t.value for t in tokens} == {"token-1"} and len(source.calls) == 1
        s.close()

    asyncio.run(main())


def test_refreshed_in_background_before_expiry_without_making_requests_wait():
    async def main():
        s, source = store(), FakeSource(lifetime=0.8)
        waits, seen = [], set()
        deadline = time.monotonic() + 3.2
        while time.monotonic() < deadline:
            started = time.monotonic()
            seen.add((await s.token("", source)).value)
            waits.append(time.monotonic() - started)
            await asyncio.sleep(0.02)
        s.close()
        # One fetch per ~3/4 lifetime: 3.2 s / 0.6 s -> about 5-6, never one per request.
        assert 4 <= len(source.calls) <= 7, source.calls
        assert len(seen) == len(source.calls)
        assert sorted(waits)[-2] < 0.04  # only the very first request waited for a fetch

    asyncio.run(main())


def test_idle_source_stops_refreshing():
    async def main():
        s, source = store(), FakeSource(lifetime=0.4)
        await s.token("", source)
        await asyncio.sleep(1.5)
        assert len(source.calls) <= 2  # at most the refresh scheduled while it was in use
        s.close()

    asyncio.run(main())


def test_failure_backoff_then_recovery(monkeypatch):
    monkeypatch.setattr(lifecycle, "BACKOFF_FIRST", 0.3)

    async def main():
        s, source = store(), FakeSource(failing=True)
        before = metrics.CREDENTIAL_FETCHES.labels("fake", "error")._value.get()
        with pytest.raises(CredentialUnavailable):
            await s.token("", source)
        # Within the backoff: refused at once, without calling the token server.
        started = time.monotonic()
        with pytest.raises(CredentialUnavailable):
            await s.token("", source)
        assert time.monotonic() - started < 0.01 and len(source.calls) == 1
        assert metrics.CREDENTIAL_FETCHES.labels("fake", "error")._value.get() == before + 1
        source.failing = False
        await asyncio.sleep(0.35)
        assert (await s.token("", source)).value == "token-2"
        s.close()

    asyncio.run(main())


def test_a_bug_in_a_source_is_unavailable_not_a_crash():
    class Broken(FakeSource):
        async def fetch(self, client, allow_cidrs):
            raise KeyError("secret-value")

    async def main():
        s = store()
        with pytest.raises(CredentialUnavailable) as info:
            await s.token("", Broken(name="broken"))
        assert "secret-value" not in str(info.value)
        s.close()

    asyncio.run(main())


def test_environments_never_share_a_token():
    async def main():
        s, source = store(), FakeSource()
        a = await s.token("env-a", source)
        b = await s.token("env-b", source)
        assert a.value != b.value and len(source.calls) == 2
        assert (await s.token("env-a", source)).value == a.value
        s.close()

    asyncio.run(main())


def test_changed_source_starts_afresh():
    @dataclass(frozen=True)
    class Defined:
        name: str
        secret: str
        calls: list = field(default_factory=list, compare=False, hash=False)

        async def fetch(self, client, allow_cidrs):
            self.calls.append(1)
            return Token(self.secret, expires_at=None)

    async def main():
        s = store()
        assert (await s.token("", Defined("d", "one"))).value == "one"
        assert (await s.token("", Defined("d", "one"))).value == "one"  # equal definition: cached
        assert (await s.token("", Defined("d", "two"))).value == "two"  # rotated secret: fetched anew
        s.close()

    asyncio.run(main())
