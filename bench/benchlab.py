"""The benchmark lab: two network namespaces, nginx upstream, proxies, load generators.

    client/proxy namespace  ebp-N               upstream namespace  ebu-N
    ├─ wrk / hey (load)                         └─ nginx on 198.18.0.2:80 and :443
    ├─ mitmdump, egress-proxy, squid on 127.0.0.1        (TLS from a lab CA)
    └─ veth 198.18.0.1/24 ──────────────────────────── veth 198.18.0.2/24

Host names (`plain.bench.test`, `pass.bench.test`, `inject.bench.test`) resolve to
198.18.0.2 through /etc/netns/ebp-N/hosts. Everything stays on 198.18.0.0/15.
Reuses the certificate and namespace helpers of the end-to-end lab.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from e2e.support.lab import _cert, _pem, in_netns, run

VENV_BIN = Path(sys.executable).parent
PROXY_V4, UPSTREAM_V4 = "198.18.0.1", "198.18.0.2"
HOSTS = ("plain.bench.test", "pass.bench.test", "inject.bench.test")
SMALL_BODY = b"x" * 100
LARGE_SIZE = 1 << 20  # 1 MiB


class BenchError(RuntimeError):
    pass


# -- process helpers ---------------------------------------------------------------
def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out.extend(int(p) for p in fh.read().split())
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(_children(p))
    return tree


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """user+system CPU of a process tree (live processes only)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def load_average() -> float:
    return os.getloadavg()[0]


class RssSampler:
    """Peak RSS of a process tree while a load runs (sampled every 0.2 s)."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> RssSampler:
        if self.pid:
            self.peak = rss_bytes(self.pid)
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.pid:
            self._thread.join()
            self.peak = max(self.peak, rss_bytes(self.pid))


def terminate(proc: subprocess.Popen, timeout: float = 8) -> None:
    """Stop one process this harness started, by PID."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# -- the lab -----------------------------------------------------------------------
class BenchLab:
    def __init__(self, workdir: Path):
        self.id = os.getpid() % 100000
        self.ns = f"ebp-{self.id}"
        self.upstream_ns = f"ebu-{self.id}"
        self.dir = workdir
        self.procs: list[subprocess.Popen] = []
        self._port = 20000

    def port(self) -> int:
        self._port += 1
        return self._port

    def start(self) -> None:
        self.cleanup()
        os.chmod(self.dir, 0o755)  # squid and nginx workers run unprivileged
        ns, uns = ["ip", "netns", "exec", self.ns], ["ip", "netns", "exec", self.upstream_ns]
        run(["ip", "netns", "add", self.ns])
        run(["ip", "netns", "add", self.upstream_ns])
        vp, vu = f"vbp{self.id}", f"vbu{self.id}"
        run(["ip", "link", "add", vp, "type", "veth", "peer", "name", vu])
        run(["ip", "link", "set", vp, "netns", self.ns])
        run(["ip", "link", "set", vu, "netns", self.upstream_ns])
        for prefix, dev, addr in ((ns, vp, PROXY_V4), (uns, vu, UPSTREAM_V4)):
            run([*prefix, "ip", "link", "set", "lo", "up"])
            run([*prefix, "ip", "addr", "add", f"{addr}/24", "dev", dev])
            run([*prefix, "ip", "link", "set", dev, "up"])
        etc = Path("/etc/netns") / self.ns
        etc.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost"] + [f"{UPSTREAM_V4} {h}" for h in HOSTS]
        (etc / "hosts").write_text("\n".join(lines) + "\n")
        (etc / "resolv.conf").write_text("options timeout:1 attempts:1\nnameserver 127.0.0.53\n")
        self._certificates()
        self._nginx()

    def _certificates(self) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("egress bench upstream CA", ca_key, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert("egress bench upstream", key, ca, ca_key, sans=[*HOSTS, UPSTREAM_V4])
        self.upstream_ca = self.dir / "upstream-ca.pem"
        self.upstream_ca.write_bytes(_pem(ca))
        (self.dir / "upstream.pem").write_bytes(_pem(cert))
        (self.dir / "upstream.key").write_bytes(_pem(key))

    def _nginx(self) -> None:
        www = self.dir / "www"
        www.mkdir(exist_ok=True)
        (www / "small").write_bytes(SMALL_BODY)
        (www / "large").write_bytes(os.urandom(LARGE_SIZE))
        d = self.dir
        conf = d / "nginx.conf"
        conf.write_text(f"""
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  sendfile on;
  tcp_nodelay on;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  client_body_temp_path {d}/nginx-tmp;
  default_type application/octet-stream;
  server {{
    listen {UPSTREAM_V4}:80 backlog=4096;
    listen {UPSTREAM_V4}:443 ssl backlog=4096;
    ssl_certificate {d}/upstream.pem;
    ssl_certificate_key {d}/upstream.key;
    ssl_session_cache shared:SSL:1m;
    root {www};
  }}
}}
""")
        self.nginx = self.spawn_upstream(["nginx", "-c", str(conf)], "nginx")
        self.wait_port(UPSTREAM_V4, 443, ns=self.ns)

    # -- processes -----------------------------------------------------------------
    def spawn(self, cmd: list[str], name: str, env: dict | None = None, ns: str | None = None) -> subprocess.Popen:
        """Start a long-running process inside a namespace (`ip netns exec` execs: PID is the program's)."""
        out = (self.dir / f"{name}.out").open("ab")
        err = (self.dir / f"{name}.err").open("ab")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns or self.ns, *cmd], stdout=out, stderr=err, env={**os.environ, **(env or {})}
        )
        self.procs.append(proc)
        return proc

    def spawn_upstream(self, cmd: list[str], name: str) -> subprocess.Popen:
        return self.spawn(cmd, name, ns=self.upstream_ns)

    def wait_port(self, host: str, port: int, ns: str | None = None, timeout: float = 30, proc=None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise BenchError(f"{proc.args[3:]} exited {proc.returncode}")
            with in_netns(ns or self.ns):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.settimeout(1)
                sock.connect((host, port))
                return
            except OSError:
                time.sleep(0.1)
            finally:
                sock.close()
        raise BenchError(f"nothing listens on {host}:{port} after {timeout} s")

    def exec(self, cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
        """Run a command in the client namespace; returns it and the CPU seconds it used."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            ["ip", "netns", "exec", self.ns, *cmd], capture_output=True, text=True, timeout=timeout, check=False
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return done, cpu

    def stop(self) -> None:
        for proc in reversed(self.procs):
            terminate(proc)
        self.cleanup()

    def cleanup(self) -> None:
        for ns in (self.ns, self.upstream_ns):
            run(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


# -- proxies -----------------------------------------------------------------------
@dataclass
class Proxy:
    name: str
    port: int
    proc: subprocess.Popen | None = None
    metrics_port: int | None = None
    ca: Path | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_mitmdump(lab: BenchLab, name: str, passthrough: bool) -> Proxy:
    port = lab.port()
    confdir = lab.dir / f"{name}-conf"
    cmd = [
        str(VENV_BIN / "mitmdump"), "-q", "--listen-host", "127.0.0.1", "-p", str(port),
        "--set", f"confdir={confdir}", "--set", f"ssl_verify_upstream_trusted_ca={lab.upstream_ca}",
    ]  # fmt: skip
    if passthrough:
        cmd += ["--ignore-hosts", ".*"]
    proxy = Proxy(name, port, lab.spawn(cmd, name), ca=confdir / "mitmproxy-ca-cert.pem")
    lab.wait_port("127.0.0.1", port, proc=proxy.proc)
    return proxy


def start_egress(lab: BenchLab, name: str, spec: Path, *extra: str, env: dict | None = None) -> Proxy:
    port, metrics_port = lab.port(), lab.port()
    confdir = lab.dir / f"{name}-conf"
    cmd = [
        str(VENV_BIN / "egress-proxy"), "run", "--spec", str(spec),
        "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
        "--confdir", str(confdir), "--upstream-ca", str(lab.upstream_ca), *extra,
    ]  # fmt: skip
    proxy = Proxy(name, port, lab.spawn(cmd, name, env=env), metrics_port=metrics_port, ca=confdir / "mitmproxy-ca-cert.pem")
    lab.wait_port("127.0.0.1", port, proc=proxy.proc)
    return proxy


def start_squid(lab: BenchLab, name: str = "squid") -> Proxy:
    port = lab.port()
    d = lab.dir / "squid"
    d.mkdir(exist_ok=True)
    shutil.chown(d, "proxy", "proxy")
    conf = d / "squid.conf"
    conf.write_text(f"""
http_port 127.0.0.1:{port}
http_access allow all
cache deny all
cache_mem 8 MB
access_log stdio:{d}/access.log
cache_log {d}/cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
cache_effective_user proxy
hosts_file /etc/hosts
dns_nameservers 127.0.0.53
shutdown_lifetime 1 seconds
max_filedescriptors 8192
""")
    proxy = Proxy(name, port, lab.spawn(["squid", "-N", "-f", str(conf)], name))
    lab.wait_port("127.0.0.1", port, proc=proxy.proc)
    return proxy


# -- load generators ---------------------------------------------------------------
@dataclass
class LoadResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    client_cpu: float  # CPU seconds the load generator used
    extra: dict = field(default_factory=dict)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _wrk_ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise BenchError(f"cannot read wrk latency {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def run_wrk(lab: BenchLab, url: str, conns: int, seconds: float, proxy: Proxy | None) -> LoadResult:
    """Plain HTTP with wrk; through a proxy as absolute-form requests (wrk has no proxy option)."""
    threads = 1 if conns == 1 else 2
    script = lab.dir / "wrk-proxy.lua"
    if proxy is not None:
        host = url.split("/")[2]
        script.write_text(f'wrk.path = "{url}"\nwrk.headers["Host"] = "{host}"\n')
        cmd = ["wrk", "-s", str(script), proxy.url]
    else:
        cmd = ["wrk", url]
    cmd[1:1] = ["--latency", "-t", str(threads), "-c", str(conns), "-d", f"{max(1, round(seconds))}s", "--timeout", "10s"]
    done, cpu = lab.exec(cmd, timeout=seconds + 30)
    out = done.stdout
    if done.returncode != 0 or "Requests/sec" not in out:
        raise BenchError(f"wrk failed: {done.stderr or out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.MULTILINE))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    errors = 0
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        errors += int(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        errors += sum(int(x) for x in m.groups())
    if "50" not in lat or "99" not in lat:  # wrk prints no percentiles when nothing completed
        raise BenchError(f"wrk reported no latency percentiles: {out[-300:]}")
    return LoadResult(rps, _wrk_ms(lat["50"]), _wrk_ms(lat["99"]), total, errors, cpu)


def run_hey(lab: BenchLab, url: str, conns: int, seconds: float, proxy: Proxy | None) -> LoadResult:
    """HTTPS with hey (Go net/http, HTTP/1.1, keep-alive), through a proxy by CONNECT (`-x`)."""
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(conns), "-t", "10", "-disable-compression"]
    if proxy is not None:
        cmd += ["-x", proxy.url]
    cmd.append(url)
    done, cpu = lab.exec(cmd, timeout=seconds + 40)
    out = done.stdout
    if done.returncode != 0 or "Requests/sec" not in out:
        raise BenchError(f"hey failed: {done.stderr or out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = dict(re.findall(r"^\s+(50|99)%+ in ([\d.]+) secs", out, re.MULTILINE))
    ok = sum(int(n) for n in re.findall(r"\[200\]\s+(\d+) responses", out))
    other = sum(int(n) for code, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", out) if code != "200")
    err_section = out.split("Error distribution:", 1)[1] if "Error distribution:" in out else ""
    errors = other + sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", err_section, re.MULTILINE))
    if "50" not in lat:
        raise BenchError(f"hey gave no latencies (no successful request?): {out[-800:]}")
    lat.setdefault("99", lat["50"])
    return LoadResult(rps, float(lat["50"]) * 1e3, float(lat["99"]) * 1e3, ok, errors, cpu)


def py_spy_exe() -> str | None:
    found = shutil.which("py-spy") or str(VENV_BIN / "py-spy")
    return found if os.access(found, os.X_OK) else None


@contextlib.contextmanager
def py_spy(pid: int, seconds: float, out: Path):
    """Sample a running process with py-spy (collapsed stacks) while the body runs."""
    exe = py_spy_exe()
    if exe is None:
        raise BenchError("py-spy not found: .venv/bin/pip install py-spy")
    proc = subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
         "--nonblocking", "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        try:
            proc.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            terminate(proc)
