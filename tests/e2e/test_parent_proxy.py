"""End-to-end: `--upstream-proxy` through a real squid as the corporate parent proxy.

squid (Debian's package) runs in the proxy namespace on loopback with a config file of
its own: basic auth (`basic_ncsa_auth`, htpasswd made here), `http_access` only for
the lab, and `tcp_outgoing_address 198.18.0.3`, so the upstream server's log tells a
connection that came through squid (peer 198.18.0.3) from one the proxy made itself
(198.18.0.1). squid's access log shows what it was asked for.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from e2e.support.clients import assert_denied, curl
from e2e.support.lab import HOSTS, UPSTREAM_V4, Lab, _terminate, in_netns, raw_request, run

SQUID = "/usr/sbin/squid"
NCSA = "/usr/lib/squid/basic_ncsa_auth"
SQUID_SOURCE = "198.18.0.3"
USER, PASSWORD = "egress", "parent-pw-7Qx9"
SPEC = """
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: v6only.test
    - domain: api.example.test
      transform:
        Authorization: "Bearer parent-test-token"
    - domain: passthrough.test
    - domain: plain.test
    - domain: sneaky.test
"""



class Squid:
    def __init__(self, lab: Lab, netns: str, listen: str = "127.0.0.1", client: str = "127.0.0.1", source: str = SQUID_SOURCE):
        self.lab = lab
        self.netns, self.listen, self.client, self.source = netns, listen, client, source
        self.port = lab.free_port()
        # squid drops to user `proxy`, which cannot enter pytest's 0700 temporary directories.
        self.dir = Path(tempfile.mkdtemp(prefix="egress-squid-"))
        self.access_log = self.dir / "access.log"

    def start(self) -> None:
        hashed = run(["openssl", "passwd", "-apr1", PASSWORD]).stdout.strip()
        (self.dir / "htpasswd").write_text(f"{USER}:{hashed}\n")
        (self.dir / "squid.conf").write_text(
            f"""
http_port {self.listen}:{self.port}
pid_filename none
cache_log {self.dir}/cache.log
logformat egress %>a %rm %ru %>Hs %un
access_log stdio:{self.access_log} egress
cache deny all
cache_mem 4 MB
coredump_dir {self.dir}
netdb_filename none
pinger_enable off
logfile_rotate 0
shutdown_lifetime 0 seconds
cache_effective_user proxy
auth_param basic program {NCSA} {self.dir}/htpasswd
auth_param basic realm parent
acl lab src {self.client}/32
acl authed proxy_auth REQUIRED
http_access allow lab authed
http_access deny all
tcp_outgoing_address {self.source}
"""
        )
        shutil.chown(self.dir, "proxy")
        for path in self.dir.iterdir():
            shutil.chown(path, "proxy")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, SQUID, "-N", "-f", str(self.dir / "squid.conf")],
            stdout=(self.dir / "stdout").open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                cache_log = self.dir / "cache.log"
                detail = cache_log.read_text()[-2000:] if cache_log.exists() else ""
                raise RuntimeError(f"squid exited: {(self.dir / 'stdout').read_text()[-2000:]}{detail}")
            with in_netns(self.netns):
                sock = socket.socket()
            try:
                sock.connect((self.listen, self.port))
                return
            except OSError:
                time.sleep(0.1)
            finally:
                sock.close()
        raise RuntimeError("squid did not start listening")

    def log(self) -> list[list[str]]:
        """Access log lines: [client, method, url, status, user]."""
        time.sleep(0.3)  # squid writes a line when the transaction ends
        if not self.access_log.exists():
            return []
        return [line.split() for line in self.access_log.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        if hasattr(self, "proc"):
            _terminate(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def squid(lab: Lab):
    if not Path(SQUID).exists() or not Path(NCSA).exists() or shutil.which("openssl") is None:
        pytest.fail(f"these tests need squid ({SQUID}, {NCSA}; Debian package squid) and openssl")
    run(["ip", "netns", "exec", lab.proxy_ns, "ip", "addr", "add", f"{SQUID_SOURCE}/24", "dev", f"vp{lab.id}"], check=False)
    parent = Squid(lab, lab.proxy_ns)
    parent.start()
    yield parent
    parent.stop()


@pytest.fixture(scope="module")
def password_file(lab: Lab) -> Path:
    path = lab.dir / "parent-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def chained(lab: Lab, squid: Squid, password_file: Path):
    proxy = lab.start_proxy(
        SPEC,
        "--upstream-proxy", f"http://127.0.0.1:{squid.port}",
        "--upstream-proxy-auth", f"{USER}:${{file:{password_file}}}",
    )  # fmt: skip
    yield proxy
    proxy.stop()
    assert PASSWORD not in proxy.stdout() + proxy.stderr()
    assert PASSWORD not in json.dumps(proxy.audit())


def _connect(lab: Lab, proxy, host: str, port: int = 443) -> tuple[int, dict, str]:
    """A raw CONNECT; the proxy's answer to it (curl keeps no body of a refused CONNECT)."""
    answer = raw_request(lab, proxy.port, f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head, _, body = answer.decode().partition("\r\n\r\n")
    lines = head.split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _last_hit(lab: Lab, host: str, path: str) -> dict:
    hits = [r for r in lab.upstream_requests() if r["local"] == HOSTS[host] and r["path"] == path]
    assert len(hits) == 1, hits
    return hits[0]


def _connects(squid: Squid, target: str) -> list[list[str]]:
    return [line for line in squid.log() if line[1] == "CONNECT" and line[2] == target]


def test_passthrough_https_goes_through_the_parent_to_the_checked_ip(lab, squid, chained):
    status, _, body = curl(lab, chained, "https://passthrough.test/via-parent-pt")
    assert status == 200, body
    hit = _last_hit(lab, "passthrough.test", "/via-parent-pt")
    assert hit["peer"] == SQUID_SOURCE  # not 198.18.0.1: the proxy did not connect itself
    assert _connects(squid, "198.18.0.17:443")[-1][3:] == ["200", USER]
    assert not [line for line in squid.log() if "passthrough.test" in line[2]]  # asked for the IP, never the name


def test_ipv6_destination_is_asked_for_in_brackets(lab, squid, chained):
    status, _, body = curl(lab, chained, "https://v6only.test/via-parent-v6")
    assert status == 200, body
    assert _last_hit(lab, "v6only.test", "/via-parent-v6")["local"] == "2001:2::10"
    assert _connects(squid, "[2001:2::10]:443")[-1][3:] == ["200", USER]


def test_intercepted_https_with_injection_through_the_parent(lab, squid, chained):
    status, _, body = curl(lab, chained, "https://api.example.test/via-parent-inject")
    assert status == 200, body
    hit = _last_hit(lab, "api.example.test", "/via-parent-inject")
    headers = {k.lower(): v for k, v in hit["headers"]}
    assert headers["authorization"] == "Bearer parent-test-token"
    assert "proxy-authorization" not in headers  # the parent's credentials stay with the parent
    assert hit["peer"] == SQUID_SOURCE
    # One tunnel for the whole exchange: the connection dialled at CONNECT was handed to mitmproxy.
    assert [line[3:] for line in _connects(squid, "198.18.0.10:443")] == [["200", USER]]


def test_plain_http_is_tunnelled_too_with_its_host_header(lab, squid, chained):
    status, _, body = curl(
        lab, chained, "http://plain.test/via-parent-plain", "--proxy-user", "client:client-secret"
    )
    assert status == 200, body
    hit = _last_hit(lab, "plain.test", "/via-parent-plain")
    headers = {k.lower(): v for k, v in hit["headers"]}
    assert headers["host"] == "plain.test"
    assert hit["peer"] == SQUID_SOURCE
    assert "proxy-authorization" not in headers  # neither ours nor the client's reaches the destination
    assert _connects(squid, "198.18.0.16:80")[-1][3:] == ["200", USER]


def test_blocked_and_loopback_names_never_reach_the_parent(lab, squid, chained):
    before = squid.log()
    status, headers, body = _connect(lab, chained, "other.test")
    assert_denied(status, headers, body, "not_allowlisted", "other.test")
    status, headers, body = _connect(lab, chained, "sneaky.test")  # allowlisted, resolves to 127.0.0.1
    assert_denied(status, headers, body, "loopback", "sneaky.test")
    status, headers, body = curl(lab, chained, "http://sneaky.test/")
    assert_denied(status, headers, body, "loopback", "sneaky.test")
    assert squid.log() == before
    assert lab.canary.hits == []


def test_parent_down_is_502_with_the_reason(lab, squid, password_file):
    dead = lab.free_port()  # nothing listens there
    proxy = lab.start_proxy(
        SPEC, "--upstream-proxy", f"http://127.0.0.1:{dead}", "--upstream-proxy-auth", f"{USER}:${{file:{password_file}}}"
    )
    try:
        status, headers, body = _connect(lab, proxy, "passthrough.test")
        assert status == 502, body
        assert headers.get("x-egress-error") == "upstream_refused"
        assert json.loads(body) == {"error": "upstream_failed", "reason": "upstream_refused", "host": "passthrough.test"}
        status, _, body = curl(lab, proxy, "http://plain.test/parent-down")
        assert status == 502 and "upstream_refused" in body, body
        assert f"upstream upstream_refused at CONNECT (port 443): parent proxy 127.0.0.1:{dead} cannot be reached" in proxy.stdout()
        assert 'egress_upstream_errors_total{reason="upstream_refused"} 2.0' in proxy.get_ops("/metrics")[1]
    finally:
        proxy.stop()
    assert PASSWORD not in proxy.stdout() + proxy.stderr()


def test_wrong_parent_credentials_are_a_clear_error(lab, squid, tmp_path):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    proxy = lab.start_proxy(
        SPEC, "--upstream-proxy", f"http://127.0.0.1:{squid.port}", "--upstream-proxy-auth", f"{USER}:${{file:{wrong}}}"
    )
    try:
        status, headers, body = _connect(lab, proxy, "passthrough.test")
        assert status == 502, body
        assert headers.get("x-egress-error") == "upstream_refused"
        assert "parent proxy refused our credentials (407): check --upstream-proxy-auth" in proxy.stdout() + proxy.stderr()
        assert _connects(squid, "198.18.0.17:443")[-1][3] == "407"
        status, _, body = curl(lab, proxy, "http://plain.test/wrong-credentials")
        assert status == 502 and "upstream_refused" in body, body
        assert not [r for r in lab.upstream_requests() if r["path"] == "/wrong-credentials"]
    finally:
        proxy.stop()
    assert "not-the-password" not in proxy.stdout() + proxy.stderr()


def test_the_password_is_not_on_the_command_line(lab, chained):
    cmdline = Path(f"/proc/{chained.proc.pid}/cmdline").read_bytes().decode()
    assert "${file:" in cmdline and PASSWORD not in cmdline


# -- transparent mode: the sandbox's redirected connections leave through the parent too --
#
# The sidecar's rules redirect every TCP connection of the sandbox namespace except the
# proxy's own (uid 0), so the parent cannot run there as `proxy`: it runs in the upstream
# namespace on the sandbox's gateway address, and connects out from 198.18.0.2 (the
# sandbox itself is 198.18.1.1, so the upstream's `peer` tells the two apart).


@pytest.fixture(scope="module")
def transparent_chained(lab: Lab, password_file: Path):
    from e2e.support.transparent_lab import SANDBOX_GW_V4, SANDBOX_V4, Sandbox

    parent = Squid(lab, lab.upstream_ns, listen=SANDBOX_GW_V4, client=SANDBOX_V4, source=UPSTREAM_V4)
    box = Sandbox(lab)
    try:
        box.start()  # first: it makes the gateway address the parent listens on
        parent.start()
        proxy = box.start_proxy(
            SPEC,
            extra=("--upstream-proxy", f"http://{SANDBOX_GW_V4}:{parent.port}",
                   "--upstream-proxy-auth", f"{USER}:${{file:{password_file}}}"),
        )  # fmt: skip
        applied = box.redirect_rules("--proxy-port", str(proxy.port), "--proxy-uid", "0", "--apply")
        assert applied.returncode == 0, applied.stderr
        yield box, parent
    finally:
        box.stop()
        parent.stop()
    assert PASSWORD not in proxy.stdout() + proxy.stderr()


def test_transparent_mode_goes_through_the_parent(lab, transparent_chained):
    box, parent = transparent_chained
    status, _, body = box.curl("https://api.example.test/transparent-parent-inject")
    assert status == 200, body
    hit = _last_hit(lab, "api.example.test", "/transparent-parent-inject")
    assert hit["peer"] == UPSTREAM_V4
    assert ["Authorization", "Bearer parent-test-token"] in hit["headers"]
    answer = box.client(
        "https", "passthrough.test", "443", "--sni", "passthrough.test", "--ca", box.ca_bundle,
        "--path", "/transparent-parent-pt",
    )  # fmt: skip
    assert answer.get("status") == 200 and answer["issuer"] == "egress test upstream CA", answer
    assert _last_hit(lab, "passthrough.test", "/transparent-parent-pt")["peer"] == UPSTREAM_V4
    status, _, body = box.curl("http://plain.test/transparent-parent-plain")
    assert status == 200, body
    assert _last_hit(lab, "plain.test", "/transparent-parent-plain")["peer"] == UPSTREAM_V4
    targets = [line[2] for line in parent.log() if line[1] == "CONNECT" and line[3] == "200" and line[4] == USER]
    assert {"198.18.0.10:443", "198.18.0.17:443", "198.18.0.16:80"} <= set(targets)
    before = parent.log()
    status, _, _ = box.curl("https://sneaky.test/")  # allowlisted, resolves to loopback: closed
    assert status == 0
    assert parent.log() == before


def test_gateway_client_token_never_reaches_the_parent_or_the_destination(lab, squid, password_file):
    token = "gw-token-5b1e07c9"
    spec_dir = lab.dir / "parent-gateway"
    spec_dir.mkdir()
    (spec_dir / "team-a.yaml").write_text(SPEC.replace("network:\n", f"network:\n  proxyToken: {token}\n", 1))
    proxy = lab.start_proxy(
        None,
        "--upstream-proxy", f"http://127.0.0.1:{squid.port}",
        "--upstream-proxy-auth", f"{USER}:${{file:{password_file}}}",
        spec_dir=spec_dir,
    )  # fmt: skip
    try:
        status, _, body = curl(lab, proxy, "http://plain.test/gateway-parent-plain", "--proxy-user", f"team-a:{token}")
        assert status == 200, body
        status, _, body = curl(lab, proxy, "https://api.example.test/gateway-parent-tls", "--proxy-user", f"team-a:{token}")
        assert status == 200, body
        for path, host in (("/gateway-parent-plain", "plain.test"), ("/gateway-parent-tls", "api.example.test")):
            hit = _last_hit(lab, host, path)
            assert hit["peer"] == SQUID_SOURCE
            assert token not in json.dumps(hit["headers"])
            assert "proxy-authorization" not in {k.lower() for k, _ in hit["headers"]}
        # squid authenticated our credentials, not the sandbox's
        assert _connects(squid, "198.18.0.16:80")[-1][3:] == ["200", USER]
        assert "team-a" not in squid.access_log.read_text()
    finally:
        proxy.stop()
    assert PASSWORD not in proxy.stdout() + proxy.stderr()
    assert token not in proxy.stdout() + proxy.stderr()


def test_workers_all_go_through_the_parent(lab, squid, password_file):
    proxy = lab.start_proxy(
        SPEC, "--workers", "2",
        "--upstream-proxy", f"http://127.0.0.1:{squid.port}", "--upstream-proxy-auth", f"{USER}:${{file:{password_file}}}",
    )  # fmt: skip
    try:
        for i in range(6):  # spread over both workers by the kernel (SO_REUSEPORT)
            status, _, body = curl(lab, proxy, f"http://plain.test/workers-parent-{i}")
            assert status == 200, body
            assert _last_hit(lab, "plain.test", f"/workers-parent-{i}")["peer"] == SQUID_SOURCE
    finally:
        proxy.stop()
    assert PASSWORD not in proxy.stdout() + proxy.stderr()
