"""AuditLog: the format of the audit log (`egress_log_format`), one line per decision on stdout."""

from __future__ import annotations

from mitmproxy import ctx

from egress.addons.refuse import refuse
from egress.ops.audit import DecisionLog

FORMATS = ("json", "text")


class AuditLog:
    def __init__(self, log: DecisionLog):
        self.log = log  # shared: every addon that decides writes its line here

    def load(self, loader) -> None:
        loader.add_option("egress_log_format", str, self.log.fmt, "Audit log format on stdout: json or text.")

    def configure(self, updated: set[str]) -> None:
        if "egress_log_format" in updated:
            fmt = ctx.options.egress_log_format
            if fmt not in FORMATS:
                return refuse(f"egress_log_format: {fmt!r} is not one of {', '.join(FORMATS)}")
            self.log.fmt = fmt
