"""Spec parsing and validation (SPEC §2): every problem names its entry and field."""

from __future__ import annotations

import ipaddress
import json

import pytest
import yaml

from egress.policy import secrets
from egress.policy.spec import SpecError, load_spec, parse_spec

CANARY = "canary-7f3a9c-SECRET-do-not-print"

ENVIRONMENT = {
    "type": "remote",
    "sources": [{"type": "git", "url": "https://example.invalid/repo.git"}],
    "network": {
        "allowlist": [
            {
                "domain": "telemetry.example.com",
                "transform": {"Authorization": "Bearer telemetry_secret_token_123"},
            },
            {"domain": "*.internal.example.com"},
            {"domain": "*"},
        ]
    },
}


def _rules(spec):
    return [e.rule for e in spec.entries]


@pytest.mark.parametrize(
    ("text", "source"),
    [
        (json.dumps(ENVIRONMENT), "env.json"),
        (json.dumps(ENVIRONMENT), "env.yaml"),  # YAML reads JSON too
        (json.dumps(ENVIRONMENT), "<spec>"),
        (yaml.safe_dump(ENVIRONMENT), "env.yaml"),
        (yaml.safe_dump(ENVIRONMENT), "env.yml"),
        (json.dumps(ENVIRONMENT["network"]), "network.json"),  # bare `network` part
        (yaml.safe_dump(ENVIRONMENT["network"]), "network.yaml"),
        (json.dumps({"network": ENVIRONMENT["network"]}), "wrapped.json"),
    ],
)
def test_parses_whole_environment_or_network(text, source):
    spec = parse_spec(text, source=source)
    assert _rules(spec) == ["telemetry.example.com", "*.internal.example.com", "*"]
    assert spec.mode == "enforce"
    assert spec.allow_cidrs == ()
    assert spec.has_transforms
    telemetry = spec.allowlist.match("telemetry.example.com")
    assert (
        telemetry.transform["Authorization"].reveal()
        == "Bearer telemetry_secret_token_123"
    )
    assert (
        spec.allowlist.match("a.b.internal.example.com").rule
        == "*.internal.example.com"
    )
    assert spec.allowlist.match("other.example.org").rule == "*"


def test_yaml_with_extensions():
    text = """
network:
  mode: report
  allowCidrs: [10.0.0.0/8, "198.18.0.0/15", fd00::/8]
  allowlist:
    - domain: API.Example.COM.
      transform:
        X-Api-Key: "${env:API_KEY}"
    - domain: "*.svc.example.com"
"""
    spec = parse_spec(text, source="s.yaml", environ={"API_KEY": "k-123"})
    assert spec.mode == "report"
    assert spec.allow_cidrs == tuple(
        ipaddress.ip_network(c) for c in ("10.0.0.0/8", "198.18.0.0/15", "fd00::/8")
    )
    entry = spec.allowlist.match("api.example.com")
    assert entry.rule == "API.Example.COM."
    assert entry.transform["X-Api-Key"].reveal() == "k-123"


def test_no_transform_means_no_credentials():
    spec = parse_spec('{"allowlist": [{"domain": "a.example.com"}]}', source="s.json")
    assert not spec.has_transforms
    assert spec.entries[0].transform == {}


def test_empty_allowlist_is_valid_and_blocks_everything():
    spec = parse_spec('{"network": {"allowlist": []}}', source="s.json")
    assert spec.entries == ()
    assert spec.allowlist.match("example.com") is None


# --- secret references ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("Bearer ${env:TOKEN}", "Bearer tok-1"),
        ("${env:TOKEN}${env:OTHER}", "tok-1two"),
        ("$${env:TOKEN}", "${env:TOKEN}"),  # escaped: literal, not resolved
        ("a$${b", "a${b"),
        (
            "$$${env:TOKEN}",
            "$${env:TOKEN}",
        ),  # the escape consumes `$${`, the next `$` stays
        ("cost $5", "cost $5"),
        ("{env:TOKEN}", "{env:TOKEN}"),
    ],
)
def test_expand(value, expected):
    assert (
        secrets.expand(value, {"TOKEN": "tok-1", "OTHER": "two"}).reveal() == expected
    )


def test_dollar_escape_in_spec_gives_literal():
    spec = parse_spec(
        json.dumps(
            {
                "allowlist": [
                    {
                        "domain": "a.example.com",
                        "transform": {"X-T": "pre$${env:NOPE}post"},
                    }
                ]
            }
        ),
        source="s.json",
        environ={},
    )
    assert spec.entries[0].transform["X-T"].reveal() == "pre${env:NOPE}post"


def test_file_reference(tmp_path):
    secret_file = tmp_path / "token"
    secret_file.write_text("file-token\n")
    spec = parse_spec(
        json.dumps(
            {
                "allowlist": [
                    {
                        "domain": "a.example.com",
                        "transform": {
                            "Authorization": f"Bearer ${{file:{secret_file}}}"
                        },
                    }
                ]
            }
        ),
        source="s.json",
    )
    # The newline an editor or `echo` leaves is not part of the token.
    assert spec.entries[0].transform["Authorization"].reveal() == "Bearer file-token"


def test_secret_never_printed():
    secret = secrets.Secret(CANARY)
    assert CANARY not in repr(secret)
    assert CANARY not in str(secret)
    assert CANARY not in f"{secret} {secret!r} {[secret]} { {'a': secret} }"
    assert secret == secrets.Secret(CANARY)
    assert secret != secrets.Secret("other")


# --- errors -------------------------------------------------------------------------


def _problems(network, environ=None, source="s.json"):
    with pytest.raises(SpecError) as info:
        parse_spec(
            json.dumps({"network": network}), source=source, environ=environ or {}
        )
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def _entry(transform, domain="api.example.com"):
    return {
        "allowlist": [
            {"domain": "ok.example.com"},
            {"domain": domain, "transform": transform},
        ]
    }


ERRORS = [
    # (network, path the single problem must name, words that must appear)
    ({"allowlist": [{"domain": "*host"}]}, "network.allowlist[0].domain", "'*host'"),
    ({"allowlist": [{"domain": "a*.b"}]}, "network.allowlist[0].domain", "'a*.b'"),
    (
        {"allowlist": [{"domain": "*.*.a.example"}]},
        "network.allowlist[0].domain",
        "first label",
    ),
    (
        {"allowlist": [{"domain": "*.com"}]},
        "network.allowlist[0].domain",
        "public suffix",
    ),
    (
        {"allowlist": [{"domain": "*.co.uk"}]},
        "network.allowlist[0].domain",
        "public suffix",
    ),
    (
        {"allowlist": [{"domain": "*.10.0.0.1"}]},
        "network.allowlist[0].domain",
        "IP address",
    ),
    ({"allowlist": [{"domain": ""}]}, "network.allowlist[0].domain", "empty"),
    ({"allowlist": [{"domain": 5}]}, "network.allowlist[0].domain", "must be a string"),
    (
        {"allowlist": [{"domain": None}]},
        "network.allowlist[0].domain",
        "must be a string",
    ),
    (
        {"allowlist": [{"transform": {"A": "b"}}]},
        "network.allowlist[0].domain",
        "missing",
    ),
    ({"allowlist": ["a.example.com"]}, "network.allowlist[0]", "must be a mapping"),
    (
        {"allowlist": [{"domain": "*", "transform": {"Authorization": "x"}}]},
        "network.allowlist[0].transform",
        "'*'",
    ),
    (_entry({"Bad Header": "v"}), "network.allowlist[1].transform", "'Bad Header'"),
    (_entry({"X:Y": "v"}), "network.allowlist[1].transform", "'X:Y'"),
    (_entry({"": "v"}), "network.allowlist[1].transform", "token"),
    (
        _entry({"Host": "evil.example"}),
        "network.allowlist[1].transform.Host",
        "cannot be injected",
    ),
    (
        _entry({"content-length": "0"}),
        "network.allowlist[1].transform.content-length",
        "cannot be injected",
    ),
    (
        _entry({"Transfer-Encoding": "chunked"}),
        "network.allowlist[1].transform.Transfer-Encoding",
        "cannot be injected",
    ),
    (
        _entry({"X-A": "a\r\nX-Evil: 1"}),
        "network.allowlist[1].transform.X-A",
        "CR or LF",
    ),
    (_entry({"X-A": "a\nb"}), "network.allowlist[1].transform.X-A", "CR or LF"),
    (_entry({"X-A": "a\rb"}), "network.allowlist[1].transform.X-A", "CR or LF"),
    (_entry({"X-A": "a\0b"}), "network.allowlist[1].transform.X-A", "NUL"),
    (
        _entry({"X-A": "a\x07b"}),
        "network.allowlist[1].transform.X-A",
        "control character",
    ),
    (
        _entry({"X-A": "a\x7fb"}),
        "network.allowlist[1].transform.X-A",
        "control character",
    ),
    (_entry({"X-A": ""}), "network.allowlist[1].transform.X-A", "empty"),
    (_entry({"X-A": " padded"}), "network.allowlist[1].transform.X-A", "whitespace"),
    (_entry({"X-A": "tök"}), "network.allowlist[1].transform.X-A", "ASCII"),
    (_entry({"X-A": 5}), "network.allowlist[1].transform.X-A", "must be a string"),
    (_entry({"X-A": None}), "network.allowlist[1].transform.X-A", "must be a string"),
    (
        _entry({"X-A": "${env:MISSING}"}),
        "network.allowlist[1].transform.X-A",
        "MISSING is not set",
    ),
    (
        _entry({"X-A": "${file:/nonexistent/egress-test}"}),
        "network.allowlist[1].transform.X-A",
        "file not found",
    ),
    (_entry({"X-A": "${file:x}"}), "network.allowlist[1].transform.X-A", "absolute"),
    (
        _entry({"X-A": "${vault:x}"}),
        "network.allowlist[1].transform.X-A",
        "unknown reference",
    ),
    (
        _entry({"X-A": "${env:}"}),
        "network.allowlist[1].transform.X-A",
        "unknown reference",
    ),
    (
        _entry({"X-A": "abc${env:X"}),
        "network.allowlist[1].transform.X-A",
        "unterminated",
    ),
    (_entry({"X-A": "a", "x-a": "b"}), "network.allowlist[1].transform.x-a", "twice"),
    # A final newline slips past a `^...$` pattern; the header line would then be
    # broken on the wire, and `Transfer-Encoding\n` past the framing-header check.
    (_entry({"Authorization\n": "Bearer x"}), "network.allowlist[1].transform", "RFC 9110 token"),
    (_entry({"Transfer-Encoding\n": "chunked"}), "network.allowlist[1].transform", "RFC 9110 token"),
    (
        {"allowlist": [{"domain": "a.example.com", "transform": ["X-A: b"]}]},
        "network.allowlist[0].transform",
        "mapping",
    ),
    (
        {"allowlist": [{"domain": "a.example.com"}, {"domain": "A.Example.com."}]},
        "network.allowlist[1].domain",
        "repeats allowlist[0]",
    ),
    (
        {"allowlist": [{"domain": "*.example.com"}, {"domain": "*.EXAMPLE.com"}]},
        "network.allowlist[1].domain",
        "repeats",
    ),
    (
        {"allowlist": [{"domain": "*"}, {"domain": " * "}]},
        "network.allowlist[1].domain",
        "repeats",
    ),
    (
        {"allowlist": [{"domain": "a.example.com", "tranform": {}}]},
        "network.allowlist[0].tranform",
        "unknown field",
    ),
    ({"allowlist": [], "allowlst": []}, "network.allowlst", "unknown field"),
    ({"allowlist": [], "mode": "block"}, "network.mode", "'block'"),
    ({"allowlist": [], "mode": "Enforce"}, "network.mode", "'Enforce'"),
    (
        {"allowlist": [], "allowCidrs": ["127.0.0.0/8"]},
        "network.allowCidrs[0]",
        "loopback",
    ),
    ({"allowlist": [], "allowCidrs": ["0.0.0.0/0"]}, "network.allowCidrs[0]", "never"),
    (
        {"allowlist": [], "allowCidrs": ["8.8.8.0/24"]},
        "network.allowCidrs[0]",
        "global",
    ),
    (
        {"allowlist": [], "allowCidrs": ["10.0.0.1/8"]},
        "network.allowCidrs[0]",
        "host bits",
    ),
    (
        {"allowlist": [], "allowCidrs": ["not-a-cidr"]},
        "network.allowCidrs[0]",
        "not a CIDR",
    ),
    (
        {"allowlist": [], "allowCidrs": "10.0.0.0/8"},
        "network.allowCidrs",
        "must be a list",
    ),
    ({"allowlist": "*"}, "network.allowlist", "must be a list"),
    ({}, "network.allowlist", "missing"),
]


@pytest.mark.parametrize(
    ("network", "path", "words"), ERRORS, ids=[e[1] + ":" + e[2] for e in ERRORS]
)
def test_each_problem_names_entry_and_field(network, path, words):
    problems = _problems(network)
    assert len(problems) == 1, problems
    (problem,) = problems
    assert problem.startswith(f"s.json: {path}: "), problem
    assert words in problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("${file:/a\0b}", "not a valid path"),
        ("${file:/a\ud800}", "not a valid path"),
        ("${env:A\0B}", "is not set"),
        ("${env:\ud800}", "is not set"),
    ],
)
def test_unusable_references_against_real_environment(value, words):
    # environ=None reads os.environ and the file system, which reject NUL and lone surrogates
    # with ValueError; that must come out as one problem, not an exception.
    text = json.dumps(
        {"allowlist": [{"domain": "a.example.com", "transform": {"X-A": value}}]}
    )
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="s.json", environ=None)
    (problem,) = info.value.problems
    assert problem.startswith("s.json: network.allowlist[0].transform.X-A: ")
    assert words in problem


@pytest.mark.parametrize(
    "network",
    [
        {"allowlist": [], "a\nb": 1},
        {"allowlist": [{"domain": "a.example.com", "x\r\ny": 1}]},
        {
            "allowlist": [
                {"domain": "a.example.com", "transform": {"X-A": "${vault:a\nb}"}}
            ]
        },
        {
            "allowlist": [
                {"domain": "a.example.com", "transform": {"X-A": "${env:A\nB}"}}
            ]
        },
    ],
)
def test_each_problem_stays_on_one_line(network):
    (problem,) = _problems(network)
    assert problem.isprintable(), problem


def test_several_problems_reported_at_once():
    problems = _problems(
        {
            "mode": "block",
            "allowCidrs": ["127.0.0.0/8", "10.0.0.0/8", "8.8.8.0/24"],
            "allowlist": [
                {"domain": "ok.example.com"},
                {"domain": "*.com"},
                {
                    "domain": "api.example.com",
                    "transform": {
                        "Bad Header": "v",
                        "X-A": "a\r\nX-Evil: 1",
                        "Host": "h",
                    },
                },
                {"domain": "*", "transform": {"Authorization": "x"}},
                {"domain": "ok.example.com"},
            ],
            "extra": True,
        }
    )
    paths = [p.split(": ")[1] for p in problems]
    assert sorted(paths) == sorted(
        [
            "network.extra",
            "network.mode",
            "network.allowCidrs[0]",
            "network.allowCidrs[2]",
            "network.allowlist[1].domain",
            "network.allowlist[2].transform",
            "network.allowlist[2].transform.X-A",
            "network.allowlist[2].transform.Host",
            "network.allowlist[3].transform",
            "network.allowlist[4].domain",
        ]
    )


def test_problems_never_show_secret_values():
    environ = {"CANARY": CANARY}
    problems = _problems(
        {
            "allowlist": [
                {
                    "domain": "a.example.com",
                    "transform": {"Authorization": "Bearer ${env:CANARY}\r\nX-Evil: 1"},
                },
                {"domain": "b.example.com", "transform": {"X-A": f"{CANARY}\r\n"}},
                {"domain": "c.example.com", "transform": {"X-B": f" {CANARY}"}},
                {"domain": "d.example.com", "transform": {"X-C": f"{CANARY}\0"}},
                {"domain": "*", "transform": {"X-D": CANARY}},
                {"domain": "e.example.com", "transform": {"Host": CANARY}},
                {"domain": "f.example.com", "transform": {"X-E": f"{CANARY}ü"}},
            ]
        },
        environ=environ,
    )
    assert len(problems) == 7
    assert not any(CANARY in p for p in problems)
    assert not any("7f3a9c" in p for p in problems)


@pytest.mark.parametrize(
    ("text", "source", "words"),
    [
        ('{"network": {"allowlist": [}', "s.json", "line 1"),
        ('{\n  "network": {\n    "allowlist": [\n  }\n}', "s.json", "line 4"),
        (
            "network:\n  allowlist:\n    - domain: a\n   - domain: b\n",
            "s.yaml",
            "line 4",
        ),
        ("network: {allowlist: [\n", "s.yaml", "line 2"),
        ("network:\n\tallowlist: []\n", "s.yaml", "line 2"),
        ("a: !!python/object/apply:os.system [true]\n", "s.yaml", "line 1"),
    ],
)
def test_malformed_document_reports_line(text, source, words):
    with pytest.raises(SpecError) as info:
        parse_spec(text, source=source)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"{source}: {words}")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[1, 2]", "top level must be a mapping"),
        ("", "empty (expected the environment object"),
        ("just a string", "top level must be a mapping"),
        ("type: remote\n", "no `network`"),
        ("network: [a]\n", "network: must be a mapping"),
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
        ("{a: " * 5000 + "1" + "}" * 5000, "nested too deeply"),
    ],
)
def test_unusable_documents(text, words):
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="s.yaml")
    assert words in info.value.problems[0]


def test_deeply_nested_json_is_a_spec_error():
    with pytest.raises(SpecError, match="nested too deeply"):
        parse_spec("[" * 100000, source="s.json")


def test_load_spec_missing_file(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "absent.yaml")


def test_load_spec_directory(tmp_path):
    with pytest.raises(SpecError, match="is a directory, not a spec file"):
        load_spec(tmp_path)


def test_load_spec_reads_file_and_names_it(tmp_path):
    path = tmp_path / "env.json"
    path.write_text(json.dumps({"network": {"allowlist": [{"domain": "*.com"}]}}))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.problems[0].startswith(f"{path}: network.allowlist[0].domain: ")
    path.write_text(json.dumps(ENVIRONMENT))
    assert _rules(load_spec(path)) == [
        "telemetry.example.com",
        "*.internal.example.com",
        "*",
    ]
