"""The docs say what the software does, checked against the real sources: every flag
in `--help` of the installed commands, every reason code in `egress/`, every key of
the chart's values.yaml is documented; every flag, reason code and value the docs
name exists. Adding a flag, a reason or a value without documenting it fails here.
(Metrics and audit-line fields are checked against a real proxy in
tests/e2e/test_documented_metrics.py.)
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest
import yaml
from documented import (
    CHART_README,
    OPERATOR_DOCS,
    README,
    REPO,
    SPEC_REASON_CODES,
    cli_flags,
    docs_text,
    page,
    readme_label_values,
    readme_metrics,
    readme_reason_codes,
    reason_codes,
    section,
    subcommands,
    table_rows,
)

FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# Flags the docs mention that belong to other tools, and which tool.
OTHER_TOOLS = {
    "--cacert": "curl",
    "--from-literal": "kubectl create secret",
    "--set-string": "helm",
    "--dry-run": "helm",
    "--strict": "helm lint, kubernetes-validate",
    "--ignore-hosts": "mitmdump",
    "--latency": "wrk",
    "--nonblocking": "py-spy",
    "--rate": "py-spy",
    "--format": "py-spy",
    "--isolated": "pip",
    "--variant": "mmdebstrap",
    "--network": "podman",
    "--read-only": "podman",
    "--cap-drop": "podman",
}
# Programs of this repository whose flags the docs use: the pattern that names one in a
# command line, and how to learn its flags.
OWN_PROGRAMS = {
    r"egress-proxy run\b": lambda: cli_flags()["egress-proxy run"],
    r"egress-proxy check\b": lambda: cli_flags()["egress-proxy check"],
    r"egress-proxy redirect-rules\b": lambda: cli_flags()["egress-proxy redirect-rules"],
    r"egress-hooks dispatch\b": lambda: cli_flags()["egress-hooks dispatch"],
    r"egress-hooks serve\b": lambda: cli_flags()["egress-hooks serve"],
    r"egress-hooks check\b": lambda: cli_flags()["egress-hooks check"],
    r"egress-(?:proxy|hooks) --version\b": lambda: frozenset({"--version"}),
    r"scripts/run-example\.sh\b": lambda: cli_flags()["egress-proxy run"],  # passes them on
    r"bench/(\w+)\.py\b": None,  # its own --help
    r"scripts/build-image\.sh\b": None,  # the options its argument loop takes
}


@functools.cache
def bench_flags(name: str) -> frozenset[str]:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / f"{name}.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    return frozenset(FLAG.findall(done.stdout + done.stderr))


@functools.cache
def build_image_flags() -> frozenset[str]:
    source = (REPO / "scripts" / "build-image.sh").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^\s*(--[a-z-]+)\)", source, re.M))


def program_flags(match: re.Match) -> frozenset[str]:
    pattern = match.re.pattern
    if pattern.startswith("bench/"):
        return bench_flags(match.group(1))
    if pattern.startswith("scripts/build-image"):
        return build_image_flags()
    return OWN_PROGRAMS[pattern]()


def all_own_flags() -> frozenset[str]:
    return frozenset().union(*cli_flags().values())


def command_lines(text: str) -> list[str]:
    """Command lines as typed: inline code spans, and the lines of fenced blocks
    (continuations joined, trailing `# comments` dropped)."""
    lines = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            lines.append(re.split(r"\s#\s", line, maxsplit=1)[0])
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.M | re.S)
    lines += re.findall(r"`([^`\n]+)`", prose)
    return lines


def attributed_flags(line: str):
    """(program text, flag, flags of that program) for flags that follow one of our programs."""
    starts = sorted(
        (m.start(), m) for pattern in OWN_PROGRAMS for m in re.finditer(pattern, line)
    )
    for i, (_, match) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(line)
        known = program_flags(match)
        for flag in FLAG.findall(line[match.end() : end]):
            yield match.group(0), flag, known


# -- direction 1: the software -> the docs ------------------------------------------------


def synopsis_blocks() -> list[tuple[str, str]]:
    """(document, its "Command line" synopsis block): docs/cli.md's, and docs/hooks.md's
    for the `egress-hooks` commands."""
    blocks = []
    for name, heading in (("cli.md", "# Command line"), ("hooks.md", "## Command line")):
        block = re.search(r"```\n(.*?)```", section(page(name), heading), re.S)
        assert block, f"docs/{name}'s Command line section has no synopsis block"
        blocks.append((name, block.group(0)))
    return blocks


def test_readme_command_line_synopsis_has_every_flag():
    """docs/cli.md lists every subcommand with all its flags, as `--help` has them (for
    `egress-hooks`, docs/cli.md's and docs/hooks.md's synopses together)."""
    synopsis: dict[str, set[str]] = {}
    for _, block in synopsis_blocks():
        current = None
        for line in block.strip("`").splitlines():
            if not line.strip():
                continue
            if line.startswith("egress-"):
                current = " ".join(line.split()[:2])
                synopsis.setdefault(current, set())
            assert current, line
            synopsis[current] |= set(FLAG.findall(line))
    for tool, names in subcommands().items():
        for name in names:
            command = f"{tool} {name}"
            assert command in synopsis, f"docs/cli.md has no `{command}`"
            missing = cli_flags()[command] - {"--help"} - synopsis[command]
            assert not missing, f"`{command}` flags missing from docs/cli.md: {sorted(missing)}"
            extra = synopsis[command] - cli_flags()[command]
            assert not extra, f"docs/cli.md gives `{command}` flags it does not have: {sorted(extra)}"


def test_every_flag_is_explained_in_readme():
    """Beyond the synopsis: each flag of `run`, `redirect-rules` and `egress-hooks` is
    described somewhere else in README or docs/ too (a table row or a sentence)."""
    prose = docs_text()
    for _, block in synopsis_blocks():
        prose = prose.replace(block, "")
    for command, flags in cli_flags().items():
        for flag in flags - {"--help"}:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", prose), f"{command} {flag} is not explained in README or docs/"


def test_version_flags_documented():
    text = README.read_text(encoding="utf-8")
    for tool in ("egress-proxy", "egress-hooks"):
        assert "--version" in cli_flags()[tool]
        assert re.search(rf"^\.venv/bin/{tool} --version +# {tool} ", text, re.M), f"README does not show {tool} --version"


def test_every_reason_code_is_in_readme():
    documented = readme_reason_codes()
    missing = (reason_codes() | SPEC_REASON_CODES) - set(documented)
    assert not missing, f"reason codes missing from the Reason codes table of docs/decisions.md: {sorted(missing)}"


def test_reason_code_constants_are_used_as_written():
    """The reason codes counted in `egress/` are the strings the docs list (no renamed
    constant left behind)."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "egress").rglob("*.py"))
    for code in reason_codes():
        assert f'"{code}"' in source, code


def test_every_egress_header_is_documented():
    source = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "egress").rglob("*.py"))
    headers = set(re.findall(r"X-Egress-[A-Za-z-]+", source))
    assert headers >= {"X-Egress-Denied", "X-Egress-Error"}
    text = docs_text()
    for header in headers | {"Proxy-Authenticate", "Proxy-Authorization"}:
        assert f"`{header}" in text, header


def test_every_metric_and_its_labels_are_in_readme():
    """Every egress_* metric the package defines, with its type and label names, is a row of
    the metric table of docs/operations.md (a real /metrics scrape checks the same in tests/e2e)."""
    from prometheus_client import REGISTRY

    # Each registers its metrics on import; egress.mitm.master imports every addon the proxy
    # runs (alone, this test saw only the metrics some earlier test had imported).
    import egress.hooks.metrics
    import egress.mitm.master
    import egress.ops.metrics  # noqa: F401

    documented = readme_metrics()
    # The registry's own map of collectors: labelled metrics without samples yet have
    # no other place their label names can be read from.
    collectors = [c for c in REGISTRY._collector_to_names if getattr(c, "_name", "").startswith("egress_")]
    assert len(collectors) >= 15
    for collector in collectors:
        name = collector._name + ("_total" if collector._type == "counter" else "_info" if collector._type == "info" else "")
        assert name in documented, f"{name} is missing from the metric table of docs/operations.md"
        doc_type, doc_labels = documented[name]
        assert doc_type == collector._type, f"{name}: docs say {doc_type}, the code {collector._type}"
        labels = set(collector._labelnames) | (set() if collector._type != "info" else set(doc_labels))
        assert labels == doc_labels, f"{name}: docs labels {sorted(doc_labels)}, the code {sorted(labels)}"
    assert set(documented) == {
        c._name + ("_total" if c._type == "counter" else "_info" if c._type == "info" else "") for c in collectors
    }


# -- direction 2: the docs -> the software ------------------------------------------------


def test_documented_reason_codes_exist():
    extra = set(readme_reason_codes()) - reason_codes()
    assert not extra, f"The Reason codes table of docs/decisions.md lists codes egress/ never uses: {sorted(extra)}"


def test_reason_codes_in_docs_exist():
    """A `snake_case` word in backticks next to "reason" in any doc is a real reason code."""
    known = reason_codes() | {"local"}  # `local`: the DNS listener's decision for localhost, not a reason
    for path in OPERATOR_DOCS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"reason(?: code)?s?[ =:`(]+[`\"]?([a-z]+_[a-z_]+)", text):
            assert match.group(1) in known, f"{path.name}: {match.group(0)!r} names no reason code"


@pytest.mark.parametrize("path", OPERATOR_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_flags_in_docs_exist(path):
    """Every `--flag` in an operator doc is a flag of one of our commands (or of the
    other tool the doc shows, listed in OTHER_TOOLS); where the doc shows our command,
    the flag belongs to that very subcommand."""
    text = path.read_text(encoding="utf-8")
    for line in command_lines(text):
        for program, flag, known in attributed_flags(line):
            assert flag in known or flag in OTHER_TOOLS, f"{path.name}: `{program}` has no {flag}: {line!r}"
    own = all_own_flags()
    scripts = frozenset().union(
        build_image_flags(), *(bench_flags(m) for m in set(re.findall(r"bench/(\w+)\.py", text)))
    )
    for flag in set(FLAG.findall(text)):
        assert flag in own or flag in scripts or flag in OTHER_TOOLS, f"{path.name}: {flag} is no flag of ours"


# -- the chart: values.yaml <-> chart README ----------------------------------------------


def value_paths(node, prefix: str = "", leaves_only: bool = False) -> set[str]:
    """Dotted paths of the keys in values.yaml (mappings with keys are descended into)."""
    paths = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths |= value_paths(value, path + ".", leaves_only)
            if leaves_only:
                continue
        paths.add(path)
    return paths


def documented_values() -> set[str]:
    """Keys in the chart README's Values table: `a.b.c` / `d` / `.e` name a.b.c, a.b.d, a.b.e;
    a comma-separated cell names top-level keys; `list[].key` names the list."""
    keys = set()
    for cells in table_rows(section(CHART_README.read_text(encoding="utf-8"), "## Values")):
        names = re.findall(r"`([^`]+)`", cells[0])
        if not names or cells[0] == "Key":
            continue
        names = [name.partition("[]")[0] for name in names]
        parent = names[0].rpartition(".")[0]
        for i, name in enumerate(names):
            if i == 0 or "," in cells[0]:
                keys.add(name)
            else:
                keys.add(f"{parent}.{name.lstrip('.')}" if parent else name.lstrip("."))
    return keys


def test_every_chart_value_is_documented():
    values = yaml.safe_load((REPO / "charts" / "egress-proxy" / "values.yaml").read_text(encoding="utf-8"))
    documented = documented_values()
    undocumented = {
        path for path in value_paths(values, leaves_only=True)
        if not any(path == d or path.startswith(d + ".") for d in documented)
    }  # fmt: skip
    assert not undocumented, f"values.yaml keys missing from the chart README's Values table: {sorted(undocumented)}"


def test_documented_chart_values_exist():
    values = yaml.safe_load((REPO / "charts" / "egress-proxy" / "values.yaml").read_text(encoding="utf-8"))
    paths = value_paths(values)
    unknown = documented_values() - paths
    assert not unknown, f"the chart README documents values that values.yaml does not have: {sorted(unknown)}"


def test_tests_named_in_docs_exist():
    """SECURITY.md's "Shown by" column (and any doc) names tests that exist: a renamed or
    deleted test must take its claim with it. `test_x_*` names a family of tests."""
    sources = [*REPO.glob("tests/**/*.py"), *REPO.glob("bench/*.py")]
    defined = set(re.findall(r"^\s*(?:async )?def (test_\w+)", "\n".join(p.read_text(encoding="utf-8") for p in sources), re.M))
    files = {p.name for p in sources}
    for path in OPERATOR_DOCS:
        text = path.read_text(encoding="utf-8")
        for name, star, suffix in re.findall(r"\b(test_[a-z0-9_]+)(\*?)(\.py)?", text):
            if suffix:
                assert name + ".py" in files, f"{path.name} names {name}.py, which does not exist"
            elif star:
                assert any(d.startswith(name) for d in defined), f"{path.name} names {name}*, no such tests"
            else:
                assert name in defined, f"{path.name} names {name}, no such test"


def test_chart_values_named_in_prose_exist():
    """`dns.enabled: false`, `ca.certificate`, `sidecar.native` ... wherever the docs name a
    value of the chart, values.yaml has it (`ca.crt` is a ConfigMap key, not a value)."""
    values = yaml.safe_load((REPO / "charts" / "egress-proxy" / "values.yaml").read_text(encoding="utf-8"))
    paths = value_paths(values)
    for path in OPERATOR_DOCS:
        text = path.read_text(encoding="utf-8")
        for name in set(re.findall(r"`([a-zA-Z][a-zA-Z0-9]*(?:\.[a-zA-Z][a-zA-Z0-9]*)+)(?:[:=][^`]*)?`", text)):
            if name.split(".")[0] in values and name not in {"ca.crt"}:
                assert name in paths, f"{path.name} names the chart value {name}, which values.yaml does not have"


def code_label_values() -> dict[tuple[str, str], frozenset[str]]:
    """The label values the code can produce, from its constants and from the string
    literals it passes to `.labels()` / the helpers that call it."""
    from egress.dns import policy as dns_policy
    from egress.hooks import decisions
    from egress.net import upstream
    from egress.policy.decisions import Decision

    source = {p.relative_to(REPO / "egress").as_posix(): p.read_text(encoding="utf-8") for p in (REPO / "egress").rglob("*.py")}
    every = "\n".join(source.values())
    decision = frozenset(
        {Decision(host="h").label, Decision(host="h", reason="r").label, Decision(host="h", reason="r", reported=True).label}
    )
    assert '"local"' in source["dns/policy.py"]
    return {
        ("egress_requests_total", "decision"): decision,
        ("egress_dns_queries_total", "decision"): decision | {"local"},
        ("egress_dns_queries_total", "qtype"): frozenset({*dns_policy.QTYPE_LABELS.values(), dns_policy.OTHER_QTYPE}),
        ("egress_upstream_errors_total", "reason"): frozenset(upstream.REASONS),
        ("egress_connections_refused_total", "limit"): frozenset(
            re.findall(r'_refuse\(client, "(\w+)"', every) + re.findall(r'REFUSED\.labels\("(\w+)"\)', every)
        ),
        ("egress_timeouts_total", "kind"): frozenset(re.findall(r'TIMEOUTS\.labels\("(\w+)"\)', every)),
        ("egress_environment_reloads_total", "result"): frozenset(re.findall(r'self\._count\([^,]+, "(\w+)"\)', every)),
        ("egress_config_reloads_total", "result"): frozenset(re.findall(r'CONFIG_RELOADS\.labels\("(\w+)"\)', every)),
        ("egress_hook_runs_total", "outcome"): frozenset({decisions.ALLOW, decisions.DENY, decisions.ERROR, decisions.TIMEOUT}),
    }


def test_documented_label_values_are_the_ones_the_code_produces():
    documented = readme_label_values()
    for key, values in code_label_values().items():
        assert values, f"found no values for {key} in the code"
        assert key in documented, f"The metric table of docs/operations.md does not list the values of {key[0]}{{{key[1]}}}"
        assert documented[key] == values, f"{key[0]}{{{key[1]}}}: docs {sorted(documented[key])}, code {sorted(values)}"
