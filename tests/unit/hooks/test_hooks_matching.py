"""Matchers: RE2, full match, case-sensitive; `*`, `.*`, "" match every tool."""

import pytest

from egress.hooks.matching import compile_matcher

TOOLS = ("code_execution", "read_file", "write_file", "list_files", "delete_file")

# pattern -> the built-in tools it must match (every other built-in must not match)
MATCHER_TABLE = {
    "code_execution": {"code_execution"},
    "read_file|write_file": {"read_file", "write_file"},
    ".*_file": {"read_file", "write_file", "delete_file"},
    "*": set(TOOLS),
    ".*": set(TOOLS),
    "": set(TOOLS),
    "*_file": set(),  # a shell glob is not a regex: invalid, matches nothing
    "file": set(),  # full match, not search
    "Read_File": set(),  # case-sensitive
    "read_file|": {"read_file"},  # the empty alternative matches only ""
    "(read|write)_file": {"read_file", "write_file"},
}


@pytest.mark.parametrize("pattern", MATCHER_TABLE)
def test_matcher_table(pattern):
    matcher = compile_matcher(pattern)
    matched = {tool for tool in TOOLS if matcher.matches(tool)}
    assert matched == MATCHER_TABLE[pattern]


@pytest.mark.parametrize("pattern", ["*_file", "(", "[a-", "a{1001}"])
def test_invalid_pattern_keeps_error_and_matches_nothing(pattern):
    matcher = compile_matcher(pattern)
    assert matcher.error and matcher.error.startswith("invalid RE2 pattern")
    assert not any(matcher.matches(tool) for tool in (*TOOLS, "", pattern))


def test_invalid_pattern_does_not_write_to_stderr(capfd):
    # RE2 logs parse errors through absl by default; that would break the
    # one-JSON-line-per-record stderr log.
    compile_matcher("*_file")
    assert capfd.readouterr().err == ""


def test_star_is_match_all_but_literal_star_tool_is_not_special():
    assert compile_matcher("*").matches("anything at all")
    assert compile_matcher("a*").matches("aaa")
    assert not compile_matcher("a*").matches("read_file")
