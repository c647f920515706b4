"""Placement (query, replace) and echo scrubbing, streamed across chunk boundaries."""

from __future__ import annotations

import base64

import pytest

from egress.credentials import placement
from egress.credentials.echo import Scrubber

SECRET = "sk-live-0123456789abcdef"


def test_set_query_replaces_the_clients_and_keeps_the_rest_byte_for_byte():
    assert placement.set_query("a=%20x&key=client&b=1+2", [("key", "s/e c")]) == "a=%20x&b=1+2&key=s%2Fe%20c"
    assert placement.set_query("", [("key", "v")]) == "key=v"


def test_replace_in_target_path_and_query():
    target, count = placement.replace_in_target("/botPLACEHOLDER_TG/getMe?t=PLACEHOLDER_TG", [("PLACEHOLDER_TG", "123:AB/C")])
    assert target == "/bot123:AB%2FC/getMe?t=123:AB/C" and count == 2


def test_replace_inside_basic():
    value = "Basic " + base64.b64encode(b"x-access-token:PLACEHOLDER_GH").decode()
    out = placement.replace_in_header(value, [("PLACEHOLDER_GH", "ghs_real")])
    assert base64.b64decode(out.split()[1]) == b"x-access-token:ghs_real"
    assert placement.replace_in_header("Bearer PLACEHOLDER_GH", [("PLACEHOLDER_GH", "t")]) == "Bearer t"


def test_scrub_forms_and_mask_length():
    s = Scrubber([SECRET, "short", "Basic dXNlcjpwYXNzd29yZA=="])
    data = f"a {SECRET} b short; auth: dXNlcjpwYXNzd29yZA==".encode()
    out, count = s.scrub(data)
    assert SECRET.encode() not in out and b"dXNlcjpwYXNzd29yZA" not in out
    assert count == 2 and len(out) == len(data) and b"short" in out


@pytest.mark.parametrize("size", [1, 3, 7, 23, 24, 25, 1000])
def test_stream_scrub_across_chunk_boundaries(size):
    body = (b"x" * 5 + SECRET.encode() + b"y" * 3) * 40 + SECRET.encode()
    counted = []
    stream = Scrubber([SECRET]).stream(counted.append)
    out = b"".join(stream(body[i : i + size]) for i in range(0, len(body), size)) + stream(b"")
    assert len(out) == len(body) and SECRET.encode() not in out and sum(counted) == 41
