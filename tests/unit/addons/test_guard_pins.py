"""ClientState.pin: an allowed destination is pinned to its checked address, never to nothing."""

from __future__ import annotations

import ipaddress

import pytest

from egress.addons.guard import ClientState


def test_pin_remembers_the_checked_address():
    state = ClientState()
    state.pin("a.test", 443, ipaddress.ip_address("198.18.0.10"))
    assert state.pins == {("a.test", 443): ipaddress.ip_address("198.18.0.10")}


def test_pin_without_an_address_fails_closed():
    # Raised inside a hook, this becomes a refusal (`internal_error`, see failsafe.py);
    # an entry without an address would otherwise only be refused later, at connect.
    state = ClientState()
    with pytest.raises(RuntimeError):
        state.pin("a.test", 443, None)
    assert state.pins == {}
