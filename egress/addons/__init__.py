"""The mitmproxy addons of egress, thin, one concern each, and `chain()`, which puts
them in the order the decisions must happen (like mitmproxy's `default_addons()`).

Every setting is an `egress_*` option declared in `load()` by the addon that reads it
and applied in `configure()`; `egress-proxy run` sets them from its flags, and
`mitmdump -s addons/egress.py --set egress_spec=FILE` from the command line.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer
from typing import Any

from egress.addons.audit_log import AuditLog
from egress.addons.credentials import CredentialPlacement, EchoScrubbing
from egress.addons.dns_filter import DnsFilter
from egress.addons.environment_gate import EnvironmentGate
from egress.addons.failsafe import fail_closed
from egress.addons.gc_pacing import PacedCollection
from egress.addons.guarantees import Guarantees
from egress.addons.guard import DestinationGuard
from egress.addons.inject import CredentialInjector
from egress.addons.limits import ConnectionLimits
from egress.addons.metrics_listener import MetricsListener
from egress.addons.policy_source import ALLOWS_NOTHING, PolicySource
from egress.addons.readiness import Readiness
from egress.addons.stream_resets import StreamResetLimit
from egress.addons.streaming import StreamUnsizedResponses
from egress.addons.timings import Timings
from egress.addons.upgrades import ProtocolSwitches
from egress.addons.upstream_trust import UpstreamTrust
from egress.addons.workers import Workers
from egress.environments.source import SpecSource
from egress.mitm.patches.early_answers import NoContinueForRefusals
from egress.net.destinations import DestinationChecker
from egress.net.parent_proxy import ParentProxy
from egress.net.resolver import LocalAddresses
from egress.ops.audit import DecisionLog


def chain(
    source: SpecSource | None = None,
    *,
    log: DecisionLog | None = None,
    readiness: Readiness | None = None,
    parent: ParentProxy | None = None,
    parent_from: tuple = (None, None),
    metrics_server: ThreadingHTTPServer | None = None,
    metrics_listen: str = "",
    count_reloads: bool = True,
) -> list[Any]:
    """Every egress addon, in order. The keyword arguments hand over what `egress-proxy run`
    has already loaded or bound before starting (so its errors come first, as one line);
    loaded as a script, each addon builds its part from its options instead.

    mitmproxy's NextLayer must come after the guard: the guard's `next_layer` decides a
    tunnel on the complete ClientHello before TLS layers are stacked (in mitmdump the
    script loader, and so this chain, sits before NextLayer; `egress-proxy run` inserts it).
    """
    log = log if log is not None else DecisionLog()
    readiness = readiness if readiness is not None else Readiness()
    policy = PolicySource(source, count_reloads=count_reloads)
    gate = EnvironmentGate(policy, log)
    checker = DestinationChecker(gate.spec_for, LocalAddresses([]))
    guard = DestinationGuard(checker, log, parent, parent_from)

    def dns_spec():
        # A DNS query carries no proof of environment: with a directory of environments no
        # environment's allowlist applies and every name is NXDOMAIN. Sandboxes of a
        # multi-environment gateway use it as their HTTP(S) proxy, which resolves names itself.
        return ALLOWS_NOTHING if policy.proves_environment else policy.spec_of(None) or ALLOWS_NOTHING

    return [
        Guarantees(),
        AuditLog(log),
        UpstreamTrust(),
        policy,
        MetricsListener(readiness, metrics_server, metrics_listen),
        Workers(),
        # Our hooks fail closed: an exception refuses the request/connection (failsafe.py).
        # The environment gate answers 407 before the guard decides anything.
        fail_closed(gate),
        fail_closed(guard),
        # Token sources, query/replace/sign, then the static transform headers (and the audit line).
        fail_closed(CredentialPlacement(gate.spec_for, log, lambda: guard.parent)),
        fail_closed(CredentialInjector(log)),
        # Server-sent events and other responses of unknown length reach the client as they come.
        fail_closed(StreamUnsizedResponses()),
        # Injected secrets that come back in a response are masked (after streaming is decided).
        fail_closed(EchoScrubbing()),
        # No 101 the proxy could not follow: the connection would turn into unchecked raw TCP.
        fail_closed(ProtocolSwitches()),
        fail_closed(ConnectionLimits()),
        # HTTP/2 rapid reset (CVE-2023-44487): a connection that keeps cancelling streams is closed.
        fail_closed(StreamResetLimit()),
        # The DNS listener (egress_dns_listen); idle without it.
        fail_closed(DnsFilter(dns_spec, checker.local.__contains__, log)),
        # Last of the requestheaders hooks that refuse: a refused `Expect: 100-continue`
        # request gets its answer instead of `100 Continue` (egress.mitm.patches.early_answers).
        fail_closed(NoContinueForRefusals()),
        Timings(),
        # Frees what finished flows and closed connections leave in reference cycles (OpenSSL
        # buffers among it) every second or so, not after hundreds of connections (gc_pacing.py).
        PacedCollection(),
        readiness,
    ]
