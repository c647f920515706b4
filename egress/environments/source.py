"""SpecSource: what the proxy asks of where its specs come from, one file or a directory."""

from __future__ import annotations

from typing import Protocol

from egress.policy.spec import Spec


class SpecSource(Protocol):
    # True for a directory of environments: each client proves its environment with
    # Proxy-Authorization; False for one spec that every client is held to.
    proves_environment: bool

    def spec_of(self, environment: str | None) -> Spec | None:
        """The spec in force for `environment` (ignored by a single spec); None: no such environment."""
        ...

    def reload(self, trigger: str) -> bool:
        """Read again now (`trigger`: "sighup", "file"); False when the new version is refused."""
        ...

    async def watch(self) -> None:
        """Reload whenever a file the specs came from changes, until cancelled."""
        ...

    def summary(self) -> str:
        """What is loaded, for the start-up line."""
        ...
