"""Credentials beyond static headers, on the wire; and the echoes scrubbed on the way back.

`CredentialPlacement` (before `CredentialInjector`, after `DestinationGuard`), for
requests the guard allowed under an entry with credentials, over TLS the proxy
terminated and originates verified (as for static transforms):
- `requestheaders`: the tokens the entry names (`egress.credentials.lifecycle`; a
  source that gives none answers 502 credential_unavailable, the request never
  leaves); `${credential:}` headers, `query`, `replace`; `sign` re-signs here when the
  client sent its payload hash, else asks for the body to be buffered (bounded);
- `request`: re-signs requests whose body had to be read first.
`EchoScrubbing` (after `StreamUnsizedResponses`): every secret this addon put on a request
(tokens, query and replace values, SigV4 keys) is masked in its response's headers and
body, streamed or not (`egress.credentials.echo`).
Policy lives in `egress.credentials`; this file only wires it in.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable

from mitmproxy import ctx, http

from egress.addons.guard import DECISION_KEY
from egress.credentials import placement, sigv4
from egress.credentials.echo import Scrubber
from egress.credentials.http import TokenClient
from egress.credentials.lifecycle import CredentialStore, CredentialUnavailable
from egress.credentials.spec import EntryCredentials
from egress.mitm import refusals
from egress.mitm.patches.buffered_requests import BUFFER_REQUEST
from egress.net.parent_proxy import ParentProxy
from egress.ops import metrics
from egress.ops.audit import DecisionLog, client_label
from egress.policy.decisions import Decision
from egress.policy.reasons import CREDENTIAL_UNAVAILABLE
from egress.policy.spec import Spec

logger = logging.getLogger(__name__)
INJECTED_KEY = "egress.injected"  # what CredentialPlacement put on the request, for the audit line
SECRETS_KEY = "egress.injected_secrets"  # every secret value put on the request, for EchoScrubbing
_SIGN_KEY = "egress.sign_pending"
_ECHO_STATE = "egress.echo_scrubber"
# Methods whose requests carry no body when they announce none (HTTP/2 announces nothing).
_BODYLESS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


class CredentialPlacement:
    def __init__(
        self, spec_for: Callable[[str], Spec], log: DecisionLog, parent: Callable[[], ParentProxy | None] = lambda: None
    ):
        self.spec_for = spec_for
        self.log = log
        self.parent = parent  # --upstream-proxy (the guard's): token calls go through it too
        self.store = CredentialStore(self._client)

    def load(self, loader) -> None:
        loader.add_option(
            "egress_credential_timeout", int, 10,
            "Seconds one token call of the proxy's own (network.credentials) may take in all; "
            "the request waiting for it then gets 502 credential_unavailable.",
        )  # fmt: skip
        loader.add_option(
            "egress_sign_max_body", int, 16 * 1024 * 1024,
            "Largest request body (bytes) read to compute a SigV4 payload hash when the client sent "
            "none (non-S3 services); larger ones are refused with 403 unsignable_request.",
        )  # fmt: skip

    def _client(self) -> TokenClient:
        opts = ctx.options
        return TokenClient(
            ca_file=opts.ssl_verify_upstream_trusted_ca or None,
            parent=self.parent(),
            timeout=opts.egress_credential_timeout,
            connect_timeout=min(opts.egress_connect_timeout, opts.egress_credential_timeout),
        )

    def done(self) -> None:
        self.store.close()

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        decision: Decision | None = flow.metadata.get(DECISION_KEY)
        if decision is None or not decision.allowed or flow.response is not None or decision.entry is None:
            return
        if not (flow.request.scheme == "https" and flow.client_conn.tls and decision.injects):
            return
        placed = decision.entry.credentials
        # Every secret this request carries is looked for in its answer, static `transform`
        # values too: an echo endpoint or an error page repeating the Authorization header
        # must not hand it to the sandbox.
        found: list[str] = [secret.reveal() for secret in decision.transform.values()]
        if not placed and not found:
            return
        if flow.request.headers.get("accept-encoding", "identity") != "identity":
            # An answer compressed on a streamed body could not be scanned for echoes.
            flow.request.headers["accept-encoding"] = "identity"
        if placed and not await self._place(flow, decision, placed, found):
            return
        flow.metadata[SECRETS_KEY] = found

    async def _place(self, flow: http.HTTPFlow, decision: Decision, placed: EntryCredentials, found: list[str]) -> bool:
        request = flow.request
        allow_cidrs = self.spec_for(flow.client_conn.id).allow_cidrs
        tokens: dict[str, str] = {}
        try:
            for source in placed.sources:
                tokens[source.name] = (await self.store.token(decision.environment, source, allow_cidrs)).value
            keys = (await self.store.token(decision.environment, placed.sign, allow_cidrs)).value if placed.sign else None
        except CredentialUnavailable as exc:
            flow.response = refusals.credential_unavailable(exc.name, decision.host)
            self._record(flow, decision, error=CREDENTIAL_UNAVAILABLE)
            return False
        found.extend(tokens.values())
        injected: list[str] = []
        if placed.replace:
            pairs = [(p, t.render(tokens)) for p, t in placed.replace]
            found.extend(secret for _, secret in pairs)
            request.path, count = placement.replace_in_target(request.path, pairs)
            fields = []
            for field_name, field_value in request.headers.fields:
                text = field_value.decode("utf-8", "surrogateescape")
                replaced = placement.replace_in_header(text, pairs)
                count += replaced != text
                fields.append((field_name, replaced.encode("utf-8", "surrogateescape")))
            request.headers.fields = tuple(fields)
            if count:
                injected.append("replace")
        for name, template in placed.headers:
            value = template.render(tokens)
            request.headers[name] = value  # replaces every same-named header, as static transforms do
            found.append(value)
            injected.append(name)
        if placed.query:
            params = [(n, t.render(tokens)) for n, t in placed.query]
            found.extend(value for _, value in params)
            path, mark, query = request.path.partition("?")
            request.path = f"{path}?{placement.set_query(query, params)}"
            injected.extend(f"query:{n}" for n, _ in params)
        if keys is not None:
            found.extend(keys.secrets)
            if not self._sign_or_defer(flow, decision, keys):
                return False
            injected.append("sign")
        flow.metadata[INJECTED_KEY] = tuple(injected)
        return True

    def _sign_or_defer(self, flow: http.HTTPFlow, decision: Decision, keys) -> bool:
        request = flow.request
        try:
            _, _, query = request.path.partition("?")
            if sigv4.is_presigned(query):
                raise sigv4.Unsignable(sigv4.PRESIGNED, "presigned URL")
            region, service = sigv4.scope(request.headers.get("authorization"), request.host)
            if not sigv4.needs_body(request.headers.items(multi=True)):
                self._sign(flow, keys, region, service, None)
                return True
            length = request.headers.get("content-length")
            if length is None and "transfer-encoding" not in request.headers and request.method in _BODYLESS:
                self._sign(flow, keys, region, service, b"")  # no body announced (and none expected)
                return True
            if length is None or not length.isdigit() or int(length) > ctx.options.egress_sign_max_body:
                raise sigv4.Unsignable(sigv4.UNSIGNABLE, "body too large or of unknown length to hash")
        except sigv4.Unsignable as refused:
            self._refuse(flow, decision, refused.reason)
            return False
        request.stream = False  # buffered (egress.mitm.patches.buffered_requests); signed in `request`
        flow.metadata[BUFFER_REQUEST] = True
        flow.metadata[_SIGN_KEY] = (keys, region, service)
        return True

    def request(self, flow: http.HTTPFlow) -> None:
        pending = flow.metadata.pop(_SIGN_KEY, None)
        if pending is None or flow.response is not None:
            return
        keys, region, service = pending
        try:
            self._sign(flow, keys, region, service, flow.request.raw_content or b"")
        except sigv4.Unsignable as refused:
            self._refuse(flow, flow.metadata[DECISION_KEY], refused.reason)

    @staticmethod
    def _sign(flow: http.HTTPFlow, keys, region: str, service: str, body: bytes | None) -> None:
        request = flow.request
        headers = [(n, v) for n, v in request.headers.items(multi=True)]
        if not any(n.lower() == "host" for n, _ in headers):
            headers.append(("host", request.host_header or request.host))
        url = f"https://{request.host_header or request.host}{request.path}"
        out, drop = sigv4.resign(request.method, url, headers, body, keys, region, service)
        for name in drop:
            request.headers.pop(name, None)
        for name, value in out.items():
            request.headers[name] = value

    def _refuse(self, flow: http.HTTPFlow, decision: Decision, reason: str) -> None:
        blocked = dataclasses.replace(decision, reason=reason, reported=False)
        flow.response = refusals.denied(reason, decision.host)
        flow.metadata[DECISION_KEY] = blocked
        self._record(flow, blocked)

    def _record(self, flow: http.HTTPFlow, decision: Decision, error: str = "") -> None:
        self.log.record(
            decision, client=client_label(flow.client_conn.peername), port=flow.request.port, method=flow.request.method,
            error=error,
        )  # fmt: skip


class EchoScrubbing:
    """Masks injected secrets in responses: headers at `responseheaders`, bodies streamed or whole."""

    def load(self, loader) -> None:
        loader.add_option(
            "egress_scrub_echoes", bool, True,
            "Mask secrets the proxy injected when a response carries them back (headers and bodies). "
            "Turn off only to measure its cost.",
        )  # fmt: skip

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        found = flow.metadata.get(SECRETS_KEY)
        if not found or flow.response is None or not ctx.options.egress_scrub_echoes:
            return
        scrubber = _scrubber(tuple(found))
        if not scrubber:
            return
        flow.metadata[_ECHO_STATE] = scrubber
        rule = _rule(flow)
        response = flow.response
        for name in list(response.headers.keys()):
            values = response.headers.get_all(name)
            scrubbed = [scrubber.scrub_text(v) for v in values]
            count = sum(c for _, c in scrubbed)
            if count:
                response.headers.set_all(name, [v for v, _ in scrubbed])
                metrics.SECRET_ECHOES.labels(rule).inc(count)
        if response.stream:
            counter = metrics.SECRET_ECHOES.labels(rule)
            inner = response.stream if callable(response.stream) else None
            stream = scrubber.stream(counter.inc)
            response.stream = (lambda chunk: stream(_joined(inner(chunk)))) if inner else stream

    def response(self, flow: http.HTTPFlow) -> None:
        scrubber: Scrubber | None = flow.metadata.pop(_ECHO_STATE, None)
        response = flow.response
        if scrubber is None or response is None or response.stream:
            return
        try:
            body = response.get_content(strict=False)
        except ValueError:
            body = response.raw_content
        if not body:
            return
        scrubbed, count = scrubber.scrub(body)
        if count:
            response.set_content(scrubbed)
            metrics.SECRET_ECHOES.labels(_rule(flow)).inc(count)


@functools.lru_cache(maxsize=256)
def _scrubber(found: tuple[str, ...]) -> Scrubber:
    """One compiled scrubber per set of secrets (a static transform's is the same for every
    request; a token's until it is refreshed), not one per response."""
    return Scrubber(found)


def _joined(chunks: bytes | Iterable[bytes]) -> bytes:
    return chunks if isinstance(chunks, bytes) else b"".join(chunks)


def _rule(flow: http.HTTPFlow) -> str:
    decision = flow.metadata.get(DECISION_KEY)
    return decision.rule if decision is not None else ""
