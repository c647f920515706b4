"""The text audit line (`--log-format text`) shows a hostile host escaped: one line, no control characters.

A host the policy could not read is logged as the client wrote it (a Host header, up to
255 characters); raw, an escape sequence would recolour or rewrite the operator's
terminal, a CR or a bidi override would make one line read as another.
"""

from __future__ import annotations

import io

import pytest

from egress.ops.audit import DecisionLog
from egress.policy import decisions as policy

HOSTILE = ["\x1b[2J\x1b[31mfake.test", "a\rallowed    GET ok.test:443", "evil\u202etset.kk", "tab\there", "\x7f\x00.test"]


@pytest.mark.parametrize("host", HOSTILE)
def test_text_line_escapes_what_is_not_printable_ascii(host):
    out = io.StringIO()
    log = DecisionLog(stream=out, fmt="text")
    decision = policy.Decision(host=host, reason=policy.NOT_ALLOWLISTED)
    log.record(decision, client="198.18.1.1:4000", port=80, method="GET")
    log.closed(decision, client="198.18.1.1:4000", port=443, method="CONNECT", bytes_up=1, bytes_down=2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.isascii() and line.isprintable(), repr(line)
        assert ascii(host)[1:-1] + ":" in line


def test_a_plain_host_is_shown_as_it_is():
    out = io.StringIO()
    DecisionLog(stream=out, fmt="text").record(
        policy.Decision(host="other.test", reason=policy.NOT_ALLOWLISTED), client="198.18.1.1:4000", port=80, method="GET"
    )
    assert out.getvalue().startswith("blocked  GET other.test:80 rule=- reason=not_allowlisted client=198.18.1.1:4000")
