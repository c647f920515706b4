"""Tokens fetched on first use, cached per source, refreshed ahead of expiry.

One `Refresher` per (environment, source): with `--spec-dir` two environments
never share a token, even from identical sources. A `Refresher`:
- fetches when a request needs a token it does not have; requests that arrive
  meanwhile wait for that same fetch (one call, however many requests);
- schedules a background refresh a quarter of the lifetime (at most 5 minutes)
  before expiry, as long as the source was used since the last fetch, so busy
  sources never make a request wait and idle ones stop calling the token server;
- after a failure, retries no sooner than a backoff (0.5 s doubling up to 60 s);
  within it a request that has no valid token is refused at once (the addon
  answers 502 credential_unavailable) rather than sent without its credential.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from egress.credentials.http import FetchFailed, TokenClient
from egress.ops import metrics
from egress.policy.addresses import IPNetwork

logger = logging.getLogger(__name__)
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 60.0
REFRESH_AHEAD_MAX = 300.0
SKEW_MAX = 30.0
DEFAULT_LIFETIME = 300.0  # an answer without expires_in: fetched again after this


@dataclass(frozen=True)
class Token:
    value: Any  # str for bearer tokens; `egress.credentials.aws_sigv4.AwsKeys` for SigV4
    expires_at: float | None  # time.monotonic(); None: never expires (static keys)
    fetched_at: float = 0.0

    def __repr__(self) -> str:
        return "<token>"


class Source(Protocol):
    @property
    def name(self) -> str: ...

    async def fetch(self, client: TokenClient, allow_cidrs: tuple[IPNetwork, ...]) -> Token: ...


class CredentialUnavailable(Exception):
    def __init__(self, name: str):
        super().__init__(f"credential {name} is unavailable")
        self.name = name


class Refresher:
    def __init__(self, source: Source, client: Callable[[], TokenClient], clock: Callable[[], float] = time.monotonic):
        self.source = source
        self._client = client
        self._clock = clock
        self._token: Token | None = None
        self._inflight: asyncio.Future[Token] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._used = False
        self._timer: asyncio.TimerHandle | None = None
        self._allow_cidrs: tuple[IPNetwork, ...] = ()
        self._last_problem = ""

    async def get(self, allow_cidrs: tuple[IPNetwork, ...] = ()) -> Token:
        """The current token; raises CredentialUnavailable."""
        self._allow_cidrs = allow_cidrs
        self._used = True
        token = self._token
        now = self._clock()
        if token is not None and self._usable(token, now):
            return token
        if self._inflight is None and now < self._retry_at:
            raise CredentialUnavailable(self.source.name)
        return await asyncio.shield(self._start())

    def _usable(self, token: Token, now: float) -> bool:
        if token.expires_at is None:
            return True
        skew = min(SKEW_MAX, (token.expires_at - token.fetched_at) / 10)
        return now < token.expires_at - skew

    def _start(self) -> asyncio.Future[Token]:
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._fetch())
        return self._inflight

    async def _fetch(self) -> Token:
        name = self.source.name
        try:
            token = await self.source.fetch(self._client(), self._allow_cidrs)
        except Exception as exc:  # noqa: BLE001 - any failure is "unavailable", never a traceback to the client
            self._failed(exc)
            raise CredentialUnavailable(name) from None
        finally:
            self._inflight = None
        metrics.CREDENTIAL_FETCHES.labels(name, "ok").inc()
        if self._failures or self._last_problem:
            logger.warning("credential %s: fetched again after %d failure(s)", name, self._failures)
        self._token, self._failures, self._retry_at, self._last_problem = token, 0, 0.0, ""
        self._used = False
        if token.expires_at is not None:
            lifetime = max(0.0, token.expires_at - token.fetched_at)
            self._schedule(max(0.0, token.expires_at - min(REFRESH_AHEAD_MAX, lifetime / 4) - self._clock()))
        return token

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        backoff = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (self._failures - 1))
        self._retry_at = self._clock() + backoff
        metrics.CREDENTIAL_FETCHES.labels(self.source.name, "error").inc()
        problem = str(exc) if isinstance(exc, FetchFailed) else f"internal error ({type(exc).__name__})"
        if problem != self._last_problem:  # one line per new problem, not one per retry
            logger.warning("credential %s: fetch failed: %s (retrying with backoff)", self.source.name, problem)
            self._last_problem = problem
        if self._token is not None and self._usable(self._token, self._clock()):
            self._schedule(backoff)  # the old token still serves: keep trying in the background

    def _schedule(self, delay: float) -> None:
        self.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, self._background)

    def _background(self) -> None:
        self._timer = None
        if not self._used or self._inflight is not None:
            return  # idle since the last fetch: the next request fetches on demand
        future = self._start()
        future.add_done_callback(lambda f: f.exception())  # retrieved: failures are logged in _failed

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class CredentialStore:
    """Every environment's refreshers. A source whose definition changed (a spec reload
    with a new secret, a rotated key file) starts afresh; an unchanged one keeps its token."""

    def __init__(self, client: Callable[[], TokenClient]):
        self._client = client
        self._refreshers: dict[tuple[str, str], Refresher] = {}

    def refresher(self, environment: str, source: Source) -> Refresher:
        key = (environment, source.name)
        current = self._refreshers.get(key)
        if current is None or current.source != source:
            if current is not None:
                current.cancel()
            current = self._refreshers[key] = Refresher(source, self._client)
        return current

    async def token(self, environment: str, source: Source, allow_cidrs: tuple[IPNetwork, ...] = ()) -> Token:
        return await self.refresher(environment, source).get(allow_cidrs)

    def close(self) -> None:
        for refresher in self._refreshers.values():
            refresher.cancel()


Fetch = Callable[[TokenClient, tuple[IPNetwork, ...]], Awaitable[Token]]
