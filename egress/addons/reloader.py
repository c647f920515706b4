"""SpecReloader: watch the spec file (and its secret files) while the proxy runs."""

from __future__ import annotations

import asyncio

from egress.environments.registry import EnvironmentRegistry
from egress.environments.single import SpecHolder


class SpecReloader:
    def __init__(self, holder: SpecHolder | EnvironmentRegistry):
        self.holder = holder
        self._task: asyncio.Task | None = None

    def running(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.holder.watch())

    def done(self) -> None:
        if self._task:
            self._task.cancel()
