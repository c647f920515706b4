"""PolicySource: where the specs come from (`egress_spec` or `egress_spec_dir`), kept current.

Loads the spec file, or the directory of environments, when its option is set, and
watches it while the proxy runs (a changed file, or one of its `${file:}` secrets, is
reloaded; a broken version is refused and the old one stays). Until a spec is loaded
every decision is made against a spec that allows nothing.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import ctx

from egress.addons.refuse import refuse
from egress.environments.registry import EnvironmentRegistry
from egress.environments.single import SpecHolder
from egress.environments.source import SpecSource
from egress.policy.domains import Allowlist
from egress.policy.spec import Spec, SpecError

logger = logging.getLogger("egress")
ALLOWS_NOTHING = Spec(allowlist=Allowlist())
_OPTIONS = {"egress_spec", "egress_spec_dir", "egress_report_only", "mode"}


def _key(spec: str | None, spec_dir: str | None, report_only: bool) -> tuple[str | None, str | None, bool]:
    return (spec, spec_dir, report_only)


class PolicySource:
    def __init__(self, source: SpecSource | None = None, *, count_reloads: bool = True):
        """`source`: already loaded by `egress-proxy run`, which checked it before listening."""
        self.source = source
        self.count_reloads = count_reloads  # with --workers one worker counts reloads
        self._loaded: tuple[str | None, str | None, bool] | None = None
        if isinstance(source, SpecHolder):
            self._loaded = _key(source.path, None, source.report_only)
        elif isinstance(source, EnvironmentRegistry):
            self._loaded = _key(None, source._as_given, source.report_only)
        self._task: asyncio.Task | None = None

    def load(self, loader) -> None:
        loader.add_option(
            "egress_spec", str | None, None,
            "Environment spec (JSON or YAML): one environment, no proxy auth. Reloaded when the file changes.",
        )  # fmt: skip
        loader.add_option(
            "egress_spec_dir", str | None, None,
            "One environment per *.yaml/*.yml/*.json in this directory (id = file stem); clients prove "
            "theirs with Proxy-Authorization (http://ENV_ID:TOKEN@proxy).",
        )  # fmt: skip
        loader.add_option(
            "egress_report_only", bool, False,
            "Like `network.mode: report`: log and count would-be blocks, let them pass.",
        )  # fmt: skip

    def configure(self, updated: set[str]) -> None:
        if not updated & _OPTIONS:
            return
        spec, spec_dir, report_only = ctx.options.egress_spec, ctx.options.egress_spec_dir, ctx.options.egress_report_only
        if spec and spec_dir:
            return refuse("egress_spec and egress_spec_dir: set one of them, not both")
        if spec_dir and any(m.startswith("transparent") for m in ctx.options.mode):
            return refuse("egress_spec_dir needs regular mode: clients prove their environment with Proxy-Authorization")
        key = _key(spec or None, spec_dir or None, report_only)
        if key == self._loaded or not (spec or spec_dir):
            return
        try:
            if spec_dir:
                source: SpecSource = EnvironmentRegistry(spec_dir, report_only=report_only, count_reloads=self.count_reloads)
            else:
                source = SpecHolder(spec, report_only=report_only, count_reloads=self.count_reloads)
        except SpecError as exc:
            return refuse("\n".join(exc.problems))
        self.source, self._loaded = source, key
        if self._task is not None:  # running: watch the new source instead
            self._task.cancel()
            self._task = asyncio.get_running_loop().create_task(source.watch())

    def running(self) -> None:
        if self.source is None:  # only as a mitmproxy script: egress-proxy run requires one
            logger.error("egress: no spec: set egress_spec (one file) or egress_spec_dir (a directory of environments)")
            raise SystemExit(1)
        self._task = asyncio.get_running_loop().create_task(self.source.watch())

    def done(self) -> None:
        if self._task:
            self._task.cancel()

    # -- what the other addons read --------------------------------------------------
    @property
    def proves_environment(self) -> bool:
        return self.source is not None and self.source.proves_environment

    def spec_of(self, environment: str | None) -> Spec | None:
        if self.source is None:
            return ALLOWS_NOTHING
        return self.source.spec_of(environment)
