"""End-to-end: second red-team pass on what a CONNECT tunnel carries before the proxy has decided.

The first pass (test_passthrough.py, test_attack_ssrf_and_smuggling.py) checked the server_name of
well-formed ClientHellos. Here the attacker shapes the *first bytes* of the tunnel so the
proxy's "is this TLS?" question gets the wrong answer while the upstream server still
reads TLS (or HTTP): record versions real servers accept but mitmproxy's check does not,
SSLv2-compatible hellos, an HTTP request whose first segment is one byte. Real TLS stacks
(Python's OpenSSL) do the handshakes, so a row fails only if a real server would really
have been reached with something the proxy did not check.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import ssl
import subprocess
import time
import uuid

import pytest
from http_head import recv_head

from e2e.support.lab import CANARY_PORT, HOSTS, Lab, in_netns, listen_tcp, serve_connections

SECRET = "rt2-secret-" + uuid.uuid4().hex[:12]
SPEC = f"""
network:
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: api.example.test
      transform:
        Authorization: "Bearer {SECRET}"
    - domain: passthrough.test
    - domain: plain.test
"""


@pytest.fixture(scope="module")
def proxy(lab: Lab):
    proxy = lab.start_proxy(SPEC)
    yield proxy
    proxy.stop()
    assert SECRET not in proxy.stdout() + proxy.stderr()


def connect(lab: Lab, proxy, host: str, port: int) -> socket.socket:
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    answer = recv_head(sock, chunk_size=1)  # byte by byte: the tunnel's bytes follow the head
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return sock


def marked_path() -> str:
    return "/rt2-" + uuid.uuid4().hex[:12]


def reached(lab: Lab, path: str) -> list[dict]:
    return [r for r in lab.upstream_requests() if r["path"].startswith(path)]


def tls_through(sock: socket.socket, server_hostname: str, cafile, patch=lambda first: first, context=None) -> ssl.SSLObject:
    """A real OpenSSL client handshake over `sock`; `patch` rewrites the first flight (the ClientHello)."""
    context = context or ssl.create_default_context(cafile=str(cafile))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    first = True
    sock.settimeout(5)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pass
        data = outgoing.read()
        if data:
            sock.sendall(patch(data) if first else data)
            first = False
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed during the handshake")
        incoming.write(chunk)
    if data := outgoing.read():
        sock.sendall(data)
    tls.sock, tls.incoming, tls.outgoing = sock, incoming, outgoing  # type: ignore[attr-defined]
    return tls


def tls_request(tls, request: bytes) -> bytes:
    tls.write(request)
    tls.sock.sendall(tls.outgoing.read())
    answer = b""
    deadline = time.monotonic() + 5
    while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
        chunk = tls.sock.recv(65536)
        if not chunk:
            break
        tls.incoming.write(chunk)
        try:
            answer += tls.read(65536)
        except ssl.SSLWantReadError:
            pass
    return answer


def record_version(minor: int):
    """Rewrite the first record header's version to 3.`minor` (what real servers accept on the first record)."""
    return lambda first: first[:1] + bytes([0x03, minor]) + first[3:]


def one_byte_records(first: bytes) -> bytes:
    """The same ClientHello, re-framed as one TLS record per handshake byte (RFC 8446 §5.1 allows it)."""
    assert first[0] == 0x16
    size = int.from_bytes(first[3:5], "big")
    message, rest = first[5 : 5 + size], first[5 + size :]
    return b"".join(b"\x16\x03\x01\x00\x01" + bytes([b]) for b in message) + rest


# -- TLS the proxy's check would not call TLS, but servers do -------------------------------------

def after(record: bytes):
    """Send `record` (another TLS content type) before the ClientHello."""
    return lambda first: record + first


UNREADABLE_HELLOS = {
    "record-3.4": record_version(4),
    "record-3.5": record_version(5),
    "record-3.255": record_version(255),
    # OpenSSL ignores warning alerts before the handshake (up to four): the ClientHello after it counts.
    "warning-alert-first": after(b"\x15\x03\x01\x00\x02\x01\x70"),
    "two-warning-alerts-first": after(b"\x15\x03\x01\x00\x02\x01\x70" * 2),
    "ccs-first": after(b"\x14\x03\x01\x00\x01\x01"),
    "heartbeat-first": after(b"\x18\x03\x01\x00\x03\x01\x00\x00"),
    "empty-appdata-first": after(b"\x17\x03\x01\x00\x00"),
}


@pytest.mark.parametrize("patch", UNREADABLE_HELLOS.values(), ids=UNREADABLE_HELLOS.keys())
def test_passthrough_hello_with_an_odd_record_version_is_still_checked(lab, proxy, patch):
    """CONNECT passthrough.test, ClientHello naming other.test in a record OpenSSL accepts:
    the server_name must still be checked (it was relayed unchecked as raw TCP)."""  # was a defect
    sock = connect(lab, proxy, "passthrough.test", 443)
    try:
        with pytest.raises((ConnectionResetError, ssl.SSLError, TimeoutError)):
            tls_through(sock, "other.test", lab.upstream_ca, patch)
    finally:
        sock.close()


@pytest.mark.parametrize("patch", UNREADABLE_HELLOS.values(), ids=UNREADABLE_HELLOS.keys())
def test_intercepted_entry_cannot_be_reached_around_interception(lab, proxy, patch):
    """A transform entry forces interception (Host checked, credential injected): a ClientHello
    the proxy's TLS layer would not recognise must not open a direct TLS session to the
    upstream instead, where the Host header goes unchecked."""  # was a defect
    path = marked_path()
    sock = connect(lab, proxy, "api.example.test", 443)
    try:
        try:
            tls = tls_through(sock, "api.example.test", lab.upstream_ca, patch)
        except (ConnectionResetError, ssl.SSLError, TimeoutError):
            pass
        else:
            tls_request(tls, f"GET {path} HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n".encode())
    finally:
        sock.close()
    assert not reached(lab, path)


def test_hello_in_one_byte_records_sent_slowly_is_checked_and_relayed(lab, proxy):
    """A ClientHello fragmented over many records and segments (legitimate per RFC 8446 §5.1)
    reaches the right upstream when its name is right..."""
    path = marked_path()

    def slowly(first: bytes) -> bytes:
        data = one_byte_records(first)
        for i in range(0, len(data) - 50, 50):
            sock.sendall(data[i : i + 50])
            time.sleep(0.002)
        return data[i + 50 :]

    sock = connect(lab, proxy, "passthrough.test", 443)
    try:
        tls = tls_through(sock, "passthrough.test", lab.upstream_ca, slowly)
        answer = tls_request(tls, f"GET {path} HTTP/1.1\r\nHost: passthrough.test\r\nConnection: close\r\n\r\n".encode())
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (hit,) = reached(lab, path)
    assert hit["local"] == HOSTS["passthrough.test"]


def test_hello_in_one_byte_records_naming_another_host_is_refused(lab, proxy):
    sock = connect(lab, proxy, "passthrough.test", 443)
    try:
        with pytest.raises((ConnectionResetError, ssl.SSLError, TimeoutError)):
            tls_through(sock, "other.test", lab.upstream_ca, one_byte_records)
    finally:
        sock.close()


# -- a Go TLS server (Caddy): what it reads as the ClientHello -----------------------------------------

CADDY_PORT = 9444
CADDYFILE = """{{
	admin off
	auto_https off
	storage file_system {dir}/data
}}
https://:{port} {{
	bind {binds}
	tls {cert} {key}
	respond "sni={{http.request.tls.server_name}} host={{http.request.host}}" 200
}}
"""


@pytest.fixture(scope="module")
def caddy(lab: Lab):
    """Caddy (Go's crypto/tls, from apt) on passthrough.test and api.example.test, port CADDY_PORT:
    it answers with the server_name it read and the Host it was asked for."""
    workdir = lab.dir / "caddy"
    workdir.mkdir(exist_ok=True)
    config = workdir / "Caddyfile"
    config.write_text(CADDYFILE.format(
        dir=workdir, port=CADDY_PORT, binds=f"{HOSTS['passthrough.test']} {HOSTS['api.example.test']}",
        cert=lab.dir / "upstream.pem", key=lab.dir / "upstream.key",
    ))  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "XDG_DATA_HOME": str(workdir), "XDG_CONFIG_HOME": str(workdir)}
    proc = subprocess.Popen(
        ["ip", "netns", "exec", lab.upstream_ns, "caddy", "run", "--config", str(config), "--adapter", "caddyfile"],
        stdout=subprocess.DEVNULL, stderr=(workdir / "caddy.log").open("w"), env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while True:
            with in_netns(lab.upstream_ns), socket.socket() as probe:
                if probe.connect_ex((HOSTS["passthrough.test"], CADDY_PORT)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, (workdir / "caddy.log").read_text()[-2000:]
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()  # ours, by its handle
        proc.wait(timeout=10)


def caddy_says(lab, proxy, connect_host: str, sni: str, host: str, patch) -> bytes:
    sock = connect(lab, proxy, connect_host, CADDY_PORT)
    try:
        tls = tls_through(sock, sni, lab.upstream_ca, patch)
        return tls_request(tls, f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    except (ConnectionResetError, ssl.SSLError, TimeoutError) as exc:
        return repr(exc).encode()
    finally:
        sock.close()


WARNING_ALERT = b"\x15\x03\x01\x00\x02\x01\x70"  # unrecognized_name, level warning


def test_go_server_positive_control(lab, proxy, caddy):
    answer = caddy_says(lab, proxy, "passthrough.test", "passthrough.test", "passthrough.test", lambda first: first)
    assert answer.endswith(b"sni=passthrough.test host=passthrough.test"), answer


@pytest.mark.parametrize("preamble", [WARNING_ALERT, WARNING_ALERT * 3, b"\x15\x00\x00\x00\x02\x01\x70"], ids=["alert", "three-alerts", "alert-version-0"])
def test_go_server_never_gets_a_client_hello_behind_another_record(lab, proxy, caddy, preamble):
    """A warning alert before the ClientHello: Go drops it and reads the ClientHello behind it.
    The proxy relayed the whole thing as raw TCP, so `sni=other.test` was served through a
    CONNECT to passthrough.test, and a transform entry was reached around interception."""  # was a defect
    answer = caddy_says(lab, proxy, "passthrough.test", "other.test", "other.test", lambda first: preamble + first)
    assert b"sni=" not in answer, answer
    answer = caddy_says(lab, proxy, "api.example.test", "api.example.test", "other.test", lambda first: preamble + first)
    assert b"sni=" not in answer, answer


# -- plain HTTP whose first segment is too short to look like HTTP ------------------------------


@pytest.mark.parametrize("first", [b"G", b"GE", b"\r\n", b"\r", b"\n"], ids=repr)
def test_http_request_starting_with_a_short_segment_is_still_checked(lab, proxy, first):
    """`CONNECT plain.test:80`, then `G` ... `ET / HTTP/1.1 Host: other.test`: the Host header
    must still be checked (mitmproxy took a first segment under 3 bytes for raw TCP)."""  # was a defect
    path = marked_path()
    sock = connect(lab, proxy, "plain.test", 80)
    request = f"GET {path} HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n".encode()
    rest = request[len(first) :] if request.startswith(first) else request
    try:
        sock.sendall(first)
        time.sleep(0.3)
        sock.sendall(rest)
        sock.settimeout(5)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    finally:
        sock.close()
    assert not reached(lab, path)
    assert b"host_mismatch" in answer, answer


def test_ssh_banner_in_a_tunnel_is_relayed_to_the_checked_address(lab, proxy):
    """Anything that is neither TLS nor HTTP goes, as raw TCP, to the checked address only
    (here the lab's HTTP server, which answers an SSH banner with its HTTP/0.9 error page)."""
    sock = connect(lab, proxy, "plain.test", 80)
    try:
        sock.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        sock.settimeout(5)
        answer = sock.recv(65536)
    finally:
        sock.close()
    assert b"Bad request" in answer, answer


def test_slow_http_with_the_right_host_still_works(lab, proxy):
    """Positive control: waiting for the request line does not break a client that writes slowly."""
    path = marked_path()
    sock = connect(lab, proxy, "plain.test", 80)
    try:
        for piece in (b"G", b"ET ", f"{path} HTTP/1.1\r".encode(), b"\nHost: plain.test\r\nConnection: close\r\n\r\n"):
            sock.sendall(piece)
            time.sleep(0.1)
        sock.settimeout(5)
        answer = sock.recv(65536)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert [h["local"] for h in reached(lab, path)] == [HOSTS["plain.test"]]


# -- transparent mode: the same first bytes, redirected from the sandbox ----------------------------

TRANSPARENT_SPEC = f"""
network:
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: api.example.test
      transform:
        Authorization: "Bearer {SECRET}"
    - domain: a.example.test
    - domain: plain.test
"""
ATTACKER = HOSTS["evilexample.test"]  # not allowlisted: where the sandbox's packets are addressed
# Runs in the sandbox as `nobody` (redirected): sends the bytes in two writes, prints what came back.
_SEND_IN_TWO = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
data, cut = bytes.fromhex(sys.argv[3]), int(sys.argv[4])
s.sendall(data[:cut])
time.sleep(0.3)
s.sendall(data[cut:])
out = b""
try:
    while chunk := s.recv(65536):
        out += chunk
except OSError:
    pass
print(out.hex())
"""


@pytest.fixture(scope="module")
def sandbox(lab: Lab):
    from e2e.support.transparent_lab import Sandbox

    box = Sandbox(lab)
    try:
        box.start()
        proxy = box.start_proxy(TRANSPARENT_SPEC)
        applied = box.redirect_rules("--proxy-port", str(proxy.port), "--proxy-uid", "0", "--apply")
        assert applied.returncode == 0, applied.stderr
        yield box
    finally:
        box.stop()
    assert SECRET not in proxy.stdout() + proxy.stderr()


def send_in_two(box, address: str, port: int, data: bytes, cut: int) -> bytes:
    out = box.exec("/usr/bin/python3", "-I", "-c", _SEND_IN_TWO, address, str(port), data.hex(), str(cut))
    assert out.returncode == 0, out.stderr
    return bytes.fromhex(out.stdout.strip())


def openssl_hello(server_hostname: str) -> bytes:
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


SSL2_HELLO = b"\x80\x2e\x01\x03\x03\x00\x15\x00\x00\x00\x10" + b"\x00\xc0\x2f" * 7 + b"\x11" * 16


@pytest.mark.parametrize(
    "hello",
    [record_version(4)(openssl_hello("api.example.test")), record_version(5)(openssl_hello("a.example.test")), SSL2_HELLO],
    ids=["transform-record-3.4", "passthrough-record-3.5", "sslv2"],
)
def test_transparent_tls_the_proxy_cannot_read_is_no_sni(lab, sandbox, hello):
    """Record version 3.4 with a transform entry's name went around interception to the
    upstream (its ServerHello came back); every such start is now `no_sni`."""  # was a defect
    seen = len(sandbox.proxy.audit())
    assert send_in_two(sandbox, ATTACKER, 443, hello, len(hello)) == b""
    entries = [e for e in sandbox.proxy.audit()[seen:] if e.get("event") == "tunnel"]
    assert [(e["decision"], e["reason"]) for e in entries] == [("blocked", "no_sni")]


def test_transparent_http_whose_first_write_is_one_byte_is_served(lab, sandbox):
    """`G`, then the rest: an HTTP request, checked by its Host (it was refused as raw TCP)."""
    path = marked_path()
    request = f"GET {path} HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n".encode()
    answer = send_in_two(sandbox, ATTACKER, 80, request, 1)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert [h["local"] for h in reached(lab, path)] == [HOSTS["plain.test"]]


# -- a CONNECT inside a tunnel -------------------------------------------------------------------


@pytest.mark.parametrize("target", ["other.test:80", "plain.test:80", f"127.0.0.1:{CANARY_PORT}", "passthrough.test:443"])
def test_connect_inside_a_plain_http_tunnel_opens_nothing_new(lab, proxy, target):
    """CONNECT plain.test:80, then `CONNECT <target>` inside it, then a request for other.test:
    the inner CONNECT is no second tunnel, and other.test / the canary are never reached."""
    path = marked_path()
    canary_hits = len(lab.canary.hits)
    sock = connect(lab, proxy, "plain.test", 80)
    try:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        time.sleep(0.3)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n".encode())
        sock.settimeout(5)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    finally:
        sock.close()
    assert not reached(lab, path), answer
    assert not [r for r in lab.upstream_requests() if r["method"] == "CONNECT"]
    assert len(lab.canary.hits) == canary_hits


# -- real clients: what they send as CONNECT host and SNI ------------------------------------------


def s_client(lab: Lab, proxy, connect: str, *sni_args: str, path: str) -> subprocess.CompletedProcess:
    request = f"GET {path} HTTP/1.1\r\nHost: {connect.split(':')[0]}\r\nConnection: close\r\n\r\n"
    return subprocess.run(
        ["ip", "netns", "exec", lab.proxy_ns, "openssl", "s_client", "-quiet", "-verify_return_error",
         "-CAfile", str(lab.upstream_ca), "-proxy", f"127.0.0.1:{proxy.port}", "-connect", connect, *sni_args],
        input=request, capture_output=True, text=True, timeout=20,
    )  # fmt: skip


@pytest.mark.parametrize(
    "sni_args, allowed",
    [(("-servername", "passthrough.test"), True), (("-noservername",), True), (("-servername", "PassThrough.TEST"), True),
     (("-servername", "passthrough.test."), True), (("-servername", "other.test"), False),
     (("-servername", "api.example.test"), False), (("-servername", "passthrough.test.other.test"), False),
     (("-servername", "xn--pssthrough-r5a.test"), False)],
    ids=["same", "none", "case", "trailing-dot", "other", "transform-entry", "suffix", "idna-lookalike"],
)  # fmt: skip
def test_openssl_s_client_server_name_against_the_connect_host(lab, proxy, sni_args, allowed):
    path = marked_path()
    out = s_client(lab, proxy, "passthrough.test:443", *sni_args, path=path)
    hits = reached(lab, path)
    if allowed:
        assert out.stdout.startswith("HTTP/1.1 200"), out.stderr[-2000:]
        assert [h["local"] for h in hits] == [HOSTS["passthrough.test"]]
    else:
        assert not hits and "HTTP/1.1" not in out.stdout, out.stdout


def test_curl_connect_to_with_another_server_name_is_refused(lab, proxy):
    """`curl --connect-to other.test:443:passthrough.test:443 https://other.test/`: the CONNECT names
    passthrough.test and the SNI other.test (a fronting attempt with a stock client)."""
    path = marked_path()
    out = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", proxy.url, "--cacert", str(lab.upstream_ca),
        "--connect-to", "other.test:443:passthrough.test:443", f"https://other.test{path}",
    )  # fmt: skip
    assert out.returncode != 0 and not reached(lab, path), (out.stdout, out.stderr)
    # The positive control: the same flags naming passthrough.test itself.
    out = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", proxy.url, "--cacert", str(lab.upstream_ca), "-o", "/dev/null",
        "-w", "%{http_code}", "--connect-to", "passthrough.test:443:passthrough.test:443", f"https://passthrough.test{path}",
    )  # fmt: skip
    assert out.stdout == "200", out.stderr
    # A trailing dot in the URL: curl's CONNECT names `passthrough.test.`, its SNI drops the dot.
    out = lab.exec(
        "curl", "-sS", "--max-time", "10", "-x", proxy.url, "--cacert", str(lab.upstream_ca), "-o", "/dev/null",
        "-w", "%{http_code}", f"https://passthrough.test.{path}-dot",
    )  # fmt: skip
    assert out.stdout == "200", out.stderr


def _huge_alpn_context(cafile) -> ssl.SSLContext:
    """A real OpenSSL client whose ClientHello is over 16 KiB (as large post-quantum key shares
    make them): 80 ALPN names of 250 bytes; OpenSSL splits it over two TLS records."""
    context = ssl.create_default_context(cafile=str(cafile))
    context.set_alpn_protocols([f"x{i:03d}".ljust(250, "y") for i in range(80)] + ["http/1.1"])
    return context


@pytest.mark.parametrize("sni, allowed", [("passthrough.test", True), ("other.test", False)])
def test_client_hello_over_16_kib_in_two_records(lab, proxy, sni, allowed):
    path = marked_path()
    firsts: list[bytes] = []

    def keep(first: bytes) -> bytes:
        firsts.append(first)
        return first

    sock = connect(lab, proxy, "passthrough.test", 443)
    try:
        if allowed:
            tls = tls_through(sock, sni, lab.upstream_ca, keep, context=_huge_alpn_context(lab.upstream_ca))
            answer = tls_request(tls, f"GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 200"), answer
        else:
            with pytest.raises((ConnectionResetError, ssl.SSLError, TimeoutError)):
                tls_through(sock, sni, lab.upstream_ca, keep, context=_huge_alpn_context(lab.upstream_ca))
    finally:
        sock.close()
    assert len(firsts[0]) > 16384 + 5 and firsts[0][5 + 16384] == 0x16  # really two records
    assert [h["local"] for h in reached(lab, path)] == ([HOSTS["passthrough.test"]] if allowed else [])


# -- encrypted_client_hello (0xfe0d): decided on the outer ClientHello --------------------------------

ECH = 0xFE0D
# An ECHClientHello of type outer (RFC 9849 §5): HPKE suite, config_id, enc, payload. What Chrome
# sends as GREASE has this shape too, with random bytes: the proxy cannot tell the two apart.
ECH_OUTER = b"\x00" + b"\x00\x01\x00\x01" + b"\x2a" + b"\x00\x20" + b"\x33" * 32 + b"\x00\x90" + b"\x44" * 144


def with_extension(first: bytes, kind: int, data: bytes) -> bytes:
    """A real one-record ClientHello with one more extension appended (lengths fixed up)."""
    size = int.from_bytes(first[3:5], "big")
    record, rest = first[5 : 5 + size], first[5 + size :]
    body = record[4:]
    at = 2 + 32
    at += 1 + body[at]  # session id
    at += 2 + int.from_bytes(body[at : at + 2], "big")  # cipher suites
    at += 1 + body[at]  # compression methods
    extensions = body[at + 2 :] + kind.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data
    body = body[:at] + len(extensions).to_bytes(2, "big") + extensions
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    return first[:3] + len(message).to_bytes(2, "big") + message + rest


@pytest.mark.parametrize("outer_sni, relayed", [("passthrough.test", True), ("other.test", False)])
def test_hello_with_ech_is_decided_on_its_outer_server_name(lab, proxy, outer_sni, relayed):
    """Relayed when the outer server_name is the CONNECT host (GREASE ECH from every Chrome looks
    like this), refused otherwise; what the inner ClientHello names is not visible (SECURITY.md)."""
    hello = with_extension(openssl_hello(outer_sni), ECH, ECH_OUTER)
    sock = connect(lab, proxy, "passthrough.test", 443)
    try:
        sock.sendall(hello)
        sock.settimeout(5)
        try:
            answer = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    finally:
        sock.close()
    # The lab's OpenSSL 3 server ignores the extension it does not know and sends its ServerHello.
    assert (answer[:1] == b"\x16" and answer[5:6] == b"\x02") is relayed, answer[:16]


# -- protocol switches: after a 101 the proxy sees no more requests ---------------------------------

SWITCH_PORT = 8101


class Switcher:
    """A raw upstream on plain.test:SWITCH_PORT that switches protocols the way the request asks:
    `Upgrade: h2c` (a Go/Envoy/Apache h2c server) or a WebSocket handshake of a version other
    than 13 (a lenient server) get a 101; anything else a 200. Records every byte after a switch."""

    def __init__(self, lab: Lab):
        self.sock = listen_tcp(lab.upstream_ns, HOSTS["plain.test"], SWITCH_PORT, backlog=16)
        self.after_switch = bytearray()
        self.switched = 0
        serve_connections(self.sock, self._serve)

    def _serve(self, conn: socket.socket, _peer) -> None:
        conn.settimeout(10)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lower = head.lower()
                if b"sec-websocket-version: 13" in lower and b"upgrade: websocket" in lower:
                    self._websocket_echo(conn, head, buf)
                    return
                if b"upgrade: h2c" in lower or b"sec-websocket-version: 12" in lower:
                    protocol = b"h2c" if b"h2c" in lower else b"websocket"
                    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + protocol + b"\r\n\r\n")
                    self.switched += 1
                    self.after_switch += buf
                    while chunk := conn.recv(65536):
                        self.after_switch += chunk
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _websocket_echo(conn: socket.socket, head: bytes, buf: bytes) -> None:
        """A real RFC 6455 handshake, then one text frame echoed back (the positive control)."""
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")  # fmt: skip
        while len(buf) < 6 or len(buf) < 6 + (buf[1] & 0x7F):
            buf += conn.recv(65536)
        size, mask = buf[1] & 0x7F, buf[2:6]
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(buf[6 : 6 + size]))
        conn.sendall(bytes([0x81, len(payload) + 5]) + b"echo:" + payload)
        # Stay open until the client goes: closing first makes the proxy send the client a
        # close frame, which can arrive in the same read as the echo.
        while conn.recv(65536):
            pass

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@pytest.fixture(scope="module")
def switcher(lab: Lab):
    server = Switcher(lab)
    yield server
    server.close()


UPGRADES = {
    "h2c": "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n",
    "websocket-v12": "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 12\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
}


@pytest.mark.parametrize("in_tunnel", [False, True], ids=["plain", "in-connect"])
@pytest.mark.parametrize("upgrade", UPGRADES.values(), ids=UPGRADES.keys())
def test_protocol_switch_the_proxy_cannot_follow_is_not_made(lab, proxy, switcher, upgrade, in_tunnel):
    """h2c smuggling (Bishop Fox, 2020) against the egress proxy: an upstream that answers 101 to
    anything but a WebSocket mitmproxy can parse turned the connection into raw TCP, and the next
    request (Host: other.test) went to the upstream unchecked."""  # was a defect
    authority = f"plain.test:{SWITCH_PORT}"
    target = "/rt2-switch" if in_tunnel else f"http://{authority}/rt2-switch"
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n"
    if in_tunnel:
        sock = connect(lab, proxy, "plain.test", SWITCH_PORT)
    else:
        with in_netns(lab.proxy_ns):
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    before = switcher.switched
    try:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {authority}\r\n{upgrade}\r\n".encode())
        sock.settimeout(5)
        first = b""
        try:
            while b"\r\n\r\n" not in first and (chunk := sock.recv(65536)):
                first += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        try:
            sock.sendall(smuggled)
            time.sleep(0.5)
        except OSError:
            pass
    finally:
        sock.close()
    time.sleep(0.2)
    assert b"Host: other.test" not in bytes(switcher.after_switch), (first, bytes(switcher.after_switch))
    assert not first.startswith(b"HTTP/1.1 101"), first
    if "h2c" in upgrade:
        # The Upgrade header does not reach the upstream: it answers as HTTP/1.1 and stays checked.
        assert switcher.switched == before and first.startswith(b"HTTP/1.1 200"), first


def test_websocket_the_proxy_follows_still_works(lab, proxy, switcher):
    """The positive control: a WebSocket handshake of version 13 is switched, and frames flow."""
    authority = f"plain.test:{SWITCH_PORT}"
    with in_netns(lab.proxy_ns):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    try:
        sock.sendall(f"GET http://{authority}/ws HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                     "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode())  # fmt: skip
        sock.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 101"), head
        mask, payload = b"\x01\x02\x03\x04", b"hello"
        sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        frame = head.partition(b"\r\n\r\n")[2]
        while len(frame) < 2 + len(b"echo:hello"):
            frame += sock.recv(65536)
    finally:
        sock.close()
    assert frame[:12] == bytes([0x81, 10]) + b"echo:hello", frame


def test_client_hello_over_16_kib_to_an_intercepted_entry(lab, proxy):
    """The same two-record ClientHello, to an entry with a transform: intercepted (the proxy's
    certificate), the credential injected, the Host still checked."""
    path = marked_path()
    context = _huge_alpn_context(proxy.ca)
    sock = connect(lab, proxy, "api.example.test", 443)
    try:
        tls = tls_through(sock, "api.example.test", proxy.ca, context=context)
        answer = tls_request(tls, f"GET {path} HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n".encode())
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    (hit,) = reached(lab, path)
    assert dict(hit["headers"])["Authorization"] == f"Bearer {SECRET}"


@pytest.mark.parametrize("alpn", [None, ["x-custom"], ["http/1.1"]], ids=["no-alpn", "other-alpn", "http1-alpn"])
@pytest.mark.parametrize("first", [b"G", b"GE", b"\r\n"], ids=repr)
def test_intercepted_http_whose_first_write_is_short_is_still_checked(lab, proxy, alpn, first):
    """Inside an intercepted tunnel (TLS terminated by the proxy), the same short first write:
    mitmproxy's guess took it for raw TCP (unless the client had negotiated an HTTP ALPN) and
    relayed the request, Host: other.test, to the upstream unchecked and without the credential."""  # was a defect
    path = marked_path()
    context = ssl.create_default_context(cafile=str(proxy.ca))
    if alpn:
        context.set_alpn_protocols(alpn)
    sock = connect(lab, proxy, "api.example.test", 443)
    answer = b""
    try:
        tls = tls_through(sock, "api.example.test", proxy.ca, context=context)
        request = f"GET {path} HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n".encode()
        rest = request[len(first) :] if request.startswith(first) else request
        for piece in (first, rest):
            tls.write(piece)
            sock.sendall(tls.outgoing.read())
            time.sleep(0.3)
        sock.settimeout(3)
        try:
            while chunk := sock.recv(65536):
                tls.incoming.write(chunk)
                try:
                    answer += tls.read(65536)
                except ssl.SSLWantReadError:
                    pass
        except (TimeoutError, ConnectionResetError, ssl.SSLError):
            pass
    except (ConnectionResetError, ssl.SSLError, TimeoutError):
        pass
    finally:
        sock.close()
    assert not reached(lab, path), answer


# Runs in the sandbox as `nobody`: TLS to the address given (redirected), no ALPN, the request in two writes.
_TLS_IN_TWO = """
import socket, ssl, sys, time
context = ssl.create_default_context(cafile=sys.argv[3])
s = context.wrap_socket(socket.create_connection((sys.argv[1], 443), timeout=5), server_hostname=sys.argv[2])
data, cut = sys.argv[4].encode(), int(sys.argv[5])
s.sendall(data[:cut])
time.sleep(0.3)
s.sendall(data[cut:])
out = b""
try:
    while chunk := s.recv(65536):
        out += chunk
except OSError:
    pass
print(out[:200])
"""


def test_transparent_intercepted_http_whose_first_write_is_short_is_still_checked(lab, sandbox):  # was a defect
    path = marked_path()
    request = f"GET {path} HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"
    out = sandbox.exec("/usr/bin/python3", "-I", "-c", _TLS_IN_TWO, ATTACKER, "api.example.test", sandbox.ca_bundle, request, "1")
    assert not reached(lab, path), (out.stdout, out.stderr)
    assert "host_mismatch" in out.stdout, (out.stdout, out.stderr)
