"""egress.policy.yaml_events against yaml.load: the same value for every document it builds,
a fallback for every document it does not (the full loader then decides)."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
import yaml

from egress.policy import yaml_events
from egress.policy.spec import _MAX_DEPTH, _YAML_LOADER, SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[3]
LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if hasattr(yaml, "CSafeLoader") else [])

# Documents the fast path must build itself (never fall back), one YAML 1.1 corner each.
PLAIN = [
    "",
    "# only a comment\n",
    "---\n",
    "--- \n...\n",
    "a: 1\n...\n",
    "--- a\n",
    "plain string",
    "~",
    "null",
    "Null",
    "NULL",
    "a:",
    "a: ~\nb: null\nc:\n",
    "[~, null, '', \"\", '~', 'null']",
    # YAML 1.1 booleans in every case PyYAML knows, and near misses that stay strings.
    "[yes, Yes, YES, no, No, NO, true, True, TRUE, false, False, FALSE]",
    "[on, On, ON, off, Off, OFF]",
    "[y, Y, n, N, yEs, tRUE, oN, 'yes', \"no\"]",
    "yes: no\non: off\n",
    # Integers: decimal, signs, underscores, binary, octal (0 prefix, not 0o), hex, base 60.
    "[0, -0, +0, 1, -17, +17, 1_000, 1__0, 0b1010, -0b1_0, 0x1F, 0X1f, 0xff_ff, -0x10]",
    "[017, 0o17, 0_7, 08, 09, 0_, 1:30, 190:20:30, -1:30, 1:60, 1:5:7]",
    "[12345678901234567890123, -9223372036854775809]",
    # Floats: exponent forms (YAML 1.1 wants a sign on the exponent), base 60, specials.
    "[1.5, -1.5, +.5, 1., 1.0e+3, 1.0e-3, 1e3, 1.0e3, 6.8523015e+5, 685.230_15e+03, 1_0.5]",
    "[190:20:30.15, -1:30.5, ._, .5_, 1_.5e+3]",
    "[.inf, .Inf, .INF, -.inf, +.inf, .nan, .NaN, .NAN, .nAn, inf, nan]",
    "{a: .nan, .nan: 1}",
    # Quoted look-alikes stay strings.
    "['1', \"1.5\", '0x1F', 'true', '~', '.nan', '1:30', '2001-12-14']",
    # Block scalars, chomping and folding.
    "a: |\n  line 1\n  line 2\nb: >\n  folded\n  text\n\n  para\nc: |-\n  x\nd: >+\n  y\n\ne: 1\n",
    "- |\n  123\n- >\n  true\n",
    # Flow collections, nested, empty, trailing commas.
    "{a: [1, {b: c}], d: {}, e: [], f: [[]], g: {h: {i: [j, k,]},}}",
    "[a, [b, [c, [d]]], {x: y}]",
    "[]",
    "{}",
    # Empty values, in mappings and sequences.
    "a:\nb:\n  c:\n  d: []\n",
    "- \n- a\n-\n",
    "? a\n: b\n? c\n",
    "{a, b: , c: d}",
    # Duplicate keys: the last value wins, at the first key's position; 1 and true are one key.
    "a: 1\nb: 2\na: 3\n",
    "a: {x: 1}\na: 2\n",
    "1: a\ntrue: b\n1.0: c\n",
    "0: a\nfalse: b\n~: c\nnull: d\n",
    # Non-string keys.
    "1: a\n1.5: b\n~: c\nyes: d\n0x10: e\n'1': f\n",
    # Unicode, escapes, comments, document markers.
    "héllo: wörld\n日本: 語\nemoji: \"\\U0001F600\"\n",
    "a: \"tab\\there\\nnl \\x41 \\u00e9\"\nb: 'it''s'\n",
    "# c\na: 1 # trailing\n# c\nb: 'x # not a comment'\n",
    "%YAML 1.1\n---\na: 1\n",
    "---\na: 1\n...\n",
    "a: 'b: c'\n",
    "key with spaces: value with spaces\n'quoted key': \"quoted value\"\n",
    "a: '-'\nb: -x\n",
    "multi\n  line\n  plain\n",
    "a: 1\n  \nb: 2\n",
    "- [1, 2]\n- {a: b}\n- - nested\n  - seq\n",
    "a: [1, 2]\n",
    "'!': x\n",
    "x: 2001-12-14t" + "\n",  # not a timestamp: a string
    "x: 1:99\n",  # not base 60: a string
    "x: +\ny: -x\nz: .\n",
    "x: <<a\ny: =a\n",
    "x: '<<'\ny: '='\n",
    "domain: h1.svc1.example.com\n",
    "allowlist:\n  - domain: '*.w0.example.net'\n  - domain: inject.bench.test\n"
    "    transform:\n      Authorization: Bearer ${env:BENCH_TOKEN}\n",
]

# Documents the fast path must leave to the full loader.
FALLS_BACK = [
    "a: &x 1\nb: *x\n",
    "a: &x 1\n",
    "a: &x [1]\n",
    "a: &x {b: 1}\n",
    "base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n",
    "<<: {x: 1}\n",
    "a: !!str 1\n",
    "a: ! 1\n",
    "a: ! [1]\n",
    "a: ! {b: 1}\n",
    "! a\n",
    "a: !!int '1'\n",
    "a: !!float 1\n",
    "a: !!seq [1]\n",
    "a: !!map {b: 1}\n",
    "a: !!set {b, c}\n",
    "a: !!omap [b: 1]\n",
    "a: !!binary aGVsbG8=\n",
    "a: !local 1\n",
    "%TAG !e! tag:example.com,2000:\n---\na: !e!x 1\n",
    "a: 2001-12-14\n",
    "a: 2001-12-14t21:59:43.10-05:00\n",
    "a: 2001-12-14 21:59:43.10 -5\n",
    "=: 1\n",
    "a: =\n",
    "[=]\n",
    "? [a, b]\n: c\n",
    "? {a: b}\n: c\n",
    "{[a]: b}\n",
    "--- 1\n--- 2\n",
    "a: 1\n---\nb: 2\n",
    "a: 1\n...\n---\n",
    "a: 0x_\n",
    "a: 0b_\n",
    "a: 2001-02-30\n",
    # Syntax errors: the full loader raises its own error, with its marks.
    "a: [1, 2\n",
    "a: b: c\n",
    "network:\n  allowlist:\n    - domain: a\n   - domain: b\n",
    "a:\n\tb: 1\n",
    "a: *undefined\n",
    "a: '\n",
    "[a, b]]\n",
]


def same(a, b) -> bool:
    """Equal, type for type (True is not 1, 1.0 is not 1), keys in the same order; nan is nan."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    return a == b


def full(text: str, loader) -> tuple[bool, object]:
    """(True, value) from yaml.load, or (False, the exception it raised)."""
    try:
        return True, yaml.load(text, Loader=loader)
    except Exception as exc:  # PyYAML's constructors raise ValueError, KeyError, ...
        return False, exc


def assert_matches_full(text: str, loader) -> object:
    fast = yaml_events.load(text, loader)
    ok, expected = full(text, loader)
    if fast is not yaml_events.FALLBACK:
        assert ok, f"fast path built {fast!r} where yaml.load raises {expected!r}: {text!r}"
        assert same(fast, expected), f"{fast!r} != {expected!r} for {text!r}"
    return fast


def _repo_documents() -> list[tuple[str, str]]:
    """Every YAML file of the repository, every ```yaml block of the docs, and every string
    constant of the tests (most are not YAML specs, but each is a YAML document or an error)."""
    docs: list[tuple[str, str]] = []
    for path in sorted(ROOT.glob("**/*.y*ml")):
        if ".venv" not in path.parts and path.suffix in (".yaml", ".yml"):
            docs.append((str(path.relative_to(ROOT)), path.read_text()))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", path.read_text(), re.S)):
            docs.append((f"{path.name} yaml block {i}", block))
    strings: set[str] = set()
    for path in sorted((ROOT / "tests").glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 20_000:
                strings.add(node.value)
    docs.extend((f"test string {s[:40]!r}", s) for s in sorted(strings))
    return docs


REPO_DOCUMENTS = _repo_documents()


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
def test_repository_documents_read_as_yaml_load_reads_them(loader):
    assert len(REPO_DOCUMENTS) > 500  # the collection found the repository's documents
    built = sum(assert_matches_full(text, loader) is not yaml_events.FALLBACK for _, text in REPO_DOCUMENTS)
    assert built > len(REPO_DOCUMENTS) // 2  # and most of them took the fast path


def test_the_example_spec_takes_the_fast_path():
    text = (ROOT / "examples" / "spec.yaml").read_text()
    assert yaml_events.load(text, _YAML_LOADER) is not yaml_events.FALLBACK


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("text", PLAIN)
def test_plain_documents_are_built_as_yaml_load_builds_them(text, loader):
    assert assert_matches_full(text, loader) is not yaml_events.FALLBACK


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("text", FALLS_BACK)
def test_other_documents_fall_back(text, loader):
    assert yaml_events.load(text, loader) is yaml_events.FALLBACK


def test_scalars_read_as_yaml_1_1():
    # A few values spelled out, so the differential test cannot agree on a wrong reading.
    doc = yaml_events.load("[yes, Off, 0x1F, 017, 0o17, 1_000, 1:30, .inf, ~, '1', 1.5e+3, 1e3]", _YAML_LOADER)
    assert doc == [True, False, 31, 15, "0o17", 1000, 90, math.inf, None, "1", 1500.0, "1e3"]
    assert yaml_events.load(".nan", _YAML_LOADER) != yaml_events.load(".nan", _YAML_LOADER)  # a nan


def test_loader_with_its_own_constructors_falls_back():
    class Loader(_YAML_LOADER):  # type: ignore[misc, valid-type]
        pass

    Loader.add_constructor("tag:yaml.org,2002:str", lambda loader, node: node.value.upper())
    assert yaml_events.load("a: b\n", Loader) is yaml_events.FALLBACK
    assert yaml.load("a: b\n", Loader=Loader) == {"A": "B"}


def test_nesting_beyond_the_limit_is_refused_on_the_fast_path():
    too_deep = "[" * (_MAX_DEPTH + 1) + "]" * (_MAX_DEPTH + 1)
    assert yaml_events.load(too_deep, _YAML_LOADER) is not yaml_events.FALLBACK
    with pytest.raises(SpecError) as info:
        parse_spec(too_deep, source="s.yaml")
    assert info.value.problems == ["s.yaml: document nested too deeply"]
    block = "".join(f"{'  ' * i}k{i}:\n" for i in range(_MAX_DEPTH + 1)) + f"{'  ' * (_MAX_DEPTH + 1)}leaf: 1\n"
    assert yaml_events.load(block, _YAML_LOADER) is not yaml_events.FALLBACK
    with pytest.raises(SpecError) as info:
        parse_spec(block, source="s.yaml")
    assert info.value.problems == ["s.yaml: document nested too deeply"]
    # At the limit, the shape check lets the document through to validation.
    at_limit = "[" * _MAX_DEPTH + "]" * _MAX_DEPTH
    with pytest.raises(SpecError, match="top level must be a mapping"):
        parse_spec(at_limit, source="s.yaml")


@pytest.mark.parametrize("text", ["a: [1, 2\n", "a: 1\n---\nb: 2\n", "a: *x\n", "a: b: c\n", "a:\n\tb: 1\n"])
def test_errors_keep_the_full_loaders_position_and_problem(text):
    with pytest.raises(yaml.MarkedYAMLError) as raised:
        yaml.load(text, Loader=_YAML_LOADER)
    mark, problem = raised.value.problem_mark, raised.value.problem
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="s.yaml")
    assert info.value.problems == [f"s.yaml: line {mark.line + 1} column {mark.column + 1}: invalid YAML ({problem})"]


@pytest.mark.parametrize(
    "text",
    ["a: 0x_\n", "a: 0b_\n", "a: 2001-02-30\n", "a: !!bool x\n", "a: !!timestamp x\n", "a: !!int ''\n"],
)
def test_values_that_do_not_fit_their_yaml_type_are_a_spec_error(text):
    # PyYAML's constructors raise ValueError, KeyError, IndexError or AttributeError here.
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="s.yaml")
    assert info.value.problems[0].startswith("s.yaml: invalid YAML (a value does not fit its YAML type")
