"""hooks.json parsing: the seed examples load clean; each mistake is one precise line."""

import json

import pytest

from egress.hooks.config import (
    DEFAULT_TIMEOUT_SECONDS,
    CommandHandler,
    HttpHandler,
    discover_config,
    load_config,
    parse_config,
)

SEED_SCHEMA_EXAMPLE = {
    "security-gate": {
        "enabled": True,
        "pre_tool_execution": [
            {
                "matcher": "code_execution",
                "hooks": [{"type": "command", "command": "python3 /.agents/hooks-scripts/gate.py", "timeout": 10}],
            }
        ],
    },
    "auto-format": {
        "post_tool_execution": [
            {
                "matcher": "*",
                "hooks": [{"type": "command", "command": "python3 /.agents/hooks-scripts/auto_lint.py", "timeout": 15}],
            }
        ]
    },
}
SEED_AUDIT_EXAMPLE = {
    "audit-logging": {
        "post_tool_execution": [
            {
                "matcher": "read_file|write_file",
                "hooks": [{"type": "http", "url": "https://telemetry.example.com/api/v1/agent-events", "timeout": 10}],
            }
        ]
    }
}


def parse(document) -> tuple:
    text = document if isinstance(document, str) else json.dumps(document)
    config = parse_config(text)
    return config, list(config.problems)


def one_rule(handlers, **group):
    return {"g": {**group, "pre_tool_execution": [{"matcher": "*", "hooks": handlers}]}}


@pytest.mark.parametrize("document", [SEED_SCHEMA_EXAMPLE, SEED_AUDIT_EXAMPLE])
def test_seed_examples_load_without_problems(document):
    config, problems = parse(document)
    assert problems == []
    assert [g.name for g in config.groups] == list(document)


def test_seed_example_fields():
    config, _ = parse({**SEED_SCHEMA_EXAMPLE, **SEED_AUDIT_EXAMPLE})
    gate, fmt, audit = config.groups
    assert gate.enabled and fmt.enabled  # enabled defaults to true
    (rule,) = gate.rules["pre_tool_execution"]
    assert rule.handlers == (CommandHandler(index=0, command="python3 /.agents/hooks-scripts/gate.py", timeout=10.0),)
    assert fmt.rules["post_tool_execution"][0].handlers[0].timeout == 15.0
    handler = audit.rules["post_tool_execution"][0].handlers[0]
    assert isinstance(handler, HttpHandler) and handler.url.endswith("/agent-events") and handler.headers == ()


def test_default_timeout_is_30_seconds():
    config, problems = parse(one_rule([{"type": "command", "command": "true"}]))
    assert problems == []
    assert config.groups[0].rules["pre_tool_execution"][0].handlers[0].timeout == DEFAULT_TIMEOUT_SECONDS == 30


def test_duplicate_group_names_are_detected_and_both_kept():
    text = '{"gate": {"pre_tool_execution": []}, "other": {}, "gate": {"enabled": false}}'
    config, problems = parse(text)
    assert problems == [
        (
            'group "gate": duplicate group name (a JSON parser would silently keep only the last one); '
            "every copy is run, in file order"
        )
    ]
    assert [(g.name, g.enabled) for g in config.groups] == [("gate", True), ("other", True), ("gate", False)]


@pytest.mark.parametrize("value", ["false", 0, 1, None, "yes"])
def test_enabled_must_be_a_bool_and_a_bad_value_keeps_the_group_on(value):
    config, problems = parse({"g": {"enabled": value, "pre_tool_execution": []}})
    assert problems == [f'group "g": enabled: must be true or false, got {json.dumps(value)}; the group stays enabled']
    assert config.groups[0].enabled is True


def test_missing_hooks():
    config, problems = parse({"g": {"pre_tool_execution": [{"matcher": "*"}]}})
    assert problems == ['group "g": pre_tool_execution[0].hooks: missing (an array of handlers)']
    assert config.groups[0].rules["pre_tool_execution"][0].handlers == ()


def test_unknown_handler_type_is_skipped_and_the_rest_kept():
    config, problems = parse(one_rule([{"type": "webhook", "url": "x"}, {"type": "command", "command": "true"}]))
    assert problems == ['group "g": pre_tool_execution[0].hooks[0].type: must be "command" or "http", got "webhook"; skipped']
    handlers = config.groups[0].rules["pre_tool_execution"][0].handlers
    assert [(h.index, h.type) for h in handlers] == [(1, "command")]


@pytest.mark.parametrize("timeout", [0, -1, "10", True, None, [], 1e999])
def test_timeout_must_be_a_positive_number(timeout):
    text = json.dumps(one_rule([{"type": "command", "command": "true", "timeout": timeout}]))
    text = text.replace("Infinity", "1e999")
    config, problems = parse(text)
    assert len(problems) == 1
    assert problems[0].startswith('group "g": pre_tool_execution[0].hooks[0].timeout: must be a positive number of seconds')
    assert config.groups[0].rules["pre_tool_execution"][0].handlers[0].timeout == DEFAULT_TIMEOUT_SECONDS


def test_fractional_timeout_is_allowed():
    config, problems = parse(one_rule([{"type": "command", "command": "true", "timeout": 1.5}]))
    assert problems == [] and config.groups[0].rules["pre_tool_execution"][0].handlers[0].timeout == 1.5


def test_invalid_matcher_is_reported_and_matches_nothing():
    config, problems = parse({"g": {"pre_tool_execution": [{"matcher": "*_file", "hooks": []}]}})
    assert problems == [
        (
            'group "g": pre_tool_execution[0].matcher: "*_file" is an invalid RE2 pattern: '
            "no argument for repetition operator: *; the rule matches nothing"
        )
    ]
    assert list(config.matching_rules("pre_tool_execution", "read_file")) == []


def test_other_mistakes_each_name_their_place():
    document = {
        "g": {
            "pre_tool_exectuion": [],
            "post_tool_execution": [
                {"matcher": 5, "hooks": []},
                {"hooks": [], "extra": 1},
                {
                    "matcher": "*",
                    "hooks": [
                        "not-an-object",
                        {"type": "command"},
                        {"type": "command", "command": "true", "url": "https://x"},
                        {"type": "http", "url": "ftp://x"},
                        {"type": "http", "url": "https://x", "headers": {"Bad Name": "v", "X-Ok": "1", "X-Nl": "a\r\nb", "X-Num": 1}},
                    ],
                },
            ],
        },
        "h": [],
    }
    config, problems = parse(document)
    where = 'group "g": post_tool_execution'
    assert problems == [
        'group "g".pre_tool_exectuion: unknown field (expected enabled, pre_tool_execution, post_tool_execution); ignored',
        f"{where}[0].matcher: must be a string, got number; the rule matches nothing",
        f"{where}[1].extra: unknown field (expected matcher, hooks); ignored",
        f'{where}[1].matcher: missing; treated as "*" (every tool) - write "*" to say so',
        f"{where}[2].hooks[0]: must be an object, got string; skipped",
        f"{where}[2].hooks[1].command: must be a non-empty string, missing; skipped",
        f"{where}[2].hooks[2].url: unknown field (expected type, command, timeout, onError); ignored",
        f"{where}[2].hooks[3].url: must be an http:// or https:// URL; skipped",
        f"{where}[2].hooks[4].headers.Bad Name: not a valid header name; header not sent",
        f"{where}[2].hooks[4].headers.X-Nl: value contains CR, LF or NUL; header not sent",
        f"{where}[2].hooks[4].headers.X-Num: value must be a string, got number; header not sent",
        'group "h": must be an object, got array',
    ]
    rules = config.groups[0].rules["post_tool_execution"]
    assert [h.index for h in rules[2].handlers] == [2, 4]
    assert rules[2].handlers[1].headers == (("X-Ok", "1"),)


def test_problems_never_echo_header_values():
    secret = "Bearer s3cr3t\r\n"
    _, problems = parse(one_rule([{"type": "http", "url": "https://x", "headers": {"Authorization": secret}}]))
    assert problems and not any("s3cr3t" in p for p in problems)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "hooks.json: invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes"),
        ("[]", "top level: must be an object of named groups, got array"),
        (b"\xff{}", "hooks.json: not UTF-8 (invalid start byte at byte 0)"),
    ],
)
def test_unusable_files(text, problem):
    config = parse_config(text)
    assert config.problems == (problem,) and config.groups == ()


def test_bom_is_accepted():
    config = parse_config(b"\xef\xbb\xbf" + json.dumps(SEED_AUDIT_EXAMPLE).encode())
    assert config.problems == () and config.groups[0].name == "audit-logging"


def test_discovery_prefers_the_workspace(tmp_path, monkeypatch):
    import egress.hooks.config as config_module

    root = tmp_path / "root" / ".agents" / "hooks.json"
    root.parent.mkdir(parents=True)
    root.write_text("{}")
    monkeypatch.setattr(config_module, "ROOT_CONFIG_PATH", root)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert discover_config(workspace) == root
    (workspace / ".agents").mkdir()
    (workspace / ".agents" / "hooks.json").write_text("{}")
    assert discover_config(workspace) == workspace / ".agents" / "hooks.json"
    root.unlink()
    assert discover_config(tmp_path / "elsewhere") is None


def test_load_config_unreadable(tmp_path):
    config = load_config(tmp_path / "missing.json")
    assert len(config.problems) == 1 and "cannot read" in config.problems[0]


def test_matching_rules_in_file_order_skipping_disabled():
    document = {
        "a": {"pre_tool_execution": [{"matcher": ".*_file", "hooks": []}, {"matcher": "read_file", "hooks": []}]},
        "off": {"enabled": False, "pre_tool_execution": [{"matcher": "*", "hooks": []}]},
        "b": {"pre_tool_execution": [{"matcher": "", "hooks": []}], "post_tool_execution": [{"matcher": "*", "hooks": []}]},
    }
    config, problems = parse(document)
    assert problems == []
    assert [(g.name, r.index) for g, r in config.matching_rules("pre_tool_execution", "read_file")] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
    ]
    assert [(g.name, r.index) for g, r in config.matching_rules("pre_tool_execution", "list_files")] == [("b", 0)]


def test_header_name_with_a_final_newline_is_not_sent():
    """`^...$` would match `X-Hook\\n`: the header line would break the request on the wire."""
    document = {"g": {"post_tool_execution": [{"matcher": "*", "hooks": [
        {"type": "http", "url": "https://x", "headers": {"X-Hook\n": "v", "X-Ok": "1"}}]}]}}  # fmt: skip
    config, problems = parse(document)
    where = 'group "g": post_tool_execution[0].hooks[0].headers'
    assert problems == [f"{where}.'X-Hook\\n': not a valid header name; header not sent"]
    assert config.groups[0].rules["post_tool_execution"][0].handlers[0].headers == (("X-Ok", "1"),)
