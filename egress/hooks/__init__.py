"""Hook dispatcher for `.agents/hooks.json` (SPEC §4).

The pure core (config validation, matcher compilation, decision parsing) lives
in `config`, `matching` and `decisions`; the subprocess and HTTP runners in
`runners/` are thin I/O shells; `dispatcher` ties them together and `cli`
exposes `egress-hooks`. Nothing heavy is imported here so the CLI starts fast.
"""

from __future__ import annotations

PRE_TOOL_EXECUTION = "pre_tool_execution"
POST_TOOL_EXECUTION = "post_tool_execution"
EVENTS = (PRE_TOOL_EXECUTION, POST_TOOL_EXECUTION)
