"""Prometheus metrics (SPEC §6). Labels carry reason codes and configured rule
patterns only, never the requested host: the sandbox must not be able to create
unbounded label values."""

from __future__ import annotations

from prometheus_client import Counter

REQUESTS = Counter(
    "egress_requests",
    "Decisions on requests (intercepted or plain HTTP) and on passthrough tunnels.",
    ["decision", "reason", "rule"],
)
CREDENTIAL_INJECTIONS = Counter(
    "egress_credential_injections",
    "Requests that had an allowlist entry's transform applied.",
    ["rule"],
)
