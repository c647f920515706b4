"""Timings for operators: request duration and upstream connect time (histograms)."""

from __future__ import annotations

import time

from mitmproxy import http
from mitmproxy.proxy import server_hooks

from egress.addons.guard import DECISION_KEY
from egress.ops import metrics


class Timings:
    def _observe(self, flow: http.HTTPFlow) -> None:
        decision = flow.metadata.get(DECISION_KEY)
        if decision is None or flow.request.timestamp_start is None:
            return
        metrics.REQUEST_DURATION.labels(decision.label).observe(time.time() - flow.request.timestamp_start)

    def response(self, flow: http.HTTPFlow) -> None:
        self._observe(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._observe(flow)

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.timestamp_start and server.timestamp_tcp_setup:
            metrics.UPSTREAM_CONNECT.observe(server.timestamp_tcp_setup - server.timestamp_start)
