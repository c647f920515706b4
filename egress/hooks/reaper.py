"""Nothing a hook started outlives the tool call.

A command hook runs in a process group of its own, and the runner kills that
group when the hook ends or times out. A process that called `setsid` (or a
double fork into a new session) has left the group, and once its parent shell
exits it is reparented away from us: the group kill cannot reach it. Two
things find it again:

- every process of a command handler's run carries `EGRESS_HOOK_RUN=<token>`
  in its environment (inherited through fork, exec and setsid alike); once the
  run has finished, every process whose environment holds its token is killed;
- the dispatcher makes itself a *child subreaper* (`PR_SET_CHILD_SUBREAPER`),
  so orphans of its hooks are reparented to it rather than to init. An orphan
  that also cleared its environment (`env -i`) is then a child of ours that is
  no handler: it is killed when no dispatch is running (one might still need
  it), and every killed child is reaped so no zombie stays behind.

Signals go through a pidfd opened *before* the environment is read, so a pid
that is reused between the read and the kill can never hit a stranger.
Processes of other users cannot be read (and so are never killed) unless the
dispatcher runs as root.
"""

from __future__ import annotations

import os
import signal
import threading

RUN_TOKEN_VARIABLE = "EGRESS_HOOK_RUN"
_PR_SET_CHILD_SUBREAPER = 36
_subreaper = False


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux >= 3.4)."""
    global _subreaper
    if _subreaper:
        return True
    import ctypes  # only here: the CLI answers most tool calls without spawning anything

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def new_token() -> str:
    import secrets

    return secrets.token_hex(12)


class Reaper:
    """Tracks the dispatches in flight and kills what finished ones left behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: set[str] = set()
        self._finished: set[bytes] = set()
        self._killed: set[int] = set()
        # One pass at a time (the dispatcher sweeps between handlers in a thread).
        self._sweeping = threading.Lock()

    def start(self) -> str:
        token = new_token()
        with self._lock:
            self._active.add(token)
        return token

    def finish(self, token: str) -> None:
        with self._lock:
            self._active.discard(token)
            self._finished.add(f"{RUN_TOKEN_VARIABLE}={token}".encode())

    def sweep(self, tagged_only: bool = False) -> list[int]:
        """One pass over /proc; returns the pids it killed. Safe to call any time.

        `tagged_only`: kill only processes with a finished token, never the untagged
        children of an idle subreaper - for a pass from another thread, which cannot
        know that no handler is being started meanwhile.
        """
        with self._sweeping:
            return self._sweep(tagged_only)

    def _sweep(self, tagged_only: bool) -> list[int]:
        with self._lock:
            finished = self._finished
            self._finished = set()
            idle = not self._active and not tagged_only
        killed: list[int] = []
        if _subreaper and idle:
            if not _has_children():
                # Every process a hook left behind is, as an orphan, a descendant of
                # ours: with no child at all there is nothing to look for.
                self._killed.clear()
                return killed
        elif not finished:
            return killed
        me = os.getpid()
        for entry in _pids():
            if entry == me:
                continue
            fd = _pidfd(entry)
            if fd is None:
                continue
            try:
                environ = _read(f"/proc/{entry}/environ")
                tagged = environ is not None and any(marker in environ for marker in finished)
                orphan = False
                if not tagged and _subreaper and idle:
                    stat = _stat(entry)
                    # No dispatch is running, so a child of ours is no handler: an orphan
                    # (one that cleared its environment, or the child of one killed before).
                    orphan = stat is not None and stat[1] == me
                    if stat is not None and stat[0] == "Z" and stat[1] == me:
                        self._killed.add(entry)  # a dead orphan: only needs reaping
                        continue
                if tagged or orphan:
                    try:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                        killed.append(entry)
                        self._killed.add(entry)
                    except OSError:
                        pass
            finally:
                os.close(fd)
        self._reap()
        return killed

    def sweep_until_quiet(self, passes: int = 5) -> list[int]:
        """Sweep again while a pass kills something: the children of a killed orphan
        are reparented to us only once it is gone. For a dispatcher about to exit."""
        import time

        killed: list[int] = []
        for _ in range(passes):
            found = self.sweep()
            if not found:
                break
            killed += found
            time.sleep(0.02)
        return killed

    def _reap(self) -> None:
        for pid in list(self._killed):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                self._killed.discard(pid)  # not our child (or already reaped)
                continue
            if done:
                self._killed.discard(pid)


def _has_children() -> bool:
    try:
        # WNOWAIT: look, do not reap (a child may be asyncio's to wait for).
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # AttributeError: not Linux (no pidfd), nothing is killed
        return None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) from /proc/PID/stat (the name may hold spaces and parens)."""
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1])
    except (IndexError, ValueError):
        return None
