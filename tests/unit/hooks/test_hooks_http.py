"""HTTP handlers against real HTTP(S) servers on 127.0.0.1 in the test process."""

import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hook_testing import QuietHandler

from egress.hooks.config import parse_config
from egress.hooks.dispatcher import Decision, DispatchSettings, dispatch

PRE = "pre_tool_execution"
POST = "post_tool_execution"
TEST_LIMIT_SECONDS = 20
MiB = 1 << 20
DENY_BODY = b'{"decision": "deny", "reason": "http says no"}'
EVENT = {"tool_call": {"name": "read_file", "args": {"path": "/workspace/private/employees.json"}}, "environment_id": "env_xyz789"}
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy")


class Recorder:
    def __init__(self):
        self.requests: list[dict] = []
        self.release = threading.Event()


def make_handler(recorder: Recorder, *, as_proxy: bool = False):
    class Handler(QuietHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            recorder.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            route = "/deny" if as_proxy else self.path
            if route == "/slow":
                recorder.release.wait(5)
            status, payload, extra = {
                "/deny": (200, DENY_BODY, {}),
                "/allow": (200, b'{"decision": "allow"}', {}),
                "/500": (500, DENY_BODY, {}),
                "/302": (302, DENY_BODY, {"Location": "/deny"}),
                "/text": (200, b"OK, logged.", {"Content-Type": "text/plain"}),
                "/big": (200, b'{"decision": "deny"}' + b" " * (2 * MiB), {}),
                "/slow": (200, DENY_BODY, {}),
            }.get(route, (404, b"", {}))
            self.reply(status, payload, extra)

    return Handler


def serve(recorder: Recorder, *, as_proxy: bool = False, tls: ssl.SSLContext | None = None):
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(recorder, as_proxy=as_proxy))
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server


@pytest.fixture(autouse=True)
def no_ambient_proxy(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def server(recorder):
    server = serve(recorder)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    recorder.release.set()
    server.shutdown()
    server.server_close()


def run_dispatch(url: str, *, event_name: str = PRE, headers: dict | None = None, timeout: float = 5, **settings) -> tuple[Decision, list[dict]]:
    handler = {"type": "http", "url": url, "timeout": timeout}
    if headers is not None:
        handler["headers"] = headers
    config = parse_config(json.dumps({"audit": {event_name: [{"matcher": "*", "hooks": [handler]}]}}))
    assert config.problems == ()
    logs: list[dict] = []
    coro = dispatch(config, event_name, EVENT, DispatchSettings(log=logs.append, record_metrics=False, **settings))
    return asyncio.run(asyncio.wait_for(coro, TEST_LIMIT_SECONDS)), logs


def test_200_deny_json_denies(server):
    decision, logs = run_dispatch(f"{server}/deny")
    assert decision.as_json() == {"decision": "deny", "reason": "http says no"} and logs == []


def test_200_allow_json_allows(server):
    decision, logs = run_dispatch(f"{server}/allow")
    assert decision.as_json() == {"decision": "allow"} and logs == []


def test_post_carries_event_json_and_configured_headers(server, recorder):
    run_dispatch(f"{server}/allow", headers={"X-Event-Source": "agent-sandbox", "Content-Type": "text/plain"})
    (request,) = recorder.requests
    assert request["path"] == "/allow"
    assert json.loads(request["body"]) == EVENT
    assert request["headers"]["X-Event-Source"] == "agent-sandbox"
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["User-Agent"].startswith("egress-hooks/")


@pytest.mark.parametrize(
    ("path", "failure", "status"),
    [("/500", "http_status", 500), ("/302", "redirect", 302), ("/text", "unparsable_output", 200), ("/big", "output_too_large", 200)],
)
def test_fail_open_responses(server, recorder, path, failure, status):
    decision, logs = run_dispatch(f"{server}{path}", headers={"X-Api-Key": "k3y-value-never-logged"})
    assert decision.as_json() == {"decision": "allow"}
    (record,) = logs
    assert (record["msg"], record["type"], record["outcome"], record["failure"], record["status"]) == (
        "hook_fail_open",
        "http",
        "error",
        failure,
        status,
    )
    assert record["host"] == "127.0.0.1"
    line = json.dumps(record)
    assert "k3y-value-never-logged" not in line and path not in line
    assert [r["path"] for r in recorder.requests] == [path]  # the 302 was not followed


def test_timeout_fails_open_in_time(server):
    started = time.monotonic()
    decision, logs = run_dispatch(f"{server}/slow", timeout=1)
    assert time.monotonic() - started < 2
    assert decision.as_json() == {"decision": "allow"}
    assert (logs[0]["outcome"], logs[0]["failure"]) == ("timeout", "timeout")


def test_connection_refused_fails_open():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    decision, logs = run_dispatch(f"http://127.0.0.1:{port}/x")
    assert decision.as_json() == {"decision": "allow"}
    assert (logs[0]["outcome"], logs[0]["failure"]) == ("error", "request_failed")
    assert logs[0]["error"].startswith("ConnectError")


def test_post_http_hook_output_is_ignored(server, recorder):
    decision, logs = run_dispatch(f"{server}/deny", event_name=POST)
    assert decision.as_json() == {} and logs == [] and len(recorder.requests) == 1


@pytest.fixture
def proxy(recorder):
    proxy_recorder = Recorder()
    server = serve(proxy_recorder, as_proxy=True)
    yield f"http://127.0.0.1:{server.server_address[1]}", proxy_recorder
    server.shutdown()
    server.server_close()


def test_explicit_proxy_is_used(proxy):
    proxy_url, proxy_recorder = proxy
    decision, _ = run_dispatch("http://telemetry.example.com/api/v1/agent-events", proxy=proxy_url)
    assert decision.denied
    assert proxy_recorder.requests[0]["path"] == "http://telemetry.example.com/api/v1/agent-events"


def test_proxy_from_environment_is_used_and_no_proxy_honoured(proxy, server, recorder, monkeypatch):
    proxy_url, proxy_recorder = proxy
    monkeypatch.setenv("HTTP_PROXY", proxy_url)
    run_dispatch("http://telemetry.example.com/api/v1/agent-events")
    assert [r["path"] for r in proxy_recorder.requests] == ["http://telemetry.example.com/api/v1/agent-events"]
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    decision, _ = run_dispatch(f"{server}/deny")
    assert decision.denied and len(proxy_recorder.requests) == 1 and len(recorder.requests) == 1


# --- HTTPS: trust comes from --ca-file / SSL_CERT_FILE only -------------------


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress-hooks test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    chain = directory / "server.pem"
    chain.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_file, chain


@pytest.fixture
def https_server(tls_material):
    _, chain = tls_material
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    server = serve(Recorder(), tls=context)
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_https_with_ca_file(https_server, tls_material):
    decision, logs = run_dispatch(f"{https_server}/deny", ca_file=str(tls_material[0]))
    assert decision.denied and logs == []


def test_https_with_ssl_cert_file(https_server, tls_material, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_material[0]))
    decision, logs = run_dispatch(f"{https_server}/deny")
    assert decision.denied and logs == []


def test_https_untrusted_certificate_fails_open(https_server, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    decision, logs = run_dispatch(f"{https_server}/deny")
    assert decision.as_json() == {"decision": "allow"}
    assert logs[0]["failure"] == "request_failed" and "CERTIFICATE_VERIFY_FAILED" in logs[0]["error"]


def test_error_text_never_carries_proxy_credentials():
    from egress.hooks.runners import http as http_runner

    text = http_runner._describe(OSError("cannot reach http://env-a:tok-SECRET@gateway:8080 or https://u@h/"))
    assert "tok-SECRET" not in text and "env-a" not in text
    assert "http://***@gateway:8080" in text and "https://***@h/" in text
