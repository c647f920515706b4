"""Header field values the proxy refuses to forward (RFC 9110 §5.5)."""

from __future__ import annotations

import pytest

from egress.wire.fields import connect_target_problem, declared_length_problem, field_value_problem, host_field_problem


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



@pytest.mark.parametrize(
    "host",
    ["pa\u00dfthrough.test", "plain.test\u200b", "plain.test\u200d", "\u24df\u24db\u24d0\u24d8\u24dd.\u24e3\u24d4\u24e2\u24e3",
     "\uff50lain.test", "plain\u3002test", "\u2460\u2461\u2466.0.0.1", "plain.test\u00ad"],
)  # fmt: skip
def test_a_host_or_authority_that_is_not_ascii_is_a_problem(host):
    """IDNA mapping (NFKC) reads these as an allowed ASCII name; the upstream would get the raw bytes."""  # was a defect
    raw = host.encode()
    assert host_field_problem([(b"Host", raw)], b"") == (
        "header 'Host': not ASCII; an internationalised name is sent as its xn-- form (RFC 9110 section 7.2, RFC 5890)"
    )
    assert host_field_problem([(b"hOsT", b"plain.test"), (b"host", raw)], b"") is not None  # any Host field, any case
    assert host_field_problem([], raw) == (
        "':authority': not ASCII; an internationalised name is sent as its xn-- form (RFC 9110 section 7.2, RFC 5890)"
    )


@pytest.mark.parametrize("host", [b"plain.test", b"xn--pathrough-eza.test:80", b"[::1]:8080", b"", b"PLAIN.TEST."])
def test_an_ascii_host_is_left_to_the_destination_check(host):
    assert host_field_problem([(b"Host", host), (b"X-A", "caf\u00e9".encode())], host) is None


@pytest.mark.parametrize("authority", ["plain.test:\u0668\u0660", "127.0.0.1:\u0967\u0967", "pa\u00dfthrough.test:443", "plain.test:\uff18\uff10"])
def test_a_connect_target_that_is_not_ascii_is_a_problem(authority):
    """mitmproxy reads the port with a Unicode `\\d`: Arabic-Indic "80" opened a tunnel to port 80."""  # was a defect
    assert connect_target_problem(authority.encode()) == (
        "CONNECT target: not ASCII; a port is ASCII digits, an internationalised name is sent as its xn-- form"
        " (RFC 9110 section 7.2, RFC 5890)"
    )


@pytest.mark.parametrize("authority", [b"plain.test:80", b"[::1]:443", b"xn--pathrough-eza.test:443"])
def test_an_ascii_connect_target_is_left_to_the_destination_check(authority):
    assert connect_target_problem(authority) is None


@pytest.mark.parametrize("declared, received", [(None, 0), (None, 5), ("0", 0), ("10", 10)])
def test_a_content_length_that_matches_the_body_or_none_is_fine(declared, received):
    assert declared_length_problem(declared, received) is None


@pytest.mark.parametrize("declared, received", [("10", 0), ("0", 3), ("10, 10", 10), ("+10", 10), ("\u0661\u0660", 10), ("", 0), ("-1", 0)])
def test_a_content_length_that_disagrees_with_the_body_is_a_problem(declared, received):
    problem = declared_length_problem(declared, received)
    assert problem is not None and f"{received}-byte body" in problem
