"""--upstream-proxy: URL and credential parsing, the CONNECT we send, and the parent's replies
(well-formed and not) read by `open_tunnel` from a real loopback socket."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from ipaddress import ip_address as parse_ip

import pytest

from egress.net import parent_proxy, upstream
from egress.net.parent_proxy import ParentProxy, ParentProxyError, ParentReplyError, parse

PASSWORD = "s3cret-parent-pw"


def test_plain_url():
    assert parse("http://proxy.corp.example:3128") == ParentProxy("proxy.corp.example", 3128)
    assert parse("http://10.0.0.5:8080/") == ParentProxy("10.0.0.5", 8080)
    assert parse("http://[fd00::5]:3128").label == "[fd00::5]:3128"


def refusal(*args, **kwargs) -> str:
    """The message of the ParentProxyError that parse(*args, **kwargs) must raise."""
    with pytest.raises(ParentProxyError) as info:
        parse(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://proxy:3128", "TLS to the parent proxy is not supported"),
        ("socks5://proxy:1080", "expected http://HOST:PORT"),
        ("proxy:3128", "expected http://HOST:PORT"),
        ("http://proxy", "no port"),
        ("http://:3128", "no host"),
        ("http://proxy:99999", "not a valid URL"),
        ("http://proxy:abc", "not a valid URL"),
        ("http://proxy:0", "port 0"),
        ("http://proxy:3128/path", "nothing after the port"),
        ("http://proxy:3128?x=1", "nothing after the port"),
        ("http://[fd00::5:3128", "not a valid URL"),
        ("http://[zz::1]:3128", "not a valid URL"),
    ],
)
def test_bad_urls(url, message):
    error = refusal(url)
    assert message in error and error.startswith("--upstream-proxy")


@pytest.mark.parametrize(
    "url",
    [f"http://user:{PASSWORD}@proxy:3128", f"http://user:{PASSWORD}/x@proxy:3128", f"http://user:{PASSWORD}#x@proxy:3128",
     f"http://user:{PASSWORD}@[zz::1]:3128", f"https://user:{PASSWORD}@proxy:3128", f"http://{PASSWORD}@proxy"],
)  # fmt: skip
def test_credentials_in_the_url_are_refused_without_echoing_them(url):
    error = refusal(url)
    assert "s3cret" not in error and "--upstream-proxy-auth" in error


def test_credentials_by_reference(tmp_path):
    secret_file = tmp_path / "pw"
    secret_file.write_text(PASSWORD + "\n")
    parent = parse("http://proxy:3128", f"alice:${{file:{secret_file}}}")
    assert parent.authorization is not None
    assert parent.authorization.header().reveal() == "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert PASSWORD not in repr(parent) and PASSWORD not in str(parent)
    from_env = parse("http://proxy:3128", "${env:PARENT_AUTH}", environ={"PARENT_AUTH": f"bob:{PASSWORD}"})
    assert from_env.authorization.header().reveal() == "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()


def test_rotated_password_file_is_used_without_a_restart(tmp_path, caplog):
    secret_file = tmp_path / "pw"
    secret_file.write_text("first-password\n")
    credentials = parse("http://proxy:3128", f"alice:${{file:{secret_file}}}").authorization
    assert credentials.header().reveal() == "Basic " + base64.b64encode(b"alice:first-password").decode()
    secret_file.write_text("second-password\n")
    assert credentials.header().reveal() == "Basic " + base64.b64encode(b"alice:second-password").decode()
    secret_file.unlink()  # a failed read keeps the last good value, logged once, never printed
    assert credentials.header().reveal() == "Basic " + base64.b64encode(b"alice:second-password").decode()
    assert credentials.header().reveal() == "Basic " + base64.b64encode(b"alice:second-password").decode()
    warnings = [r.getMessage() for r in caplog.records if "credentials read before" in r.getMessage()]
    assert len(warnings) == 1 and "file not found" in warnings[0]
    assert "first-password" not in caplog.text and "second-password" not in caplog.text
    assert "second-password" not in repr(credentials) + str(credentials)


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (f"alice:{PASSWORD}", "a literal password would show in `ps` output"),
        ("alice:${env:NOT_SET_ANYWHERE}", "environment variable NOT_SET_ANYWHERE is not set"),
        ("alice:${file:relative}", "path must be absolute"),
        ("alice:${file:/nonexistent/pw}", "file not found"),
        ("${env:PARENT_AUTH}", "expected USER:PASSWORD"),
    ],
)
def test_bad_credentials(reference, message):
    error = refusal("http://proxy:3128", reference, environ={"PARENT_AUTH": PASSWORD})
    assert message in error and PASSWORD not in error


def test_cli_errors_are_one_line_without_the_secret(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("network:\n  allowlist:\n    - domain: example.com\n")
    cases = [
        (["--upstream-proxy", f"http://u:{PASSWORD}@proxy:3128"], "credentials in the URL"),
        (["--upstream-proxy", "ftp://proxy:21"], "expected http://HOST:PORT"),
        (["--upstream-proxy-auth", "u:${env:X}"], "--upstream-proxy-auth needs --upstream-proxy"),
        (["--upstream-proxy", "http://proxy:3128", "--upstream-proxy-auth", f"u:{PASSWORD}"], "literal password"),
    ]
    for extra, message in cases:
        done = subprocess.run(
            [sys.executable, "-m", "egress.cli", "run", "--spec", str(spec), "--confdir", str(tmp_path / "conf"), *extra],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("egress-proxy: --upstream-proxy") and message in lines[0], lines
        assert PASSWORD not in done.stderr + done.stdout


def test_connect_request_names_the_checked_address():
    auth = parse("http://p:1", "${env:A}", environ={"A": "u:p"}).authorization.header()
    assert parent_proxy.connect_request("198.18.0.10", 443, auth) == (
        b"CONNECT 198.18.0.10:443 HTTP/1.1\r\nHost: 198.18.0.10:443\r\nProxy-Authorization: Basic dTpw\r\n\r\n"
    )
    assert parent_proxy.connect_request("2001:2::10", 80, None) == (
        b"CONNECT [2001:2::10]:80 HTTP/1.1\r\nHost: [2001:2::10]:80\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"HTTP/1.1 200 Connection established\r\n\r\n", 200),
        (b"HTTP/1.0 200\r\nVia: 1.1 squid\r\n\r\n", 200),
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", 407),
    ],
)
def test_reply_status(head, status):
    assert parent_proxy.parse_reply(head) == status


@pytest.mark.parametrize(
    "head",
    [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/2 200\r\n\r\n", b"HTTP/1.1 20 OK\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n",
     b"HTTP/1.1 100 Continue\r\n\r\n", b"http/1.1 200 OK\r\n\r\n", b"\r\n\r\n", b"HTTP/1.1 200 OK\nX: y\r\n\r\n"],
)  # fmt: skip
def test_malformed_replies(head):
    with pytest.raises(ParentReplyError) as info:
        parent_proxy.parse_reply(head)
    assert info.value.reason == upstream.UPSTREAM_REFUSED


@pytest.mark.parametrize(
    ("status", "reason"),
    [(200, None), (204, None), (403, "upstream_refused"), (407, "upstream_refused"), (500, "upstream_refused"),
     (301, "upstream_refused"), (502, "upstream_unreachable"), (503, "upstream_unreachable"), (504, "upstream_timeout")],
)  # fmt: skip
def test_status_to_reason(status, reason):
    assert parent_proxy.reason_for_status(status) == reason
    if reason:
        assert reason in upstream.REASONS


# -- open_tunnel / dial against a scripted parent on loopback (a real socket, a fake parent:
# the misbehaving replies below are what a real squid never sends) --


async def _scripted_parent(reply: bytes, close: bool = True):
    received = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.readuntil(b"\r\n\r\n"))
        writer.write(reply)
        await writer.drain()
        if close:
            writer.close()
        else:
            await asyncio.sleep(5)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, ParentProxy("127.0.0.1", port), received


def _dial(reply: bytes, close: bool = True, timeout: float = 2):
    async def go():
        server, parent, received = await _scripted_parent(reply, close)
        try:
            side = await upstream.dial(parse_ip("198.18.0.10"), 443, timeout, parent)
            side.close()
            return side, bytes(received)
        finally:
            server.close()

    return asyncio.run(go())


def test_tunnel_keeps_bytes_after_the_reply_head():
    side, received = _dial(b"HTTP/1.1 200 Connection established\r\n\r\nserver-first")
    assert bytes(side.early) == b"server-first"
    assert received.startswith(b"CONNECT 198.18.0.10:443 HTTP/1.1\r\n")


@pytest.mark.parametrize(
    ("reply", "reason", "detail"),
    [
        (b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n", "upstream_refused",
         "refused our credentials (407)"),
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", "upstream_refused", "refused the CONNECT (403)"),
        (b"HTTP/1.1 503 Service Unavailable\r\n\r\n", "upstream_unreachable", "answered 503"),
        (b"HTTP/1.1 504 Gateway Timeout\r\n\r\n", "upstream_timeout", "answered 504"),
        (b"garbage\r\n\r\n", "upstream_refused", "malformed reply"),
        (b"HTTP/1.1 200 OK\r\n", "upstream_refused", "closed the connection without answering"),
        (b"", "upstream_refused", "closed the connection without answering"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 20000, "upstream_refused", "over 16 KiB"),
    ],
)  # fmt: skip
def test_parent_refusals(reply, reason, detail):
    with pytest.raises(upstream.DialFailed) as info:
        _dial(reply)
    assert info.value.reason == reason
    assert detail in info.value.detail


def test_parent_that_never_answers_times_out():
    with pytest.raises(upstream.DialFailed) as info:
        _dial(b"", close=False, timeout=0.5)
    assert info.value.reason == "upstream_timeout"


def test_parent_down_is_refused():
    async def go():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        await upstream.dial(parse_ip("198.18.0.10"), 443, 2, ParentProxy("127.0.0.1", port))

    with pytest.raises(upstream.DialFailed) as info:
        asyncio.run(go())
    assert info.value.reason == "upstream_refused"
    assert "parent proxy 127.0.0.1:" in info.value.detail
