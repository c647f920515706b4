"""Host normalisation, IP-literal parsing, pattern parsing and most-specific matching."""

from __future__ import annotations

import ipaddress

import pytest

from egress.policy.domains import (
    Allowlist,
    HostError,
    is_loopback_name,
    normalize_host,
    parse_ip_literal,
    parse_ipv4_literal,
    parse_pattern,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("example.com", "example.com"),
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("  example.com  ", "example.com"),
        ("EXAMPLE.com.", "example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example.", "xn--bcher-kva.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("_dmarc.example.com", "_dmarc.example.com"),
        ("a-b.example", "a-b.example"),
        ("a" * 63 + ".example", "a" * 63 + ".example"),
        # IP literals come out in canonical text form.
        ("127.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[::FFFF:127.0.0.1]", "::ffff:127.0.0.1"),
        ("1.2.3.4.", "1.2.3.4"),
        # A trailing dot on a short IPv4 form still yields the address, not a name
        # that only becomes an address when normalised a second time.
        ("1.2.3.", "1.2.0.3"),
        ("127.1.", "127.0.0.1"),
        # U+3002 is a label separator for IDNA; the result is an IP literal.
        ("0x7f\u30021", "127.0.0.1"),
    ],
)
def test_normalize_host(raw, expected):
    assert normalize_host(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        ".",
        "a..b",
        ".example.com",
        "example.com..",
        "-a.example",
        "a-.example",
        "a b.example",
        "a/b.example",
        "a@b.example",
        "a" * 64 + ".example",
        ".".join(["a" * 60] * 5),  # 304 characters
        "[::1",
        "[not-an-ip]",
        "exa\u3002\u3002mple",  # empty label after IDNA mapping
        "\u0000.example",
        # `$` in a label pattern matches before a final newline: a label ending in
        # one (a DNS question can carry it) is not a host name.
        "a\n.example",
        "example\n.test",
        "a.b\n.example",
    ],
)
def test_normalize_host_rejects(raw):
    with pytest.raises(HostError):
        normalize_host(raw)


@pytest.mark.parametrize("raw", [None, 5, b"example.com"])
def test_normalize_host_rejects_non_strings(raw):
    with pytest.raises(HostError):
        normalize_host(raw)


def test_normalize_host_length_limit():
    name = ".".join(["a" * 63] * 3 + ["a" * 61])  # exactly 253
    assert normalize_host(name) == name
    with pytest.raises(HostError, match="253"):
        normalize_host(name + "a")


LOOPBACK_SPELLINGS = [
    ("127.0.0.1", "127.0.0.1"),
    ("127.0.0.2", "127.0.0.2"),
    ("127.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0X7F000001", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("0x7f.0.0.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("0177.1", "127.0.0.1"),
    ("127.0.0.1.", "127.0.0.1"),
    ("[::1]", "::1"),
    ("::1", "::1"),
    ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
    ("[0:0:0:0:0:0:0:1]", "::1"),
    ("0.0.0.0", "0.0.0.0"),
    ("0", "0.0.0.0"),
    ("[::]", "::"),
    ("[fe80::1%eth0]", "fe80::1"),
]


@pytest.mark.parametrize(("raw", "expected"), LOOPBACK_SPELLINGS)
def test_parse_ip_literal_spellings(raw, expected):
    assert parse_ip_literal(raw) == ipaddress.ip_address(expected)
    assert normalize_host(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1.2.3.4", "1.2.3.4"),
        ("1.2.3", "1.2.0.3"),
        ("1.2", "1.0.0.2"),
        ("1", "0.0.0.1"),
        ("0xffffffff", "255.255.255.255"),
        ("4294967295", "255.255.255.255"),
        ("0377.0377.0377.0377", "255.255.255.255"),
        ("10.0xffffff", "10.255.255.255"),
        ("10.0.0xffff", "10.0.255.255"),
    ],
)
def test_parse_ipv4_literal(raw, expected):
    assert parse_ipv4_literal(raw) == ipaddress.IPv4Address(expected)


@pytest.mark.parametrize(
    "raw",
    [
        "1e100.net",
        "256.1.1.1.1",
        "1.2.3.4.5",
        "256.1.1.1",
        "1.256.1.1",
        "1.2.3.256",
        "1.2.65536",
        "1.16777216",
        "4294967296",
        "0x100000000",
        "08.1.1.1",  # 8 is not an octal digit
        "1.2.3.x",
        "a.b.c.d",
        "example.com",
        "-1.2.3.4",
        "1.2.3.+4",
        # int() reads signs, spaces and underscores inet_aton does not; `0x-9` raised
        # AddressValueError out of normalize_host (found by a property test).
        "0.0x-9",
        "0x-1",
        "0x+1",
        "0x_7f.1",
        "1_0.0.0.1",
        "0x 7f.1",
        "",
    ],
)
def test_non_ipv4_literals(raw):
    assert parse_ipv4_literal(raw) is None
    assert parse_ip_literal(raw) is None


@pytest.mark.parametrize(
    "raw", ["[::1", "::g", "[1:2:3:4:5:6:7:8:9]", "example.com", "1e100.net"]
)
def test_parse_ip_literal_none(raw):
    assert parse_ip_literal(raw) is None


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("localhost", True),
        ("a.localhost", True),
        ("a.b.localhost", True),
        ("localhost.example", False),
        ("notlocalhost", False),
        ("example.com", False),
    ],
)
def test_is_loopback_name(host, expected):
    assert is_loopback_name(host) is expected


# --- patterns -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "domain"),
    [
        ("api.example.com", "exact", "api.example.com"),
        ("API.Example.COM.", "exact", "api.example.com"),
        ("bücher.example", "exact", "xn--bcher-kva.example"),
        ("*.example.com", "wildcard", "example.com"),
        ("*.Example.Com.", "wildcard", "example.com"),
        ("*.bücher.example", "wildcard", "xn--bcher-kva.example"),
        (
            "*.github.io",
            "wildcard",
            "github.io",
        ),  # private-section suffix: the operator's choice
        ("*", "any", ""),
        (" * ", "any", ""),
        ("10.0.0.1", "exact", "10.0.0.1"),
        ("0x7f.1", "exact", "127.0.0.1"),
        ("[::1]", "exact", "::1"),
    ],
)
def test_parse_pattern(text, kind, domain):
    pattern = parse_pattern(text)
    assert (pattern.kind, pattern.domain) == (kind, domain)


def test_parse_pattern_keeps_text_for_rule_label():
    assert parse_pattern("*.Example.com").text == "*.Example.com"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("*host", "whole label"),
        ("*host.example.com", "whole label"),
        ("a*.b", "whole label"),
        ("a.*.example.com", "whole label"),
        ("example.*", "whole label"),
        ("**", "whole label"),
        ("*.com", "public suffix"),
        ("*.co.uk", "public suffix"),
        ("*.test", "public suffix"),
        ("*.example", "public suffix"),
        ("*.localhost", "public suffix"),
        ("*.unknowntld", "public suffix"),  # unknown TLDs count as public
        ("*.*.a.b", "first label"),
        ("*.a.*.b", "first label"),
        ("*.127.0.0.1", "IP address"),
        ("*.1.2.3.4", "IP address"),
        ("*.0x7f.1", "IP address"),
        ("*.[::1]", "IP address"),
        ("*.1.2.3.", "IP address"),  # reads as 1.2.0.3 once the trailing dot is dropped
        ("*.0x7f\u30021", "IP address"),  # IDNA maps U+3002 to a dot
        ("", "empty"),
        ("   ", "empty"),
        ("*.", "empty"),
        ("a..b", "label"),
        ("a b.example", "label"),
        # copied from a URL or a proxy config: says what to write instead
        ("https://api.github.com/v3", "not a URL: write 'api.github.com'"),
        ("pypi.org/simple", "not a URL: write 'pypi.org'"),
        ("/etc/hosts", "not a URL or a path"),
        ("api.github.com:443", "without a port: write 'api.github.com'"),
        ("*.pythonhosted.org:443", "without a port: write '\\*.pythonhosted.org'"),
        ("[::1]:443", "malformed IP literal"),
    ],
)
def test_parse_pattern_rejects(text, message):
    with pytest.raises(HostError, match=message):
        parse_pattern(text)


@pytest.mark.parametrize(
    "value", [None, 5, ["a.example"], {"domain": "a.example"}, b"a.example"]
)
def test_parse_pattern_rejects_non_strings(value):
    with pytest.raises(HostError, match="must be a string"):
        parse_pattern(value)


# --- most-specific-wins ---------------------------------------------------------


def _allowlist(*patterns):
    allowlist = Allowlist()
    for text in patterns:
        allowlist.add(parse_pattern(text), text)
    return allowlist


FULL = _allowlist(
    "*",
    "*.example.test",
    "*.deep.example.test",
    "api.example.test",
    "example.test",
    "10.0.0.1",
    "[2001:db8::1]",
)


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ("api.example.test", "api.example.test"),  # exact beats both wildcards
        ("example.test", "example.test"),  # apex: only the exact entry
        ("a.example.test", "*.example.test"),
        ("a.b.example.test", "*.example.test"),
        ("deep.example.test", "*.example.test"),  # `*.deep...` does not cover its apex
        ("x.deep.example.test", "*.deep.example.test"),  # longest suffix wins
        ("x.y.deep.example.test", "*.deep.example.test"),
        (
            "a.api.example.test",
            "*.example.test",
        ),  # exact `api` does not cover subdomains
        ("evilexample.test", "*"),
        ("example.test.evil.test", "*"),
        ("other.test", "*"),
        ("10.0.0.1", "10.0.0.1"),
        ("10.0.0.2", "*"),
        ("2001:db8::1", "[2001:db8::1]"),
    ],
)
def test_most_specific_wins(host, rule):
    assert FULL.match(host) == rule


WILDCARD_ONLY = _allowlist("*.example.test")


@pytest.mark.parametrize(
    ("host", "matches"),
    [
        ("a.example.test", True),
        ("a.b.example.test", True),
        ("a.b.c.d.example.test", True),
        ("example.test", False),
        ("evilexample.test", False),
        ("a.evilexample.test", False),
        ("example.test.evil.test", False),
        ("a.example.test.evil.test", False),
        ("example.tes", False),
        ("xample.test", False),
        ("test", False),
    ],
)
def test_wildcard_boundaries(host, matches):
    assert (WILDCARD_ONLY.match(host) is not None) is matches


def test_no_entry_no_match():
    assert Allowlist().match("example.test") is None
    assert len(Allowlist()) == 0
    assert len(FULL) == 7


@pytest.mark.parametrize(
    ("allowlist", "host", "expected"),
    [
        # An IP host never walks the wildcard table, even when its text ends like a suffix.
        (_allowlist("*.example.test"), "10.0.0.1", None),
        (_allowlist("*.example.test", "*"), "10.0.0.1", "*"),
        (_allowlist("192.0.2.1"), "192.0.2.1", "192.0.2.1"),
        (_allowlist("192.0.2.1"), "192.0.2.2", None),
        (_allowlist("0xc0000201"), "192.0.2.1", "0xc0000201"),
        (_allowlist("*.example.test"), "::1", None),
    ],
)
def test_ip_hosts_match_only_exact_or_any(allowlist, host, expected):
    assert allowlist.match(host) == expected


def test_ip_host_does_not_match_wildcard_over_its_trailing_labels():
    # Inserting straight into the table (bypassing parse_pattern's IP refusal) shows
    # that `match` itself refuses to treat `1.2.3.4` as a subdomain of `2.3.4`.
    allowlist: Allowlist[str] = Allowlist()
    allowlist.wildcard["2.3.4"] = "suffix"
    allowlist.wildcard["3.4"] = "suffix"
    assert allowlist.match("1.2.3.4") is None
    assert allowlist.match("x.2.3.4") == "suffix"


@pytest.mark.parametrize(
    "pattern",
    ["stra\u00dfe.de", "*.stra\u00dfe.de", "\u03c3\u03bf\u03c6\u03bf\u03c2.gr", "a\u200db.example", "a\u200cb.example",
     "STRA\u00dfE.DE."],
)  # fmt: skip
def test_an_allowlist_name_idna2003_and_idna2008_read_differently_is_refused(pattern):  # was a defect
    """`straße.de` became `strasse.de` (Python's codec is IDNA2003): another domain than the
    `xn--strae-oqa.de` every current client looks up; the entry allowed a site nobody named."""
    with pytest.raises(HostError, match=r"read differently by IDNA2003 and IDNA2008; write the name's xn-- form"):
        parse_pattern(pattern)


@pytest.mark.parametrize(
    "pattern, domain",
    [("b\u00fccher.de", "xn--bcher-kva.de"), ("xn--strae-oqa.de", "xn--strae-oqa.de"), ("M\u00fcnchen.DE.", "xn--mnchen-3ya.de")],
)  # fmt: skip
def test_other_internationalised_names_are_read_as_both_standards_read_them(pattern, domain):
    assert parse_pattern(pattern).domain == domain
