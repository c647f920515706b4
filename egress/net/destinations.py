"""Destination checking with I/O: name verdict, resolution, address choice.

The one readable sequence the security of the proxy rests on (after smokescreen's
`safeResolve`): check the name, resolve it once, classify every address, and
return the single address that may be dialled. Callers pin that address to the
connection; nothing resolves the name a second time.
"""

from __future__ import annotations

from collections.abc import Callable

from egress.net.resolver import LocalAddresses, ResolveError, resolve
from egress.policy import decisions as policy
from egress.policy.addresses import IPAddress
from egress.policy.spec import Spec


class DestinationChecker:
    def __init__(self, spec_for: Callable[[str], Spec], local_addresses: LocalAddresses):
        # client connection id -> the spec in force for that client's environment
        # (the one spec with --spec; with --spec-dir, see egress.addons.environment_gate).
        self._spec_for = spec_for
        self.local = local_addresses

    def spec_for(self, client_id: str) -> Spec:
        return self._spec_for(client_id)

    @property
    def spec(self) -> Spec:
        """The spec for traffic that belongs to no client connection (e.g. a DNS query):
        the one spec with --spec; with --spec-dir a spec that allows nothing."""
        return self._spec_for("")

    async def check(self, raw_host: str, port: int, client_id: str = "") -> tuple[policy.Decision, IPAddress | None]:
        spec = self._spec_for(client_id)
        decision = policy.check_name(spec, raw_host)
        if not decision.allowed:
            return decision, None
        try:
            addresses = await resolve(decision.host, port)
        except ResolveError:
            return policy.with_reason(spec, decision, policy.RESOLVE_FAILED), None
        address, decision = policy.pick_address(spec, decision, addresses, self.local.__contains__)
        return decision, address
