"""egress.mitm.patches.skip_type_checks: mitmproxy's debug-only per-message type check is left out, nothing else.

The gain is measured by bench/proxy_bench.py (docs/benchmarks.md), not timed here.
"""

from __future__ import annotations

import pytest
from mitmproxy import http

from egress.mitm.patches.skip_type_checks import install as skip_message_type_checks


def test_messages_are_built_without_the_type_walk_and_still_work():
    skip_message_type_checks()
    skip_message_type_checks()  # idempotent
    # The annotation walk at construction is gone (with it, a str timestamp_end raised TypeError)...
    built = http.Request("a.test", 443, b"GET", b"https", b"a.test", b"/x", b"HTTP/1.1", http.Headers(), b"", None, 0.0, "x")
    assert built.data.timestamp_end == "x"
    request = http.Request("a.test", 443, b"GET", b"https", b"a.test", b"/x", b"HTTP/1.1", http.Headers(), b"", None, 0.0, None)
    assert request.pretty_url == "https://a.test/x"
    # ...while mitmproxy's own validation of what flows through it (setters, parsers) stays.
    with pytest.raises(TypeError):
        request.method = 5  # type: ignore[assignment]
    response = http.Response.make(403, b"{}", {"Content-Type": "application/json"})
    assert response.status_code == 403 and response.headers["content-length"] == "2"
