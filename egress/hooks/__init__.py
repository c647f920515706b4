"""Hook dispatcher for `.agents/hooks.json` (SPEC §4, §8).

The pure core (config validation, matcher compilation, decision parsing, what a
failure means for a fail-closed handler) lives in `config`, `matching`,
`decisions` and `fail_closed`; `layers` merges the operator's and the
workspace's files; the subprocess and HTTP runners in `runners/` and the
`reaper` of escaped processes are thin I/O shells; `dispatcher` ties them
together, `server` holds one snapshot behind a socket, `client` is its thin
client and `cli` exposes `egress-hooks`. Nothing heavy is imported here so the
CLI starts fast.
"""

from __future__ import annotations

PRE_TOOL_EXECUTION = "pre_tool_execution"
POST_TOOL_EXECUTION = "post_tool_execution"
EVENTS = (PRE_TOOL_EXECUTION, POST_TOOL_EXECUTION)
