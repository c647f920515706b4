#!/usr/bin/env python3
"""The seed page's three hook scenarios, end to end, in one command:

    .venv/bin/python examples/hooks-scenarios/run.py          # a transcript
    .venv/bin/python examples/hooks-scenarios/run.py --json   # a summary, for tests

What runs, all on this machine and loopback (no root, no network):

- the operator's hooks.json (`root/.agents/hooks.json`, the sandbox's read-only
  `/.agents/hooks.json`): the seed's `rm -rf` gate and privacy gate, both with
  `"onError": "deny"`, and its audit HTTP hook after `read_file|write_file`;
- `egress-proxy run` with `spec.yaml`: the audit hook's only destination, with the
  telemetry token injected on the wire, never written in hooks.json;
- `egress-hooks serve` holding that configuration; every tool call goes through
  `egress-hooks dispatch --server ... --fail-closed`, as a runtime would call it;
- a scripted agent (the model's part is a fixed script) that runs its tool calls in
  a temporary workspace, reads deny reasons and adapts;
- "the internet": a small HTTPS telemetry server for 198.51.100.7 behind a CONNECT
  parent proxy (`--upstream-proxy`), both in this process.

The scenarios: (1) `rm -rf /tmp/forbidden` is denied, the agent then writes `{}` to
the workspace's `.agents/hooks.json` - a write the gate allows - and tries again: still
denied, because the operator's file is authoritative; (2) the agent reads
`/private/employees.json`, is denied, and recovers with `/public/summary.json`; (3) it
writes `audit.log` and reads it back, and every file event reaches the telemetry
server through the proxy with `Authorization: Bearer <token>` added, counted in the
proxy's /metrics.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
TELEMETRY_IP = "198.51.100.7"
TOKEN = "telemetry_secret_token_123"  # the seed's example token; only the proxy has it
PRE, POST = "pre_tool_execution", "post_tool_execution"


def tool(name: str, **args) -> dict:
    return {"name": name, "args": args}


# -- "the internet": a telemetry server and a parent proxy in front of it ------------


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for TELEMETRY_IP signed by it: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject, key, issuer, issuer_key, ca, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hooks example CA")])
    ca = build(ca_name, ca_key, ca_name, ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TELEMETRY_IP)])
    cert = build(name, key, ca_name, ca_key, False, [x509.IPAddress(ipaddress.ip_address(TELEMETRY_IP))])
    paths = directory / "ca.pem", directory / "telemetry.pem", directory / "telemetry-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


class Telemetry:
    """The seed's telemetry.example.com: records every audit event it is sent."""

    def __init__(self, cert: Path, key: Path):
        self.events: list[dict] = []
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                events.append({"path": self.path, "authorization": self.headers.get("Authorization"), "event": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


class ParentProxy:
    """Answers `CONNECT 198.51.100.7:443` by splicing to the telemetry server: the
    egress proxy checks and resolves the destination itself, then dials through this."""

    def __init__(self, telemetry_port: int):
        self.telemetry_port = telemetry_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket):
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        if not head.startswith(f"CONNECT {TELEMETRY_IP}:443 ".encode()):
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            client.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.telemetry_port))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pipe(source: socket.socket, sink: socket.socket):
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                for end in (source, sink):
                    try:
                        end.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)


# -- the sandbox: proxy, dispatch server, workspace -----------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(check, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            result = check()
        except OSError:
            result = None
        if result:
            return result
        time.sleep(0.1)
    raise SystemExit(f"run.py: {what} did not start within {seconds:.0f} s")


class Sandbox:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.workspace = tmp / "workspace"
        (self.workspace / "private").mkdir(parents=True)
        (self.workspace / "public").mkdir()
        (self.workspace / "private" / "employees.json").write_text('{"employees": [{"id": 1, "salary": 150000, "ssn": "000-00-0000"}]}')
        (self.workspace / "public" / "summary.json").write_text('{"department": "Engineering", "team_size": 42, "status": "active"}')
        self.processes: list[subprocess.Popen] = []
        ca, cert, key = make_certificates(tmp)
        self.telemetry = Telemetry(cert, key)
        self.parent = ParentProxy(self.telemetry.port)
        self.proxy_port, self.metrics_port = free_port(), free_port()
        confdir = tmp / "confdir"
        self.proxy_log = (tmp / "proxy.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [str(BIN / "egress-proxy"), "run", "--spec", str(HERE / "spec.yaml"),
                 "--listen", f"127.0.0.1:{self.proxy_port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                 "--confdir", str(confdir), "--upstream-ca", str(ca), "--upstream-proxy", f"http://127.0.0.1:{self.parent.port}"],
                env={**os.environ, "TELEMETRY_TOKEN": TOKEN}, stdout=self.proxy_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        )
        wait_until(lambda: self.get("/readyz")[0] == 200, "egress-proxy")
        self.socket = tmp / "hooks.sock"
        self.hooks_log = (tmp / "hooks.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [str(BIN / "egress-hooks"), "serve", "--listen", f"unix:{self.socket}",
                 "--operator-config", str(HERE / "root" / ".agents" / "hooks.json"), "--workspace", str(self.workspace),
                 "--proxy", f"http://127.0.0.1:{self.proxy_port}", "--ca-file", str(confdir / "mitmproxy-ca-cert.pem")],
                env={**os.environ, "EXAMPLE_PYTHON": sys.executable, "EXAMPLE_ROOT": str(HERE / "root")},
                stdout=subprocess.DEVNULL, stderr=self.hooks_log,
            )  # fmt: skip
        )
        wait_until(self.socket.exists, "egress-hooks serve")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=2) as answer:
                return answer.status, answer.read().decode()
        except OSError:
            return 0, ""

    def dispatch(self, event_name: str, event: dict) -> dict:
        """What the runtime does around each tool call: the thin client, failing closed."""
        done = subprocess.run(
            [str(BIN / "egress-hooks"), "dispatch", event_name, "--server", f"unix:{self.socket}", "--fail-closed"],
            input=json.dumps(event).encode(), capture_output=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"run.py: egress-hooks dispatch failed: {done.stderr.decode().strip()}")
        return json.loads(done.stdout)

    def injections(self) -> float:
        _, metrics = self.get("/metrics")
        total = 0.0
        for line in metrics.splitlines():
            if line.startswith("egress_credential_injections_total{") and f'rule="{TELEMETRY_IP}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def close(self):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.parent.listener.close()
        self.telemetry.server.shutdown()
        self.proxy_log.close()
        self.hooks_log.close()


# -- the runtime and the scripted agent ----------------------------------------------


def execute(sandbox: Sandbox, call: dict) -> tuple[str, str | None]:
    """Run an allowed tool call in the workspace: (result, error)."""
    args = call["args"]
    try:
        if call["name"] == "code_execution":
            done = subprocess.run(["/bin/sh", "-c", args["code"]], cwd=sandbox.workspace, capture_output=True, text=True, timeout=30)
            return done.stdout.strip(), (done.stderr.strip() or None)
        path = Path(args["path"])
        if call["name"] == "read_file":
            return path.read_text(), None
        if call["name"] == "write_file":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(args["content"])
            return f"wrote {len(args['content'])} characters", None
    except OSError as exc:
        return "", str(exc)
    return "", f"unknown tool {call['name']}"


class ScriptedAgent:
    """The model's part, as a script: the calls it makes, and how it adapts to a deny."""

    def __init__(self, workspace: Path):
        w = workspace
        self.turns = [
            ("Run `rm -rf /tmp/forbidden` using code_execution.",
             [tool("code_execution", code="rm -rf /tmp/forbidden", language="bash"),
              # A hostile agent tries to switch the gate off with a write the gate allows...
              tool("write_file", path=str(w / ".agents" / "hooks.json"), content="{}"),
              # ...and tries again.
              tool("code_execution", code="rm -rf /tmp/forbidden", language="bash")]),
            ("Read `/workspace/private/employees.json` and summarize the employee details.",
             [tool("read_file", path=str(w / "private" / "employees.json"))]),
            ("Create `/workspace/audit.log` containing 'event 1', then read it back.",
             [tool("write_file", path=str(w / "audit.log"), content="event 1"),
              tool("read_file", path=str(w / "audit.log"))]),
        ]  # fmt: skip

    @staticmethod
    def adapt(call: dict, reason: str) -> dict | None:
        """The next call after a deny (None: explain to the user instead)."""
        if call["name"] == "read_file" and "/public/" in reason:
            return tool("read_file", path=call["args"]["path"].replace("/private/employees.json", "/public/summary.json"))
        if call["name"] == "code_execution":
            return tool("code_execution", code="ls -d /tmp/forbidden 2>/dev/null || echo '/tmp/forbidden is not there'", language="bash")
        return None


def run(say) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="egress-hooks-example-"))
    sandbox = None
    summary: dict = {"calls": []}
    try:
        sandbox = Sandbox(tmp)
        say(f"egress-proxy on 127.0.0.1:{sandbox.proxy_port}, egress-hooks serve on unix:{sandbox.socket}")
        say(f"workspace {sandbox.workspace}\n")
        agent = ScriptedAgent(sandbox.workspace)
        for number, (prompt, calls) in enumerate(agent.turns, 1):
            say(f"== turn {number}: {prompt}")
            queue = list(calls)
            while queue:
                call = queue.pop(0)
                event = {"tool_call": call, "environment_id": "env_example"}
                shown = json.dumps(call["args"])[:90]
                decision = sandbox.dispatch(PRE, event)
                record = {"turn": number, "tool": call["name"], "args": call["args"], "decision": decision["decision"]}
                summary["calls"].append(record)
                if decision["decision"] == "deny":
                    say(f"   {call['name']} {shown}\n     DENIED: {decision['reason']}")
                    record["reason"] = decision["reason"]
                    retry = agent.adapt(call, decision["reason"])
                    if retry is not None:
                        say("     the model reads the reason and adapts:")
                        queue.insert(0, retry)
                    continue
                result, error = execute(sandbox, call)
                say(f"   {call['name']} {shown}\n     allowed -> {result[:80]!r}" + (f" (error: {error})" if error else ""))
                record["result"] = result
                post_event = {**event, **({"error": error} if error else {})}
                sandbox.dispatch(POST, post_event)
            say("")
        audits = sandbox.telemetry.events
        summary["audit_events"] = [{"tool": e["event"]["tool_call"]["name"], "authorization": e["authorization"]} for e in audits]
        summary["injections_metric"] = sandbox.injections()
        summary["token_in_hooks_json"] = TOKEN in (HERE / "root" / ".agents" / "hooks.json").read_text()
        say(f"== the telemetry server received {len(audits)} audit events through the proxy:")
        for e in audits:
            say(f"   {e['event']['tool_call']['name']:<10} Authorization: {e['authorization']}")
        say(f"   egress_credential_injections_total{{rule=\"{TELEMETRY_IP}\"}} = {summary['injections_metric']:g}")
        say(f"   the token is in hooks.json: {summary['token_in_hooks_json']}")
    finally:
        if sandbox is not None:
            sandbox.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description="The seed's hook scenarios end to end (see the docstring).")
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead of the transcript")
    args = parser.parse_args()
    summary = run((lambda text: None) if args.json else print)
    if args.json:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
