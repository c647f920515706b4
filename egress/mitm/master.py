"""A lean mitmproxy master: only the addons an egress proxy needs.

`mitmdump` loads about 35 addons and dispatches every event to each of them;
here the chain is mitmproxy's core, proxy server, next-layer and TLS addons plus
ours, in the order the decisions must happen (guard before injector).
"""

from __future__ import annotations

from pathlib import Path

from mitmproxy import master, options
from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig

from egress.addons import dns_layer
from egress.addons.credentials import CredentialPlacement, EchoScrubbing
from egress.addons.dns_filter import DnsFilter
from egress.addons.environment_gate import ALLOWS_NOTHING, EnvironmentGate
from egress.addons.failsafe import fail_closed, fail_closed_call, fault_injected
from egress.addons.gc_pacing import PacedCollection
from egress.addons.guard import DestinationGuard
from egress.addons.inject import CredentialInjector
from egress.addons.limits import ConnectionLimits
from egress.addons.readiness import Readiness
from egress.addons.reloader import SpecReloader
from egress.addons.stream_resets import StreamResetLimit
from egress.addons.streaming import StreamUnsizedResponses
from egress.addons.timings import Timings
from egress.addons.upgrades import ProtocolSwitches
from egress.environments.registry import EnvironmentRegistry
from egress.environments.single import SpecHolder
from egress.mitm.event_cache import HookDispatcher
from egress.mitm.patches.buffered_requests import install_buffered_requests
from egress.mitm.patches.debug_checks import skip_message_type_checks
from egress.mitm.patches.early_answers import NoContinueForRefusals, install_early_answers
from egress.mitm.patches.error_pages import install_error_pages
from egress.mitm.patches.h1_trailers import install_trailer_refusal
from egress.net.destinations import DestinationChecker
from egress.net.parent_proxy import ParentProxy
from egress.net.resolver import LocalAddresses
from egress.ops.audit import DecisionLog


def build_master(
    holder: SpecHolder | EnvironmentRegistry,
    *,
    listen_host: str,
    listen_port: int,
    mode: str,
    confdir: str,
    upstream_ca: str | None,
    extra_options: dict[str, str],
    log: DecisionLog,
    readiness: Readiness,
    dns_listen: tuple[str, int] | None = None,
    parent: ParentProxy | None = None,
) -> master.Master:
    opts = options.Options()
    m = master.Master(opts, with_termlog=True)
    HookDispatcher.install(m)  # hooks found once per event name, not per event
    install_trailer_refusal()  # HTTP/1 trailers: closed, not a crash and a hang (egress.mitm.patches.h1_trailers)
    install_error_pages()  # mitmproxy's own 4xx/5xx: JSON, no version banner (egress.mitm.patches.error_pages)
    install_early_answers()  # a refusal at the head of a large upload is answered (egress.mitm.patches.early_answers)
    install_buffered_requests()  # a body SigV4 must hash is read first (egress.mitm.patches.buffered_requests)
    skip_message_type_checks()  # mitmproxy's debug-only checks, 5.8 % of the busy path (egress.mitm.patches.debug_checks)
    # Which spec a client connection is held to: the one spec (--spec), or its environment's (--spec-dir).
    if isinstance(holder, EnvironmentRegistry):
        gate = EnvironmentGate(holder, None, log)
    else:
        one = holder
        gate = EnvironmentGate(None, lambda: one.spec, log)
    local = LocalAddresses([listen_host, *([dns_listen[0]] if dns_listen else [])])
    checker = DestinationChecker(gate.spec_for, local)
    m.addons.add(
        core.Core(),
        proxyserver.Proxyserver(),
        # Our hooks fail closed: an exception refuses the request/connection (failsafe.py).
        # The guard comes before mitmproxy's NextLayer: its `next_layer` decides a tunnel
        # on the complete ClientHello before TLS layers are stacked (or waits for it).
        # The environment gate answers 407 before the guard decides anything.
        fail_closed(gate),
        fail_closed(DestinationGuard(checker, log, parent)),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        errorcheck.ErrorCheck(),
        # Token sources, query/replace/sign, then the static transform headers (and the audit line).
        fail_closed(CredentialPlacement(gate.spec_for, log, parent)),
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
        # Last of the requestheaders hooks that refuse: a refused `Expect: 100-continue`
        # request gets its answer instead of `100 Continue` (egress.mitm.patches.early_answers).
        fail_closed(NoContinueForRefusals()),
        Timings(),
        # Frees what finished flows and closed connections leave in reference cycles (OpenSSL
        # buffers among it) every second or so, not after hundreds of connections (collector.py).
        PacedCollection(),
        SpecReloader(holder),
        readiness,
    )
    if dns_listen:
        # A DNS query carries no proof of environment: with --spec-dir no environment's
        # allowlist applies and every name is NXDOMAIN. Sandboxes of a multi-environment
        # gateway use it as their HTTP(S) proxy, which resolves names itself.
        dns_spec = (lambda: ALLOWS_NOTHING) if isinstance(holder, EnvironmentRegistry) else (lambda: holder.spec)
        dns_filter = DnsFilter(dns_spec, local.__contains__, log)
        m.addons.add(fail_closed(dns_filter))
        # The fast path is left out while a test fault is set for the hook: that must
        # show the full path failing closed, and the fast path falls back to it anyway.
        fast = None if fault_injected("DnsFilter", "dns_request") else dns_filter.answer_datagram
        dns_layer.install(fail_closed_call("DnsFilter", "dns_request", dns_filter.answer_now), fast)
    settings: dict[str, object] = dict(
        listen_host=listen_host,
        listen_port=listen_port,
        mode=listen_modes(mode, listen_host, listen_port) + (dns_modes(*dns_listen) if dns_listen else []),
        confdir=confdir,
        # mitmproxy dials only when a request needs it, after every check has run; the
        # guard itself dials a CONNECT's checked address before answering `200`.
        connection_strategy="lazy",
        # Bodies above 64 KiB (and every body of unknown length, addons/streaming.py)
        # stream through instead of being buffered: memory stays
        # flat whatever the sandbox downloads (no addon of ours reads a body; headers
        # are still injected). At 1m, sixteen 1 MiB downloads took RSS from 78 to
        # 220 MB and it stayed at 180; at 64k it peaks below 100 (docs/benchmarks.md).
        stream_large_bodies="64k",
        termlog_verbosity="warn",
    )
    if upstream_ca:
        settings["ssl_verify_upstream_trusted_ca"] = upstream_ca
    opts.update(**settings)
    opts.set(*(f"{k}={v}" for k, v in extra_options.items()))
    return m


def listen_modes(mode: str, listen_host: str, listen_port: int) -> list[str]:
    """mitmproxy modes to run; transparent on loopback listens on both loopbacks.

    nftables `redirect` delivers redirected IPv4 connections to 127.0.0.1 and IPv6
    ones to ::1, so a transparent proxy on one loopback also takes the other (IPv6
    only where the namespace has ::1), staying unreachable from outside the pod.
    """
    if mode != "transparent":
        return [mode]
    return [mode, *(f"transparent@{other}:{listen_port}" for other in _loopback_hosts(listen_host)[1:])]


def dns_modes(host: str, port: int) -> list[str]:
    """The `dns@` listeners (UDP and TCP each); on loopback both loopbacks, as `listen_modes`.

    The sandbox's redirected DNS arrives on 127.0.0.1 (IPv4) or ::1 (IPv6 packets to
    port 53), like its TCP.
    """
    return [f"dns@{h}:{port}" for h in _loopback_hosts(host)]


def _loopback_hosts(host: str) -> list[str]:
    """`host`, and the other loopback when `host` is one (::1 only where the namespace has it)."""
    other = {"127.0.0.1": "::1", "::1": "127.0.0.1"}.get(host)
    if other is None or (other == "::1" and not _has_ipv6_loopback()):
        return [host]
    return [host, other]


def _has_ipv6_loopback() -> bool:
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[0] == "0" * 31 + "1" for line in lines if line.strip())

