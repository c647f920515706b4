"""The DNS audit line is written field by field for speed (egress/ops/audit.py): it must be
exactly what json.dumps of the same fields writes, whatever the name holds."""

from __future__ import annotations

import io
import json

import pytest

from egress.dns import policy as dp
from egress.ops.audit import DecisionLog
from egress.policy import decisions as policy

NAMES = [
    "c2VjcmV0.attacker.example",
    'quote".backslash\\.test',
    "ctl\x00\x1f\x7f.test",
    "bücher.test",
    "emoji\U0001f600.test",
    "lone\ud800surrogate.test",
    "x" * 300,
    "",
]


@pytest.mark.parametrize("name", NAMES)
def test_dns_line_is_what_json_dumps_writes(name):
    out = io.StringIO()
    verdict = dp.Verdict(dp.Action.ERROR, dp.NXDOMAIN, policy.Decision(host=name, reason=policy.NOT_ALLOWLISTED))
    DecisionLog(stream=out).record_dns(verdict, client='198.18.1.1:5353', name=name, qtype="TXT")
    line = out.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    parsed = json.loads(line)
    expected = {"time": parsed["time"], "event": "dns", "client": "198.18.1.1:5353", "environment": "",
                "name": name[:253], "qtype": "TXT", "decision": "blocked", "reason": "not_allowlisted", "rule": ""}  # fmt: skip
    assert line == json.dumps(expected, separators=(",", ":")) + "\n"
