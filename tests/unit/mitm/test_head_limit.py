"""egress.mitm.patches.head_limit._head_over_limit: the HTTP/1 head bound, complete heads included.

The end-to-end versions are tests/e2e/test_reliability.py::test_oversized_request_head_gets_431
(a head still incomplete) and tests/e2e/test_attack_ssrf_and_smuggling.py (`head-over-64k`: a complete
70 KB head sent at once, which went through to the upstream before).
"""

from __future__ import annotations

import pytest

from egress.mitm.patches.head_limit import _head_over_limit

LIMIT = 100


@pytest.mark.parametrize(
    "buffered, over",
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 200, True),  # incomplete, over the limit
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 200 + b"\r\n\r\n", True),  # complete, over the limit: was let through
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 60 + b"\r\n\r\n" + b"b" * 500, False),  # a body after a small head
        (b"GET / HTTP/1.1\nX: a\n\n" + b"b" * 500, False),  # bare LF line ends, as mitmproxy (h11) reads them
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 77 + b"\r\n\r\n" + b"b" * 50, False),  # a head of exactly the limit
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 78 + b"\r\n\r\n" + b"b" * 50, True),  # one byte more
        (b"a" * LIMIT, False),  # not more than the limit yet: mitmproxy waits for the rest
    ],
)
def test_head_over_limit(buffered, over):
    assert _head_over_limit(bytearray(buffered), LIMIT) is over
