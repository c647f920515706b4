"""README.md stays a page a newcomer reads to the end (the reference lives in docs/), and
every relative link in README.md and docs/*.md leads to a file of the repository."""

from __future__ import annotations

import re

import pytest
from documented import DOCS, README, REPO

README_MAX_LINES = 250
# [text](target) and [text](target "title"); images too. Code spans and fenced blocks are
# removed first: a link shown as code is not a link.
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


@pytest.mark.parametrize("path", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_to_files(path):
    links = relative_links(path.read_text(encoding="utf-8"))
    for link in links:
        target = (path.parent / link.split("#", 1)[0]).resolve()
        assert target.is_relative_to(REPO), f"{path.name}: {link} leaves the repository"
        assert target.exists(), f"{path.name}: {link} leads to no file"


def test_relative_links_are_found():
    """The link pattern sees the links README has (a pattern that matched nothing would
    pass the test above for every page)."""
    links = relative_links(README.read_text(encoding="utf-8"))
    assert "SECURITY.md" in links and "docs/README.md" in links
