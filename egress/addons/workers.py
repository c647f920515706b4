"""Workers: `egress_workers`, the number of proxy processes sharing the listen port.

`egress-proxy run --workers N` starts and supervises them (egress/mitm/workers.py);
inside one process the option only records N. Loaded as a mitmproxy script, one
mitmproxy process is all there is, so any other number is refused.
"""

from __future__ import annotations

from mitmproxy import ctx

from egress.addons.refuse import mode, refuse


class Workers:
    def load(self, loader) -> None:
        loader.add_option(
            "egress_workers", int, 1,
            "Proxy processes sharing the listen port (SO_REUSEPORT), one CA and one /metrics; "
            "started by `egress-proxy run --workers`.",
        )  # fmt: skip

    def configure(self, updated: set[str]) -> None:
        if "egress_workers" in updated and ctx.options.egress_workers != 1 and mode.script:
            refuse("egress_workers: worker processes are started by `egress-proxy run --workers`, not by mitmproxy")
