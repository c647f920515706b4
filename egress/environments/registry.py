"""Many environments in one proxy (`--spec-dir DIR`): environment id -> its `Spec`.

Every `*.yaml`, `*.yml` or `*.json` directly in DIR is one environment in the
usual spec format; its id is the file stem. Dotfiles are skipped, which covers a
mounted ConfigMap's `..data` link and `..2026_...` timestamp directory (its
entries are `a.yaml -> ..data/a.yaml` links, followed like files). Other names
(a README, a subdirectory) are not environments and are ignored.

Reload is per file, by the same stat polling (and SIGHUP) as `egress.environments.single`:
an added file serves at once, a changed file (or a `${file:}` it references)
swaps that environment only, a broken file keeps that environment's last good
spec (the failure counted with the environment), and a removed file ends the
environment: its new connections and requests are refused with 407.

The start is strict, like `--spec`: every file must load, else the proxy does not
start (`egress-proxy check --spec-dir` says why). A file that breaks later only
costs its own environment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from egress.environments.single import Fingerprint, _fingerprint, _log
from egress.ops import metrics
from egress.policy.spec import Spec, SpecError, parse_spec, read_spec_text

ENVIRONMENT_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class SpecFile:
    environment: str  # the file stem; checked by `environment_problem`
    path: Path


def environment_problem(stem: str) -> str | None:
    if ENVIRONMENT_ID.fullmatch(stem):
        return None
    return (
        "file name is not a valid environment id (lower-case letters, digits, '.', '_', '-'; "
        "starting with a letter or digit; at most 63 characters)"
    )


def spec_files(directory: Path) -> list[SpecFile]:
    """The environment files directly in `directory`, sorted; raises OSError if it cannot be listed."""
    return [SpecFile(stem, Path(path)) for stem, path, _ in _listing(directory)]


FileStat = tuple[str, int, int, int, int]  # as in egress.environments.single's fingerprints


def _listing(directory: Path) -> list[tuple[str, str, FileStat]]:
    """(stem, path, stat) of the environment files, sorted: one stat per file, the poll's whole cost.

    Plain strings, no Path objects: building a thousand of them took most of a poll.
    """
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue  # dotfiles, editors' swap files, a ConfigMap's `..data` and `..<timestamp>`
            stem, suffix = os.path.splitext(name)
            if suffix not in SPEC_SUFFIXES:
                continue
            try:
                st = os.stat(entry.path)  # follows a ConfigMap's links
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((stem, entry.path, (entry.path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)))
    found.sort(key=lambda item: item[1])
    return found


def load_environment(spec_file: SpecFile, report_only: bool = False) -> Spec:
    """Load one environment's spec; raises SpecError naming the file."""
    return _load_with_digest(spec_file, report_only)[0]


def _load_with_digest(spec_file: SpecFile, report_only: bool) -> tuple[Spec, bytes]:
    """The spec and a digest of the very text it was parsed from."""
    if (problem := environment_problem(spec_file.environment)) is not None:
        raise SpecError([f"{spec_file.path}: {problem}"])
    text = read_spec_text(spec_file.path)
    spec = parse_spec(text, source=str(spec_file.path))
    spec = dataclasses.replace(spec, environment=spec_file.environment, mode="report" if report_only else spec.mode)
    return spec, _digest(text.encode("utf-8"))


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def load_directory(directory: str | Path, report_only: bool = False) -> tuple[dict[str, tuple[SpecFile, Spec]], list[str]]:
    """Every environment in `directory`, and one line per problem (all files are tried)."""
    loaded, problems = _load_all(Path(directory), report_only)
    return {env: (e.spec_file, e.spec) for env, e in loaded.items()}, problems


def _load_all(directory: Path, report_only: bool) -> tuple[dict[str, _Loaded], list[str]]:
    try:
        files = spec_files(directory)
    except OSError as exc:
        return {}, [f"{directory}: cannot list the spec directory ({exc.strerror})"]
    loaded: dict[str, _Loaded] = {}
    problems: list[str] = []
    by_id: dict[str, SpecFile] = {}
    for spec_file in files:
        if (other := by_id.get(spec_file.environment)) is not None:
            problems.append(f"{spec_file.path}: environment {spec_file.environment!r} is also defined by {other.path.name}")
            loaded.pop(spec_file.environment, None)
            continue
        by_id[spec_file.environment] = spec_file
        try:
            loaded[spec_file.environment] = _load_one(spec_file, report_only)
        except SpecError as exc:
            problems.extend(exc.problems)
    return loaded, problems


@dataclass
class _Loaded:
    spec_file: SpecFile
    spec: Spec
    seen: Fingerprint  # of the file and its secret files, when last loaded (or tried)
    # Of the text the spec was parsed from. A ConfigMap update swaps every file's inode
    # (kubelet writes a new directory), so a stat change alone does not mean this file
    # changed: its content is compared before a thousand environments are re-parsed.
    digest: bytes = b""

    def seen_secrets(self) -> Fingerprint:
        return _fingerprint(list(self.spec.secret_files))

    def unchanged_content(self, now: Fingerprint) -> bool:
        """True (and remembered) when only the spec file's stat changed, not its text or secrets."""
        if now[1:] != self.seen[1:]:
            return False  # a secret file changed
        try:
            same = _digest(self.spec_file.path.read_bytes()) == self.digest
        except OSError:
            return False
        if same:
            self.seen = now
        return same


class EnvironmentRegistry:
    """The environments in force (`--spec-dir`); `spec(environment)` is read once per new
    decision. A `SpecSource`."""

    POLL_SECONDS = 0.5
    proves_environment = True

    def __init__(self, directory: str | Path, report_only: bool = False, count_reloads: bool = True):
        self.directory = Path(directory)
        self._as_given = str(directory)  # as the operator wrote it, for messages
        self.report_only = report_only
        self.count_reloads = count_reloads  # with --workers, one worker counts
        loaded, problems = _load_all(self.directory, report_only)
        if problems:
            raise SpecError(problems)  # like --spec: the proxy never starts on a broken spec
        self._environments = loaded
        # Files that failed after start and have no environment (bad name, never loaded):
        # remembered so a broken file is not retried on every poll.
        self._failed: dict[str, Fingerprint] = {}  # path -> its stat when it failed
        self._unreadable = False
        metrics.init_labels()
        self._in_force()

    # -- what the proxy reads -------------------------------------------------------
    def spec(self, environment: str) -> Spec | None:
        loaded = self._environments.get(environment)
        return loaded.spec if loaded is not None else None

    def spec_of(self, environment: str | None) -> Spec | None:
        return self.spec(environment) if environment is not None else None

    def summary(self) -> str:
        return f"{len(self)} environments from {self._as_given} (proxy auth required)"

    @property
    def environments(self) -> list[str]:
        return sorted(self._environments)

    def __len__(self) -> int:
        return len(self._environments)

    def _in_force(self) -> None:
        metrics.ENVIRONMENTS.set(len(self._environments))
        metrics.ALLOWLIST_ENTRIES.set(sum(len(e.spec.entries) for e in self._environments.values()))
        metrics.CONFIG_LAST_SUCCESS.set(time.time())

    # -- reload -----------------------------------------------------------------------
    def _scan(self) -> tuple[list[SpecFile], list[SpecFile], list[str]] | None:
        """(files to load, duplicate files, environments removed); None if the directory cannot be listed.

        Only stats: with a thousand environments a poll costs a directory listing and
        a stat per file, and a reload loads only the files that changed.
        """
        try:
            files = _listing(self.directory)
        except OSError:
            return None
        present: dict[str, str] = {}  # environment -> path
        to_load, duplicates = [], []
        for environment, path, file_stat in files:
            if environment in present:
                if self._failed.get(path) != (file_stat,):
                    duplicates.append(SpecFile(environment, Path(path)))
                continue
            present[environment] = path
            loaded = self._environments.get(environment)
            if loaded is not None and loaded.seen[0][0] == path:
                now = (file_stat, *loaded.seen_secrets()) if loaded.spec.secret_files else (file_stat,)
                if now != loaded.seen and not loaded.unchanged_content(now):
                    to_load.append(loaded.spec_file)
            elif self._failed.get(path) != (file_stat,):
                to_load.append(SpecFile(environment, Path(path)))
        reloading = {f.environment for f in to_load}
        removed = [
            e for e, loaded in self._environments.items() if present.get(e) != loaded.seen[0][0] and e not in reloading
        ]
        return to_load, duplicates, removed

    def reload(self, trigger: str) -> bool:
        """Bring every environment up to date with its file; True when nothing failed.

        SIGHUP rescans at once; like the poll it loads only what changed (a full reload
        of a thousand files would stall every connection for seconds).
        """
        scan = self._scan()
        if scan is None:
            # An unreadable directory is not "every file removed": keep serving what we have,
            # and say so once (not twice a second) until it can be read again.
            if not self._unreadable:
                self._unreadable = True
                self._count("", "failure")
                _log("spec_dir_unreadable", trigger=trigger, directory=str(self.directory))
            return False
        self._unreadable = False
        to_load, duplicates, removed = scan
        if not (to_load or duplicates or removed):
            return True
        ok = True
        for spec_file in duplicates:
            # Two files for one id (a.yaml and a.json): the first (sorted) keeps serving.
            ok &= self._fail(spec_file, trigger, [
                f"{spec_file.path}: environment {spec_file.environment!r} is defined by another file too"])
        for spec_file in to_load:
            ok &= self._load(spec_file, trigger)
        for environment in removed:
            del self._environments[environment]
            self._count(environment, "removed")
            _log("environment_removed", trigger=trigger, environment=environment)
        self._failed = {path: fp for path, fp in self._failed.items() if os.path.exists(path)}
        self._in_force()
        return ok

    def _load(self, spec_file: SpecFile, trigger: str) -> bool:
        previous = self._environments.get(spec_file.environment)
        try:
            loaded = _load_one(spec_file, self.report_only)
        except SpecError as exc:
            return self._fail(spec_file, trigger, exc.problems)
        spec = loaded.spec
        self._failed.pop(str(spec_file.path), None)
        self._environments[spec_file.environment] = loaded
        self._count(spec_file.environment, "success")
        gc.freeze()  # long-lived like the first load (see egress.cli.main)
        _log(
            "environment_loaded" if previous is None else "environment_reloaded",
            trigger=trigger, environment=spec_file.environment, entries=len(spec.entries), mode=spec.mode,
        )  # fmt: skip
        return True

    def _fail(self, spec_file: SpecFile, trigger: str, problems: list[str]) -> bool:
        loaded = self._environments.get(spec_file.environment)
        valid_id = environment_problem(spec_file.environment) is None
        if loaded is not None and loaded.spec_file.path == spec_file.path:
            # Keep the last good spec; do not retry the same broken file every poll.
            loaded.seen = _fingerprint_of(spec_file, loaded.spec)
        else:
            self._failed[str(spec_file.path)] = _file_fingerprint(spec_file)
        # The label is an environment only when the name is one; a bad name counts under "".
        self._count(spec_file.environment if valid_id else "", "failure")
        _log(
            "environment_reload_failed", trigger=trigger, environment=spec_file.environment if valid_id else "",
            file=spec_file.path.name, problems=problems, kept_entries=len(loaded.spec.entries) if loaded else None,
        )  # fmt: skip
        return False

    def _count(self, environment: str, result: str) -> None:
        if self.count_reloads:
            metrics.ENVIRONMENT_RELOADS.labels(environment, result).inc()
            metrics.CONFIG_RELOADS.labels("success" if result != "failure" else "failure").inc()

    def changed(self) -> bool:
        scan = self._scan()
        return scan is not None and any(scan)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.POLL_SECONDS)
            self.reload("file_changed")  # one scan: a stat per file; loads only what changed


def _load_one(spec_file: SpecFile, report_only: bool) -> _Loaded:
    # The file's stat is taken before it is read: a change racing the read shows up
    # as a changed stat at the next poll instead of being lost.
    before = _file_fingerprint(spec_file)
    spec, digest = _load_with_digest(spec_file, report_only)
    return _Loaded(spec_file, spec, before + _fingerprint(list(spec.secret_files)), digest)


def _file_fingerprint(spec_file: SpecFile) -> Fingerprint:
    return _fingerprint([str(spec_file.path)])


def _fingerprint_of(spec_file: SpecFile, spec: Spec) -> Fingerprint:
    return _fingerprint([str(spec_file.path), *spec.secret_files])
