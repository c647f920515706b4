"""One audit line per decision: JSON on stdout (or text for humans).

Fields never include header values, query strings or bodies; injected headers
are listed by name only.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from egress.ops import metrics
from egress.policy.decisions import Decision


def client_label(peername: tuple | None) -> str:
    """A client as audit lines name it, `host:port` ("" when the address is unknown)."""
    return f"{peername[0]}:{peername[1]}" if peername else ""


class DecisionLog:
    def __init__(self, fmt: str = "json", stream: TextIO | None = None):
        self.fmt = fmt
        self.stream = stream or sys.stdout
        self._dns_counters: dict[tuple[str, str, str, str], Any] = {}

    def record(
        self,
        decision: Decision,
        *,
        client: str,
        port: int,
        method: str,
        injected: tuple[str, ...] = (),
        kind: str = "request",
        error: str = "",
    ) -> None:
        metrics.REQUESTS.labels(decision.label, decision.reason, decision.rule, decision.environment).inc()
        if injected:
            metrics.CREDENTIAL_INJECTIONS.labels(decision.rule, decision.environment).inc()
        line = self._line(decision, kind, client, port, method, injected)
        if decision.request is not None:
            # The entry has request rules: which item let it pass, or what was refused.
            line["request_rule"] = decision.request.item
            if not decision.request.item:
                line["path"] = decision.request.path
                if decision.request.problem:
                    line["detail"] = decision.request.problem
        if error:  # the destination was allowed but could not be reached (upstream_*)
            line["error"] = error
        text = self._format(line)
        if decision.request is not None and self.fmt == "text":
            text += f" request_rule={decision.request.item or '-'}"
            if not decision.request.item:
                text += f" path={_shown(decision.request.path)}"
        if error and self.fmt == "text":
            text += f" error={error}"
        self._write(text)

    def closed(self, decision: Decision, *, client: str, port: int, method: str, bytes_up: int, bytes_down: int) -> None:
        """A passthrough tunnel ended: one more line with its byte counts (not a decision, not counted)."""
        line = self._line(decision, "tunnel_closed", client, port, method, ())
        line["bytes_up"], line["bytes_down"] = bytes_up, bytes_down
        text = self._format(line)
        if self.fmt == "text":
            text = f"closed   {method} {_shown(decision.host)}:{port} bytes_up={bytes_up} bytes_down={bytes_down} client={client}"
            if decision.environment:
                text += f" environment={decision.environment}"
        self._write(text)

    def record_dns(self, verdict, *, client: str, name: str, qtype: str) -> None:
        """Count a DNS query (`egress.dns.policy.Verdict`); one line for each one blocked or reported."""
        decision = verdict.metric_decision
        key = (decision, verdict.reason, verdict.rule, qtype)
        counter = self._dns_counters.get(key)
        if counter is None:  # `.labels()` validates and locks on every call: once per series
            counter = self._dns_counters[key] = metrics.DNS_QUERIES.labels(*key, "")
        counter.inc()
        if decision not in ("blocked", "reported"):
            return
        name = name[:253]
        if self.fmt == "text":
            text = f"{decision:8} DNS {qtype} {name!r} rule={verdict.rule or '-'} reason={verdict.reason or '-'} client={client}"
        else:
            # What json.dumps(dict, separators=(",", ":")) writes, field by field (tested
            # against it): a blocked-query flood makes this line a fifth of the listener's time.
            q = _json_string
            text = (f'{{"time":{q(_now())},"event":"dns","client":{q(client)},"environment":"","name":{q(name)},'
                    f'"qtype":{q(qtype)},"decision":{q(decision)},"reason":{q(verdict.reason)},"rule":{q(verdict.rule)}}}')  # fmt: skip
        # Written (and flushed) before the answer is sent: whoever sees the answer can
        # find its line, and a crash cannot lose the line of a query already answered.
        self._write(text)

    @staticmethod
    def _line(decision: Decision, kind: str, client: str, port: int, method: str, injected: tuple[str, ...]) -> dict:
        return {
            "time": _now(),
            "event": kind,
            "client": client,
            "environment": decision.environment,
            "host": decision.host,
            "port": port,
            "method": method,
            "decision": decision.label,
            "reason": decision.reason,
            "rule": decision.rule,
            "injected": list(injected),
        }

    def _format(self, line: dict) -> str:
        if self.fmt != "text":
            return json.dumps(line, separators=(",", ":"))
        text = (
            f"{line['decision']:8} {line['method']} {_shown(line['host'])}:{line['port']} rule={line['rule'] or '-'} "
            f"reason={line['reason'] or '-'} client={line['client']}"
        )
        if line["environment"]:
            text += f" environment={line['environment']}"
        if line["injected"]:
            text += f" injected={','.join(line['injected'])}"
        return text

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def _shown(host: str) -> str:
    """A host as the client named it, for a text line: a name the policy could not read (a
    Host header is the client's text) may hold control characters (a terminal escape, a
    bidi override), shown escaped as in Python, not written raw into the operator's log."""
    return host if host.isascii() and host.isprintable() else ascii(host)[1:-1]


_json_string = json.encoder.encode_basestring_ascii  # json.dumps of one str (ensure_ascii), in C

_second: list = [-1, ""]  # [whole second, its formatted text]: strftime once a second, not per line


def _now() -> str:
    now = time.time()
    whole = int(now)
    if _second[0] != whole:
        _second[:] = [whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))]
    return f"{_second[1]}.{int(now % 1 * 1000):03d}Z"
