"""Proxy decisions (SPEC §3) as pure functions over a `Spec`.

The addons ask two questions, in this order, and act on the answers:
1. `check_name`: may this requested host be reached at all (name level)?
2. `pick_address`: of the addresses it resolved to, which one may we dial?
Neither does I/O; resolution and local-address discovery are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from egress.policy.addresses import IPAddress, embedded_ipv4, forbidden_reason
from egress.policy.domains import HostError, is_loopback_name, normalize_host, parse_ip_literal
from egress.policy.reasons import (  # noqa: F401  (callers read them from here too)
    FORBIDDEN_ADDRESS,
    HOST_MISMATCH,
    INTERNAL_ERROR,
    LOOPBACK,
    NEVER_REPORTED,
    NO_SNI,
    NOT_ALLOWLISTED,
    PLAINTEXT_CREDENTIALS,
    PROXY_AUTH_REQUIRED,
    PROXY_SELF,
    REASONS,
    REQUEST_NOT_ALLOWED,
    RESOLVE_FAILED,
    TRACE_CREDENTIALS,
)
from egress.policy.request_rules import Verdict, body_problem
from egress.policy.spec import AllowlistEntry, Spec


@dataclass(frozen=True)
class Decision:
    """Outcome for one destination. `host` is normalised (or the raw text if unparsable)."""

    host: str
    reason: str = ""  # empty when allowed
    entry: AllowlistEntry | None = None
    reported: bool = False  # report mode: would have been blocked, let through
    environment: str = ""  # the spec's environment ("" with --spec): audit field and metric label
    request: Verdict | None = None  # the entry's request rules on this request (None: it has none)

    @property
    def allowed(self) -> bool:
        return not self.reason or self.reported

    @property
    def label(self) -> str:
        """The `decision` metric label."""
        if not self.reason:
            return "allowed"
        return "reported" if self.reported else "blocked"

    @property
    def rule(self) -> str:
        return self.entry.rule if self.entry else ""

    @property
    def transform(self):
        return self.entry.transform if self.entry and not self.reason else {}

    @property
    def injects(self) -> bool:
        return bool(self.entry and not self.reason and self.entry.injects)

    @property
    def intercepted(self) -> bool:
        return bool(self.entry and not self.reason and self.entry.intercepted)


def _finish(spec: Spec, host: str, reason: str, entry: AllowlistEntry | None = None) -> Decision:
    reported = bool(reason) and spec.mode == "report" and reason not in NEVER_REPORTED
    return Decision(host=host, reason=reason, entry=entry, reported=reported, environment=spec.environment)


def check_name(spec: Spec, raw_host: str) -> Decision:
    """Name-level verdict: loopback names, IP literals and the allowlist."""
    try:
        host = normalize_host(raw_host)
    except HostError:
        return _finish(spec, raw_host[:255], NOT_ALLOWLISTED)
    return check_normalized_name(spec, host)


def check_normalized_name(spec: Spec, host: str) -> Decision:
    """`check_name` for a host `normalize_host` already returned (the DNS policy has one)."""
    if is_loopback_name(host):
        return _finish(spec, host, LOOPBACK)
    ip = parse_ip_literal(host)
    if ip is not None and forbidden_reason(ip, spec.allow_cidrs) == LOOPBACK:
        return _finish(spec, host, LOOPBACK)
    entry = spec.allowlist.match(host)
    if entry is None:
        return _finish(spec, host, NOT_ALLOWLISTED)
    return _finish(spec, host, "", entry)


def pick_address(
    spec: Spec,
    decision: Decision,
    addresses: Iterable[IPAddress],
    is_self: Callable[[IPAddress], bool],
) -> tuple[IPAddress | None, Decision]:
    """First permitted address of those resolved, and the updated decision.

    Every address is classified; forbidden ones are dropped rather than failing the
    whole name, so `a.test -> [127.0.0.1, 198.18.0.10]` dials 198.18.0.10. When none
    is left, the reason is that of the worst address seen.
    """
    addresses = list(addresses)
    reasons: list[str] = []
    for ip in addresses:
        reason = address_reason(spec, ip, is_self)
        if reason is None:
            return ip, decision
        reasons.append(reason)
    if not reasons:
        return None, _finish(spec, decision.host, RESOLVE_FAILED, decision.entry)
    worst = next(r for r in (LOOPBACK, PROXY_SELF, FORBIDDEN_ADDRESS) if r in reasons)
    blocked = _finish(spec, decision.host, worst, decision.entry)
    if blocked.reported:
        # Report mode dials the first address that is merely "forbidden".
        first = next(ip for ip, r in zip(addresses, reasons, strict=True) if r == FORBIDDEN_ADDRESS)
        # A name already reported (not allowlisted) keeps that first reason.
        return first, decision if decision.reported else blocked
    return None, blocked


def address_reason(spec: Spec, ip: IPAddress, is_self: Callable[[IPAddress], bool]) -> str | None:
    """Why `ip` may not be reached (None: it may): the guard's classification, also used for DNS answers."""
    reason = forbidden_reason(ip, spec.allow_cidrs)
    if reason != LOOPBACK and any(is_self(a) for a in (ip, *embedded_ipv4(ip))):
        return PROXY_SELF
    return reason


def with_reason(spec: Spec, decision: Decision, reason: str) -> Decision:
    """A later check (host mismatch, plaintext credentials) blocks an allowed decision."""
    return _finish(spec, decision.host, reason, decision.entry)


def check_request(spec: Spec, decision: Decision, method: bytes, target: bytes, upgrade: bool) -> Decision:
    """An allowed decision held to its entry's `requests` (SPEC §8): the method and target
    as received; `upgrade` for a WebSocket handshake. A decision already refused (or
    reported) for its destination keeps that reason."""
    rules = decision.entry.requests if decision.entry is not None and not decision.reason else None
    if rules is None:
        return decision
    verdict = rules.check(method, target, upgrade)
    if verdict.allowed:
        return replace(decision, request=verdict)
    return replace(_finish(spec, decision.host, REQUEST_NOT_ALLOWED, decision.entry), request=verdict)


def check_request_body(
    spec: Spec, decision: Decision, declared_length: str | None, content: bytes | None, limit: int
) -> Decision:
    """A decision whose item also checks the body (`git-read`'s LFS batch): at the headers
    (`content` None) only the declared length, then the body once it has arrived. `limit`:
    the size above which the proxy streams a body (it must hold all of it to check it)."""
    verdict = decision.request
    if verdict is None or not verdict.body or decision.reason:
        return decision
    problem = body_problem(verdict.body, declared_length, content, limit)
    if problem is None:
        return decision
    refused = replace(verdict, allowed=False, item="", problem=problem, body="")
    return replace(_finish(spec, decision.host, REQUEST_NOT_ALLOWED, decision.entry), request=refused)


def unnamed(reason: str = NOT_ALLOWLISTED) -> Decision:
    """A redirected connection that names no destination (transparent mode).

    TLS without SNI is `no_sni`; plain HTTP without a Host header, and TCP that is
    neither TLS nor HTTP, are `not_allowlisted` with an empty host: no name, so no
    allowlist entry. Refused in report mode too, since letting it pass would mean
    dialling the address the client chose, which nothing has checked.
    """
    return Decision(host="", reason=reason)


# Methods whose answer is the request itself (RFC 9110 §9.3.8; TRACK is IIS's alias).
# Method names are case-sensitive, but servers that upper-case them exist: compared
# case-insensitively, so `trace` is refused too.
ECHO_METHODS = frozenset({"TRACE", "TRACK"})


def echoes_request(method: str) -> bool:
    """Would a server answer this method with the request it received (credentials included)?"""
    return method.upper() in ECHO_METHODS
