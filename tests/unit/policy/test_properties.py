"""Property tests: embedded IPv4 forms, normalisation, matching boundaries, spec round-trip."""

from __future__ import annotations

import ipaddress
import json

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from egress.policy import domains
from egress.policy.addresses import AddressClass, classify_address, forbidden_reason
from egress.policy.domains import Allowlist, HostError, normalize_host, parse_pattern
from egress.policy.spec import parse_spec

SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address

# Uniform 32-bit integers almost never land in 127/8 or 169.254/16, so bias toward
# every range the classifier treats specially.
SPECIAL_V4 = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "11.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
]
ipv4s = st.one_of(
    st.ip_addresses(v=4),
    st.sampled_from(SPECIAL_V4).flatmap(lambda n: st.ip_addresses(network=n)),
)
# allowCidrs the spec accepts; 10.0.0.0/7 also covers the global 11.0.0.0/8.
ALLOWABLE = [
    "10.0.0.0/7",
    "100.64.0.0/10",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "192.0.2.0/24",
    "240.0.0.0/5",
]
allow_cidrs = st.lists(st.sampled_from(ALLOWABLE), unique=True, max_size=4).map(
    lambda cs: tuple(ipaddress.ip_network(c) for c in cs)
)
# Teredo servers that are themselves global, some inside 10.0.0.0/7, so that an
# allowed server cannot vouch for a forbidden client.
teredo_servers = st.one_of(
    st.sampled_from([V4("65.54.227.120"), V4("8.8.8.8")]),
    st.ip_addresses(network="11.0.0.0/8"),
)
bits = st.integers(min_value=0, max_value=2**80 - 1)
low32 = st.integers(min_value=0, max_value=2**32 - 1)


def mapped(v4: V4, _extra: int) -> V6:
    return V6(0xFFFF << 32 | int(v4))


def translated(v4: V4, _extra: int) -> V6:
    return V6(0xFFFF << 48 | int(v4))


def nat64(v4: V4, _extra: int) -> V6:
    return V6(int(V6("64:ff9b::")) | int(v4))


def six_to_four(v4: V4, extra: int) -> V6:
    return V6(0x2002 << 112 | int(v4) << 80 | extra)


FORMS = [mapped, translated, nat64, six_to_four]


@SETTINGS
@given(v4=ipv4s, form=st.sampled_from(FORMS), extra=bits, cidrs=allow_cidrs)
def test_embedded_forms_classify_like_their_ipv4(v4, form, extra, cidrs):
    v6 = form(v4, extra)
    assert classify_address(v6) is classify_address(v4)
    assert forbidden_reason(v6) == forbidden_reason(v4)
    assert forbidden_reason(v6, cidrs) == forbidden_reason(v4, cidrs)


@SETTINGS
@given(v4=ipv4s, cidrs=allow_cidrs)
def test_ipv4_compatible_classifies_like_its_ipv4(v4, cidrs):
    assume(int(v4) > 1)  # `::` and `::1` are themselves, not 0.0.0.0 / 0.0.0.1
    v6 = V6(int(v4))
    assert forbidden_reason(v6) == forbidden_reason(v4)
    assert forbidden_reason(v6, cidrs) == forbidden_reason(v4, cidrs)


@SETTINGS
@given(client=ipv4s, server=teredo_servers, flags_port=low32, cidrs=allow_cidrs)
def test_teredo_client_classifies_like_its_ipv4(client, server, flags_port, cidrs):
    v6 = V6(
        0x20010000 << 96
        | int(server) << 64
        | flags_port << 32
        | (~int(client) & 0xFFFFFFFF)
    )
    assert v6.teredo == (server, client)
    assert forbidden_reason(v6) == forbidden_reason(client)
    assert forbidden_reason(v6, cidrs) == forbidden_reason(client, cidrs)


@SETTINGS
@given(v4=ipv4s, cidrs=allow_cidrs)
def test_allow_cidrs_never_open_always_forbidden(v4, cidrs):
    if classify_address(v4) in {AddressClass.LOOPBACK, AddressClass.UNSPECIFIED}:
        assert forbidden_reason(v4, cidrs) == "loopback"
    elif classify_address(v4) in {
        AddressClass.LINK_LOCAL,
        AddressClass.MULTICAST,
        AddressClass.BROADCAST,
    }:
        assert forbidden_reason(v4, cidrs) == "forbidden_address"


# --- names ----------------------------------------------------------------------------

ascii_labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
labels = st.one_of(
    ascii_labels,
    st.sampled_from(
        [
            "bücher",
            "münchen",
            "straße",
            "例え",
            "пример",
            "xn--bcher-kva",
            "0x7f",
            "0177",
            "127",
            "1",
        ]
    ),
)
hosts = st.lists(labels, min_size=1, max_size=5).map(".".join)
host_noise = st.text(alphabet="aZ09-_.:[]%xü\u3002 ", max_size=24)


@SETTINGS
@given(
    raw=st.one_of(hosts, host_noise, hosts.map(str.upper), hosts.map(lambda h: h + "."))
)
def test_normalize_is_idempotent(raw):
    try:
        once = normalize_host(raw)
    except HostError:
        return
    assert normalize_host(once) == once
    assert once == once.lower()
    assert not once.endswith(".")


# Names the shortcut in normalize_host may take, and near misses of it: numeric last
# labels (IPv4 spellings), hex, hyphens at the edges, 63/64-character labels, over 253.
shortcut_candidates = st.one_of(
    hosts,
    st.text(alphabet="ab09x-_.", max_size=40),
    st.lists(st.text(alphabet="a0-", min_size=62, max_size=65), min_size=1, max_size=5).map(".".join),
)


@settings(max_examples=3000, deadline=None)
@given(raw=shortcut_candidates)
def test_the_canonical_name_shortcut_answers_as_the_full_walk(raw):
    def outcome(fn):
        try:
            return fn(raw)
        except HostError as exc:
            return ("error", str(exc))

    assert outcome(normalize_host) == outcome(domains._normalize_in_full)


def _variants(host: str) -> list[str]:
    return [host.upper(), host.title(), host + ".", host.upper() + ".", f"  {host} "]


# Bases that are not public suffixes, so `*.` patterns over them load.
registrable = st.tuples(
    st.lists(ascii_labels, max_size=2),
    st.sampled_from(["example.com", "example.org", "corp.example.net"]),
).map(lambda t: ".".join([*t[0], t[1]]))
pattern_texts = st.one_of(
    registrable, registrable.map(lambda d: "*." + d), st.just("*")
)


def _build(patterns: list[str]) -> Allowlist[str]:
    allowlist: Allowlist[str] = Allowlist()
    for text in patterns:
        allowlist.add(parse_pattern(text), text)
    return allowlist


@SETTINGS
@given(
    patterns=st.lists(pattern_texts, max_size=6),
    prefix=st.lists(ascii_labels, max_size=2),
    base=registrable,
)
def test_match_ignores_case_and_trailing_dot(patterns, prefix, base):
    allowlist = _build(patterns)
    host = ".".join([*prefix, base])
    expected = allowlist.match(normalize_host(host))
    for variant in _variants(host):
        assert allowlist.match(normalize_host(variant)) == expected


@SETTINGS
@given(
    suffix=registrable,
    evil=ascii_labels,
    sub=st.lists(ascii_labels, min_size=1, max_size=3),
)
def test_wildcard_suffix_confusion(suffix, evil, sub):
    allowlist = _build(["*." + suffix])
    assert allowlist.match(normalize_host(".".join([*sub, suffix]))) is not None
    assert allowlist.match(normalize_host(suffix)) is None
    assert allowlist.match(normalize_host(evil + suffix)) is None
    assert allowlist.match(normalize_host(suffix + "." + evil)) is None
    assert allowlist.match(normalize_host(".".join([*sub, suffix, evil]))) is None


@SETTINGS
@given(
    patterns=st.lists(pattern_texts, max_size=6),
    probe_prefix=st.lists(ascii_labels, max_size=2),
    token=st.from_regex(r"[A-Za-z0-9._~+/=-]{1,20}", fullmatch=True),
    mode=st.sampled_from(["enforce", "report"]),
    cidrs=st.lists(st.sampled_from(ALLOWABLE), unique=True, max_size=3),
)
def test_spec_round_trip(patterns, probe_prefix, token, mode, cidrs):
    # One entry per distinct pattern (duplicates are a load error, tested elsewhere).
    seen, entries = set(), []
    for text in patterns:
        key = (parse_pattern(text).kind, parse_pattern(text).domain)
        if key not in seen:
            seen.add(key)
            entry = {"domain": text}
            if text != "*":
                entry["transform"] = {
                    "Authorization": f"Bearer {token}",
                    "X-Rule": text,
                }
            entries.append(entry)
    network = {"mode": mode, "allowCidrs": cidrs, "allowlist": entries}
    document = {"type": "remote", "sources": [], "network": network}
    from_json = parse_spec(json.dumps(document), source="s.json")
    from_yaml = parse_spec(yaml.safe_dump(document), source="s.yaml")
    bare_yaml = parse_spec(yaml.safe_dump(network), source="s.yml")
    reference = _build([e["domain"] for e in entries])

    probes = {"unrelated.example.net"}
    for text in patterns:
        if text == "*":
            continue
        domain = text.removeprefix("*.")
        probes |= {
            domain,
            "x." + domain,
            ".".join([*probe_prefix, domain]),
            "evil" + domain,
        }
    for spec in (from_json, from_yaml, bare_yaml):
        assert spec.mode == mode
        assert [str(c) for c in spec.allow_cidrs] == cidrs
        assert [e.rule for e in spec.entries] == [e["domain"] for e in entries]
        for probe in probes:
            host = normalize_host(probe)
            entry = spec.allowlist.match(host)
            assert (entry.rule if entry else None) == reference.match(host)
            if entry is not None and entry.rule != "*":
                assert entry.transform["Authorization"].reveal() == f"Bearer {token}"
                assert entry.transform["X-Rule"].reveal() == entry.rule
