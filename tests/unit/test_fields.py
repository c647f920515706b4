"""Header field values the proxy refuses to forward (RFC 9110 §5.5)."""

from __future__ import annotations

import pytest

from egress.fields import field_value_problem


@pytest.mark.parametrize(
    "value", [b"a\rHost: other.test", b"a\r", b"\rb", b"a\nb", b"a\x00b", b"Bearer x\r\nTransfer-Encoding: chunked"]
)
def test_cr_lf_nul_in_a_value_is_a_problem_naming_the_header_not_the_value(value):
    problem = field_value_problem([(b"Host", b"plain.test"), (b"X-Token", value)])
    assert problem == "header 'X-Token': value contains CR, LF or NUL (RFC 9110 section 5.5)"
    assert value.decode() not in problem


@pytest.mark.parametrize("value", [b"", b"plain", b"a\tb", b"a b", b"\x0b\x0c", "caf\u00e9".encode(), b"\x7f\xff"])
def test_other_bytes_are_forwarded(value):
    assert field_value_problem([(b"X-A", value)]) is None

