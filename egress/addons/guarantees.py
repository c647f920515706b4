"""Guarantees: the mitmproxy options that would weaken what egress guarantees, refused.

`egress-proxy run` refuses them on its command line; this addon refuses them wherever
the chain runs (as a mitmproxy script too, and when changed later in mitmweb), and
sets what the chain relies on: upstream connections opened only after the destination
was checked (`connection_strategy=lazy`), and large bodies streamed, not buffered.
"""

from __future__ import annotations

from mitmproxy import ctx

from egress.addons.refuse import refuse

# option -> (the value the guarantees need, why another is refused)
WEAKENING = {
    "ssl_insecure": (False, "upstream certificates are always verified before credentials are sent"),
    "ignore_hosts": ([], "passthrough is decided by the allowlist (entries without transform)"),
    "allow_hosts": ([], "the allowlist decides which hosts are reached"),
    "upstream_cert": (True, "the client's certificate must name the checked upstream"),
    "map_remote": ([], "it would change a request's destination after the allowlist checked it"),
    "flow_detail": (None, "above 1 it prints request headers, injected credentials among them"),
    "save_stream_file": (None, "it would write flows, injected credentials among them, to a file"),
    "hardump": ("", "it would write flows, injected credentials among them, to a file"),
}
LAZY = "lazy"
STREAM_ABOVE = "64k"


def _weakened(name: str, value: object) -> bool:
    needed, _ = WEAKENING[name]
    if name == "flow_detail":
        return isinstance(value, int) and value > 1
    if needed is None:
        return bool(value)
    return value != needed


class Guarantees:
    def configure(self, updated: set[str]) -> None:
        for name in sorted(updated & WEAKENING.keys()):
            if name in ctx.options.keys() and _weakened(name, getattr(ctx.options, name)):
                refuse(f"{name}: refused while egress is loaded: {WEAKENING[name][1]}")
                return
        if "connection_strategy" in updated and ctx.options.connection_strategy != LAZY:
            ctx.options.update(connection_strategy=LAZY)
        if "stream_large_bodies" in updated and ctx.options.stream_large_bodies is None:
            # Memory stays flat whatever the sandbox downloads (docs/benchmarks.md).
            ctx.options.update(stream_large_bodies=STREAM_ABOVE)
