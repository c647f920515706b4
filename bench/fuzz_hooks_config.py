"""Bounded-time fuzzing of the hooks.json parser: `parse_config` never raises.

Not part of CI. Run for N seconds (default 60):

    PYTHONPATH=. .venv/bin/python bench/fuzz_hooks_config.py 60

Inputs come from hypothesis strategies: raw bytes and text (encodings, BOMs,
JSON syntax), and structured documents close to real hooks.json files (group
names, duplicate keys, `enabled` of every type, RE2 matchers valid and invalid,
command/http handlers with odd URLs, headers, timeouts). For every input the
parser must return a `HooksConfig` (problems as strings, never an exception),
and matching a tool name against whatever it built must not raise either.
Exit status 0: nothing escaped; otherwise the input and traceback are printed.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egress.hooks.config import HooksConfig, parse_config

EVENTS = ["pre_tool_execution", "post_tool_execution", "on_error", ""]
TOOLS = ["code_execution", "read_file", "write_file", "list_files", "delete_file", "", "x" * 300]
MATCHERS = ["code_execution", "read_file|write_file", "*", ".*", "", "*_file", "(", "a{99999}", "\\", "[[:alpha:]]+", "é+"]
URLS = ["https://t.example.com/a", "http://x", "ftp://x", "https://", "//x", "https://[::1]:99999/", "\x00", 5, None]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=20)
handler = st.fixed_dictionaries(
    {"type": st.sampled_from(["command", "http", "other", 3])},
    optional={
        "command": st.one_of(st.text(max_size=30), json_values),
        "url": st.sampled_from(URLS),
        "timeout": st.one_of(st.integers(-5, 10**12), st.floats(allow_nan=True), st.text(max_size=5), st.booleans()),
        "headers": st.one_of(st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3), json_values),
    },
)
rule = st.fixed_dictionaries(
    {"matcher": st.one_of(st.sampled_from(MATCHERS), st.text(max_size=10), json_values)},
    optional={"hooks": st.one_of(st.lists(handler, max_size=3), json_values)},
)
group = st.dictionaries(
    st.sampled_from(["enabled", *EVENTS]),
    st.one_of(st.lists(rule, max_size=3), json_values),
    max_size=4,
)
document = st.dictionaries(st.text(max_size=12), st.one_of(group, json_values), max_size=4)


def _as_text(doc, duplicate: bool) -> str:
    text = json.dumps(doc, allow_nan=True)
    if duplicate and text.startswith("{") and len(text) > 2:
        # The same group name twice: json.dumps cannot write that, so splice it in.
        first = next(iter(doc), None)
        if first is not None:
            text = text[:-1] + ", " + json.dumps(first) + ": {}}"
    return text


inputs = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200),
    st.builds(_as_text, document, st.booleans()),
    st.builds(lambda t: "\ufeff" + t, st.builds(_as_text, document, st.booleans())),
)

checked = 0


def check(data) -> None:
    global checked
    checked += 1
    config = parse_config(data, source="fuzz.json")
    assert isinstance(config, HooksConfig)
    assert all(isinstance(p, str) for p in config.problems)
    for event in EVENTS:
        for tool in TOOLS:
            list(config.matching_rules(event, tool))


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    deadline = time.monotonic() + seconds

    @settings(max_examples=10**9, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(inputs)
    def run(data) -> None:
        if time.monotonic() > deadline:
            raise TimeUp
        check(data)

    try:
        run()
    except TimeUp:
        pass
    except Exception:
        traceback.print_exc()
        print(f"fuzz_hooks_config: FAILED after {checked} inputs", file=sys.stderr)
        return 1
    print(f"fuzz_hooks_config: {checked} inputs in {seconds:.0f} s, nothing escaped parse_config")
    return 0


class TimeUp(Exception):
    pass


if __name__ == "__main__":
    sys.exit(main())
