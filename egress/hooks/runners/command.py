"""Run a command hook: `/bin/sh -c CMD` with the event on stdin.

The traps this avoids, each seen in other agents' hook runners:
- Deadlock on big payloads: stdin is written *while* stdout/stderr are read,
  so a 5 MB `write_file` event cannot fill both pipes at once.
- Unbounded memory: stdout is kept up to a cap but read to the end, so a
  chatty hook never blocks on a full pipe and never grows our memory.
- Orphans: the shell gets its own process group (`start_new_session`), and a
  timeout signals the whole group - SIGTERM, a short grace, then SIGKILL. When
  the hook ends by itself the group is killed too: nothing it started in the
  background outlives it (processes that left the group are found by
  `egress.hooks.reaper`).
- Hanging on a held pipe: a grandchild that keeps stdout open (`sleep 60 &`)
  cannot make us wait past the timeout; the final drain is bounded too, so a
  process that escaped the group still cannot hold us.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

from egress.hooks.decisions import MAX_OUTPUT_BYTES

SHELL = "/bin/sh"
MAX_STDERR_BYTES = 4096  # the tail is kept; it only feeds the fail-open log line
TERMINATE_GRACE_SECONDS = 0.3
FINAL_DRAIN_SECONDS = 0.5
_READ_CHUNK = 65536


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None
    stdout: bytes
    stdout_truncated: bool
    stderr_tail: bytes
    timed_out: bool
    duration_ms: float
    spawn_error: str | None = None


class _Capture:
    """Reads a pipe to EOF, keeping the first `head` or the last `tail` bytes."""

    def __init__(self, stream: asyncio.StreamReader, *, head: int = 0, tail: int = 0):
        self.stream = stream
        self.head = head
        self.tail = tail
        self.data = bytearray()
        self.truncated = False

    async def run(self) -> None:
        while chunk := await self.stream.read(_READ_CHUNK):
            if self.head:
                room = self.head - len(self.data)
                if len(chunk) > room:
                    self.truncated = True
                self.data += chunk[: max(room, 0)]
            else:
                self.data += chunk
                del self.data[: max(len(self.data) - self.tail, 0)]


async def run_command(
    command: str,
    stdin_data: bytes,
    timeout: float,
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    grace: float = TERMINATE_GRACE_SECONDS,
) -> CommandResult:
    started = time.monotonic()

    def elapsed_ms() -> float:
        return round((time.monotonic() - started) * 1000, 1)

    try:
        process = await asyncio.create_subprocess_exec(
            SHELL,
            "-c",
            # hooks.json is UTF-8; passing bytes keeps it so under any locale.
            command.encode("utf-8", "surrogateescape"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(None, b"", False, b"", False, elapsed_ms(), spawn_error=f"{type(exc).__name__}: {exc.strerror or exc}")

    # All three pipes were requested above, so none of them is None.
    assert process.stdout is not None and process.stderr is not None
    stdout = _Capture(process.stdout, head=MAX_OUTPUT_BYTES)
    stderr = _Capture(process.stderr, tail=MAX_STDERR_BYTES)
    writer = asyncio.create_task(_feed_stdin(process, stdin_data))
    readers = [asyncio.create_task(stdout.run()), asyncio.create_task(stderr.run())]
    # Done means: the shell exited *and* both pipes reached EOF, i.e. no
    # descendant can still add to the decision.
    finished = asyncio.gather(process.wait(), *readers)
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(finished), timeout)
    except TimeoutError:
        timed_out = True
        await _stop_group(process, finished, grace)
    finally:
        # Also reached when the caller cancels us: nobody will read this hook's
        # answer any more, so none of its processes may outlive it. After a
        # normal end, what is left in the group is background work of the hook.
        _signal_group(process, signal.SIGKILL)
        writer.cancel()
        if not finished.done():
            # Bounded drain ran out (a process left the group and holds a
            # pipe): stop reading rather than wait for it.
            finished.cancel()
            for reader in readers:
                reader.cancel()
        await asyncio.gather(writer, finished, return_exceptions=True)
        _close_transport(process)
    return CommandResult(
        exit_code=process.returncode,
        stdout=bytes(stdout.data),
        stdout_truncated=stdout.truncated,
        stderr_tail=bytes(stderr.data),
        timed_out=timed_out,
        duration_ms=elapsed_ms(),
    )


async def _feed_stdin(process: asyncio.subprocess.Process, data: bytes) -> None:
    stdin = process.stdin
    assert stdin is not None  # spawned with stdin=PIPE
    try:
        stdin.write(data)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        # The hook exited or closed stdin without reading it all: normal for
        # a gate that only needs the tool name, or that has already decided.
        pass
    finally:
        try:
            stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass


async def _stop_group(process: asyncio.subprocess.Process, finished: asyncio.Future, grace: float) -> None:
    _signal_group(process, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(finished), grace)
    except TimeoutError:
        pass
    # SIGKILL even if the shell is gone: a child that ignored SIGTERM may
    # still be in the group.
    _signal_group(process, signal.SIGKILL)
    try:
        # A short grace (the event's budget ran out) shortens the drain too.
        await asyncio.wait_for(asyncio.shield(finished), min(FINAL_DRAIN_SECONDS, max(grace, 0.05) * 2))
    except TimeoutError:
        pass


def _signal_group(process: asyncio.subprocess.Process, signum: int) -> None:
    # With start_new_session the shell leads a group whose id is its pid. The
    # id cannot be reused while any member is alive, so this never hits a
    # stranger; once the group is empty it fails harmlessly.
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _close_transport(process: asyncio.subprocess.Process) -> None:
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()
