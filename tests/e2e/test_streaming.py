"""End-to-end: a response the upstream sends bit by bit reaches the client bit by bit.

Streaming LLM APIs (server-sent events over a chunked HTTP/1.1 response or an HTTP/2
stream without a length) are the main traffic of an agent sandbox, and the hosts
that carry credentials are intercepted. A response without a declared length used
to be buffered until 64 KiB had arrived (`stream_large_bodies`), i.e. for a
completion of a few KiB until the model had finished: the client saw nothing for
the whole generation, and clients with a read timeout (httpx: 5 s by default) gave
up. The upstream here sends five events 0.4 s apart; each must reach the client
long before the last is sent.
"""

from __future__ import annotations

import json
import ssl
import time

import httpx
import pytest

from e2e.support.clients import client_ca_bundle
from e2e.support.lab import TEST_CIDRS_DUAL, Lab, allowlist_spec, bearer, in_netns

SECRET = "stream-secret-4c1d9e"
SPEC = allowlist_spec(("api.example.test", bearer("EGRESS_TEST_TOKEN")), "plain.test", cidrs=TEST_CIDRS_DUAL)
EVENTS = 5  # 0.4 s apart: the whole response takes 1.6 s or more


@pytest.fixture(scope="module")
def proxy(lab: Lab):
    proxy = lab.start_proxy(SPEC, env={"EGRESS_TEST_TOKEN": SECRET})
    yield proxy
    proxy.stop()
    assert SECRET not in proxy.stdout() + proxy.stderr()


def arrivals(lab: Lab, proxy, url: str, http2: bool = False) -> list[float]:
    """Seconds from the request to each event's arrival at a real httpx client."""
    ctx = ssl.create_default_context(cafile=client_ca_bundle(lab, proxy))
    seen: list[float] = []
    with in_netns(lab.proxy_ns), httpx.Client(proxy=proxy.url, verify=ctx, trust_env=False, timeout=10, http2=http2) as client:
        start = time.monotonic()
        with client.stream("GET", url) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            for line in response.iter_lines():
                if line.startswith("data: "):
                    assert json.loads(line[6:])["n"] == len(seen)
                    seen.append(time.monotonic() - start)
    return seen


@pytest.mark.parametrize(
    "url, http2",
    [
        ("https://api.example.test/sse/%d", False),  # intercepted, credential injected, HTTP/1.1
        ("https://api.example.test/sse/%d", True),  # the client speaks HTTP/2 to the proxy
        ("http://plain.test/sse/%d", False),  # plain HTTP through the proxy
    ],
    ids=["intercepted-h1", "intercepted-h2", "plain-http"],
)
def test_events_arrive_as_they_are_sent(lab, proxy, url, http2):
    seen = arrivals(lab, proxy, url % EVENTS, http2)
    assert len(seen) == EVENTS
    # The first event long before the last is sent (buffered, it came after >= 1.6 s),
    # and the events spread over the response as the upstream spaced them.
    assert seen[0] < 1.0, seen
    assert seen[-1] - seen[0] > 1.2, seen


def test_the_streamed_request_still_carries_the_injected_credential(lab, proxy):
    arrivals(lab, proxy, "https://api.example.test/sse/1")
    hit = [r for r in lab.upstream_requests() if r["path"] == "/sse/1"][-1]
    assert ["Authorization", f"Bearer {SECRET}"] in hit["headers"]
