"""`egress_hook_runs_total{event, type, outcome}` (SPEC §6), in the default registry.

Imported only when a run is recorded, so the CLI, which exits after one
dispatch and has no scraper, never pays for prometheus_client.
"""

from __future__ import annotations

from prometheus_client import Counter

HOOK_RUNS = Counter(
    "egress_hook_runs_total",
    "Hook handler runs, by event, handler type and outcome (allow, deny, error, timeout).",
    ["event", "type", "outcome"],
)


def record_hook_run(event: str, handler_type: str, outcome: str) -> None:
    HOOK_RUNS.labels(event=event, type=handler_type, outcome=outcome).inc()
