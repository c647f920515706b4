"""What the operator reads, and what the software does, as two sets each: the flags,
metrics, reason codes and Helm values the docs name, and the ones the real sources
have (`--help` of the installed commands, the reason-code constants in `egress/`,
`values.yaml`). Tests compare them (tests/unit/docs/test_docs_match_cli.py and, for a real
/metrics scrape and real audit lines, tests/e2e/test_documented_metrics.py).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
# The hooks reference: its "Command line" section lists the `egress-hooks` commands too.
HOOKS_DOC = DOCS / "hooks.md"
CHART_README = REPO / "charts" / "egress-proxy" / "README.md"
# Every document an operator reads, and the chart files that name flags and values.
OPERATOR_DOCS = [
    README,
    REPO / "SECURITY.md",
    *sorted((REPO / "docs").glob("*.md")),
    CHART_README,
    REPO / "charts" / "egress-proxy" / "values.yaml",
    REPO / "charts" / "egress-proxy" / "templates" / "NOTES.txt",
]
# The commands whose `--help` is the source of truth, as typed.
COMMANDS = [
    ("egress-proxy",),
    ("egress-proxy", "run"),
    ("egress-proxy", "check"),
    ("egress-proxy", "redirect-rules"),
    ("egress-hooks",),
    ("egress-hooks", "dispatch"),
    ("egress-hooks", "serve"),
    ("egress-hooks", "check"),
]
# SPEC §3 and §7: the reason codes other tools depend on.
SPEC_REASON_CODES = {
    "not_allowlisted", "loopback", "forbidden_address", "resolve_failed", "host_mismatch",
    "plaintext_credentials", "proxy_self", "no_sni", "proxy_auth_required",
    "upstream_refused", "upstream_unreachable", "upstream_timeout",
}  # fmt: skip


def page(name: str) -> str:
    """The text of one reference page, `docs/NAME`."""
    return (DOCS / name).read_text(encoding="utf-8")


def docs_text() -> str:
    """README.md and every page of docs/, as one text: where a claim is made anywhere."""
    return "\n".join(path.read_text(encoding="utf-8") for path in [README, *sorted(DOCS.glob("*.md"))])


def script(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    if found.exists():
        return str(found)
    path = shutil.which(name)
    assert path, f"{name} is not installed"
    return path


@functools.cache
def cli_help(command: tuple[str, ...]) -> str:
    env = {**os.environ, "COLUMNS": "200"}  # one option per line, help text unwrapped
    done = subprocess.run(
        [script(command[0]), *command[1:], "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


_OPTION_LINE = re.compile(r"^ {2}(?:-\w(?: \S+)?, )?(--[a-z][a-z0-9-]*)", re.M)


@functools.cache
def cli_flags() -> dict[str, frozenset[str]]:
    """'egress-proxy run' -> its options, from the real `--help` (definitions only,
    not flags named inside another option's help text)."""
    return {" ".join(c): frozenset(_OPTION_LINE.findall(cli_help(c))) for c in COMMANDS}


@functools.cache
def subcommands() -> dict[str, frozenset[str]]:
    result = {}
    for tool in ("egress-proxy", "egress-hooks"):
        match = re.search(r"\{([a-z,-]+)\}", cli_help((tool,)))
        assert match, cli_help((tool,))
        result[tool] = frozenset(match.group(1).split(","))
    return result


def reason_codes() -> set[str]:
    """Every reason code the installed package can put in `X-Egress-Denied`,
    `X-Egress-Error`, a metric label or an audit line: the string constants of
    egress/policy/reasons.py, the one module that defines them."""
    from egress.policy import reasons

    return {value for name, value in vars(reasons).items() if name.isupper() and isinstance(value, str)}


def section(text: str, heading: str) -> str:
    """The body of a Markdown section (up to the next heading of the same or a higher
    level; `# ` lines inside fenced code blocks are not headings)."""
    level = len(heading.split(" ", 1)[0])
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    assert start is not None, f"no section {heading!r}"
    body, fenced = [], False
    for line in lines[start + 1 :]:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        body.append(line)
    return "".join(body)


def table_rows(text: str) -> list[list[str]]:
    """Cells of every Markdown table row in `text` (header and separator rows included)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and line.rstrip().endswith("|"):
            rows.append([cell.strip() for cell in line.strip()[1:-1].split("|")])
    return rows


def _top_level_code(cell: str) -> list[str]:
    """`names` in a cell outside parentheses: `a` (`x`, `y`), `b` -> [a, b]."""
    depth, kept = 0, []
    for char in cell:
        depth += char == "("
        if depth == 0:
            kept.append(char)
        depth -= char == ")" and depth > 0
    return re.findall(r"`([^`]+)`", "".join(kept))


def readme_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """The metric table of docs/operations.md: name -> (type, label names)."""
    text = section(page("operations.md"), "## Metrics and health")
    metrics = {}
    for cells in table_rows(text):
        if len(cells) == 3 and re.fullmatch(r"`egress_[a-z_]+`", cells[0]):
            labels = frozenset(code for code in _top_level_code(cells[2]) if re.fullmatch(r"[a-z_]+", code))
            metrics[cells[0].strip("`")] = (cells[1], labels)
    return metrics


def readme_reason_codes() -> dict[str, list[str]]:
    """The reason-code table of docs/decisions.md: code -> its cells."""
    text = section(page("decisions.md"), "## Reason codes")
    return {
        cells[0].strip("`"): cells for cells in table_rows(text) if re.fullmatch(r"`[a-z_]+`", cells[0])
    }


def readme_label_values() -> dict[tuple[str, str], frozenset[str]]:
    """The metric table of docs/operations.md: (metric, label) -> the values listed in
    parentheses after the label, e.g. `decision` (`allowed`, `blocked`, `reported`)."""
    text = section(page("operations.md"), "## Metrics and health")
    values = {}
    for cells in table_rows(text):
        if len(cells) == 3 and re.fullmatch(r"`egress_[a-z_]+`", cells[0]):
            for label, listed in re.findall(r"`([a-z_]+)` \(((?:`[^`]+`(?:, )?)+)\)", cells[2]):
                values[(cells[0].strip("`"), label)] = frozenset(re.findall(r"`([^`]+)`", listed))
    return values
