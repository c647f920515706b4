"""`egress-proxy run --workers N`: N proxy processes on one port, one CA, one /metrics.

mitmproxy runs one event loop in one process, so one proxy uses one core. With
`--workers N` the `egress-proxy` process becomes a supervisor:

- it validates the spec and creates the CA in `--confdir` *before* starting any
  worker, so every worker loads the same CA (no start-up race creating two);
- it starts N workers (`python -m egress.cli` with the same arguments); each binds
  the listen address itself with SO_REUSEPORT, and the kernel spreads incoming
  connections over the workers' sockets (a dead worker's socket leaves the group);
- workers write their metrics to a private directory in prometheus-client's
  multiprocess mode; the supervisor serves `/metrics` (counters and histograms
  summed over workers, gauges by their `multiprocess_mode`), `/healthz`, and
  `/readyz` (ready once every worker listens);
- SIGTERM/SIGINT stop the workers, SIGHUP is passed on (each reloads the spec). If
  a worker exits on its own, the others are stopped and the supervisor exits 1:
  the pod restarts whole rather than running on with fewer cores than it asked for.

A worker learns it is one from `EGRESS_WORKER` (`INDEX:READY_FILE`) in its
environment; `PROMETHEUS_MULTIPROC_DIR` is set for it before prometheus-client
is imported.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from egress.addons.readiness import Readiness

WORKER_ENV = "EGRESS_WORKER"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STOP_SECONDS = 10.0


@dataclass(frozen=True)
class Worker:
    """What a worker process knows about itself."""

    index: int
    ready_file: Path

    @property
    def counts_reloads(self) -> bool:
        # Every worker reloads the spec, but a reload is one event for the pod: one counts it.
        return self.index == 0

    def readiness(self) -> Readiness:
        return _FileReadiness(self.ready_file)


def current() -> Worker | None:
    value = os.environ.get(WORKER_ENV)
    if not value:
        return None
    index, _, ready = value.partition(":")
    return Worker(int(index), Path(ready))


class _FileReadiness(Readiness):
    """Readiness that the supervisor can see: a file that exists while we listen."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def running(self) -> None:
        super().running()
        self.path.touch()

    def done(self) -> None:
        super().done()
        self.path.unlink(missing_ok=True)


# -- worker side: listen with SO_REUSEPORT ---------------------------------------------
def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host or not host else socket.AF_INET
    # proto must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that
    # say so, and without it every response written in two parts (head, body) waited
    # for the client's delayed ACK (40 ms): two workers served less than one.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and not host:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "" = every address, both families
        sock.bind((host or "::", port))
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def listen_with_reuseport() -> None:
    """Make this process's TCP proxy listeners bind with SO_REUSEPORT.

    mitmproxy binds through `asyncio.start_server(handler, host, port)`, which has no
    SO_REUSEPORT; its server instances get a `listen` that binds the socket itself.
    Only in worker processes: a single proxy keeps mitmproxy's own binding.
    """
    from mitmproxy.proxy import mode_servers

    async def listen(self, host: str, port: int):
        if self.mode.transport_protocol != "tcp" or port == 0:
            return await mode_servers.AsyncioServerInstance.listen(self, host, port)
        return [await asyncio.start_server(self.handle_stream, sock=reuseport_socket(host, port))]

    for cls in (mode_servers.RegularInstance, mode_servers.TransparentInstance):
        cls.listen = listen  # type: ignore[method-assign]  # the patch described above


# -- supervisor side -------------------------------------------------------------------
def prepare_ca(confdir: Path) -> None:
    """Create (or load) the CA once, before the workers start, so all of them use it."""
    from mitmproxy import certs
    from mitmproxy.options import Options

    certs.CertStore.from_store(confdir, "mitmproxy", key_size=Options().key_size)


def metrics_registry(multiproc_dir: Path):
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from egress.ops import metrics

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc_dir))
    metrics.set_build_info()
    registry.register(metrics.BUILD)  # an Info is per process: the supervisor's own
    return registry


class Supervisor:
    def __init__(self, count: int, argv: list[str]):
        self.count = count
        self.argv = argv
        self.dir = Path(tempfile.mkdtemp(prefix="egress-workers-"))
        self.metrics_dir = self.dir / "metrics"
        self.metrics_dir.mkdir()
        self.procs: list[subprocess.Popen] = []
        self.stopping = False

    def ready_file(self, index: int) -> Path:
        return self.dir / f"ready-{index}"

    def is_ready(self) -> bool:
        return all(p.poll() is None for p in self.procs) and all(
            self.ready_file(i).exists() for i in range(self.count)
        )

    def start_workers(self) -> None:
        for index in range(self.count):
            env = {**os.environ, WORKER_ENV: f"{index}:{self.ready_file(index)}", MULTIPROC_ENV: str(self.metrics_dir)}
            self.procs.append(subprocess.Popen([sys.executable, "-m", "egress.cli", *self.argv], env=env))

    def signal_workers(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def stop(self) -> None:
        self.stopping = True
        self.signal_workers(signal.SIGTERM)

    async def wait(self) -> int:
        """Until stopped or a worker exits; returns the supervisor's exit status."""
        from prometheus_client.multiprocess import mark_process_dead

        failed: subprocess.Popen | None = None
        while not self.stopping and failed is None:
            await asyncio.sleep(0.2)
            failed = next((p for p in self.procs if p.poll() is not None), None)
        if failed is not None and not self.stopping:
            index = self.procs.index(failed)
            print(
                f"egress-proxy: worker {index} (pid {failed.pid}) exited with status {failed.returncode}; stopping the others",
                file=sys.stderr,
                flush=True,
            )
            self.stop()
        deadline = time.monotonic() + STOP_SECONDS
        for proc in self.procs:
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            mark_process_dead(proc.pid, str(self.metrics_dir))
        return 1 if failed is not None else 0

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


async def supervise(count: int, argv: list[str], confdir: Path, metrics_host: str, metrics_port: int, describe: str) -> int:
    """Run `count` workers with `argv` (the `egress-proxy` arguments) until stopped.

    Raises OSError when the metrics address cannot be bound.
    """
    from egress.ops.metrics_server import serve_metrics

    prepare_ca(confdir)
    supervisor = Supervisor(count, argv)
    try:
        registry = metrics_registry(supervisor.metrics_dir)
        server = serve_metrics(metrics_host, metrics_port, supervisor.is_ready, registry=registry)
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, supervisor.stop)
            loop.add_signal_handler(signal.SIGHUP, supervisor.signal_workers, signal.SIGHUP)
            supervisor.start_workers()
            pids = " ".join(str(p.pid) for p in supervisor.procs)
            print(f"egress-proxy: {describe}, {count} workers (pids {pids})", file=sys.stderr, flush=True)
            return await supervisor.wait()
        finally:
            server.shutdown()
    finally:
        supervisor.stop()
        supervisor.cleanup()
