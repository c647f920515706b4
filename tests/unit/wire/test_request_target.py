"""Request lines the proxy refuses to forward (RFC 9110 §9.1, RFC 9112 §3.2), and echo methods."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.policy.decisions import echoes_request
from egress.wire.request_target import request_target_problem


@pytest.mark.parametrize(
    "method, path",
    [(b"GET", b"/"), (b"GET", b"/a?b=c%20d#f"), (b"GET", b"//double"), (b"OPTIONS", b"*"), (b"M-SEARCH", b"/x"),
     (b"PROPFIND", "/caf\u00e9".encode())],
)  # fmt: skip
def test_ordinary_request_lines_pass(method, path):
    assert request_target_problem(method, path) is None


@pytest.mark.parametrize(
    "method, path",
    [(b"GET", b"https://other.test/x"), (b"GET", b"other.test:443"), (b"GET", b"x"), (b"GET", b"/a HTTP/1.1"),
     (b"GET", b"/a\tb"), (b"GET", b"/a\x7f"), (b"GET", b"*"), (b"GET /x HTTP/1.1", b"/a"), (b"", b"/"), (b"G(", b"/")],
)  # fmt: skip
def test_targets_a_server_could_read_otherwise_are_problems_that_do_not_echo_them(method, path):
    problem = request_target_problem(method, path)
    assert problem is not None
    assert path.decode("latin-1") not in problem or path in (b"*",)


@given(st.binary(max_size=30))
def test_a_passing_target_is_one_request_line_field(path):
    if request_target_problem(b"GET", path) is None:
        assert path == b"*" or (path.startswith(b"/") and not any(c <= 0x20 or c == 0x7F for c in path))


@pytest.mark.parametrize("method", ["TRACE", "TRACK", "trace", "tRaCk"])
def test_echo_methods_in_any_case(method):
    assert echoes_request(method)


@pytest.mark.parametrize("method", ["GET", "POST", "OPTIONS", "TRACES", "CONNECT"])
def test_other_methods_do_not_echo(method):
    assert not echoes_request(method)
