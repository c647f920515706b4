"""End-to-end attack corpus: cloud-metadata and in-cluster targets, URL-parser
confusions, and encrypted-DNS / QUIC side doors, through every entry point of the real proxy.

Rows are only those the earlier tables (test_attack_ssrf_and_smuggling.py and the other test_attack_*.py)
do not hold. Sources:
- PayloadsAllTheThings, "Server Side Request Forgery" / "SSRF Cloud Instances" (AWS IMDS and
  ECS, GCP, Azure, Alibaba, Oracle, Tencent, DigitalOcean, Hetzner, OpenStack, Kubernetes,
  Docker) and its "Bypass" lists (decimal, octal, hex, short and mixed inet_aton forms,
  IPv6 carrying IPv4, enclosed alphanumerics, fullwidth dots);
- HackTricks "Cloud SSRF" and the "SSRF bible" (cheat sheet by Wallarm), same targets;
- Orange Tsai, "A New Era of SSRF - Exploiting URL Parser in Trending Programming Languages!"
  (Black Hat USA 2017): authority confusions.

Every entry point is used: absolute-form plain HTTP, CONNECT, the Host header of plain HTTP
inside a tunnel, the `--spec-dir` gateway, `--upstream-proxy` (a parent that must never be
asked), transparent mode (the Host header and TLS server_name of a redirected connection),
and the DNS listener (its answer must never carry such an address). The allowlist is `*`
with `allowCidrs: [198.18.0.0/15]`, so only the address guard stands in the way; the lab's
loopback canary tells whether anything was dialled there.
Rows that found a defect are marked `# was a defect`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import signal
import socket
import struct
import subprocess
import time
import uuid

import pytest

from e2e.support.clients import status_and_reason
from e2e.support.lab import CANARY_PORT, EGRESS_PROXY, HOSTS, UPSTREAM_V4, Canary, Lab, raw_request
from e2e.support.raw_upstream import RawUpstream
from e2e.test_attack_ssrf_and_smuggling import (  # noqa: F401  (strict is a fixture)
    _h2_request,
    _h2_streams,
    strict,
)

TOKEN = "rt4-tok-" + secrets.token_hex(8)
STAR_SPEC = """
network:
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: "*"
"""

# -- targets ----------------------------------------------------------------------------------
# (authority as the attacker writes it, reason the proxy must give)

CLOUD_TARGETS = [
    # AWS: IMDS in inet_aton short and mixed forms (a.b.c: last part 16 bits, a.b: 24 bits)
    ("169.254.43518", "forbidden_address"), ("169.16689662", "forbidden_address"),
    ("0xa9.0xfe.0xa9.0xfe", "forbidden_address"), ("0XA9FEA9FE", "forbidden_address"),
    ("0xa9.254.0251.0376", "forbidden_address"), ("025177524776", "forbidden_address"),
    ("00000251.00000376.00000251.00000376", "forbidden_address"), ("169.254.169.254.", "forbidden_address"),
    ("0xa9fea9fe.", "forbidden_address"), ("0x00000000a9fea9fe", "forbidden_address"),
    # AWS IMDS in IPv6 forms: translated, compatible, NAT64 (dotted and hex), 6to4, Teredo, local-use NAT64
    ("[0:0:0:0:0:ffff:169.254.169.254]", "forbidden_address"), ("[::ffff:0:a9fe:a9fe]", "forbidden_address"),
    ("[::169.254.169.254]", "forbidden_address"), ("[64:ff9b::169.254.169.254]", "forbidden_address"),
    ("[64:ff9b::a9fe:a9fe]", "forbidden_address"), ("[2002:a9fe:a9fe::]", "forbidden_address"),
    ("[2002:a9fe:a9fe:1234::1]", "forbidden_address"), ("[2001:0:4136:e378:8000:63bf:5601:5601]", "forbidden_address"),
    ("[64:ff9b:1::a9fe:a9fe]", "forbidden_address"), ("[fe80::a9fe:a9fe]", "forbidden_address"),
    ("[::ffff:169.254.169.254%25eth0]", "forbidden_address"),
    # AWS IMDS over IPv6 (fd00:ec2::254) and its DNS (fd00:ec2::23), other spellings
    ("[FD00:EC2::254]", "forbidden_address"), ("[fd00:ec2:0:0:0:0:0:254]", "forbidden_address"),
    ("[fd00:0ec2::0254]", "forbidden_address"), ("[fd00:ec2::23]", "forbidden_address"),
    # AWS ECS task metadata (v2/v3/v4) 169.254.170.2
    ("169.254.170.2", "forbidden_address"), ("2852039170", "forbidden_address"), ("[::ffff:a9fe:aa02]", "forbidden_address"),
    # Azure WireServer 168.63.129.16 (HackTricks: the host endpoint beside IMDS)
    ("168.63.129.16", "forbidden_address"), ("2822734096", "forbidden_address"), ("[::ffff:168.63.129.16]", "forbidden_address"),
    # Alibaba 100.100.100.200
    ("1684301000", "forbidden_address"), ("0x64.0x64.0x64.0xc8", "forbidden_address"), ("100.100.25800", "forbidden_address"),
    ("[64:ff9b::6464:64c8]", "forbidden_address"),
    # Oracle Cloud 192.0.0.192, Tencent 169.254.0.23
    ("3221225664", "forbidden_address"), ("0300.0.0.0300", "forbidden_address"), ("2851995671", "forbidden_address"),
    # Kubernetes API service 10.96.0.1, a node's kubelet (10.0.0.5:10250 below), Docker bridge 172.17.0.1
    ("10.96.0.1", "forbidden_address"), ("10.96.1", "forbidden_address"), ("174063617", "forbidden_address"),
    ("0xa600001", "forbidden_address"), ("[::ffff:10.96.0.1]", "forbidden_address"),
    ("172.17.0.1", "forbidden_address"), ("172.17.1", "forbidden_address"), ("2886795265", "forbidden_address"),
    ("0xac.0x11.0.1", "forbidden_address"), ("[2002:ac11:1::]", "forbidden_address"),
    # names the corpora use, mapped in the lab's hosts file as a cloud's resolver maps them
    ("metadata.google.internal", "forbidden_address"), ("METADATA.GOOGLE.INTERNAL.", "forbidden_address"),
    ("metadata.tencentyun.com", "forbidden_address"), ("kubernetes.default.svc", "forbidden_address"),
    ("kubernetes.default.svc.cluster.local", "forbidden_address"), ("host.docker.internal", "forbidden_address"),
    ("instance-data", "forbidden_address"), ("metadata", "forbidden_address"), ("rancher-metadata", "forbidden_address"),
    # HackTricks "URL format bypass": mixed octal/decimal, zero-padded, other loopback addresses
    ("0251.254.169.254", "forbidden_address"), ("169.254.169.0376", "forbidden_address"),
    ("127.000000000000000.1", "loopback"), ("127.127.127.127", "loopback"), ("127.0.0.0", "loopback"),
    ("0x7f.0x00.0x00.0x01", "loopback"), ("[0:0:0:0:0:ffff:7f00:0001]", "loopback"),
]  # fmt: skip
# The corpora's "cloud" names, each mapped to its real address in the lab's resolver (hosts file).
CLOUD_HOST_LINES = [
    "169.254.169.254 metadata.google.internal",
    "169.254.0.23 metadata.tencentyun.com",
    "10.96.0.1 kubernetes.default.svc kubernetes.default.svc.cluster.local",
    "172.17.0.1 host.docker.internal",
    "169.254.169.254 instance-data metadata",
    "169.254.169.250 rancher-metadata",
]
# ports the targets listen on (Docker's API, kubelet, Kubernetes API, the canary itself)
PORTS = {"172.17": 2375, "10.96": 443, "kubernetes": 6443, "host.docker": 2375}


def port_for(authority: str) -> int:
    return next((p for prefix, p in PORTS.items() if authority.startswith(prefix)), CANARY_PORT)


@pytest.fixture(scope="module", autouse=True)
def cloud_names(lab: Lab):
    """The corpora's metadata names resolve, in the proxy's namespace, to the addresses clouds give them."""
    path = f"/etc/netns/{lab.proxy_ns}/hosts"
    with open(path) as f:
        original = f.read()
    with open(path, "a") as f:
        f.write("\n".join(CLOUD_HOST_LINES) + "\n")
    yield
    with open(path, "w") as f:
        f.write(original)


@pytest.fixture(scope="module")
def star(lab: Lab, cloud_names):
    dns_port = lab.free_port()
    proxy = lab.start_proxy(STAR_SPEC, "--dns-listen", f"127.0.0.1:{dns_port}")
    proxy.dns_port = dns_port
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def gateway(lab: Lab, cloud_names):
    directory = lab.dir / f"rt4-envs-{lab.free_port()}"
    directory.mkdir()
    (directory / "env-a.yaml").write_text(
        f'network:\n  proxyToken: "{TOKEN}"\n  allowCidrs: ["198.18.0.0/15"]\n  allowlist:\n    - domain: "*"\n'
    )
    proxy = lab.start_proxy(None, spec_dir=directory)
    yield proxy
    proxy.stop()
    assert TOKEN not in proxy.stdout() + proxy.stderr()


@pytest.fixture(scope="module")
def chained(lab: Lab, cloud_names):
    """A parent proxy that records every byte it is sent and answers every CONNECT with 502."""
    refuse = lambda head: b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"  # noqa: E731
    with RawUpstream(lab, UPSTREAM_V4, lab.free_port(), tls=False, respond=refuse) as parent:
        proxy = lab.start_proxy(STAR_SPEC, "--upstream-proxy", f"http://{UPSTREAM_V4}:{parent.port}")
        proxy.parent = parent
        yield proxy
        proxy.stop()


def explicit_requests(authority: str, extra: str = "") -> list[bytes]:
    target = f"{authority}:{port_for(authority)}"
    return [
        f"GET http://{target}/latest/meta-data/ HTTP/1.1\r\nHost: {target}\r\n{extra}Connection: close\r\n\r\n".encode(),
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n".encode(),
    ]


# -- explicit proxy, gateway, parent proxy ------------------------------------------------------


@pytest.mark.parametrize("authority, reason", CLOUD_TARGETS, ids=[a for a, _ in CLOUD_TARGETS])
def test_cloud_targets_are_refused_explicit_gateway_and_before_the_parent(lab, star, gateway, chained, authority, reason):
    before = len(lab.canary.hits)
    asked = len(chained.parent.connections)
    credential = "Proxy-Authorization: Basic " + base64.b64encode(f"env-a:{TOKEN}".encode()).decode() + "\r\n"
    for proxy, extra in ((star, ""), (gateway, credential), (chained, "")):
        for request in explicit_requests(authority, extra):
            assert status_and_reason(raw_request(lab, proxy.port, request)) == (403, reason), (proxy.port, request)
    assert len(lab.canary.hits) == before
    assert chained.parent.connections[asked:] == []  # nothing reached the parent, not even a connection


def test_parent_positive_control_an_allowed_name_is_asked_for_by_its_checked_address(lab, chained):
    asked = len(chained.parent.connections)
    answer = raw_request(lab, chained.port, b"CONNECT plain.test:443 HTTP/1.1\r\nHost: plain.test:443\r\n\r\n")
    assert status_and_reason(answer)[0] == 502
    assert [bytes(a).split(b"\r\n")[0] for a in chained.parent.connections[asked:]] == [f"CONNECT {HOSTS['plain.test']}:443 HTTP/1.1".encode()]


KUBELET = ["10.0.0.5:10250", "10.0.0.5:10255", "172.17.0.1:2376", "192.168.49.2:8443", "[fd00::5]:10250"]


@pytest.mark.parametrize("target", KUBELET)
def test_node_and_daemon_ports_are_refused(lab, star, target):
    """kubelet (10250 / read-only 10255), Docker TLS (2376), minikube's API server: private addresses."""
    for request in (f"GET https://{target}/pods HTTP/1.1\r\nHost: {target}\r\n\r\n", f"CONNECT {target} HTTP/1.1\r\n\r\n"):
        assert status_and_reason(raw_request(lab, star.port, request.encode())) == (403, "forbidden_address")


# -- Host header inside a plain-HTTP tunnel ------------------------------------------------------


@pytest.mark.parametrize("authority", ["169.254.169.254", "metadata.google.internal", "[fd00:ec2::254]", "0xa9fea9fe"])
def test_host_inside_a_tunnel_naming_metadata_is_refused(lab, star, authority):
    before = len(lab.canary.hits)
    inner = f"GET /computeMetadata/v1/ HTTP/1.1\r\nHost: {authority}\r\nMetadata-Flavor: Google\r\nConnection: close\r\n\r\n"
    answer = raw_request(lab, star.port, f"CONNECT plain.test:80 HTTP/1.1\r\nHost: plain.test:80\r\n\r\n{inner}".encode())
    tunnel, _, inside = answer.partition(b"\r\n\r\n")
    assert tunnel.startswith(b"HTTP/1.1 200")
    assert status_and_reason(inside) == (403, "host_mismatch")
    assert len(lab.canary.hits) == before


@pytest.mark.parametrize("authority", ["169.254.169.254", "metadata.google.internal", "[fd00:ec2::254]", "100.100.100.200:80"])
def test_h2_authority_naming_metadata_in_the_credentials_tunnel_is_refused(lab, strict, authority):  # noqa: F811
    path = "/rt4-" + uuid.uuid4().hex[:12]
    headers = _h2_request(authority, ("metadata-flavor", "Google"), ("metadata", "true"), path=path)
    assert _h2_streams(lab, strict, [headers]) == {1: (403, "host_mismatch")}
    assert [r for r in lab.upstream_requests() if r["path"].startswith(path)] == []


# -- unreadable spellings: enclosed alphanumerics, fullwidth and ideographic dots, encodings ----------

UNREADABLE = [
    "\u2460\u2465\u2468.\u2461\u2464\u2463.\u2460\u2465\u2468.\u2461\u2464\u2463",  # ①⑥⑨.②⑤④.①⑥⑨.②⑤④
    "\u2460\u2461\u2466\uff0e\u24ea\uff0e\u24ea\uff0e\u2460",  # ①②⑦．⓪．⓪．①
    "169\u3002254\u3002169\u3002254", "169\uff61254\uff61169\uff61254",  # ideographic / halfwidth full stops
    "\uff11\uff16\uff19.\uff12\uff15\uff14.\uff11\uff16\uff19.\uff12\uff15\uff14",  # fullwidth digits
    "%31%36%39.254.169.254", "169.254.169.254%2e", "%5B::1%5D", "169.254.169.254%00.plain.test",
    "metadata.google.internal%2e", "m\u0435tadata.google.internal",  # Cyrillic e
    "425.510.425.510", "169.254.169.254.1", "0x1a9fea9fe", "4581474350",  # overflowing forms (mod 2**32 / 256)
    "[::ffff:169.254.169.254]:80:80", "[fd00:ec2::254%eth0]", "[fd00:ec2::254]:", "169.254.169.254:+80",
    "\u24df\u24db\u24d0\u24d8\u24dd.\u24e3\u24d4\u24e2\u24e3",  # ⓟⓛⓐⓘⓝ.ⓣⓔⓢⓣ: in transparent mode, was a defect (below)
]  # fmt: skip


@pytest.mark.parametrize("authority", UNREADABLE)
def test_unreadable_spellings_are_refused_everywhere(lab, star, gateway, authority):
    before = len(lab.canary.hits)
    credential = "Proxy-Authorization: Basic " + base64.b64encode(f"env-a:{TOKEN}".encode()).decode() + "\r\n"
    for proxy, extra in ((star, ""), (gateway, credential)):
        for target in (authority, f"{authority}:{CANARY_PORT}"):
            for request in (
                f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{extra}Connection: close\r\n\r\n",
                f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n",
            ):
                answer = raw_request(lab, proxy.port, request.encode("utf-8"))
                status, _ = status_and_reason(answer)
                assert status in (400, 403), (request, answer[:200])
    assert len(lab.canary.hits) == before


# -- a Host / :authority that IDNA maps onto the checked name, forwarded raw ---------------------------
# HackTricks / PayloadsAllTheThings "unicode normalization" and the IDNA2003-vs-IDNA2008 deviation
# characters (UTS #46: ß, ς, ZWJ, ZWNJ): the proxy's IDNA mapping (NFKC) made these equal to an
# allowed name, and the raw bytes went upstream, where a host router reads another name.  # was a defect

NON_ASCII_HOSTS = [
    "pa\u00dfthrough.test", "passthrough.test\u200d", "plain.test\u200b", "pl\u00adain.test",
    "\u24df\u24db\u24d0\u24d8\u24dd.\u24e3\u24d4\u24e2\u24e3", "\uff50\uff4c\uff41\uff49\uff4e.test", "plain\u3002test",
]  # fmt: skip
NOT_ASCII_DETAIL = "not ASCII; an internationalised name is sent as its xn-- form (RFC 9110 section 7.2, RFC 5890)"


def _target_of(host: str) -> str:
    return "passthrough.test" if "p" in host[:2] and "th" in host else "plain.test"


@pytest.mark.parametrize("host", NON_ASCII_HOSTS)
def test_a_host_header_that_is_not_ascii_is_400_never_forwarded(lab, star, host):  # was a defect
    seen = len(lab.upstream_requests())
    for request in (
        f"GET http://{_target_of(host)}/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n",
        f"CONNECT {_target_of(host)}:80 HTTP/1.1\r\nHost: {_target_of(host)}:80\r\n\r\nGET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n",
    ):
        answer = raw_request(lab, star.port, request.encode())
        if request.startswith("CONNECT"):
            tunnel, _, answer = answer.partition(b"\r\n\r\n")
            assert tunnel.startswith(b"HTTP/1.1 200")
        assert status_and_reason(answer) == (400, ""), answer[:300]
        assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"error": "bad_request", "detail": f"header 'Host': {NOT_ASCII_DETAIL}"}
    assert lab.upstream_requests()[seen:] == []


@pytest.mark.parametrize("url", ["http://\u24df\u24db\u24d0\u24d8\u24dd.\u24e3\u24d4\u24e2\u24e3/", "http://PLAIN.test./"])
def test_real_curl_sends_an_idn_as_ascii_and_is_served(lab, star, url):
    """Positive control for the 400 above: curl (libidn2, UTS #46) writes the name it maps, in ASCII."""
    marker = "/rt4-" + uuid.uuid4().hex[:12]
    out = lab.exec("curl", "-q", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", "-x", star.url, url + marker[1:])
    assert out.stdout == "200", out.stderr
    (hit,) = [r for r in lab.upstream_requests() if r["path"].startswith(marker)]
    assert hit["local"] == HOSTS["plain.test"] and dict(hit["headers"])["Host"].isascii()


@pytest.mark.parametrize(
    "target", ["plain.test:\u0668\u0660", "plain.test:\uff18\uff10", "127.0.0.1:\u0967\u0967", "pa\u00dfthrough.test:443"]
)
def test_a_connect_target_that_is_not_ascii_is_400(lab, star, target):  # was a defect (the ports)
    """mitmproxy reads a CONNECT port with a Unicode `\\d`: `plain.test:٨٠` (Arabic-Indic 80) opened a tunnel."""
    before = len(lab.canary.hits)
    answer = raw_request(lab, star.port, f"CONNECT {target} HTTP/1.1\r\nHost: plain.test\r\n\r\n".encode())
    assert status_and_reason(answer) == (400, "")
    assert len(lab.canary.hits) == before


@pytest.mark.parametrize("host", ["api.example.test\u200b", "\uff41pi.example.test", "api.example.tes\u0165"])
def test_h2_authority_that_is_not_ascii_is_refused(lab, strict, host):  # noqa: F811
    """Inside the intercepted tunnel to the credential's host: refused (the h2 stack already resets
    these streams; the Host check above covers it too), and no credential goes anywhere."""
    path = "/rt4-" + uuid.uuid4().hex[:12]
    for headers in (_h2_request(host, path=path), _h2_request("api.example.test", ("host", host), path=path)):
        result = _h2_streams(lab, strict, [headers])
        assert result[1] in ((400, ""), "reset", "terminated"), result
    assert [r for r in lab.upstream_requests() if r["path"].startswith(path)] == []


# -- Orange Tsai's URL-parser confusions, sent raw -----------------------------------------------
# plain.test plays the "checked" host and 127.0.0.1:7777 (the canary) / other.test the "other" one.

ORANGE = [
    "GET http://plain.test &@127.0.0.1:7777# @other.test/ HTTP/1.1",
    "GET http://127.0.0.1:7777 &@plain.test# @other.test/ HTTP/1.1",
    "GET http://127.0.0.1:7777:80/ HTTP/1.1",
    "GET http://plain.test:80:7777/ HTTP/1.1",
    "GET http://127.0.0.1:11211:80/ HTTP/1.1",
    "GET http://plain.test\\@127.0.0.1:7777/ HTTP/1.1",
    "GET http://plain.test:80\\@127.0.0.1:7777/ HTTP/1.1",
    "GET http://127.0.0.1:7777\\@plain.test/ HTTP/1.1",
    "GET http://foo@127.0.0.1:7777@plain.test/ HTTP/1.1",
    "GET http://foo@plain.test@127.0.0.1:7777/ HTTP/1.1",
    "GET http://foo@evil@plain.test/ HTTP/1.1",
    "GET http://plain.test%0d%0aHost:%20127.0.0.1:7777/ HTTP/1.1",
    "GET http://127.0.0.1:7777%23@plain.test/ HTTP/1.1",
    "GET http://127.0.0.1:7777%2523@plain.test/ HTTP/1.1",
    "GET http://plain.test%2f@127.0.0.1:7777/ HTTP/1.1",
    "GET http://127.0.0.1%09.plain.test:7777/ HTTP/1.1",
    "GET http://127.0.0.1\uff1a7777/ HTTP/1.1",
    "GET http://plain.test\uff03@127.0.0.1:7777/ HTTP/1.1",
    "GET http://plain.test\uff20127.0.0.1:7777/ HTTP/1.1",
    "GET http://[::1]:7777%23@plain.test/ HTTP/1.1",
    "GET http://0:7777/ HTTP/1.1",
    "GET http:\\\\127.0.0.1:7777/ HTTP/1.1",
    "GET http:///127.0.0.1:7777/ HTTP/1.1",
    "GET http://plain.test/ HTTP/1.1\r\nHost: 127.0.0.1:7777",
    "CONNECT plain.test:80 &@127.0.0.1:7777 HTTP/1.1",
    "CONNECT 127.0.0.1:7777#@plain.test:80 HTTP/1.1",
    "CONNECT plain.test:80\\@127.0.0.1:7777 HTTP/1.1",
]  # fmt: skip


@pytest.mark.parametrize("line", ORANGE)
def test_orange_tsai_parser_confusions_are_refused(lab, star, line):
    before, seen = len(lab.canary.hits), len(lab.upstream_requests())
    head = line if "\r\nHost:" in line else f"{line}\r\nHost: plain.test"
    answer = raw_request(lab, star.port, f"{head}\r\nConnection: close\r\n\r\n".encode())
    assert status_and_reason(answer)[0] in (400, 403), answer[:300]
    assert len(lab.canary.hits) == before
    assert lab.upstream_requests()[seen:] == []


@pytest.mark.parametrize(
    "target",
    ["http://plain.test?@127.0.0.1:7777/", "http://plain.test#@127.0.0.1:7777/", "http://plain.test/?@127.0.0.1:7777/",
     "http://plain.test/@127.0.0.1:7777/", "//127.0.0.1:7777/"],
)  # fmt: skip
def test_delimiters_before_at_leave_the_authority_alone(lab, star, target):
    """`?`/`#`/`/` end the authority (RFC 3986): the request goes to plain.test, only there."""
    marker = uuid.uuid4().hex[:10]
    before, seen = len(lab.canary.hits), len(lab.upstream_requests())
    answer = raw_request(lab, star.port, f"GET {target} HTTP/1.1\r\nHost: plain.test\r\nX-M: {marker}\r\nConnection: close\r\n\r\n".encode())
    status, _ = status_and_reason(answer)
    hits = lab.upstream_requests()[seen:]
    assert len(lab.canary.hits) == before
    assert status in (200, 400), answer[:300]
    assert {h["local"] for h in hits} <= {HOSTS["plain.test"]}
    assert len(hits) == (status == 200)


# -- DNS listener: the answer never carries such an address ------------------------------------------

DNS_NAMES = [
    "169.254.169.254", "169.254.170.2", "168.63.129.16", "100.100.100.200", "192.0.0.192", "169.254.0.23",
    "10.96.0.1", "172.17.0.1", "0xa9fea9fe", "2852039166", "169.254.43518", "0251.0376.0251.0376", "127.1",
    "0", "198.18.0.1", "metadata.google.internal", "metadata.tencentyun.com", "kubernetes.default.svc",
    "host.docker.internal", "instance-data", "metadata.test", "sneaky.test",
]  # fmt: skip


def _dig(lab: Lab, proxy, name: str, qtype: str) -> tuple[str, list[str]]:
    out = lab.exec("dig", "+tries=1", "+time=3", "-p", str(proxy.dns_port), "@127.0.0.1", name, qtype)
    match = re.search(r"status: (\w+)", out.stdout)
    answers = [line.split()[-1] for line in out.stdout.split(";; ANSWER SECTION:")[-1].splitlines()[1:] if line.strip() and not line.startswith(";")] if ";; ANSWER SECTION:" in out.stdout else []  # fmt: skip
    return (match.group(1) if match else "no answer"), answers


@pytest.mark.parametrize("name", DNS_NAMES)
def test_dns_answer_never_carries_a_metadata_or_internal_address(lab, star, name):
    for qtype in ("A", "AAAA"):
        status, answers = _dig(lab, star, name, qtype)
        # SERVFAIL: the lab's resolver has no server to ask for the AAAA of a hosts-file name
        assert status in ("NOERROR", "NXDOMAIN", "SERVFAIL"), (name, qtype, status)
        assert answers == [], (name, qtype, answers)


def test_dns_positive_control(lab, star):
    assert _dig(lab, star, "plain.test", "A") == ("NOERROR", [HOSTS["plain.test"]])


# -- transparent mode: Host header and server_name of a redirected connection --------------------------

TRANSPARENT_BATCH = r"""
import json, socket, sys
out = []
for address, port, data in json.loads(sys.argv[1]):
    try:
        s = socket.create_connection((address, port), timeout=5)
        s.sendall(bytes.fromhex(data))
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    except OSError as exc:
        got = b""
    out.append(got.decode("latin-1"))
print(json.dumps(out))
"""
ATTACKER = HOSTS["evilexample.test"]  # not allowlisted: where the sandbox's packets are addressed


@pytest.fixture(scope="module")
def sandbox(lab: Lab):
    from e2e.support.transparent_lab import Sandbox

    box = Sandbox(lab)
    try:
        box.start()
        with open(f"/etc/netns/{box.proxy_ns}/hosts", "a") as f:
            f.write("\n".join(CLOUD_HOST_LINES) + "\n")
        box.canary = Canary(box.proxy_ns)
        box.canary.start()
        proxy = box.start_proxy(STAR_SPEC.replace('domain: "*"', 'domain: "*"\n    - domain: plain.test'))
        applied = box.redirect_rules("--proxy-port", str(proxy.port), "--proxy-uid", "0", "--apply")
        assert applied.returncode == 0, applied.stderr
        yield box
    finally:
        if getattr(box, "canary", None) is not None:
            # shutdown wakes the accept() thread: a socket left open in the namespace keeps
            # it (and its veth) alive, and the next module's sandbox cannot be created.
            with contextlib.suppress(OSError):
                box.canary.sock.shutdown(socket.SHUT_RDWR)
            box.canary.sock.close()
        box.stop()


def transparent_send(box, rows: list[tuple[str, int, bytes]]) -> list[bytes]:
    out = box.exec("/usr/bin/python3", "-I", "-c", TRANSPARENT_BATCH, json.dumps([(a, p, d.hex()) for a, p, d in rows]), timeout=120)
    assert out.returncode == 0, out.stderr
    return [s.encode("latin-1") for s in json.loads(out.stdout)]


TRANSPARENT_HOSTS = [(a, r) for a, r in CLOUD_TARGETS if not a.startswith("[") or "%" not in a] + [
    ("169.254.169.254", "forbidden_address"), ("[fd00:ec2::254]", "forbidden_address"), ("100.100.100.200", "forbidden_address"),
    ("192.0.0.192", "forbidden_address"), ("169.254.0.23", "forbidden_address"), ("metadata.test", "forbidden_address"),
    ("127.0.0.1:7777", "loopback"), ("0x7f.1:7777", "loopback"), ("[::ffff:127.0.0.1]:7777", "loopback"),
    ("localhost:7777", "loopback"), ("2130706433:7777", "loopback"), ("0:7777", "loopback"),
]  # fmt: skip


def test_transparent_host_header_naming_metadata_is_refused(lab, sandbox):
    """The address connected to is never used; the Host header is the name, and the guard refuses it."""
    rows = [(ATTACKER, CANARY_PORT if h.endswith(f":{CANARY_PORT}") else 80,
             f"GET /latest/meta-data/ HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n".encode()) for h, _ in TRANSPARENT_HOSTS]  # fmt: skip
    answers = transparent_send(sandbox, rows)
    got = [(h, status_and_reason(a)) for (h, _), a in zip(TRANSPARENT_HOSTS, answers, strict=True)]
    assert got == [(h, (403, r)) for h, r in TRANSPARENT_HOSTS]
    assert sandbox.canary.hits == []


def test_transparent_unreadable_host_headers_are_refused(lab, sandbox):
    hosts = [*UNREADABLE, "plain.test@127.0.0.1:7777", "127.0.0.1:7777#@plain.test", "plain.test:80:7777"]
    rows = [(ATTACKER, 80, f"GET / HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n".encode()) for h in hosts]
    statuses = [status_and_reason(a)[0] for a in transparent_send(sandbox, rows)]
    assert [(h, s) for h, s in zip(hosts, statuses, strict=True) if s not in (400, 403)] == []
    assert sandbox.canary.hits == []


def test_transparent_host_header_that_is_not_ascii_is_400(lab, sandbox):  # was a defect
    """The Host header is the destination's name here: `ⓟⓛⓐⓘⓝ.ⓣⓔⓢⓣ` was read as plain.test, allowed,
    and forwarded raw."""
    seen = len(lab.upstream_requests())
    rows = [(ATTACKER, 80, f"GET / HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n".encode()) for h in NON_ASCII_HOSTS]
    answers = transparent_send(sandbox, rows)
    assert [status_and_reason(a) for a in answers] == [(400, "")] * len(NON_ASCII_HOSTS)
    assert lab.upstream_requests()[seen:] == []


def client_hello(server_name: str) -> bytes:
    """A minimal TLS 1.2 ClientHello carrying `server_name` as the corpora write it (raw bytes)."""
    name = server_name.encode("utf-8")
    sni = struct.pack("!HBH", len(name) + 3, 0, len(name)) + name
    extensions = struct.pack("!HH", 0, len(sni)) + sni
    body = b"\x03\x03" + b"\x11" * 32 + b"\x00" + b"\x00\x02\xc0\x2f" + b"\x01\x00" + struct.pack("!H", len(extensions)) + extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def test_transparent_tls_server_name_naming_metadata_is_closed(lab, sandbox):
    names = ["169.254.169.254", "metadata.google.internal", "kubernetes.default.svc", "0xa9fea9fe", "127.0.0.1",
             "host.docker.internal", "\u2460\u2461\u2466.\u24ea.\u24ea.\u2460"]  # fmt: skip
    seen = len(sandbox.proxy.audit())
    answers = transparent_send(sandbox, [(ATTACKER, 443, client_hello(n)) for n in names])
    assert answers == [b""] * len(names)
    entries = [(e["host"], e["decision"], e["reason"]) for e in sandbox.proxy.audit()[seen:] if e.get("event") == "tunnel"]
    assert entries == [
        ("169.254.169.254", "blocked", "forbidden_address"), ("metadata.google.internal", "blocked", "forbidden_address"),
        ("kubernetes.default.svc", "blocked", "forbidden_address"), ("169.254.169.254", "blocked", "forbidden_address"),
        ("127.0.0.1", "blocked", "loopback"), ("host.docker.internal", "blocked", "forbidden_address"),
        ("", "blocked", "no_sni"),  # raw UTF-8 is no host name
    ]  # fmt: skip
    assert sandbox.canary.hits == []


# -- QUIC / DNS-over-TLS / DNS-over-HTTPS from a transparent sandbox ---------------------------------

QUIC_INITIAL = bytes.fromhex("c300000001") + b"\x08" + secrets.token_bytes(8) + b"\x00" + b"\x00" + b"\x44\xc4" + secrets.token_bytes(1200)


def test_quic_initial_to_udp_443_never_leaves(lab, narrow):
    """HTTP/3 (QUIC v1 Initial, long header) to UDP 443: dropped by the filter, so clients fall back to TCP."""
    script = "import socket,sys;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2)\n" \
             "try:\n s.sendto(bytes.fromhex(sys.argv[1]),(sys.argv[2],443));print(s.recv(9))\nexcept OSError as e:print('dropped',type(e).__name__)"  # fmt: skip
    for address in (HOSTS["plain.test"], "198.18.0.53"):
        out = narrow.exec("/usr/bin/python3", "-I", "-c", script, QUIC_INITIAL.hex(), address)
        assert out.stdout.startswith("dropped"), out.stdout + out.stderr


NARROW_SPEC = """
network:
  allowCidrs: ["198.18.0.0/15"]
  allowlist:
    - domain: plain.test
"""


@pytest.fixture(scope="module")
def narrow(sandbox):
    """The same transparent sandbox, its spec hot-reloaded to allow plain.test only (the rows below
    are about which rule decides, so `*` would hide the answer)."""
    def reloads() -> float:
        text = sandbox.proxy.get_ops("/metrics")[1]
        match = re.search(r'^egress_config_reloads_total\{result="success"\} ([0-9.e+]+)$', text, re.M)
        return float(match.group(1)) if match else 0.0

    before = reloads()
    sandbox.proxy.spec_path.write_text(NARROW_SPEC)
    sandbox.proxy.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while reloads() == before:
        assert time.monotonic() < deadline, "the spec was not reloaded"
        time.sleep(0.1)
    return sandbox


def test_dns_over_tls_is_decided_by_its_server_name_like_any_tls(lab, narrow):
    """TCP 853 is redirected like any port: a resolver the allowlist does not name is closed at its
    ClientHello; an allowlisted name is passed through to that name's checked address on 853 (the
    allowlist names hosts, not ports), whatever address the sandbox connected to."""
    seen = len(narrow.proxy.audit())
    rows = [(ATTACKER, 853, client_hello("dns.resolver.test")), ("198.18.0.53", 853, client_hello("one.one.one.one")),
            ("198.18.0.53", 853, client_hello("plain.test"))]  # fmt: skip
    assert transparent_send(narrow, rows) == [b"", b"", b""]  # nothing listens on 853 upstream
    entries = [(e["host"], e["port"], e["decision"], e["reason"], e.get("error", "")) for e in narrow.proxy.audit()[seen:] if e.get("event") == "tunnel"]
    assert entries == [
        ("dns.resolver.test", 853, "blocked", "not_allowlisted", ""), ("one.one.one.one", 853, "blocked", "not_allowlisted", ""),
        ("plain.test", 853, "allowed", "", "upstream_refused"),
    ]  # fmt: skip


def test_dns_over_https_is_decided_by_its_host_like_any_request(lab, narrow):
    """DoH is HTTP(S): `/dns-query` to an allowlisted host is an allowed request (docs/dns.md: an
    allowlisted host that answers DNS is a resolver the allowlist opened); to any other, 403."""
    query = base64.urlsafe_b64encode(b"\x00\x00\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01").rstrip(b"=").decode()
    hosts = ("plain.test", "dns.google", "cloudflare-dns.com", "198.18.0.53")
    rows = [(ATTACKER, 80, f"GET /dns-query?dns={query} HTTP/1.1\r\nHost: {h}\r\nAccept: application/dns-message\r\nConnection: close\r\n\r\n".encode())
            for h in hosts]  # fmt: skip
    answers = [status_and_reason(a) for a in transparent_send(narrow, rows)]
    assert answers == [(200, ""), (403, "not_allowlisted"), (403, "not_allowlisted"), (403, "not_allowlisted")]


# -- the allowlist itself: a name IDNA2003 and IDNA2008 read as two domains ---------------------------


@pytest.mark.parametrize("domain", ["stra\u00dfe.de", "*.stra\u00dfe.de", "pa\u00dfthrough.test"])
def test_check_refuses_an_allowlist_name_the_two_idna_standards_read_differently(tmp_path, domain):  # was a defect
    """`straße.de` was accepted as `strasse.de` (IDNA2003), a domain nobody named; clients send `xn--strae-oqa.de`."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f'network:\n  allowlist:\n    - domain: "{domain}"\n', encoding="utf-8")
    out = subprocess.run([EGRESS_PROXY, "check", "--spec", str(spec)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1, out.stdout
    assert (out.stdout + out.stderr).strip() == (
        f"{spec}: network.allowlist[0].domain: invalid internationalised name (U+00DF is read differently by"
        " IDNA2003 and IDNA2008; write the name's xn-- form)"
    )
