"""MetricsListener: `/metrics`, `/healthz` and `/readyz` on `egress_metrics_listen`."""

from __future__ import annotations

from http.server import ThreadingHTTPServer

from mitmproxy import ctx

from egress.addons.readiness import Readiness
from egress.addons.refuse import refuse
from egress.net.hostport import HostPortError, parse_hostport
from egress.ops.metrics_server import DEFAULT_LISTEN, serve_metrics


class MetricsListener:
    def __init__(self, readiness: Readiness, server: ThreadingHTTPServer | None = None, listening_on: str = ""):
        """`server`: already listening on `listening_on` (`egress-proxy run` binds it before
        starting, so a taken port is one clear line)."""
        self.readiness = readiness
        self.server = server
        self.listening_on = listening_on if server is not None else ""

    def load(self, loader) -> None:
        loader.add_option(
            "egress_metrics_listen", str, DEFAULT_LISTEN,
            "HOST:PORT for /metrics, /healthz and /readyz; empty: none (with --workers the supervisor serves them).",
        )  # fmt: skip

    def configure(self, updated: set[str]) -> None:
        if "egress_metrics_listen" not in updated or ctx.options.egress_metrics_listen == self.listening_on:
            return
        where = ctx.options.egress_metrics_listen
        self.done()
        if not where:
            return
        try:
            host, port = parse_hostport(where, "egress_metrics_listen")
            self.server = serve_metrics(host, port, self.readiness.ready.is_set)
        except HostPortError as exc:
            return refuse(str(exc))
        except OSError as exc:
            return refuse(f"egress_metrics_listen {where}: cannot listen ({exc.strerror})")
        self.listening_on = where

    def done(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
            self.listening_on = ""
