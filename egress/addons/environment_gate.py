"""EnvironmentGate: which environment's spec a client connection is held to.

Runs before DestinationGuard. With `--spec-dir` a client proves its environment
with `Proxy-Authorization: Basic base64(ENV_ID:TOKEN)`:

- `http_connect`     a CONNECT must carry it; the tunnel, and everything in it,
                     belongs to that environment. Else 407.
- `http_connected`   the CONNECT was answered 2xx: from here on the connection is
                     that tunnel (a refused CONNECT leaves a plain connection).
- `requestheaders`   a plain-HTTP request must carry it (each one, as HTTP proxies
                     expect); a request in a tunnel was proven by its CONNECT.
                     Else 407.
- A failed proof with credentials (wrong, malformed, unknown environment) also
  closes the connection; a request without any keeps it (the usual challenge).
- The first proof binds the client connection to its environment for its life:
  a later request (or CONNECT) with other credentials is refused with 407 and the
  connection is closed. A removed environment refuses its bound connections' new
  requests with 407 too.
- Binding counts against `egress_max_connections_per_environment` (429 and close).
- `Proxy-Authorization` is removed from every request before anything else sees
  it (also with `--spec`, where it is not checked): it never goes upstream, into a
  log line or a metric.

The guard asks `spec_for(client_id)`; an unbound client (which only happens if a
check is skipped) gets a spec that allows nothing: fail closed.
"""

from __future__ import annotations

import logging

from mitmproxy import connection, ctx, http

from egress.addons.limits import REFUSED
from egress.addons.policy_source import ALLOWS_NOTHING, PolicySource
from egress.environments.source import SpecSource
from egress.mitm import refusals
from egress.net.limits import DEFAULTS
from egress.ops.audit import DecisionLog, client_label
from egress.policy import decisions as policy
from egress.policy.domains import HostError, normalize_host
from egress.policy.spec import Spec
from egress.wire import proxy_auth

logger = logging.getLogger(__name__)


def _host(raw: str) -> str:
    try:
        return normalize_host(raw)
    except HostError:
        return raw[:255]



class EnvironmentGate:
    def __init__(self, source: PolicySource | SpecSource, log: DecisionLog):
        self.source = source  # proves_environment False: --spec, one environment, no proxy auth
        self.log = log
        self.bound: dict[str, str] = {}  # client id -> environment
        self.tunnels: set[str] = set()  # client ids whose CONNECT was answered: all later traffic is in it
        self.per_environment: dict[str, int] = {}

    def load(self, loader) -> None:
        loader.add_option(
            "egress_max_connections_per_environment", int, DEFAULTS["egress_max_connections_per_environment"],
            "--spec-dir: client connections bound to one environment at once; more are refused with 429. 0 disables.",
        )  # fmt: skip

    def spec_for(self, client_id: str) -> Spec:
        spec = self.source.spec_of(self.bound.get(client_id) if self.source.proves_environment else None)
        return spec if spec is not None else ALLOWS_NOTHING

    # -- hooks ------------------------------------------------------------------------
    def http_connect(self, flow: http.HTTPFlow) -> None:
        header = flow.request.headers.pop(proxy_auth.HEADER, None)
        if self.source.proves_environment:
            self._admit(flow, header)

    def http_connected(self, flow: http.HTTPFlow) -> None:
        # Only a CONNECT that was answered 2xx opens a tunnel whose requests its proof covers.
        # One the guard refused (403) or could not dial (502) leaves the connection a plain
        # one: its later requests must prove the same environment again (otherwise
        # they would be taken as "in the tunnel" and served with other or no credentials).
        if self.source.proves_environment and flow.client_conn.id in self.bound:
            self.tunnels.add(flow.client_conn.id)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        header = flow.request.headers.pop(proxy_auth.HEADER, None)
        if not self.source.proves_environment or flow.response is not None:
            return
        client = flow.client_conn
        if client.id in self.tunnels:
            # Proven by the CONNECT; the header inside the tunnel was the origin's business.
            environment = self.bound.get(client.id, "")
            if self.source.spec_of(environment) is None:
                self._refuse(flow, environment, close=False)
            return
        self._admit(flow, header)

    def client_disconnected(self, client: connection.Client) -> None:
        self.tunnels.discard(client.id)
        environment = self.bound.pop(client.id, None)
        if environment is not None:
            left = self.per_environment.get(environment, 1) - 1
            if left > 0:
                self.per_environment[environment] = left
            else:
                self.per_environment.pop(environment, None)

    # -- deciding -----------------------------------------------------------------------
    def _admit(self, flow: http.HTTPFlow, header: str | None) -> bool:
        """Check the credentials of a CONNECT or plain-HTTP request; answer it if they fail."""
        client = flow.client_conn
        result = proxy_auth.authenticate(header, self.source.spec_of)
        bound = self.bound.get(client.id)
        if bound is not None:
            if result.environment != bound or self.source.spec_of(bound) is None:
                # One connection, one environment: switching is refused and ends the connection.
                self._refuse(flow, result.named or bound, close=True)
                return False
            return True
        if result.environment is None:
            # Absent credentials are the usual challenge before a client sends them: keep the
            # connection. Wrong ones end it, so guessing tokens costs a connection each.
            self._refuse(flow, result.named, close=header is not None)
            return False
        cap = ctx.options.egress_max_connections_per_environment
        if cap and self.per_environment.get(result.environment, 0) >= cap:
            REFUSED.labels("per_environment").inc()
            logger.warning("refused a connection of environment %s: %d connections open", result.environment, cap)
            flow.response = refusals.connection_limit(_host(flow.request.host))
            return False
        self.bound[client.id] = result.environment
        self.per_environment[result.environment] = self.per_environment.get(result.environment, 0) + 1
        return True

    def _refuse(self, flow: http.HTTPFlow, environment: str, close: bool) -> None:
        host = _host(flow.request.host)
        flow.response = refusals.proxy_auth_required(host, close)
        decision = policy.Decision(host=host, reason=policy.PROXY_AUTH_REQUIRED, environment=environment)
        method = flow.request.method
        self.log.record(decision, client=client_label(flow.client_conn.peername), port=flow.request.port, method=method,
                        kind="tunnel" if method == "CONNECT" else "request")  # fmt: skip
