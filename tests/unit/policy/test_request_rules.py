"""egress.policy.request_rules: normalisation, patterns, presets and the spec's `requests` field.

Table-driven like smokescreen's ACL tests; hypothesis checks the normalisation
against an independent model of how nginx (merge_slashes on) reads a path, and the
segment glob against a regex model. The end-to-end versions (real proxy, real curl,
git and nginx) are in tests/e2e/test_request_rules.py.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.net.http.http1 import assemble_response

from egress.mitm import refusals
from egress.ops.audit import DecisionLog
from egress.policy import decisions as policy
from egress.policy import request_rules as rr
from egress.policy.spec import SpecError, parse_spec

# -- normalisation ----------------------------------------------------------------------------

NORMALISED = [
    (b"/", "/"),
    (b"/repos/acme/x/issues", "/repos/acme/x/issues"),
    (b"/repos/acme/x/issues?state=open&x=%2F", "/repos/acme/x/issues"),  # the query is not matched
    (b"/a//b", "/a/b"),  # merged, as nginx does (merge_slashes on)
    (b"//a///b/", "/a/b/"),
    (b"/a/b//", "/a/b/"),
    (b"/a/./b", "/a/b"),
    (b"/a/b/.", "/a/b/"),
    (b"/a/b/..", "/a/"),
    (b"/a/b/../c", "/a/c"),
    (b"/repos/acme/x/../../other/y/issues", "/repos/other/y/issues"),
    (b"/a/%2e%2e/b", "/b"),  # %2e is '.', unreserved: decoded, then removed
    (b"/a/.%2E/b", "/b"),
    (b"/a/%2e/b", "/a/b"),
    (b"/%41%62%7e%5f", "/Ab~_"),  # unreserved: decoded
    (b"/a%3ab", "/a%3Ab"),  # reserved: kept, hex upper-cased
    (b"/a%20b", "/a%20b"),
    (b"/caf%c3%a9", "/caf%C3%A9"),
    (b"/caf\xc3\xa9", "/caf%C3%A9"),  # raw bytes above 0x7F count as their escape
    (b"/%F0%9F%98%80", "/%F0%9F%98%80"),
    (b"/a/..b/c..", "/a/..b/c.."),  # not dot segments
    (b"/a/...", "/a/..."),
    (b"*", "*"),  # OPTIONS *
    (b"/%3B", "/%3B"),  # an escaped ';' is data (Tomcat strips parameters before decoding)
]

REFUSED = [
    (b"/a#b", "fragment"),
    (b"/a?x#y", "fragment"),
    (b"a/b", "not an absolute path"),
    (b"https://other.test/x", "not an absolute path"),
    (b"/a%2Fb", "encoded '/'"),
    (b"/a%2fb", "encoded '/'"),
    (b"/a\\b", "backslash"),
    (b"/a%5Cb", "encoded '\\'"),
    (b"/a%5cb", "encoded '\\'"),
    (b"/a%00b", "NUL"),
    (b"/a%0Ab", "control"),
    (b"/a%7Fb", "control"),
    (b"/a%", "invalid percent-encoding"),
    (b"/a%4", "invalid percent-encoding"),
    (b"/a%zz", "invalid percent-encoding"),
    (b"/a%%41", "invalid percent-encoding"),
    (b"/a%252F", "double percent-encoding"),
    (b"/a%252e%252e/b", "double percent-encoding"),
    (b"/a;b", "';'"),
    (b"/a/..;/b", "';'"),
    (b"/x;jsessionid=1", "';'"),
    (b"/%C0%AE%C0%AE/x", "not UTF-8"),  # overlong '.'
    (b"/%C0%AF", "not UTF-8"),  # overlong '/'
    (b"/%E0%80%AF", "not UTF-8"),  # overlong '/', three bytes
    (b"/%ED%A0%80", "not UTF-8"),  # a surrogate
    (b"/%FF", "not UTF-8"),
    (b"/caf\xe9", "not UTF-8"),  # raw Latin-1
    (b"/%EF%BC%8F", "Unicode folding"),  # FULLWIDTH SOLIDUS
    (b"/%EF%BC%BC", "Unicode folding"),  # FULLWIDTH REVERSE SOLIDUS
    (b"/%EF%BC%8E%EF%BC%8E/x", "Unicode folding"),  # FULLWIDTH FULL STOP
    (b"/..", "above the root"),
    (b"/a/../..", "above the root"),
    (b"/%2e%2e/x", "above the root"),
    (b"/a//../b", "repeated '/' together with a dot segment"),  # nginx: /b; RFC 3986: /a/b
    (b"/a/.//b", "repeated '/' together with a dot segment"),
]


@pytest.mark.parametrize(("target", "path"), NORMALISED)
def test_normalised(target, path):
    assert rr.normalize_path(target)[0] == path


@pytest.mark.parametrize(("target", "words"), REFUSED)
def test_refused(target, words):
    with pytest.raises(rr.PathError, match=re.escape(words)):
        rr.normalize_path(target)


def test_query_is_returned_raw():
    assert rr.normalize_path(b"/a/info/refs?service=git-upload-pack") == ("/a/info/refs", b"service=git-upload-pack")


def test_shown_path_never_raw():
    assert rr.shown_path(b"/a\x1b[31m\xff b?token=secret") == "/a%1B[31m%FF%20b"
    assert len(rr.shown_path(b"/" + b"a" * 1000)) == 255


# An independent model of nginx's reading (ngx_http_parse_complex_uri with merge_slashes
# on): decode every escape, merge slashes, remove dot segments. For every path the proxy
# accepts, the fully decoded normalised path must be exactly what nginx routes on.
def nginx_uri(target: bytes) -> bytes:
    path = unquote_to_bytes(target.partition(b"?")[0])
    out: list[bytes] = []
    segments = [s for s in path.split(b"/")[1:]]
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == b"" and not last:
            continue
        if segment == b".":
            if last:
                out.append(b"")
        elif segment == b"..":
            out.pop()
            if last:
                out.append(b"")
        else:
            out.append(segment)
    return b"/" + b"/".join(out)


_PIECES = st.sampled_from(
    [b"/", b"//", b"a", b"b", b".", b"..", b"%2e", b"%2E", b"%41", b"%2F", b"%3A", b"%25", b"%C3%A9", b"%C0%AE",
     b"\\", b";", b"~", b"%", b"%g", b"?", b"#", b"\xc3\xa9", b"*", b"%00"]
)  # fmt: skip
_TARGETS = st.lists(_PIECES, max_size=12).map(lambda parts: b"/" + b"".join(parts))


@settings(max_examples=3000, deadline=None)
@given(_TARGETS)
def test_normalisation_is_what_nginx_routes_on(target):
    try:
        path, _ = rr.normalize_path(target)
    except rr.PathError:
        return
    assert unquote_to_bytes(path) == nginx_uri(target)
    # ...and is a fixed point: normalising it again changes nothing.
    assert rr.normalize_path(path.encode())[0] == path
    segments = path.split("/")[1:]
    assert "." not in segments and ".." not in segments and "" not in segments[:-1]


# -- patterns ---------------------------------------------------------------------------------

MATCHES = [
    ("/", "/", True),
    ("/", "/a", False),
    ("/a", "/a", True),
    ("/a", "/a/", False),  # a trailing slash is a different path
    ("/a/", "/a/", True),
    ("/a/*", "/a/b", True),
    ("/a/*", "/a/", False),  # `*` is one non-empty segment
    ("/a/*", "/a/b/c", False),
    ("/a/*/c", "/a/b/c", True),
    ("/a/**", "/a", True),  # `**`: any number, none included
    ("/a/**", "/a/", True),
    ("/a/**", "/a/b/c/d", True),
    ("/a/**", "/ab", False),
    ("/**/info/refs", "/info/refs", True),
    ("/**/info/refs", "/acme/x.git/info/refs", True),
    ("/**/info/refs", "/acme/x.git/info/refs/", False),
    ("/a/**/b/**/c", "/a/x/b/y/z/c", True),
    ("/a/**/b/**/c", "/a/b/c", True),
    ("/a/**/b/**/c", "/a/c/b", False),
    ("/**", "/", True),
    ("/**", "/anything/at/all", True),
    ("/%7euser", "/~user", True),  # literals are normalised the same way
    ("/a%3Ab", "/a%3Ab", True),
    ("/a%3ab", "/a%3Ab", True),
    ("/v1/models/gemini:generateContent", "/v1/models/gemini:generateContent", True),
    ("/repos/acme/*/issues", "/repos/other/y/issues", False),
]


@pytest.mark.parametrize(("pattern", "path", "expected"), MATCHES)
def test_pattern(pattern, path, expected):
    assert rr.parse_path_pattern(pattern).matches(path[1:].split("/")) is expected


def _glob_regex(segments: tuple[str, ...]) -> re.Pattern[str]:
    parts = {"*": r"/[^/]+", "**": r"(?:/[^/]*)*"}
    return re.compile("".join(parts.get(s, "/" + re.escape(s)) for s in segments) or "/")


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "*", "**"]), min_size=1, max_size=6),
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=8),
    st.booleans(),
)
def test_glob_agrees_with_a_regex_model(pattern_segments, path_segments, trailing):
    pattern = rr.parse_path_pattern("/" + "/".join(pattern_segments))
    segments = [*path_segments, ""] if trailing or not path_segments else path_segments
    path = "/" + "/".join(segments)
    assert pattern.matches(segments) is (_glob_regex(pattern.segments).fullmatch(path) is not None)


def test_many_double_stars_on_a_long_path_is_fast():
    pattern = rr.parse_path_pattern("/**/a/**/a/**/a/**/a/**/b")
    segments = ["a"] * 4000
    started = time.monotonic()
    assert not pattern.matches(segments)
    assert time.monotonic() - started < 2  # a regex of the same pattern backtracks for hours


PATTERN_ERRORS = [
    ("a/b", "not an absolute path"),
    ("", "not an absolute path"),
    ("/a/b*", "whole segment"),
    ("/a/**b", "whole segment"),
    ("/a//b", "empty segment"),
    ("/a/../b", "dot segments"),
    ("/a/./b", "dot segments"),
    ("/a/%2e%2e/b", "dot segments"),
    ("/a?x=1", "query"),
    ("/a#x", "fragment"),
    ("/a;x", "';'"),
    ("/a\\b", "backslash"),
    ("/a b", "unsupported character"),
    ("/a/{id}", "unsupported character"),
    ("/a/[0-9]", "unsupported character"),
    ("/é", "unsupported character"),
    ("/a%2Fb", "encoded '/'"),
    ("/a%zz", "invalid percent-encoding"),
]


@pytest.mark.parametrize(("text", "words"), PATTERN_ERRORS)
def test_pattern_errors(text, words):
    with pytest.raises(rr.RuleError, match=re.escape(words)):
        rr.parse_path_pattern(text)


# -- rules: the SPEC §8 example and the presets ------------------------------------------------


def rules(raw) -> rr.RequestRules:
    parsed, problems = rr.parse_requests(raw)
    assert problems == [] and parsed is not None
    return parsed


SPEC_EXAMPLE = [{"methods": ["GET", "HEAD"]}, {"methods": ["POST"], "paths": ["/repos/acme/*/issues", "/graphql"]}]

SPEC_EXAMPLE_CASES = [
    (b"GET", b"/anything", "requests[0]"),
    (b"HEAD", b"/", "requests[0]"),
    (b"POST", b"/repos/acme/x/issues", "requests[1]"),
    (b"POST", b"/repos/acme/x/./issues", "requests[1]"),
    (b"POST", b"/repos//acme/x/issues", "requests[1]"),  # nginx merges: the same route
    (b"POST", b"/repos/acme/x/issues?labels=a", "requests[1]"),
    (b"POST", b"/graphql", "requests[1]"),
    (b"POST", b"/repos/acme/x/../../other/y/issues", ""),
    (b"POST", b"/repos/acme/x/%2e%2e/%2e%2e/other/y/issues", ""),
    (b"POST", b"/repos/acme/x%2F..%2F..%2Fother/issues", ""),
    (b"POST", b"/repos/acme/x;/issues", ""),
    (b"POST", b"/repos/acme/x\\..\\y/issues", ""),
    (b"POST", b"/repos/acme/x/issues#frag", ""),
    (b"POST", b"/repos/acme/x/comments", ""),
    (b"POST", b"/graphql/", ""),
    (b"post", b"/graphql", ""),  # methods are case-sensitive
    (b"Get", b"/anything", ""),
    (b"PUT", b"/graphql", ""),
    (b"DELETE", b"/repos/acme/x/issues", ""),
    (b"OPTIONS", b"*", ""),
]


@pytest.mark.parametrize(("method", "target", "item"), SPEC_EXAMPLE_CASES)
def test_spec_example(method, target, item):
    verdict = rules(SPEC_EXAMPLE).check(method, target)
    assert (verdict.allowed, verdict.item) == (bool(item), item)


READ_ONLY_CASES = [
    (b"GET", b"/x", False, True),
    (b"HEAD", b"/x", False, True),
    (b"OPTIONS", b"/x", False, True),
    (b"OPTIONS", b"*", False, True),
    (b"GET", b"/ws", True, False),  # a WebSocket carries data both ways: not a read
    (b"POST", b"/ws", True, False),
    *((m.encode(), b"/x", False, False) for m in ("POST", "PUT", "PATCH", "DELETE", "TRACE", "get", "PROPFIND")),
    (b"GET", b"/a%2Fb", False, False),  # an ambiguous path is refused whatever the method
]


@pytest.mark.parametrize(("method", "target", "upgrade", "allowed"), READ_ONLY_CASES)
def test_read_only(method, target, upgrade, allowed):
    assert rules("read-only").check(method, target, upgrade).allowed is allowed


GIT_READ_CASES = [
    (b"GET", b"/acme/x.git/info/refs?service=git-upload-pack", "git-read/refs"),
    (b"GET", b"/acme/x/info/refs?service=git-upload-pack", "git-read/refs"),
    (b"GET", b"/acme/x.git/info/refs?service=git%2Dupload%2Dpack", "git-read/refs"),
    (b"GET", b"/acme/x.git/info/refs", "git-read/refs"),  # dumb HTTP: the static ref list
    (b"GET", b"/acme/x.git/info/refs?other=1", "git-read/refs"),
    (b"GET", b"/acme/x.git/info/refs?service=git-receive-pack", ""),
    (b"GET", b"/acme/x.git/info/refs?service=git-upload-pack&service=git-receive-pack", ""),
    (b"GET", b"/acme/x.git/info/refs?service=git-receive-pack&service=git-upload-pack", ""),
    (b"GET", b"/acme/x.git/info/refs?service=", ""),
    (b"GET", b"/acme/x.git/info/refs?service=%zz", ""),
    (b"GET", b"/acme/x.git/info/refs?%73ervice=git-receive-pack", ""),  # %73 is 's'
    (b"POST", b"/acme/x.git/info/refs?service=git-upload-pack", ""),
    (b"POST", b"/acme/x.git/git-upload-pack", "git-read/upload-pack"),
    (b"POST", b"/acme/x.git/git-receive-pack", ""),
    (b"POST", b"/acme/x.git/git-upload-pack/../git-receive-pack", ""),
    (b"POST", b"/acme/x.git/git-receive-pack?x=/git-upload-pack", ""),
    (b"POST", b"/acme/x.git/git-upload-pack%2F..%2Fgit-receive-pack", ""),
    (b"GET", b"/acme/x.git/git-upload-pack", ""),
    (b"GET", b"/acme/x.git/HEAD", "git-read/dumb"),
    (b"GET", b"/acme/x.git/objects/info/packs", "git-read/dumb"),
    (b"GET", b"/acme/x.git/objects/ab/cdef0123", "git-read/dumb"),
    (b"GET", b"/acme/x.git/objects/pack/pack-1.pack", "git-read/dumb"),
    (b"HEAD", b"/acme/x.git/objects/pack/pack-1.idx", "git-read/dumb"),
    (b"PUT", b"/acme/x.git/objects/ab/cdef0123", ""),
    (b"POST", b"/acme/x.git/info/lfs/objects/batch", "git-read/lfs"),
    (b"GET", b"/acme/x.git/info/lfs/objects/0123abcd", "git-read/lfs"),
    (b"PUT", b"/acme/x.git/info/lfs/objects/0123abcd", ""),
    (b"POST", b"/acme/x.git/info/lfs/objects/0123abcd/verify", ""),
    (b"POST", b"/acme/x.git/info/lfs/locks", ""),
    (b"POST", b"/repos/acme/x/issues", ""),
    (b"GET", b"/acme/x", ""),  # the web UI is not part of a clone
]


@pytest.mark.parametrize(("method", "target", "item"), GIT_READ_CASES)
def test_git_read(method, target, item):
    verdict = rules("git-read").check(method, target)
    assert (verdict.allowed, verdict.item) == (bool(item), item)


def test_git_read_never_lets_a_websocket_through():
    assert not rules("git-read").check(b"GET", b"/x.git/info/refs", upgrade=True).allowed


def test_presets_combine_with_items_in_a_list():
    combined = rules(["read-only", {"methods": ["POST"], "paths": ["/graphql"]}])
    assert combined.check(b"GET", b"/x").item == "read-only"
    assert combined.check(b"POST", b"/graphql").item == "requests[1]"
    assert not combined.check(b"POST", b"/x").allowed


def test_user_items_let_a_websocket_handshake_through_on_their_method_and_path():
    ws = rules([{"methods": ["GET"], "paths": ["/ws"]}])
    assert ws.check(b"GET", b"/ws", upgrade=True).allowed
    assert not ws.check(b"GET", b"/other", upgrade=True).allowed


def test_paths_only_item_allows_every_method_on_them():
    item = rules([{"paths": ["/public/**"]}])
    assert item.check(b"DELETE", b"/public/x").allowed
    assert not item.check(b"GET", b"/private").allowed


def test_verdict_of_an_ambiguous_path():
    verdict = rules("read-only").check(b"GET", b"/a%2Fb?token=secret")
    assert verdict == rr.Verdict(False, "", "/a%2Fb", "an encoded '/' (%2F) in the path")


# -- the spec's `requests` field ----------------------------------------------------------------


def spec_with(requests_yaml: str, extra: str = ""):
    return parse_spec(
        f"network:\n  allowlist:\n    - domain: api.example.test\n{extra}      requests: {requests_yaml}\n", source="s.yaml"
    )


def test_entry_with_requests_is_intercepted():
    spec = spec_with("read-only")
    entry = spec.entries[0]
    assert entry.requests is not None and entry.requests.text == "read-only"
    assert entry.intercepted and not entry.injects


def test_entry_without_requests_lets_everything_through_as_before():
    spec = parse_spec("network:\n  allowlist:\n    - domain: api.example.test\n")
    assert spec.entries[0].requests is None and not spec.entries[0].intercepted


SPEC_ERRORS = [
    ("reed-only", "s.yaml: network.allowlist[0].requests: unknown preset 'reed-only' (expected one of read-only, git-read, or a list of items)"),
    ("[]", "s.yaml: network.allowlist[0].requests: is empty: it would refuse every request (remove the entry instead)"),
    ("{methods: [GET]}", "s.yaml: network.allowlist[0].requests: must be a preset name (read-only, git-read) or a list of items, not dict"),
    ("[{methods: [get]}]", "s.yaml: network.allowlist[0].requests[0].methods[0]: 'get' is not a registered HTTP method (IANA); methods are case-sensitive: did you mean GET?"),
    ("[{methods: [FETCH]}]", "s.yaml: network.allowlist[0].requests[0].methods[0]: 'FETCH' is not a registered HTTP method (IANA)"),
    ('[{methods: ["GET /"]}]', "s.yaml: network.allowlist[0].requests[0].methods[0]: 'GET /' is not an HTTP method token (RFC 9110 section 9.1)"),
    ("[{methods: [CONNECT]}]", "s.yaml: network.allowlist[0].requests[0].methods[0]: CONNECT is not a request inside a tunnel (CONNECT is decided by the allowlist)"),
    ("[{methods: [1]}]", "s.yaml: network.allowlist[0].requests[0].methods[0]: must be a string, not int"),
    ("[{methods: []}]", "s.yaml: network.allowlist[0].requests[0].methods: must be a non-empty list"),
    ("[{methods: GET}]", "s.yaml: network.allowlist[0].requests[0].methods: must be a non-empty list"),
    ("[{paths: [repos/x]}]", "s.yaml: network.allowlist[0].requests[0].paths[0]: 'repos/x' is not an absolute path (it must start with '/')"),
    ('[{paths: ["/repos/x*"]}]', "s.yaml: network.allowlist[0].requests[0].paths[0]: '/repos/x*': '*' must be a whole segment ('*' one segment, '**' any number)"),
    ('[{paths: ["/a?b=1"]}]', "s.yaml: network.allowlist[0].requests[0].paths[0]: '/a?b=1': a query ('?') is not supported (the query is not part of the match)"),
    ("[{}]", "s.yaml: network.allowlist[0].requests[0]: needs `methods` and/or `paths`"),
    ("[git-write]", "s.yaml: network.allowlist[0].requests[0]: unknown preset 'git-write' (expected one of read-only, git-read, or a list of items)"),
    ("[7]", "s.yaml: network.allowlist[0].requests[0]: must be a mapping with `methods` and/or `paths`, or a preset name"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "problem"), SPEC_ERRORS)
def test_spec_errors_name_entry_field_and_why(value, problem):
    with pytest.raises(SpecError) as info:
        spec_with(value)
    assert info.value.problems == [problem]


def test_misspelt_field():
    with pytest.raises(SpecError) as info:
        spec_with("[{method: [GET]}]")
    assert info.value.problems == [
        "s.yaml: network.allowlist[0].requests[0].method: unknown field (expected methods, paths)",
        "s.yaml: network.allowlist[0].requests[0]: needs `methods` and/or `paths`",
    ]


def test_spec_reports_every_rule_problem_at_once():
    with pytest.raises(SpecError) as info:
        spec_with('[{methods: [get, PUT], paths: ["x", "/ok"]}, nope]')
    assert [p.split(": ")[1] for p in info.value.problems] == [
        "network.allowlist[0].requests[0].methods[0]",
        "network.allowlist[0].requests[0].paths[0]",
        "network.allowlist[0].requests[1]",
    ]


def test_unknown_entry_field_lists_requests():
    with pytest.raises(SpecError, match=r"unknown field \(expected domain, query, replace, requests, sign, transform\)"):
        parse_spec("network:\n  allowlist:\n    - domain: a.test\n      request: read-only\n")


# -- decisions, refusal, audit ------------------------------------------------------------------


def decision_for(spec, method=b"POST", target=b"/x", upgrade=False):
    return policy.check_request(spec, policy.check_name(spec, "api.example.test"), method, target, upgrade)


def test_refused_request_is_request_not_allowed_and_carries_no_credential():
    spec = spec_with("read-only", extra="      transform: {Authorization: Bearer t}\n")
    decision = decision_for(spec)
    assert decision.reason == policy.REQUEST_NOT_ALLOWED and not decision.allowed
    assert decision.transform == {} and not decision.injects
    assert decision.request == rr.Verdict(False, "", "/x")


def test_passing_request_keeps_its_credential_and_names_the_item():
    spec = spec_with("read-only", extra="      transform: {Authorization: Bearer t}\n")
    decision = decision_for(spec, b"GET")
    assert decision.allowed and decision.reason == "" and set(decision.transform) == {"Authorization"}
    assert decision.request is not None and decision.request.item == "read-only"


def test_report_mode_reports_and_lets_through_without_the_credential():
    spec = parse_spec(
        "network:\n  mode: report\n  allowlist:\n    - domain: api.example.test\n"
        "      transform: {Authorization: Bearer t}\n      requests: read-only\n"
    )
    decision = decision_for(spec)
    assert decision.allowed and decision.reported and decision.label == "reported"
    assert decision.reason == policy.REQUEST_NOT_ALLOWED and decision.transform == {}


def test_entry_without_rules_is_not_asked():
    spec = parse_spec("network:\n  allowlist:\n    - domain: api.example.test\n")
    decision = policy.check_name(spec, "api.example.test")
    assert policy.check_request(spec, decision, b"DELETE", b"/a%2Fb", False) is decision


def test_a_destination_refusal_keeps_its_reason():
    spec = spec_with("read-only")
    named = policy.with_reason(spec, policy.check_name(spec, "api.example.test"), policy.HOST_MISMATCH)
    assert policy.check_request(spec, named, b"POST", b"/x", False) is named


def test_refusal_bytes():
    response = refusals.request_not_allowed("api.example.test", "POST", "/repos/other/y/issues", "")
    assert assemble_response(response) == (
        b"HTTP/1.1 403 Forbidden\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Egress-Denied: request_not_allowed\r\n"
        b"content-length: 138\r\n"
        b"\r\n"
        b'{"error": "egress_denied", "reason": "request_not_allowed", "host": "api.example.test", '
        b'"method": "POST", "path": "/repos/other/y/issues"}'
    )


def test_refusal_of_an_ambiguous_path_says_why():
    body = json.loads(refusals.request_not_allowed("h.test", "GET", '/a%2Fb"<x>', "an encoded '/' (%2F) in the path").content)
    assert body == {
        "error": "egress_denied", "reason": "request_not_allowed", "host": "h.test", "method": "GET",
        "path": '/a%2Fb"<x>', "detail": "an encoded '/' (%2F) in the path",
    }  # fmt: skip


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_audit_line_names_the_rule(fmt):
    spec = spec_with("git-read")
    out = io.StringIO()
    log = DecisionLog(fmt, out)
    log.record(decision_for(spec, b"POST", b"/x.git/git-upload-pack"), client="c", port=443, method="POST")
    log.record(decision_for(spec, b"POST", b"/x.git/git-receive-pack?secret=1"), client="c", port=443, method="POST")
    first, second = out.getvalue().splitlines()
    if fmt == "json":
        allowed, refused = json.loads(first), json.loads(second)
        assert (allowed["decision"], allowed["request_rule"], allowed["rule"]) == ("allowed", "git-read/upload-pack", "api.example.test")
        assert "path" not in allowed
        assert (refused["decision"], refused["reason"], refused["request_rule"]) == ("blocked", "request_not_allowed", "")
        assert refused["path"] == "/x.git/git-receive-pack"
    else:
        assert first.endswith(" request_rule=git-read/upload-pack")
        assert second.endswith(" request_rule=- path=/x.git/git-receive-pack")
    assert "secret" not in out.getvalue()


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(["GET", "get", "/a", "a", "/**", "read-only", "git-read", "*", "/a*"])
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["methods", "paths", "x"]), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=1500, deadline=None)
@given(_VALUES)
def test_any_requests_value_is_a_spec_or_a_spec_error(value):
    text = json.dumps({"network": {"allowlist": [{"domain": "a.test", "requests": value}]}})
    try:
        spec = parse_spec(text, source="s.json")
    except SpecError as exc:
        assert all(p.startswith("s.json: network.allowlist[0].requests") for p in exc.problems), exc.problems
    else:
        assert spec.entries[0].requests is not None


def test_check_command_reports_rule_problems_without_a_traceback(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "network:\n  allowlist:\n    - domain: github.com\n      requests: git-write\n"
        "    - domain: api.github.com\n      requests:\n        - {methods: [post], paths: [repos/x]}\n"
    )
    script = Path(sys.executable).with_name("egress-proxy")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "egress.cli"]
    done = subprocess.run([*command, "check", "--spec", str(spec)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert (done.stdout + done.stderr).splitlines() == [
        f"{spec}: network.allowlist[0].requests: unknown preset 'git-write' (expected one of read-only, git-read, or a list of items)",
        f"{spec}: network.allowlist[1].requests[0].methods[0]: 'post' is not a registered HTTP method (IANA); methods are case-sensitive: did you mean POST?",
        f"{spec}: network.allowlist[1].requests[0].paths[0]: 'repos/x' is not an absolute path (it must start with '/')",
    ]


# -- git-read's LFS batch: the body must ask for a download ---------------------------------------

BATCH = b"/x.git/info/lfs/objects/batch"


def lfs_decision(spec, length: str | None, content: bytes | None, limit: int = 65536):
    decision = decision_for(spec, b"POST", BATCH)
    assert decision.request is not None and decision.request.body == rr.LFS_DOWNLOAD
    return policy.check_request_body(spec, decision, length, content, limit)


@pytest.mark.parametrize(
    ("length", "content", "problem"),
    [
        ("40", b'{"operation": "download", "objects": []}', None),
        ("40", None, None),  # at the headers: only the length
        ("38", b'{"operation": "upload", "objects": []}', "does not ask for operation 'download'"),
        ("2", b"[]", "does not ask for operation 'download'"),
        ("5", b"nope!", "not JSON"),
        ("2", b"\xff\xfe", "not JSON"),
        ('{"operation": "Download"}', b'{"operation": "Download"}', "Content-Length"),
        (None, None, "Content-Length of at most 65536 bytes"),  # chunked, or HTTP/2 without one: streamed past 64 KiB
        ("65537", None, "Content-Length of at most 65536 bytes"),
        ("-1", None, "Content-Length"),
        ("0x10", None, "Content-Length"),
        ("\u00b2", None, "Content-Length"),  # a digit to str.isdigit, not to int()
        ("\uff11\uff12", None, "Content-Length"),
    ],
)
def test_lfs_batch_body(length, content, problem):
    decision = lfs_decision(spec_with("git-read"), length, content)
    if problem is None:
        assert decision.allowed and decision.request is not None and decision.request.item == "git-read/lfs"
    else:
        assert decision.reason == policy.REQUEST_NOT_ALLOWED and not decision.allowed
        assert decision.request is not None and problem in decision.request.problem and decision.request.item == ""
        assert decision.request.path == "/x.git/info/lfs/objects/batch"


def test_lfs_batch_body_limit_follows_the_streaming_threshold():
    spec = spec_with("git-read")
    assert lfs_decision(spec, "100", None, limit=1024).allowed
    assert not lfs_decision(spec, "2000", None, limit=1024).allowed  # it would be streamed: not checkable


def test_lfs_batch_upload_is_reported_in_report_mode():
    spec = parse_spec("network:\n  mode: report\n  allowlist:\n    - domain: api.example.test\n      requests: git-read\n")
    decision = lfs_decision(spec, "38", b'{"operation": "upload", "objects": []}')
    assert decision.allowed and decision.reported


def test_items_without_a_body_check_are_not_asked():
    spec = spec_with("read-only")
    decision = decision_for(spec, b"GET", b"/x")
    assert policy.check_request_body(spec, decision, None, None, 65536) is decision
