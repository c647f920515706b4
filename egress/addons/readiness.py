"""Readiness: the proxy is ready once mitmproxy's listeners are up."""

from __future__ import annotations

import threading


class Readiness:
    def __init__(self) -> None:
        self.ready = threading.Event()

    def running(self) -> None:
        self.ready.set()

    def done(self) -> None:
        self.ready.clear()
