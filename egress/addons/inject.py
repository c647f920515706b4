"""CredentialInjector: put an allowlist entry's `transform` headers on the wire.

Runs after DestinationGuard. Credentials are added only to requests that
- the guard allowed under an entry with a transform (not merely reported), and
- travel over TLS that the proxy terminates on the client side and originates,
  verified, on the server side (scheme https: mitmproxy verifies upstream
  certificates unless `ssl_insecure`, which egress-proxy refuses to start with).
A header the client sent under the same name is replaced, never kept beside ours.
"""

from __future__ import annotations

from mitmproxy import http

from egress.addons.credentials import INJECTED_KEY
from egress.addons.guard import DECISION_KEY
from egress.ops.audit import DecisionLog, client_label
from egress.policy.decisions import Decision


class CredentialInjector:
    def __init__(self, log: DecisionLog):
        self.log = log

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        decision: Decision | None = flow.metadata.get(DECISION_KEY)
        if decision is None or not decision.allowed or flow.response is not None:
            return
        injected: tuple[str, ...] = ()
        if decision.transform and flow.request.scheme == "https" and flow.client_conn.tls:
            for name, secret in decision.transform.items():
                flow.request.headers[name] = secret.reveal()  # replaces every same-named header
            injected = tuple(decision.transform)
        # What egress.addons.credentials placed before us (${credential:} headers, query, replace, sign).
        injected += flow.metadata.get(INJECTED_KEY, ())
        self.log.record(
            decision,
            client=client_label(flow.client_conn.peername),
            port=flow.request.port,
            method=flow.request.method,
            injected=injected,
        )
