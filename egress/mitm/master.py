"""A lean mitmproxy master: only the addons an egress proxy needs.

`mitmdump` loads about 35 addons and dispatches every event to each of them;
here the chain is mitmproxy's core, proxy server, next-layer and TLS addons plus
ours, in the order the decisions must happen (guard before injector).
"""

from __future__ import annotations

from mitmproxy import master, options
from mitmproxy.addons import core, errorcheck, next_layer, proxyserver, tlsconfig

from egress.addons import chain
from egress.addons.guard import DestinationGuard
from egress.addons.readiness import Readiness
from egress.environments.source import SpecSource
from egress.mitm import patches
from egress.mitm.event_cache import HookDispatcher
from egress.net.listen_modes import dns_modes, listen_modes
from egress.net.parent_proxy import ParentProxy
from egress.ops.audit import DecisionLog


def build_master(
    source: SpecSource,
    *,
    listen_host: str,
    listen_port: int,
    mode: str,
    confdir: str,
    egress_options: dict[str, object],
    extra_options: dict[str, str],
    log: DecisionLog,
    readiness: Readiness,
    dns_listen: tuple[str, int] | None = None,
    parent: ParentProxy | None = None,
    metrics_server=None,
    count_reloads: bool = True,
) -> master.Master:
    """The master `egress-proxy run` runs: `egress_options` are the `egress_*` options its
    flags set; what it loaded or bound already (`source`, `parent`, `metrics_server`) is
    handed to the chain so that nothing is loaded twice."""
    opts = options.Options()
    m = master.Master(opts, with_termlog=True)
    HookDispatcher.install(m)  # hooks found once per event name, not per event
    patches.install_all()  # every change to mitmproxy internals (egress/mitm/patches/)
    ours = chain(
        source,
        log=log,
        readiness=readiness,
        parent=parent,
        parent_from=(egress_options.get("egress_upstream_proxy"), egress_options.get("egress_upstream_proxy_auth")),
        metrics_server=metrics_server,
        metrics_listen=str(egress_options.get("egress_metrics_listen", "")),
        count_reloads=count_reloads,
    )
    # mitmproxy's NextLayer right after the guard, whose `next_layer` decides first.
    after_guard = next(i for i, addon in enumerate(ours) if isinstance(addon, DestinationGuard)) + 1
    m.addons.add(
        core.Core(),
        proxyserver.Proxyserver(),
        *ours[:after_guard],
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        errorcheck.ErrorCheck(),
        *ours[after_guard:],
    )
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
        **egress_options,
    )
    opts.update(**settings)
    opts.set(*(f"{k}={v}" for k, v in extra_options.items()))
    return m
