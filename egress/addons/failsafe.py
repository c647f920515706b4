"""Fail closed: an exception in one of our hooks refuses what the hook was deciding on.

mitmproxy's addon manager catches an exception raised by a hook, logs it and
carries on with the flow, so a check that crashes would let its request through
unchecked. `fail_closed(addon)` wraps every event hook of one of our addons
(at registration, in `egress.mitm.master`) so that instead

- request-phase hooks (`http_connect`, `requestheaders`, `request`) answer
  403 with reason `internal_error` (our extension of SPEC §3's reason codes);
  response-phase hooks replace the response with 502 `internal_error`,
- `dns_request` answers SERVFAIL instead of whatever it had decided,
- `next_layer` and `tls_clienthello` refuse the tunnel (nothing is sent upstream,
  the client sees a close), `server_connect` refuses the upstream connection (502),
  `client_connected` refuses the client connection,
- bookkeeping hooks (`client_disconnected`, `server_connected`, ...) decide
  nothing, so their errors are only logged and counted.

Each error is logged once, with the hook, the exception type and where it was
raised, never its message or any header value (they may hold a secret), and is
counted in `egress_internal_errors_total{hook}`. The proxy keeps serving.

Test-only: `EGRESS_TEST_FAULT=[ADDON.]HOOK[@HOST][,...]`, read when an addon is
wrapped, makes HOOK (of every addon, or of the addon class named ADDON) raise
before our code runs, only for destination HOST when given.
Unset, it does nothing. End-to-end tests use it to show that the proxy fails closed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import traceback
from collections.abc import Callable
from typing import Any

import mitmproxy.proxy.layers  # noqa: F401  (registers the HTTP/TLS/TCP hooks in `hooks.all_hooks`)
from mitmproxy import connection, dns, exceptions, hooks, http, tls
from mitmproxy.proxy import layer, server_hooks

from egress.addons.tunnel import RefuseLayer
from egress.mitm import refusals
from egress.ops import metrics
from egress.policy import decisions as policy

logger = logging.getLogger(__name__)

INTERNAL_ERRORS = metrics.INTERNAL_ERRORS
TEST_FAULT_ENV = "EGRESS_TEST_FAULT"

_REQUEST_HOOKS = frozenset({"http_connect", "requestheaders", "request", "http_connect_upstream"})
_RESPONSE_HOOKS = frozenset({"responseheaders", "response"})
# Lifecycle hooks are not wrapped: a failing `load`/`configure` must stop start-up.
_LIFECYCLE_HOOKS = frozenset({"load", "configure", "running", "done", "update", "add_log"})


class InjectedFault(RuntimeError):
    """Raised by EGRESS_TEST_FAULT (tests only)."""


def _test_faults() -> dict[str, str | None]:
    faults: dict[str, str | None] = {}
    for item in filter(None, (part.strip() for part in os.environ.get(TEST_FAULT_ENV, "").split(","))):
        hook, _, host = item.partition("@")
        faults[hook] = host.lower() or None
    return faults


def _subject(data: Any) -> tuple[str, str]:
    """(destination host, client address) of a hook's argument, for the log line and test faults."""
    if isinstance(data, http.HTTPFlow):
        return data.request.host, _peer(data.client_conn)
    if isinstance(data, tls.ClientHelloData):
        return data.client_hello.sni or "", _peer(data.context.client)
    if isinstance(data, server_hooks.ServerConnectionHookData):
        host = data.server.address[0] if data.server.address else ""
        return str(host), _peer(data.client)
    if isinstance(data, connection.Client):
        return "", _peer(data)
    if isinstance(data, dns.DNSFlow):
        question = data.request.question if data.request else None
        return (question.name if question else ""), _peer(data.client_conn)
    if isinstance(data, layer.NextLayer):
        address = data.context.server.address
        return (str(address[0]) if address else ""), _peer(data.context.client)
    return "", ""


def _peer(client: connection.Client) -> str:
    if not client.peername:
        return ""
    host, port, *_ = client.peername
    return f"{host}:{port}"


def _refuse(hook: str, data: Any) -> str:
    """Make the hook's subject fail closed; returns what was done, for the log line."""
    if isinstance(data, http.HTTPFlow):
        if hook in _REQUEST_HOOKS:
            data.response = refusals.internal_error(403, data.request.host)
            return "request refused"
        if hook in _RESPONSE_HOOKS:
            data.response = refusals.internal_error(502, data.request.host)
            return "response replaced"
    elif isinstance(data, tls.ClientHelloData):
        # Neither intercept nor forward: the passthrough layer's upstream connection
        # is refused before it opens, which closes the client's.
        data.ignore_connection = True
        data.context.server.error = f"egress: {policy.INTERNAL_ERROR}"
        return "tunnel refused"
    elif isinstance(data, layer.NextLayer):
        # Nothing is stacked that could reach the upstream: the client connection is closed.
        data.layer = RefuseLayer(data.context)
        return "tunnel refused"
    elif isinstance(data, server_hooks.ServerConnectionHookData) and hook == "server_connect":
        data.server.error = f"egress: {policy.INTERNAL_ERROR}"
        return "upstream connection refused"
    elif isinstance(data, dns.DNSFlow) and hook == "dns_request":
        data.response = None  # the DNS layer answers SERVFAIL (egress/addons/dns_layer.py)
        data.metadata.clear()
        return "query answered SERVFAIL"
    elif isinstance(data, connection.Client) and hook == "client_connected":
        data.error = f"egress: {policy.INTERNAL_ERROR}"
        return "client connection refused"
    return "nothing to refuse"


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}"


def _handle(owner: str, hook: str, data: Any, exc: Exception) -> None:
    INTERNAL_ERRORS.labels(hook).inc()
    action = _refuse(hook, data)
    host, client = _subject(data)
    # The exception's message is left out on purpose: it may quote a header value.
    logger.error(
        "internal error in %s.%s (%s at %s), %s (fail closed): host=%s client=%s",
        owner, hook, type(exc).__name__, _where(exc), action, host[:255] or "-", client or "-",
    )  # fmt: skip


def _wrap(owner: str, hook: str, func: Callable, fault_host: str | None | bool) -> Callable:
    def maybe_fault(data: Any) -> None:
        if fault_host is not False and (fault_host is None or _subject(data)[0].lower() == fault_host):
            raise InjectedFault(f"{TEST_FAULT_ENV}: {hook}")

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def guarded_async(data: Any, *rest: Any) -> Any:
            try:
                maybe_fault(data)
                return await func(data, *rest)
            except exceptions.AddonHalt:
                raise  # not an error: "decide later" (next_layer waiting for more bytes)
            except Exception as exc:
                _handle(owner, hook, data, exc)

        return guarded_async

    @functools.wraps(func)
    def guarded(data: Any, *rest: Any) -> Any:
        try:
            maybe_fault(data)
            return func(data, *rest)
        except exceptions.AddonHalt:
            raise
        except Exception as exc:
            _handle(owner, hook, data, exc)

    return guarded


def fail_closed[A](addon: A) -> A:
    """Wrap every event hook `addon` defines (instance attributes shadow the class's methods)."""
    faults = _test_faults()
    owner = type(addon).__name__
    for name in hooks.all_hooks:
        if name in _LIFECYCLE_HOOKS:
            continue
        func = getattr(addon, name, None)
        if not callable(func):
            continue
        key = f"{owner}.{name}" if f"{owner}.{name}" in faults else name
        fault_host: str | None | bool = faults[key] if key in faults else False
        setattr(addon, name, _wrap(owner, name, func, fault_host))
    return addon


def fault_injected(owner: str, hook: str) -> bool:
    """Whether EGRESS_TEST_FAULT names `owner.hook` or `hook` (tests only)."""
    faults = _test_faults()
    return f"{owner}.{hook}" in faults or hook in faults


def fail_closed_call[F: Callable](owner: str, hook: str, func: F) -> F:
    """`func`, called by a layer in place of `hook`, guarded like that hook.

    An exception is counted under `hook`, its subject refused as the hook's would be,
    and the call returns None (so a caller can tell "failed closed" from a result).
    EGRESS_TEST_FAULT for `owner.hook` / `hook` applies to it too.
    """
    faults = _test_faults()
    key = f"{owner}.{hook}" if f"{owner}.{hook}" in faults else hook
    fault_host: str | None | bool = faults[key] if key in faults else False
    return _wrap(owner, hook, func, fault_host)  # type: ignore[return-value]
