"""README's quick start, run as written: the shell blocks are read from README.md, so a
change there is tested here.

Everything runs in a network namespace of its own with only loopback up, and HOME in
a temporary directory (so `~/.egress-proxy` is fresh): nothing leaves the machine.
What that leaves out, said here rather than skipped silently:
- `scripts/test.sh` is not run: it is the command that runs this test (CI runs it).
- examples/spec.yaml's hosts do not resolve offline, so the `200` from pypi.org and
  the injected token at api.github.com cannot be seen. What is checked instead is
  that each request reached the proxy (curl honoured the proxy variables) and was
  matched to its allowlist entry by name; the proxy then refused it only because
  the name did not resolve (`resolve_failed`).
Checked as claimed: the listen address and the CA path printed at start (and the CA
file), `/readyz` answering `ready`, and the metadata request's 403 with
`X-Egress-Denied: not_allowlisted`. A last test shows why the README says
lower-case `http_proxy`: with only `HTTP_PROXY`, curl goes around the proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from e2e.support.lab import in_netns

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
START_TIMEOUT = 600  # run-example.sh builds and installs the wheel first (2 shared cores)


def quickstart_blocks() -> list[list[str]]:
    """The `sh` blocks of README's "Quick start" section, as lists of lines."""
    text = README.read_text(encoding="utf-8")
    assert "\n## Quick start\n" in text, "README.md has no '## Quick start' section"
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 3, f"expected the install, client and --version blocks, found {len(blocks)}"
    return [block.splitlines() for block in blocks]


def commands(block: list[str]) -> list[str]:
    return [line for line in block if line.strip() and not line.lstrip().startswith("#")]


def claim(line: str) -> str:
    """The output a command line's trailing comment promises."""
    return line.split("  #", 1)[1].strip() if "  #" in line else ""


@pytest.fixture(scope="module")
def namespace():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the quick-start test needs root and iproute2 (it creates a network namespace)")
    name = f"egq-{os.getpid() % 100000}"
    etc = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost\n")
        # Nothing listens there: every name outside the hosts file fails at once.
        (etc / "resolv.conf").write_text("options timeout:1 attempts:1\nnameserver 127.0.0.53\n")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(etc, ignore_errors=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quickstart")


@pytest.fixture(scope="module")
def shell_env(workdir):
    """A user's shell: a fresh HOME, no proxy variables, the machine's Python and pip cache."""
    real_home = Path.home()
    home = workdir / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["HOME"] = str(home)
    # find-python.sh looks in pyenv's versions under HOME by default; pip's cache too.
    env.setdefault("PYENV_ROOT", os.environ.get("PYENV_ROOT") or str(real_home / ".pyenv"))
    env.setdefault("XDG_CACHE_HOME", str(real_home / ".cache"))
    return env


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()) is not None:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout}s:\n{log.read_text()[-3000:]}")


def ready(namespace: str) -> bool:
    try:
        with in_netns(namespace):
            sock = socket.create_connection(("127.0.0.1", 9090), timeout=2)
        with sock:
            sock.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
            return sock.recv(1024).startswith(b"HTTP/1.0 200")
    except OSError:
        return False


@pytest.fixture(scope="module")
def running_example(namespace, shell_env, workdir):
    """Block 1 as written: `scripts/run-example.sh` in the background (and not `scripts/test.sh`)."""
    install_block, *_ = quickstart_blocks()
    lines = commands(install_block)
    assert "scripts/test.sh" in lines  # not run here: it is what runs this test
    [run_example] = [line for line in lines if "run-example" in line]
    assert run_example == "scripts/run-example.sh"
    stdout, stderr = workdir / "proxy.stdout", workdir / "proxy.stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", namespace, "bash", "-c", run_example],
            cwd=REPO, env=shell_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        banner = wait_for(
            lambda: next((line for line in stderr.read_text().splitlines() if "CA certificate:" in line), None),
            START_TIMEOUT, "start-up banner", proc, stderr,
        )  # fmt: skip
        wait_for(lambda: True if ready(namespace) else None, 60, "/readyz 200", proc, stderr)
        yield {"namespace": namespace, "env": shell_env, "stdout": stdout, "stderr": stderr, "banner": banner}
    finally:
        # Our own process group (start_new_session): the script, install.sh, or the proxy.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def run_block(example, lines: list[str]) -> list[tuple[str, int, str]]:
    """Run the block's lines in one shell, as written; (line, exit status, output) per command."""
    script = []
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            script.append(line)
            continue
        script += [f"printf '@@begin {i}\\n'", line, f"printf '\\n@@end {i} %d\\n' \"$?\""]
    done = subprocess.run(
        ["ip", "netns", "exec", example["namespace"], "bash", "-c", "\n".join(script)],
        # curl writes errors to stderr: one pipe keeps them in order with its output
        env=example["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=REPO,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = done.stdout
    results = []
    for match in re.finditer(r"@@begin (\d+)\n(.*?)\n@@end \1 (\d+)\n", out + "\n", re.S):
        results.append((lines[int(match.group(1))], int(match.group(3)), match.group(2)))
    assert len(results) == len(commands(lines)), out
    return results


def audit(example) -> list[dict]:
    return [json.loads(line) for line in example["stdout"].read_text().splitlines() if line.startswith("{")]


def decision_for(example, host: str) -> dict:
    entries = [e for e in audit(example) if e.get("host") == host]
    assert entries, f"the proxy saw no request for {host}: the client did not use it"
    return entries[-1]


def test_quickstart_as_written(running_example):
    example = running_example
    home = example["env"]["HOME"]
    # Block 1's claims: "listens on 127.0.0.1:8080"; "its CA (printed at start; by default
    # ~/.egress-proxy/mitmproxy-ca-cert.pem)".
    stderr = example["stderr"].read_text()
    assert "proxy on 127.0.0.1:8080" in stderr, stderr
    ca = Path(example["banner"].split("CA certificate:", 1)[1].strip())
    assert ca == Path(home) / ".egress-proxy" / "mitmproxy-ca-cert.pem"
    assert ca.read_text().startswith("-----BEGIN CERTIFICATE-----")

    _, client_block, _ = quickstart_blocks()
    results = run_block(example, client_block)
    checked = set()
    for line, status, output in results:
        promised = claim(line)
        if "/readyz" in line:
            assert status == 0 and output.strip() == "ready" == promised, (line, output)
        elif line.startswith("export "):
            assert status == 0, (line, output)  # what it sets is judged by the requests below
        elif "pypi.org" in line:
            # Offline the 200 cannot be seen (pypi.org does not resolve here): the request
            # went through the proxy, matched `pypi.org`, and failed only at resolution.
            assert "200" in promised
            entry = decision_for(example, "pypi.org")
            assert (entry["event"], entry["rule"], entry["reason"]) == ("tunnel", "pypi.org", "resolve_failed"), entry
            assert "403" in output, output  # curl: CONNECT tunnel failed, response 403
        elif "api.github.com" in line:
            # Offline the injected token cannot be seen: the CA named in the command is the
            # one the proxy printed, and the request reached the proxy's `api.github.com` entry.
            assert "--cacert ~/.egress-proxy/mitmproxy-ca-cert.pem" in line
            entry = decision_for(example, "api.github.com")
            assert (entry["rule"], entry["reason"]) == ("api.github.com", "resolve_failed"), entry
        elif "169.254.169.254" in line:
            # (stderr is no terminal here, so curl's progress meter comes first)
            assert status == 0 and "HTTP/1.1 " in output, output
            response = output[output.index("HTTP/1.1 ") :]
            head, _, body = response.replace("\r\n", "\n").partition("\n\n")
            assert head.startswith("HTTP/1.1 403"), output
            assert re.search(r"^x-egress-denied: not_allowlisted$", head, re.I | re.M), head
            assert json.loads(body)["reason"] == "not_allowlisted", body
            for word in ("403", "X-Egress-Denied: not_allowlisted"):
                assert word in promised, promised
            assert decision_for(example, "169.254.169.254")["reason"] == "not_allowlisted"
        else:
            raise AssertionError(f"README's quick start has a command this test does not check: {line!r}")
        checked.add(line)
    assert len(checked) == 5, checked


def test_upper_case_http_proxy_is_not_used_by_curl(running_example):
    """Why the README says lower-case: curl ignores `HTTP_PROXY` for http:// URLs, so the
    metadata request goes direct (here: no route out of the namespace, so it fails)."""
    example = running_example
    seen = len([e for e in audit(example) if e.get("host") == "169.254.169.254"])
    env = {**example["env"], "HTTP_PROXY": "http://127.0.0.1:8080"}
    done = subprocess.run(
        ["ip", "netns", "exec", example["namespace"], "curl", "-sS", "-i", "--max-time", "5",
         "http://169.254.169.254/latest/meta-data/"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode != 0 and "403" not in done.stdout, (done.stdout, done.stderr)
    assert len([e for e in audit(example) if e.get("host") == "169.254.169.254"]) == seen


def test_version_commands_as_written(running_example):
    """The third block: the installed commands print the version they claim, which is
    the package's (README must follow a version bump)."""
    *_, version_block = quickstart_blocks()
    results = run_block(running_example, version_block)
    assert len(results) == 2
    wheel_version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    for line, status, output in results:
        tool = line.split()[0].rsplit("/", 1)[1]
        assert line.startswith(".venv/bin/"), line  # where scripts/run-example.sh installed them
        assert status == 0 and output.strip() == claim(line) == f"{tool} {wheel_version}", (line, output)
