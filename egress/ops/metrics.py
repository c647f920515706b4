"""Prometheus metrics (SPEC §6 and the operations issue).

Labels carry reason codes, decision names and configured rule patterns only,
never the requested host or anything else the sandbox chooses: a sandbox must
not be able to create unbounded label values.

What is counted once: every request the proxy sees (plain HTTP and requests
inside intercepted TLS), every CONNECT it refuses, and every passthrough
tunnel (once, when its ClientHello is accepted or refused).
"""

from __future__ import annotations

import platform

from prometheus_client import Counter, Gauge, Histogram, Info, disable_created_metrics

from egress import __version__

# `*_created` series double the exposition and answer no operator's question.
disable_created_metrics()

REQUESTS = Counter(
    "egress_requests",
    "Decisions on requests (intercepted or plain HTTP) and on passthrough tunnels.",
    # environment: "" with --spec; with --spec-dir one of the configured environments
    # (never a name a client merely claimed), so it is bounded by the spec files.
    ["decision", "reason", "rule", "environment"],
)
DNS_QUERIES = Counter(
    "egress_dns_queries",
    "Queries to the DNS listener (--dns-listen) by decision, reason, allowlist rule and query type.",
    # environment: always "" — a DNS query carries no proof of environment, so with
    # --spec-dir the listener answers from no environment's allowlist (see master.py).
    ["decision", "reason", "rule", "qtype", "environment"],
)
CREDENTIAL_INJECTIONS = Counter(
    "egress_credential_injections",
    "Requests that had an allowlist entry's credentials applied (transform, query, replace or sign).",
    ["rule", "environment"],
)
CREDENTIAL_FETCHES = Counter(
    "egress_credential_fetches",
    "The proxy's own token calls (network.credentials sources) by source name and outcome (ok, error).",
    ["credential", "outcome"],
)
SECRET_ECHOES = Counter(
    "egress_secret_echoes",
    "Occurrences of an injected secret found in a response (headers or body) and masked before the client saw them.",
    ["rule"],
)
UPSTREAM_ERRORS = Counter(
    "egress_upstream_errors",
    "Allowed tunnels and requests whose checked upstream address could not be connected (answered "
    "502/504, or a transparent connection closed).",
    ["reason"],
)
TIMEOUTS = Counter(
    "egress_timeouts",
    "Connections or requests ended by a proxy timeout (connect, read, header).",
    ["kind"],
)
REQUEST_DURATION = Histogram(
    "egress_request_duration_seconds",
    "Time from request headers received to response complete, for requests the proxy sees.",
    ["decision"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
UPSTREAM_CONNECT = Histogram(
    "egress_upstream_connect_seconds",
    "TCP connect time to the checked upstream address.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CONFIG_RELOADS = Counter(
    "egress_config_reloads",
    "Spec reloads (file change or SIGHUP) by result.",
    ["result"],
)
CONFIG_LAST_SUCCESS = Gauge(
    "egress_config_last_reload_success_timestamp_seconds",
    "Unix time of the last successful spec load.",
    multiprocess_mode="livemax",  # --workers: the latest of the live workers
)
ALLOWLIST_ENTRIES = Gauge(
    "egress_allowlist_entries",
    "Entries in the allowlist in force.",
    multiprocess_mode="livemostrecent",  # --workers: as the worker that loaded last sees it
)
ENVIRONMENTS = Gauge(
    "egress_environments",
    "Environments served (--spec-dir: spec files in force; 1 with --spec).",
    multiprocess_mode="livemostrecent",
)
ENVIRONMENT_RELOADS = Counter(
    "egress_environment_reloads",
    "--spec-dir: per-environment spec loads after start (added, changed, broken, removed files) by result.",
    ["environment", "result"],
)
BUILD = Info("egress_build", "Versions this proxy was built from.")


def set_build_info() -> None:
    import mitmproxy.version

    BUILD.info(
        {
            "version": __version__,
            "mitmproxy_version": mitmproxy.version.VERSION,
            "python_version": platform.python_version(),
        }
    )


def init_labels() -> None:
    """Create the result series up front so `rate()` sees them from the first scrape."""
    for result in ("success", "failure"):
        CONFIG_RELOADS.labels(result)
    for reason in ("upstream_refused", "upstream_unreachable", "upstream_timeout"):
        UPSTREAM_ERRORS.labels(reason)

INTERNAL_ERRORS = Counter(
    "egress_internal_errors",
    "Exceptions raised inside the proxy's own hooks; each one refused what it was deciding on.",
    ["hook"],
)

CONNECTIONS_REFUSED = Counter(
    "egress_connections_refused",
    "Client connections refused at accept because a connection limit was reached.",
    ["limit"],
)

CONNECTIONS_CLOSED = Counter(
    "egress_connections_closed",
    "Client connections the proxy closed for abusing HTTP/2 (h2_resets: rapid reset; h2_control_flood: PING/SETTINGS flood).",
    ["reason"],
)
