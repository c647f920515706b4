"""The spec in force, and its hot reload.

`SpecHolder.spec` is read once per new decision, so swapping it changes the
policy for new connections and requests while connections already checked keep
the address they were pinned to and complete.

Changes are detected by polling `stat()` of the spec file and of every
`${file:}` it references. Polling (rather than inotify) sees Kubernetes
ConfigMap updates, which atomically swap a `..data` symlink two levels above
the file, exactly like an in-place edit: the followed inode changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import sys
import time
from pathlib import Path

from egress.ops import metrics
from egress.policy.spec import Spec, SpecError, load_spec

Fingerprint = tuple[tuple[str, int, int, int, int], ...]


def _fingerprint(paths: list[str]) -> Fingerprint:
    out = []
    for path in paths:
        try:
            st = os.stat(path)  # follows symlinks: a ConfigMap swap changes the inode
            out.append((path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((path, 0, 0, 0, 0))
    return tuple(out)


def _log(event: str, **fields: object) -> None:
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event, **fields}
    print(json.dumps(line), file=sys.stderr, flush=True)


class SpecHolder:
    """One spec file (`--spec`): every client is held to it. A `SpecSource`."""

    POLL_SECONDS = 0.5
    proves_environment = False

    def __init__(self, path: str | Path, report_only: bool = False, count_reloads: bool = True):
        self.path = str(path)
        self.report_only = report_only
        # With --workers every worker reloads, but only one counts: one reload per pod.
        self.count_reloads = count_reloads
        self.spec = self._load()  # raises SpecError: a proxy never starts without a valid spec
        self._seen = self._current_fingerprint()
        metrics.init_labels()
        self._in_force(self.spec)

    def _load(self) -> Spec:
        spec = load_spec(self.path)
        return dataclasses.replace(spec, mode="report") if self.report_only else spec

    def _current_fingerprint(self) -> Fingerprint:
        return _fingerprint([self.path, *self.spec.secret_files])

    def _in_force(self, spec: Spec) -> None:
        metrics.ALLOWLIST_ENTRIES.set(len(spec.entries))
        metrics.ENVIRONMENTS.set(1)
        metrics.CONFIG_LAST_SUCCESS.set(time.time())

    def spec_of(self, environment: str | None) -> Spec:
        return self.spec

    def summary(self) -> str:
        return f"{len(self.spec.entries)} allowlist entries (mode {self.spec.mode})"

    def reload(self, trigger: str) -> bool:
        """Load the spec again; keep the old one if the new one is invalid."""
        try:
            spec = self._load()
        except SpecError as exc:
            if self.count_reloads:
                metrics.CONFIG_RELOADS.labels("failure").inc()
            _log("spec_reload_failed", trigger=trigger, problems=exc.problems, kept_entries=len(self.spec.entries))
            self._seen = self._current_fingerprint()  # do not retry the same broken file every poll
            return False
        self.spec = spec
        self._seen = self._current_fingerprint()
        if self.count_reloads:
            metrics.CONFIG_RELOADS.labels("success").inc()
        self._in_force(spec)
        gc.freeze()  # the new spec is long-lived too (see egress.cli.main); the old one is freed by refcount
        _log("spec_reloaded", trigger=trigger, entries=len(spec.entries), mode=spec.mode)
        return True

    def changed(self) -> bool:
        return self._current_fingerprint() != self._seen

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.POLL_SECONDS)
            if self.changed():
                self.reload("file_changed")
