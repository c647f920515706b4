"""Decision parsing: only an exact `{"decision": "deny"}` denies; the rest allows, visibly."""

import pytest

from egress.hooks.decisions import (
    MAX_OUTPUT_BYTES,
    default_deny_reason,
    judge_command,
    judge_http,
    parse_decision_output,
)

PRE = "pre_tool_execution"
POST = "post_tool_execution"


@pytest.mark.parametrize(
    ("output", "deny", "reason", "problem"),
    [
        (b'{"decision": "deny", "reason": "no"}', True, "no", None),
        (b'{"decision": "deny"}', True, None, None),
        (b'{"decision": "deny", "reason": 5}', True, None, None),
        (b'{"decision": "deny", "reason": "   "}', True, None, None),
        (b'\xef\xbb\xbf \r\n{"decision":"deny","reason":"bom"}\r\n\n', True, "bom", None),
        (b'{"decision": "deny", "reason": "caf\xff"}', True, "caf\ufffd", None),
        (b'{"decision": "allow", "decision": "deny"}', True, None, None),
        (b'{"decision": "deny", "decision": "allow"}', True, None, None),
        (b'{"decision": "allow"}', False, None, None),
        (b'{"decision": "allow", "extra": {"decision": "deny"}}', False, None, None),
        (b'{"decision": "Deny"}', False, None, "unrecognised_decision"),
        (b'{"decision": "block"}', False, None, "foreign_decision_block"),  # Claude Code's format: still no deny
        (b'{"decision": ["deny"]}', False, None, "unrecognised_decision"),
        (b"{}", False, None, "no_decision"),
        (b'{"result": {"decision": "deny"}}', False, None, "no_decision"),
        (b'[{"decision": "deny"}]', False, None, "not_a_json_object"),
        (b'"deny"', False, None, "not_a_json_object"),
        (b"deny", False, None, "unparsable_output"),
        (b'{"decision": "deny"}\n{"decision": "deny"}', False, None, "unparsable_output"),
        (b'\xff\xfe{"decision": "deny"}', False, None, "unparsable_output"),
        (b"", False, None, "empty_output"),
        (b" \n\t", False, None, "empty_output"),
        (b"[" * 100000, False, None, "unparsable_output"),
    ],
)
def test_parse_decision_output(output, deny, reason, problem):
    parsed = parse_decision_output(output)
    assert (parsed.deny, parsed.reason, parsed.problem) == (deny, reason, problem)


def test_truncated_output_is_never_a_decision():
    deny = b'{"decision": "deny"}' + b" " * MAX_OUTPUT_BYTES
    assert parse_decision_output(deny[:MAX_OUTPUT_BYTES], truncated=True).problem == "output_too_large"


def command(event=PRE, exit_code=0, stdout=b"", truncated=False, timed_out=False, spawn_error=None):
    return judge_command(
        event, "gate", exit_code=exit_code, stdout=stdout, stdout_truncated=truncated, timed_out=timed_out, spawn_error=spawn_error
    )


@pytest.mark.parametrize(
    ("kwargs", "outcome", "failure"),
    [
        ({"stdout": b'{"decision":"allow"}'}, "allow", None),
        ({"stdout": b'{"decision":"deny"}'}, "deny", None),
        ({"stdout": b"ok"}, "error", "unparsable_output"),
        ({"exit_code": 1, "stdout": b'{"decision":"allow"}'}, "error", "nonzero_exit"),
        ({"exit_code": 2, "stdout": b'{"decision":"deny"}'}, "error", "deny_with_nonzero_exit"),
        ({"exit_code": 127}, "error", "command_not_found"),
        ({"exit_code": 126}, "error", "command_not_executable"),
        ({"exit_code": -9}, "error", "killed_by_signal"),
        ({"timed_out": True, "stdout": b'{"decision":"deny"}'}, "timeout", "timeout"),
        ({"exit_code": None, "spawn_error": "FileNotFoundError"}, "error", "spawn_failed"),
        ({"event": POST, "stdout": b"anything"}, "allow", None),
        ({"event": POST, "stdout": b'{"decision":"deny"}'}, "allow", None),
        ({"event": POST, "exit_code": 3}, "error", "nonzero_exit"),
    ],
)
def test_judge_command(kwargs, outcome, failure):
    result = command(**kwargs)
    assert (result.outcome, result.failure) == (outcome, failure)


def test_deny_without_reason_names_the_group():
    result = command(stdout=b'{"decision":"deny"}')
    assert result.deny_reason == default_deny_reason("gate") == 'Tool call denied by hook group "gate".'


@pytest.mark.parametrize(
    ("status", "body", "outcome", "failure"),
    [
        (200, b'{"decision":"deny","reason":"r"}', "deny", None),
        (204, b"", "error", "empty_output"),
        (200, b"<html>", "error", "unparsable_output"),
        (302, b'{"decision":"deny"}', "error", "redirect"),
        (500, b'{"decision":"deny"}', "error", "http_status"),
        (404, b"", "error", "http_status"),
    ],
)
def test_judge_http(status, body, outcome, failure):
    result = judge_http(PRE, "g", status=status, body=body, body_truncated=False, timed_out=False)
    assert (result.outcome, result.failure) == (outcome, failure)
    assert result.details["status"] == status


def test_judge_http_failures():
    assert judge_http(PRE, "g", status=None, body=b"", body_truncated=False, timed_out=True).outcome == "timeout"
    failed = judge_http(PRE, "g", status=None, body=b"", body_truncated=False, timed_out=False, error="ConnectError: refused")
    assert (failed.outcome, failed.failure) == ("error", "request_failed")
    assert judge_http(POST, "g", status=200, body=b"junk", body_truncated=False, timed_out=False).outcome == "allow"
