"""Proxy-Authorization edge cases (egress.wire.proxy_auth.parse_basic), table-driven: what real clients
send, and the shapes of the second red-team pass. RFC 7617 credentials are `Basic` (any case), one
or more spaces, then padded standard base64 of `user:password`; the password is everything after
the first colon. Anything else is no proof (407), never a guess at what was meant."""

from __future__ import annotations

import base64

import pytest

from egress.wire.proxy_auth import parse_basic


def b64(text: str, encoding: str = "utf-8") -> str:
    return base64.b64encode(text.encode(encoding)).decode()


ROWS = [
    # accepted: what curl, requests, httpx, git, pip and undici send, and RFC-valid variants
    (f"Basic {b64('env-a:tok')}", ("env-a", "tok")),
    (f"basic {b64('env-a:tok')}", ("env-a", "tok")),
    (f"BASIC {b64('env-a:tok')}", ("env-a", "tok")),
    (f"Basic    {b64('env-a:tok')}", ("env-a", "tok")),
    (f"  Basic {b64('env-a:tok')}  ", ("env-a", "tok")),
    (f"Basic {b64('env-a:a:b:c')}", ("env-a", "a:b:c")),  # ':' in the token
    (f"Basic {b64('env-a:')}", ("env-a", "")),  # empty token: parsed, then refused by authenticate
    (f"Basic {b64(':tok')}", ("", "tok")),  # empty user: no such environment
    (f"Basic {b64('énv:tok')}", ("énv", "tok")),  # UTF-8 user: no such environment
    # refused: not Basic, not base64, not padded, not UTF-8, no colon
    (None, None),
    ("", None),
    ("Basic", None),
    ("Basic ", None),
    (f"Basic\t{b64('env-a:tok')}", None),  # RFC 7235: the separator is SP
    (f"Basic\u00a0{b64('env-a:tok')}", None),
    (f"Bearer {b64('env-a:tok')}", None),
    (f"Digest {b64('env-a:tok')}", None),
    (f"Basicc {b64('env-a:tok')}", None),
    (f"Basic {b64('env-a:toke').rstrip('=')}", None),  # padding removed (10 bytes: '==' dropped)
    (f"Basic {b64('env-a:tok')[:4]} {b64('env-a:tok')[4:]}", None),  # whitespace inside
    (f"Basic {b64('env-a:tok')[:4]}\n{b64('env-a:tok')[4:]}", None),
    (f"Basic {base64.urlsafe_b64encode(b'env-a:t?>~').decode()}", None),  # URL-safe alphabet
    (f"Basic {b64('env-a:tok')}!", None),  # a character outside the alphabet
    (f"Basic {b64('env-a:tok')}, Basic {b64('env-b:tok')}", None),  # two headers, joined
    (f"Basic {b64('env-a-tok')}", None),  # no colon
    (f"Basic {b64('env-a:tök', 'latin-1')}", None),  # not UTF-8
    ("Basic " + "A" * 60000, None),
]


@pytest.mark.parametrize("value, expected", ROWS, ids=[repr(v)[:50] for v, _ in ROWS])
def test_parse_basic(value, expected):
    assert parse_basic(value) == expected
