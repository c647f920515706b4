"""Every change egress makes to mitmproxy's internals, in one place.

mitmproxy has no extension point for these: each module here replaces one method
or module global of mitmproxy, written against exactly one mitmproxy release.
`install_all()` checks that release (and that every target still has the shape its
patch expects) before changing anything, so a different mitmproxy refuses to start
with a clear message instead of misbehaving silently.

| module             | target                                            | why |
|--------------------|---------------------------------------------------|-----|
| buffered_requests  | `HttpStream.check_body_size`                      | a body SigV4 re-signing must hash is read before the request is sent |
| connect_handoff    | `proxy.server.asyncio` (module global)            | an intercepted tunnel reuses the connection dialled at CONNECT; mitmproxy's connects go through `--upstream-proxy` |
| dns_listener       | `DnsInstance.make_top_layer`, `.start_udp_based_server` | the DNS listener answers every query itself, on the event loop |
| early_answers      | `HttpStream.start_request_stream`                 | a refusal at the head of a large upload is answered at once |
| error_pages        | `_http1.make_error_response`, `_http2.version`    | mitmproxy's own error pages: JSON, no version banner |
| h1_trailers        | `Http1Connection.read_body`                       | HTTP/1 trailers close the connection instead of crashing the layer |
| head_limit         | `Http1Server.read_headers`, `Http1Client.read_headers` | HTTP/1 heads bounded (431 / 502) |
| h2_floods          | `Http2Server.handle_h2_event`                     | HTTP/2 rapid reset and PING/SETTINGS floods close the connection |
| skip_type_checks   | `http.MessageData.__post_init__`                  | mitmproxy's debug-only type check, 5.8 % of the busy path |
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

import mitmproxy.version

from egress.mitm.patches import (
    buffered_requests,
    connect_handoff,
    dns_listener,
    early_answers,
    error_pages,
    h1_trailers,
    h2_floods,
    head_limit,
    skip_type_checks,
)

# The mitmproxy release every patch here was written and tested against (pyproject.toml pins it).
MITMPROXY_VERSION = "12.3.1"


class PatchError(RuntimeError):
    """mitmproxy is not the release the patches were written for."""


@dataclass(frozen=True)
class Target:
    """One attribute of mitmproxy a patch replaces, and the shape the patch relies on."""

    module: str
    path: str  # attribute path inside the module: "Class.method" or "name"
    kind: str  # "generator", "coroutine", "function" or "module"
    params: tuple[str, ...] = ()  # the replaced callable's parameters, in order

    def problem(self) -> str | None:
        """None when the target is there with this shape, else what differs."""
        try:
            obj: object = importlib.import_module(self.module)
        except ImportError as exc:
            return f"{self.module}: cannot import ({exc})"
        for part in self.path.split("."):
            if not hasattr(obj, part):
                return f"{self.module}.{self.path}: missing"
            obj = getattr(obj, part)
        if self.kind == "module":
            return None if inspect.ismodule(obj) else f"{self.module}.{self.path}: not a module"
        checks = {"generator": inspect.isgeneratorfunction, "coroutine": inspect.iscoroutinefunction}
        if not callable(obj) or (self.kind in checks and not checks[self.kind](obj)):
            return f"{self.module}.{self.path}: not a {self.kind} function"
        params = tuple(inspect.signature(obj).parameters)
        if self.params and params != self.params:
            return f"{self.module}.{self.path}: parameters {params}, the patch expects {self.params}"
        return None


_HTTP1 = "mitmproxy.proxy.layers.http._http1"
TARGETS: dict[str, tuple[Target, ...]] = {
    "buffered_requests": (Target("mitmproxy.proxy.layers.http", "HttpStream.check_body_size", "generator", ("self", "request")),),
    "connect_handoff": (
        Target("mitmproxy.proxy.server", "asyncio", "module"),
        Target("asyncio", "open_connection", "coroutine"),
    ),
    "dns_listener": (
        Target("mitmproxy.proxy.mode_servers", "DnsInstance.make_top_layer", "function", ("self", "context")),
        Target("mitmproxy.proxy.mode_servers", "DnsInstance.start_udp_based_server", "coroutine", ("self", "host", "port")),
        Target("mitmproxy.proxy.layers.dns", "DNSLayer", "function"),
    ),
    "early_answers": (Target("mitmproxy.proxy.layers.http", "HttpStream.start_request_stream", "generator", ("self",)),),
    "error_pages": (
        Target(_HTTP1, "make_error_response", "function", ("status_code", "message")),
        Target("mitmproxy.proxy.layers.http._http2", "version", "module"),
    ),
    "h1_trailers": (Target(_HTTP1, "Http1Connection.read_body", "generator", ("self", "event")),),
    "head_limit": (
        Target(_HTTP1, "Http1Server.read_headers", "generator", ("self", "event")),
        Target(_HTTP1, "Http1Client.read_headers", "generator", ("self", "event")),
    ),
    "h2_floods": (Target("mitmproxy.proxy.layers.http._http2", "Http2Server.handle_h2_event", "generator", ("self", "event")),),
    "skip_type_checks": (Target("mitmproxy.http", "MessageData.__post_init__", "function", ("self",)),),
}
_INSTALLERS = {
    "buffered_requests": buffered_requests.install,
    "connect_handoff": connect_handoff.install,
    "dns_listener": dns_listener.install,
    "early_answers": early_answers.install,
    "error_pages": error_pages.install,
    "h1_trailers": h1_trailers.install,
    "head_limit": head_limit.install,
    "h2_floods": h2_floods.install,
    "skip_type_checks": skip_type_checks.install,
}
_installed = False


def problems() -> list[str]:
    """What keeps the patches from being installed on the running mitmproxy (empty: nothing)."""
    found = []
    if mitmproxy.version.VERSION != MITMPROXY_VERSION:
        found.append(f"mitmproxy {mitmproxy.version.VERSION} is installed; egress needs mitmproxy {MITMPROXY_VERSION}")
    for targets in TARGETS.values():
        found.extend(p for t in targets if (p := t.problem()) is not None)
    return found


def install_all() -> None:
    """Install every patch, once per process; PatchError (nothing changed) on another mitmproxy."""
    global _installed
    if _installed:
        return
    found = problems()
    if found:
        raise PatchError("; ".join(found) + f" (pip install mitmproxy=={MITMPROXY_VERSION})")
    for install in _INSTALLERS.values():
        install()
    _installed = True
