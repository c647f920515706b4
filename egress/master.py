"""A lean mitmproxy master: only the addons an egress proxy needs.

`mitmdump` loads about 35 addons and dispatches every event to each of them;
here the chain is mitmproxy's core, proxy server, next-layer and TLS addons plus
ours, in the order the decisions must happen (guard before injector).
"""

from __future__ import annotations

from pathlib import Path

from mitmproxy import master, options
from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig

from egress.addons.failsafe import fail_closed
from egress.addons.guard import DestinationGuard
from egress.addons.inject import CredentialInjector
from egress.addons.lifecycle import Readiness
from egress.addons.limits import ConnectionLimits
from egress.addons.observe import Timings
from egress.addons.reloader import SpecReloader
from egress.audit import DecisionLog
from egress.destinations import DestinationChecker
from egress.dispatch import HookDispatcher
from egress.reload import SpecHolder
from egress.resolver import LocalAddresses


def build_master(
    holder: SpecHolder,
    *,
    listen_host: str,
    listen_port: int,
    mode: str,
    confdir: str,
    upstream_ca: str | None,
    extra_options: dict[str, str],
    log: DecisionLog,
    readiness: Readiness,
) -> master.Master:
    opts = options.Options()
    m = master.Master(opts, with_termlog=True)
    HookDispatcher.install(m)  # hooks found once per event name, not per event
    checker = DestinationChecker(lambda: holder.spec, LocalAddresses([listen_host]))
    m.addons.add(
        core.Core(),
        proxyserver.Proxyserver(),
        # Our hooks fail closed: an exception refuses the request/connection (failsafe.py).
        # The guard comes before mitmproxy's NextLayer: its `next_layer` decides a tunnel
        # on the complete ClientHello before TLS layers are stacked (or waits for it).
        fail_closed(DestinationGuard(checker, log)),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        errorcheck.ErrorCheck(),
        fail_closed(CredentialInjector(log)),
        fail_closed(ConnectionLimits()),
        Timings(),
        SpecReloader(holder),
        readiness,
    )
    settings: dict[str, object] = dict(
        listen_host=listen_host,
        listen_port=listen_port,
        mode=listen_modes(mode, listen_host, listen_port),
        confdir=confdir,
        # mitmproxy dials only when a request needs it, after every check has run; the
        # guard itself dials a CONNECT's checked address before answering `200`.
        connection_strategy="lazy",
        # Bodies above 64 KiB stream through instead of being buffered: memory stays
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
    other = {"127.0.0.1": "::1", "::1": "127.0.0.1"}.get(listen_host)
    if mode != "transparent" or other is None or (other == "::1" and not _has_ipv6_loopback()):
        return [mode]
    return [mode, f"transparent@{other}:{listen_port}"]


def _has_ipv6_loopback() -> bool:
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[0] == "0" * 31 + "1" for line in lines if line.strip())

