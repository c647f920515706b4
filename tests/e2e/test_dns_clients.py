"""End-to-end: the proxy's DNS listener against every stub resolver and DNS client we can run.

Stub resolvers differ in the query shapes they send and in what they insist on in
an answer (ID, question echo, RD/RA/AD/CD, EDNS OPT echo and size, TC and TCP
fallback, TCP framing and pipelining, parallel A+AAAA on one socket, search lists).
Each row of `CLIENTS` is one real client in the sandbox of tests/e2e/support/dns_lab.py, as
`nobody`, behind `redirect-rules --dns-port`: an allowlisted name resolves to its
address, a name the allowlist does not match fails cleanly (NXDOMAIN, at once, with
few queries: no retry storm) and never reaches a resolver.

The clients come from apt (bind9-dnsutils, knot-dnsutils, ldnsutils, busybox,
musl-tools, python3-dnspython, wget, nodejs), installed by scripts/test.sh; a row
whose client is missing is skipped and says which package it needs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.support.dns_lab import DnsSandbox, redirected_sandbox
from e2e.support.lab import Lab
from e2e.support.transparent_lab import RESOLVER_V4, SYSTEM_PYTHON

SPEC = """
network:
  allowCidrs: ["198.18.0.0/15", "2001:2::/48"]
  allowlist:
    - domain: dnsonly.example.test
    - domain: dual.example.test
    - domain: many.example.test
    - domain: "*.fresh.example.test"
"""
# Under an allowlisted wildcard, every name has one A and one AAAA at the cluster
# resolver (dns_lab): a fresh name per client is in no cache, so its answer takes the
# resolver path (the `dns_request` hook; A+AAAA in parallel from one socket wait there
# one after the other), where the cached DUAL takes the fast path.
FRESH_SUFFIX, FRESH_V4, FRESH_V6 = ".fresh.example.test", "198.18.0.15", "2001:2::15"
BOTH = (FRESH_V4, FRESH_V6)
DUAL = "dual.example.test"  # dns_lab.RECORDS: one A, one AAAA
DUAL_V4, DUAL_V6 = "198.18.0.14", "2001:2::14"
# A blocked name is asked at most this many times by one client run (a search list
# doubles the names, A+AAAA doubles the types): more is a retry storm.
MAX_BLOCKED_QUERIES = 6
# Every client's own timeout is 2 s (resolv.conf `timeout:2 attempts:1`, or set below):
# an answer that is not understood shows up as a run that lasts at least that long.
QUICK_SECONDS = 1.9

MUSL_SOURCE = r"""
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    struct addrinfo hints, *res, *p;
    char text[INET6_ADDRSTRLEN];
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;  /* AF_UNSPEC: musl sends A and AAAA at once, one socket */
    int rc = getaddrinfo(argv[1], "443", &hints, &res);
    if (rc != 0) {
        printf("error %d %s\n", rc, gai_strerror(rc));
        return 2;
    }
    for (p = res; p; p = p->ai_next) {
        void *a = p->ai_family == AF_INET ? (void *)&((struct sockaddr_in *)p->ai_addr)->sin_addr
                                          : (void *)&((struct sockaddr_in6 *)p->ai_addr)->sin6_addr;
        printf("%s\n", inet_ntop(p->ai_family, a, text, sizeof text));
    }
    freeaddrinfo(res);
    return 0;
}
"""

NODE_SCRIPT = r"""
const dns = require('node:dns');
const [how, name] = process.argv.slice(2);
const resolver = new dns.promises.Resolver({timeout: 2000, tries: 1});
const calls = {
  resolve4: () => resolver.resolve4(name),
  resolve6: () => resolver.resolve6(name),
  resolveAny: () => resolver.resolveAny(name),
  lookup: () => dns.promises.lookup(name, {all: true}),
};
calls[how]().then(
  (r) => { console.log(JSON.stringify(r)); },
  (e) => { console.log('error ' + e.code); process.exitCode = 2; },
);
"""

DNSPYTHON_SCRIPT = r"""
import sys, dns.message, dns.query, dns.rcode, dns.resolver, socket
how, name = sys.argv[1:3]
server = sys.argv[3]
if how == "pipelined":
    # Several queries written back to back on one TCP connection, then the answers read.
    types = ["A", "AAAA", "TXT", "HTTPS", "A"]
    queries = [dns.message.make_query(name, t, id=0x100 + i) for i, t in enumerate(types)]
    with socket.create_connection((server, 53), timeout=2) as sock:
        sock.sendall(b"".join(len(w).to_bytes(2, "big") + w for w in (q.to_wire() for q in queries)))
        for q in queries:
            r, _ = dns.query.receive_tcp(sock, expiration=None)
            if not q.is_response(r):
                sys.exit(f"answer {r.id} does not match query {q.id}")
            addrs = [rd.to_text() for rr in r.answer for rd in rr]
            print(dns.rcode.to_text(r.rcode()), " ".join(addrs))
    sys.exit(0)
res = dns.resolver.Resolver()
res.timeout = res.lifetime = 2
rtype, tcp = {"A": ("A", False), "AAAA": ("AAAA", False), "tcp": ("A", True), "https": ("HTTPS", False)}[how]
try:
    print(" ".join(r.to_text() for r in res.resolve(name, rtype, tcp=tcp, search=False)))
except dns.resolver.NXDOMAIN:
    print("NXDOMAIN"); sys.exit(2)
except dns.resolver.NoAnswer:
    print("NODATA"); sys.exit(0)
"""


@dataclass(frozen=True)
class Client:
    id: str
    argv: Callable[[str, Path], list[str]]  # (name, directory of helper files) -> command
    tool: str  # the executable that must exist, and its package
    package: str
    resolved: Callable[[subprocess.CompletedProcess], bool]
    failed: Callable[[subprocess.CompletedProcess], bool]
    name: str = DUAL  # the allowlisted name asked
    blocked_suffix: str = ".attacker.test"  # the blocked name: a fresh label + this
    fresh: tuple[str, ...] = (FRESH_V4,)  # what a fresh name under the wildcard resolves to


def has(*parts: str) -> Callable[[subprocess.CompletedProcess], bool]:
    return lambda out: all(p in out.stdout for p in parts)


def code(rc: int, *parts: str) -> Callable[[subprocess.CompletedProcess], bool]:
    return lambda out: out.returncode == rc and all(p in out.stdout + out.stderr for p in parts)


def resopts(options: str, *cmd: str, search: str = "") -> Callable[[str, Path], list[str]]:
    """glibc with resolv.conf options given the documented way for one process (RES_OPTIONS, LOCALDOMAIN)."""
    env = [f"RES_OPTIONS={options}"] + ([f"LOCALDOMAIN={search}"] if search else [])
    return lambda name, _: ["env", *env, *cmd, name]


def dig_ok(*extra: str) -> Callable[[subprocess.CompletedProcess], bool]:
    def check(out: subprocess.CompletedProcess) -> bool:
        return ("status: NOERROR" in out.stdout and DUAL_V4 in out.stdout and "arning" not in out.stdout + out.stderr
                and all(e in out.stdout for e in extra))  # fmt: skip

    return check


def dig_nx(out: subprocess.CompletedProcess) -> bool:
    return "status: NXDOMAIN" in out.stdout and "arning" not in out.stdout + out.stderr


def digcmd(*opts: str) -> Callable[[str, Path], list[str]]:
    return lambda name, _: ["dig", "+tries=1", "+time=2", *opts, name, "A"]


def kdigcmd(*opts: str) -> Callable[[str, Path], list[str]]:
    return lambda name, _: ["kdig", "+timeout=2", "+retry=0", *opts, name, "A"]


def kdig_ok(*extra: str) -> Callable[[subprocess.CompletedProcess], bool]:
    def check(out: subprocess.CompletedProcess) -> bool:
        return ("status: NOERROR" in out.stdout and DUAL_V4 in out.stdout and "WARNING" not in out.stdout + out.stderr
                and all(re.search(e, out.stdout) for e in extra))  # fmt: skip

    return check


def kdig_nx(out: subprocess.CompletedProcess) -> bool:
    return "status: NXDOMAIN" in out.stdout and "WARNING" not in out.stdout + out.stderr


MANY = "many.example.test"  # dns_lab.RECORDS: 40 A records, more than 512 bytes


def forty(out: subprocess.CompletedProcess) -> bool:
    """All 40 addresses of MANY: a truncated UDP answer was retried over TCP (or fit in EDNS)."""
    found = set(re.findall(r"\b198\.18\.2\.(\d+)\b", out.stdout))
    return found == {str(i) for i in range(1, 41)}


def some_of_forty(out: subprocess.CompletedProcess) -> bool:
    """A client that never retries over TCP: it uses the records of the truncated answer,
    as a real resolver (CoreDNS, dnsmasq) sends them; an empty one would be no address."""
    found = set(re.findall(r"\b198\.18\.2\.(\d+)\b", out.stdout))
    return 20 <= len(found) < 40 and found <= {str(i) for i in range(1, 41)}


GETENT_OK = has(DUAL_V4, DUAL_V6)
GETENT_NX = code(2)
PY_GAI = "import socket, sys; print(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 443, %s)}))"

CLIENTS = [
    # glibc getaddrinfo (AF_UNSPEC: A and AAAA in parallel on one socket), resolv.conf options
    Client("glibc-getent", lambda n, _: ["getent", "ahosts", n], "getent", "libc-bin", GETENT_OK, GETENT_NX, fresh=BOTH),
    *(
        Client(f"glibc-{opts.replace(' ', '+')}", resopts(opts, "getent", "ahosts"), "getent", "libc-bin",
               GETENT_OK, GETENT_NX, fresh=BOTH)
        for opts in ("edns0", "edns0 trust-ad", "use-vc", "single-request", "single-request-reopen", "rotate",
                     "edns0 trust-ad use-vc")
    ),
    # ndots:5 and a search list: the short name is completed, the blocked one is tried
    # with the suffix first, then as given; neither reaches a resolver.
    Client("glibc-ndots5-search", resopts("ndots:5", "getent", "ahosts", search="example.test"), "getent",
           "libc-bin", GETENT_OK, GETENT_NX, name="dual", fresh=()),
    Client("python-getaddrinfo", lambda n, _: [SYSTEM_PYTHON, "-c", PY_GAI % "0", n], "python3", "python3",
           has(DUAL_V4, DUAL_V6), code(1, "Name or service not known"), fresh=BOTH),
    Client("python-getaddrinfo-inet6", lambda n, _: [SYSTEM_PYTHON, "-c", PY_GAI % "socket.AF_INET6", n], "python3",
           "python3", has(DUAL_V6), code(1, "Name or service not known"), fresh=(FRESH_V6,)),
    Client("host", lambda n, _: ["host", "-W", "2", n], "host", "bind9-host",
           has(f"has address {DUAL_V4}", f"has IPv6 address {DUAL_V6}"), code(1, "NXDOMAIN"), fresh=BOTH),
    Client("nslookup", lambda n, _: ["nslookup", "-timeout=2", "-retry=1", n], "nslookup", "bind9-dnsutils",
           has(f"Address: {DUAL_V4}", f"Address: {DUAL_V6}"), code(1, "NXDOMAIN"), fresh=BOTH),
    Client("dig", digcmd(), "dig", "bind9-dnsutils", dig_ok(), dig_nx),
    Client("dig+tcp", digcmd("+tcp"), "dig", "bind9-dnsutils", dig_ok(), dig_nx),
    # One TCP connection kept open for several queries (A, then AAAA).
    Client("dig+tcp+keepopen", lambda n, _: [*digcmd("+tcp", "+keepopen")(n, _), n, "AAAA"], "dig", "bind9-dnsutils",
           dig_ok(DUAL_V6), dig_nx, fresh=BOTH),
    Client("dig+cookie", digcmd("+cookie"), "dig", "bind9-dnsutils", dig_ok(), dig_nx),
    Client("dig+dnssec", digcmd("+dnssec"), "dig", "bind9-dnsutils", dig_ok("flags: do;"), dig_nx),
    Client("dig+cdflag", digcmd("+cdflag"), "dig", "bind9-dnsutils", dig_ok(" cd;"), dig_nx),
    Client("dig+adflag", digcmd("+adflag"), "dig", "bind9-dnsutils", dig_ok(), dig_nx),
    Client("dig+bufsize=512", digcmd("+bufsize=512"), "dig", "bind9-dnsutils", dig_ok(), dig_nx),
    Client("dig+nsid", digcmd("+nsid"), "dig", "bind9-dnsutils", dig_ok(), dig_nx),
    Client("dig+noedns", digcmd("+noedns"), "dig", "bind9-dnsutils", dig_ok(), dig_nx),
    Client("dig-0x20-case", lambda n, _: ["dig", "+tries=1", "+time=2", n.upper(), "A"], "dig", "bind9-dnsutils",
           dig_ok(DUAL.upper()), dig_nx, fresh=()),
    Client("kdig", kdigcmd(), "kdig", "knot-dnsutils", kdig_ok(), kdig_nx),
    Client("kdig+tcp", kdigcmd("+tcp"), "kdig", "knot-dnsutils", kdig_ok(), kdig_nx),
    Client("kdig+dnssec", kdigcmd("+dnssec"), "kdig", "knot-dnsutils", kdig_ok(r"Version: 0; flags: do;"), kdig_nx),
    Client("kdig+tcp+keepopen", lambda n, _: [*kdigcmd("+tcp", "+keepopen")(n, _), n, "AAAA"], "kdig",
           "knot-dnsutils", kdig_ok(DUAL_V6), kdig_nx, fresh=BOTH),
    Client("kdig+cookie", kdigcmd("+cookie"), "kdig", "knot-dnsutils", kdig_ok(), kdig_nx),
    Client("kdig+nsid", kdigcmd("+nsid"), "kdig", "knot-dnsutils", kdig_ok(), kdig_nx),
    Client("kdig+cdflag", kdigcmd("+cdflag"), "kdig", "knot-dnsutils", kdig_ok(r"Flags: qr rd ra cd;"), kdig_nx),
    Client("kdig+bufsize=512", kdigcmd("+bufsize=512"), "kdig", "knot-dnsutils", kdig_ok(), kdig_nx),
    Client("drill", lambda n, _: ["drill", n, "A"], "drill", "ldnsutils", has(DUAL_V4, "rcode: NOERROR"),
           has("rcode: NXDOMAIN")),
    Client("drill-tcp", lambda n, _: ["drill", "-t", n, "A"], "drill", "ldnsutils", has(DUAL_V4, "rcode: NOERROR"),
           has("rcode: NXDOMAIN")),
    Client("drill-dnssec", lambda n, _: ["drill", "-D", n, "A"], "drill", "ldnsutils",
           has(DUAL_V4, "rcode: NOERROR"), has("rcode: NXDOMAIN")),
    *(
        Client(f"node-{how}", lambda n, d, how=how: ["node", str(d / "dns.js"), how, n], "node", "nodejs",
               ok, code(2, "error ENOTFOUND"), fresh=fresh)
        for how, ok, fresh in (
            ("resolve4", has(DUAL_V4), (FRESH_V4,)),
            ("resolve6", has(DUAL_V6), (FRESH_V6,)),
            # ANY of an allowlisted name: an empty answer, as for every type but A/AAAA
            # (docs/dns.md, qtype_not_served): c-ares reports that as ENODATA.
            ("resolveAny", code(2, "error ENODATA"), ()),
            ("lookup", has(DUAL_V4, DUAL_V6), BOTH),
        )
    ),
    *(
        Client(f"dnspython-{how}", lambda n, d, how=how: [SYSTEM_PYTHON, str(d / "dnspy.py"), how, n, RESOLVER_V4],
               SYSTEM_PYTHON, "python3-dnspython", ok, code(2, "NXDOMAIN"), fresh=fresh)
        for how, ok, fresh in (
            ("A", has(DUAL_V4), (FRESH_V4,)),
            ("AAAA", has(DUAL_V6), (FRESH_V6,)),
            ("tcp", has(DUAL_V4), (FRESH_V4,)),
            ("https", has("NODATA"), ()),
        )
    ),
    # Five queries written at once on one TCP connection, for a name in no cache: the
    # first two wait for the resolver while the others are behind them.
    Client("dnspython-tcp-pipelined",
           lambda n, d: [SYSTEM_PYTHON, str(d / "dnspy.py"), "pipelined", n, RESOLVER_V4], SYSTEM_PYTHON,
           "python3-dnspython",
           has(f"NOERROR {FRESH_V4}\nNOERROR {FRESH_V6}\nNOERROR \nNOERROR \nNOERROR {FRESH_V4}\n"),
           has("NXDOMAIN \n" * 5), name=f"x{uuid.uuid4().hex[:12]}{FRESH_SUFFIX}", fresh=()),
    Client("busybox-nslookup", lambda n, _: ["busybox", "nslookup", n], "busybox", "busybox",
           has(f"Address: {DUAL_V4}", f"Address: {DUAL_V6}"), has("NXDOMAIN"), fresh=BOTH),
    Client("musl-getaddrinfo", lambda n, d: [str(d / "musl-gai"), n], "musl-gcc", "musl-tools",
           has(DUAL_V4, DUAL_V6), code(2, "error"), fresh=BOTH),
    # More than 512 bytes: TC over UDP, then the client's own TCP fallback (or EDNS).
    Client("large-glibc-getent", lambda n, _: ["getent", "ahostsv4", n], "getent", "libc-bin", forty, GETENT_NX,
           name=MANY, fresh=()),
    Client("large-glibc-edns0", resopts("edns0", "getent", "ahostsv4"), "getent", "libc-bin", forty, GETENT_NX,
           name=MANY, fresh=()),
    Client("large-python-getaddrinfo", lambda n, _: [SYSTEM_PYTHON, "-c", PY_GAI % "socket.AF_INET", n], "python3",
           "python3", forty, code(1, "Name or service not known"), name=MANY, fresh=()),
    Client("large-host", lambda n, _: ["host", "-W", "2", "-t", "A", n], "host", "bind9-host", forty,
           code(1, "NXDOMAIN"), name=MANY, fresh=()),
    Client("large-nslookup", lambda n, _: ["nslookup", "-timeout=2", "-type=A", n], "nslookup", "bind9-dnsutils",
           forty, code(1, "NXDOMAIN"), name=MANY, fresh=()),
    Client("large-dig+noedns", digcmd("+noedns"), "dig", "bind9-dnsutils", forty, dig_nx, name=MANY, fresh=()),
    Client("large-kdig+bufsize=512", kdigcmd("+bufsize=512"), "kdig", "knot-dnsutils", forty, kdig_nx, name=MANY,
           fresh=()),
    Client("large-drill-tcp", lambda n, _: ["drill", "-t", n, "A"], "drill", "ldnsutils", forty,
           has("rcode: NXDOMAIN"), name=MANY, fresh=()),
    Client("large-node-resolve4", lambda n, d: ["node", str(d / "dns.js"), "resolve4", n], "node", "nodejs", forty,
           code(2, "error ENOTFOUND"), name=MANY, fresh=()),
    Client("large-dnspython", lambda n, d: [SYSTEM_PYTHON, str(d / "dnspy.py"), "A", n, RESOLVER_V4], SYSTEM_PYTHON,
           "python3-dnspython", forty, code(2, "NXDOMAIN"), name=MANY, fresh=()),
    # These never retry over TCP (musl only since 1.2.4; Debian 12 has 1.2.3, Alpine 3.17 too):
    # they use the records of the truncated answer.
    Client("large-drill-udp-only", lambda n, _: ["drill", n, "A"], "drill", "ldnsutils",
           lambda out: some_of_forty(out) and "qr tc rd ra" in out.stdout, has("rcode: NXDOMAIN"), name=MANY,
           fresh=()),
    Client("large-busybox-nslookup", lambda n, _: ["busybox", "nslookup", "-type=a", n], "busybox", "busybox",
           some_of_forty, has("NXDOMAIN"), name=MANY, fresh=()),
    Client("large-musl-getaddrinfo", lambda n, d: [str(d / "musl-gai"), n], "musl-gcc", "musl-tools", some_of_forty,
           code(2, "error"), name=MANY, fresh=()),
    # Resolving for a connection: the name through the proxy's DNS, then HTTPS to it.
    Client("curl", lambda n, d: ["curl", "-sS", "--max-time", "5", "--cacert", str(d / "client-ca.pem"), "-o",
                                 "/dev/null", "-w", "%{http_code} %{remote_ip}", f"https://{n}/dns-clients"],
           "curl", "curl", has("200 198.18.0.10"), code(6, "Could not resolve host"),
           name="dnsonly.example.test", fresh=()),
    Client("wget", lambda n, d: ["wget", "-q", "-O", "/dev/null", "--tries=1", "--timeout=5",
                                 f"--ca-certificate={d / 'client-ca.pem'}", f"https://{n}/dns-clients"],
           "wget", "wget", code(0), code(4), name="dnsonly.example.test", fresh=()),
]  # fmt: skip


@pytest.fixture(scope="module")
def box(lab: Lab):
    with redirected_sandbox(lab, SPEC) as sandbox:
        for name, text in (("dns.js", NODE_SCRIPT), ("dnspy.py", DNSPYTHON_SCRIPT), ("musl.c", MUSL_SOURCE)):
            (sandbox.public / name).write_text(text)
            (sandbox.public / name).chmod(0o644)
        if shutil.which("musl-gcc"):
            built = subprocess.run(["musl-gcc", "-static", "-O1", "-o", str(sandbox.public / "musl-gai"),
                                    str(sandbox.public / "musl.c")], capture_output=True, text=True, timeout=60)  # fmt: skip
            assert built.returncode == 0, built.stderr
        yield sandbox


def needs(client: Client) -> None:
    if shutil.which(client.tool) is None:
        pytest.skip(f"{client.tool} not installed (apt package {client.package}; scripts/test.sh installs it)")
    if client.id.startswith("dnspython"):
        probe = subprocess.run([SYSTEM_PYTHON, "-c", "import dns.resolver"], capture_output=True, timeout=30)
        if probe.returncode != 0:
            pytest.skip("dnspython not installed for the system Python (apt package python3-dnspython)")


def run(box: DnsSandbox, client: Client, name: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    out = box.exec(*client.argv(name, box.public), timeout=30)
    return out, time.monotonic() - started


def asked(box: DnsSandbox, label: str) -> int:
    """DNS queries the proxy answered whose name holds `label` (its audit log)."""
    return sum(1 for line in box.proxy.audit() if line.get("event") == "dns" and label in line.get("name", "").lower())


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.id)
def test_client_resolves_allowlisted_and_blocked_fails_cleanly(box: DnsSandbox, client: Client):
    needs(client)
    out, took = run(box, client, client.name)
    assert client.resolved(out), f"{client.id} did not resolve {client.name}:\n{out.stdout}\n{out.stderr}"
    assert took < QUICK_SECONDS, f"{client.id} took {took:.1f} s to resolve {client.name}\n{out.stdout}"
    if client.fresh:
        name = "x" + uuid.uuid4().hex[:12] + FRESH_SUFFIX
        out, took = run(box, client, name)
        assert all(a in out.stdout for a in client.fresh), f"{client.id}: {name}:\n{out.stdout}\n{out.stderr}"
        assert took < QUICK_SECONDS, f"{client.id} took {took:.1f} s to resolve {name}\n{out.stdout}"

    label = "x" + uuid.uuid4().hex[:12]
    name = label + client.blocked_suffix
    out, took = run(box, client, name)
    assert client.failed(out), f"{client.id} on {name}: rc={out.returncode}\n{out.stdout}\n{out.stderr}"
    assert took < QUICK_SECONDS, f"{client.id} took {took:.1f} s to fail: an answer it did not accept?\n{out.stdout}"
    count = asked(box, label)
    assert 1 <= count <= MAX_BLOCKED_QUERIES, f"{client.id} asked {count} times for {name}"
    logged = box.all_queries()
    assert label not in logged.lower(), f"{name} reached a resolver:\n{logged}"
    assert not any(label.encode() in part.lower() for part in box.sink.received), box.sink.received


SPLIT_TCP = r"""
import socket, struct, sys, time
def query(ident, name, qtype=1):
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)
def framed(q): return struct.pack("!H", len(q)) + q
names = sys.argv[2:]
wire = b"".join(framed(query(0x700 + i, n)) for i, n in enumerate(names))
with socket.create_connection((sys.argv[1], 53), timeout=3) as s:
    # The length prefix alone, then the rest a few bytes at a time: one query's
    # bytes spread over many segments, the next query's prefix split across two.
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire[:1]); time.sleep(0.05); s.sendall(wire[1:2]); time.sleep(0.05)
    for i in range(2, len(wire), 7):
        s.sendall(wire[i:i + 7]); time.sleep(0.005)
    got = b""
    while True:
        answers, rest = [], got
        while len(rest) >= 2 and len(rest) - 2 >= struct.unpack("!H", rest[:2])[0]:
            size = struct.unpack("!H", rest[:2])[0]; answers.append(rest[2:2 + size]); rest = rest[2 + size:]
        if len(answers) == len(names):
            break
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
for a in answers:
    print(hex(struct.unpack("!H", a[:2])[0]), a[3] & 15, struct.unpack("!H", a[6:8])[0])
"""


def test_tcp_length_prefix_split_across_segments(box: DnsSandbox):
    """RFC 7766 8: a client may write the two-byte length and the message in separate
    segments, and pipelined queries may straddle them; each is answered, under its ID."""
    script = box.public / "split_tcp.py"
    script.write_text(SPLIT_TCP)
    script.chmod(0o644)
    blocked = f"x{uuid.uuid4().hex[:12]}.attacker.test"
    out = box.exec(SYSTEM_PYTHON, "-I", str(script), RESOLVER_V4, DUAL, blocked, f"x{uuid.uuid4().hex[:12]}{FRESH_SUFFIX}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["0x700 0 1", "0x701 3 0", "0x702 0 1"], out.stdout
    assert blocked not in box.all_queries()
