"""Every flag of `egress-proxy run|check|redirect-rules` and `egress-hooks`, given a bad
value, as an operator would type it: the real console script in a subprocess must
exit non-zero with one line that names the flag (or file) and says why, never a
traceback, and never echo a credential it was given.

Spec and hooks.json loaders get hostile files too (empty, a list, binary junk, 50 MB,
deeply nested, a YAML alias bomb, a recursive alias, a directory, unreadable): each is
refused within seconds under a 1 GiB address-space limit.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from documented import cli_flags, script

SECRET = "s3cr3t-canary-7f1e"  # must never appear in any output
LOADER_SECONDS = 10  # a bomb or a huge file must be refused well within this
ADDRESS_SPACE = 1024**3  # the loader cases run under this RLIMIT_AS


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Iterator[dict[str, str]]:
    d = tmp_path_factory.mktemp("bad-input")
    paths: dict[str, Path] = {}

    def put(name: str, content: bytes | str) -> None:
        path = d / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        paths[name] = path

    put("good.yaml", "network:\n  allowlist:\n    - domain: example.test\n")
    put("empty.yaml", "")
    put("list.yaml", "- a\n- b\n")
    put("junk.yaml", bytes(range(128, 256)) * 8)
    put("nested.yaml", "[" * 5000 + "]" * 5000 + "\n")
    put("recursive.yaml", "network: &n\n  allowlist: [*n]\n")
    # "Billion laughs": ten levels of nine aliases, 9**10 values once expanded, 500 bytes on disk.
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    put("bomb.yaml", "\n".join(lines) + "\nnetwork: {mode: *a9, allowlist: []}\n")
    with (d / "big.yaml").open("wb") as f:  # 50 MB (sparse: the size is what matters)
        f.truncate(50 * 1024 * 1024)
    paths["big.yaml"] = d / "big.yaml"
    put("unreadable.yaml", "network: {allowlist: []}\n")
    (d / "unreadable.yaml").chmod(0)
    (d / "adir").mkdir()
    paths["adir"] = d / "adir"
    put("notpem.pem", "hello\n")
    put("hooks-ok.json", "{}\n")
    put("hooks-deep.json", "[" * 100000 + "]" * 100000)
    put("hooks-empty.json", "")
    with (d / "hooks-big.json").open("wb") as f:
        f.write(b"{}")
        f.truncate(50 * 1024 * 1024)
    paths["hooks-big.json"] = d / "hooks-big.json"
    specs = d / "specs"
    specs.mkdir()
    (specs / "team-a.yaml").write_text("network:\n  proxyToken: t\n  allowlist: []\n")
    (specs / "team-b.yaml").write_text("network:\n  allowlist: [{domain: '*.com'}]\n")
    paths["specs"] = specs
    good_dir = d / "good-specs"
    good_dir.mkdir()
    (good_dir / "team-a.yaml").write_text("network:\n  proxyToken: t\n  allowlist: []\n")
    paths["good-specs"] = good_dir
    paths["confdir"] = d / "confdir"
    found = {name: str(path) for name, path in paths.items()}
    # Ports held by this test while the cases run: "address in use" for the listeners.
    busy_tcp = socket.socket()
    busy_tcp.bind(("127.0.0.1", 0))
    busy_tcp.listen()
    busy_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy_udp.bind(("127.0.0.1", 0))
    found["busy-tcp"] = f"127.0.0.1:{busy_tcp.getsockname()[1]}"
    found["busy-udp"] = f"127.0.0.1:{busy_udp.getsockname()[1]}"
    with busy_tcp, busy_udp:
        yield found


# (id, command and arguments, expected exit status, words the one line must contain)
# `{name}` is replaced by the path of that file from the `files` fixture.
RUN = ["egress-proxy", "run", "--spec", "{good.yaml}"]
CASES = [
    # -- egress-proxy run: addresses
    ("listen-port-too-big", [*RUN, "--listen", "127.0.0.1:70000"], 2, "--listen: port 70000 is out of range"),
    ("listen-port-negative", [*RUN, "--listen", "127.0.0.1:-1"], 2, "--listen: port -1 is out of range"),
    ("listen-no-port", [*RUN, "--listen", "127.0.0.1"], 2, "--listen: expected HOST:PORT, got '127.0.0.1' (no port"),
    ("listen-no-host", [*RUN, "--listen", ":8080"], 2, "--listen: expected HOST:PORT, got ':8080' (no host"),
    ("listen-ipv6-unbracketed", [*RUN, "--listen", "::1:8080"], 2, "--listen: an IPv6 address needs brackets"),
    ("dns-listen-ipv6-no-port", [*RUN, "--dns-listen", "[::1]"], 2, "--dns-listen: '[::1]' has no port"),
    ("dns-listen-ipv6-unclosed", [*RUN, "--dns-listen", "[::1"], 2, "--dns-listen: '[::1' has no closing ']'"),
    ("dns-listen-ipv6-bare", [*RUN, "--dns-listen", "::1"], 2, "--dns-listen: an IPv6 address needs brackets"),
    ("dns-listen-brackets-not-ipv6", [*RUN, "--dns-listen", "[x]:53"], 2, "--dns-listen: 'x' in brackets is not an IPv6"),
    ("dns-listen-junk-after-bracket", [*RUN, "--dns-listen", "[::1]53"], 2, "--dns-listen: expected ':PORT' after ']'"),
    ("dns-listen-empty", [*RUN, "--dns-listen", ""], 2, "--dns-listen: expected HOST:PORT, got ''"),
    ("listen-address-in-use", [*RUN, "--listen", "{busy-tcp}"], 2, "--listen {busy-tcp}: cannot listen on TCP (Address already in use)"),
    ("listen-address-not-local", [*RUN, "--listen", "198.51.100.1:8080"], 2, "--listen 198.51.100.1:8080: cannot listen on TCP (Cannot assign requested address)"),
    ("dns-listen-address-in-use", [*RUN, "--dns-listen", "{busy-udp}"], 2, "--dns-listen {busy-udp}: cannot listen on UDP (Address already in use)"),
    ("metrics-listen-in-use", [*RUN, "--metrics-listen", "{busy-tcp}"], 2, "--metrics-listen {busy-tcp}: cannot listen (Address already in use)"),
    ("metrics-port-not-number", [*RUN, "--metrics-listen", "127.0.0.1:abc"], 2, "--metrics-listen: port 'abc' is not a number"),
    ("metrics-bad-ipv4", [*RUN, "--metrics-listen", "300.1.1.1:9090"], 2, "--metrics-listen: '300.1.1.1' is not an IPv4 address"),
    # -- egress-proxy run: counts, choices
    ("timeout-negative", [*RUN, "--connect-timeout", "-1"], 2, "argument --connect-timeout: '-1' is not a non-negative whole number"),
    ("timeout-fraction", [*RUN, "--read-timeout", "1.5"], 2, "argument --read-timeout: '1.5' is not a non-negative"),
    ("idle-timeout-word", [*RUN, "--idle-timeout", "soon"], 2, "argument --idle-timeout: 'soon' is not a non-negative"),
    ("header-timeout-negative", [*RUN, "--header-timeout", "-5"], 2, "argument --header-timeout: '-5'"),
    ("max-connections-negative", [*RUN, "--max-connections", "-1"], 2, "argument --max-connections: '-1'"),
    ("max-per-client-word", [*RUN, "--max-connections-per-client", "x"], 2, "argument --max-connections-per-client: 'x'"),
    ("max-per-env-negative", [*RUN, "--max-connections-per-environment", "-2"], 2, "argument --max-connections-per-environment: '-2'"),
    ("workers-zero", [*RUN, "--workers", "0"], 2, "argument --workers: '0' is not a number of workers (1-256)"),
    ("workers-too-many", [*RUN, "--workers", "999"], 2, "argument --workers: '999' is not a number of workers"),
    ("mode-bogus", [*RUN, "--mode", "bogus"], 2, "argument --mode: invalid choice: 'bogus'"),
    ("log-format-bogus", [*RUN, "--log-format", "xml"], 2, "argument --log-format: invalid choice: 'xml'"),
    # -- egress-proxy run: files and directories
    ("confdir-is-a-file", [*RUN, "--confdir", "{good.yaml}"], 2, "--confdir {good.yaml}: exists and is not a directory"),
    ("upstream-ca-missing", [*RUN, "--upstream-ca", "{adir}/none.pem"], 2, "--upstream-ca {adir}/none.pem: cannot read (No such file"),
    ("upstream-ca-directory", [*RUN, "--upstream-ca", "{adir}"], 2, "--upstream-ca {adir}: cannot read (Is a directory)"),
    ("upstream-ca-not-pem", [*RUN, "--upstream-ca", "{notpem.pem}"], 2, "--upstream-ca {notpem.pem}: no PEM certificate in file"),
    ("upstream-ca-binary", [*RUN, "--upstream-ca", "{junk.yaml}"], 2, "--upstream-ca {junk.yaml}: not a PEM file (not ASCII text)"),
    ("spec-missing", ["egress-proxy", "run", "--spec", "{adir}/none.yaml"], 1, "{adir}/none.yaml: file not found"),
    ("spec-is-a-directory", ["egress-proxy", "run", "--spec", "{adir}"], 1, "{adir}: is a directory, not a spec file"),
    ("spec-dir-missing", ["egress-proxy", "run", "--spec-dir", "{adir}/none"], 1, "{adir}/none: cannot list the spec directory (No such file"),
    ("spec-dir-is-a-file", ["egress-proxy", "run", "--spec-dir", "{good.yaml}"], 1, "cannot list the spec directory (Not a directory)"),
    ("spec-dir-transparent", ["egress-proxy", "run", "--spec-dir", "{good-specs}", "--mode", "transparent"], 2, "--spec-dir needs --mode regular"),
    ("spec-and-spec-dir", [*RUN, "--spec-dir", "{good-specs}"], 2, "argument --spec-dir: not allowed with argument --spec"),
    ("no-spec", ["egress-proxy", "run"], 2, "one of the arguments --spec --spec-dir is required"),
    # -- egress-proxy run: --set
    ("set-no-equals", [*RUN, "--set", "foo"], 2, "--set: expected NAME=VALUE, got 'foo'"),
    ("set-no-name", [*RUN, "--set", "=1"], 2, "--set: expected NAME=VALUE, got '=1'"),
    ("set-unknown-option", [*RUN, "--set", "no_such_option=1"], 2, "--set: Unknown option(s): no_such_option"),
    ("set-bad-value", [*RUN, "--set", "body_size_limit=abc"], 2, "--set: Invalid body_size_limit specification: abc"),
    ("set-refused-weakening", [*RUN, "--set", "ssl_insecure=true"], 2, "--set ssl_insecure: refused"),
    ("set-flag-backed-option", [*RUN, "--set", "egress_connect_timeout=-1"], 2, "--set egress_connect_timeout: refused (use --connect-timeout)"),
    ("set-header-bytes-zero", [*RUN, "--set", "egress_max_header_bytes=0"], 2, "egress_max_header_bytes must be at least 1"),
    # -- egress-proxy run: parent proxy
    ("upstream-proxy-scheme", [*RUN, "--upstream-proxy", "ftp://proxy.test:21"], 2, "--upstream-proxy 'ftp://proxy.test:21': expected http://HOST:PORT"),
    ("upstream-proxy-port", [*RUN, "--upstream-proxy", "http://proxy.test:99999"], 2, "--upstream-proxy 'http://proxy.test:99999': not a valid URL"),
    ("upstream-proxy-no-host", [*RUN, "--upstream-proxy", "http://"], 2, "--upstream-proxy 'http://': no host"),
    ("upstream-proxy-credentials-in-url", [*RUN, "--upstream-proxy", f"http://u:{SECRET}@proxy.test:3128"], 2, "--upstream-proxy: credentials in the URL"),
    ("upstream-proxy-auth-alone", [*RUN, "--upstream-proxy-auth", "u:${env:X}"], 2, "--upstream-proxy-auth needs --upstream-proxy"),
    ("upstream-proxy-auth-literal", [*RUN, "--upstream-proxy", "http://proxy.test:3128", "--upstream-proxy-auth", f"u:{SECRET}"], 2, "--upstream-proxy-auth: a literal password"),
    ("upstream-proxy-auth-missing-file", [*RUN, "--upstream-proxy", "http://proxy.test:3128", "--upstream-proxy-auth", "u:${file:{adir}/none}"], 2, "--upstream-proxy-auth: ${file:{adir}/none}: file not found"),
    # -- egress-proxy check: hostile spec files
    ("check-empty", ["egress-proxy", "check", "--spec", "{empty.yaml}"], 1, "{empty.yaml}: empty (expected the environment object"),
    ("check-list", ["egress-proxy", "check", "--spec", "{list.yaml}"], 1, "{list.yaml}: top level must be a mapping"),
    ("check-binary", ["egress-proxy", "check", "--spec", "{junk.yaml}"], 1, "{junk.yaml}: not UTF-8 text (byte 0x80 at offset 0)"),
    ("check-50mb", ["egress-proxy", "check", "--spec", "{big.yaml}"], 1, "{big.yaml}: larger than 32 MiB, not a spec file"),
    ("check-nested", ["egress-proxy", "check", "--spec", "{nested.yaml}"], 1, "{nested.yaml}: document nested too deeply"),
    ("check-alias-bomb", ["egress-proxy", "check", "--spec", "{bomb.yaml}"], 1, "{bomb.yaml}: document too large: more than 5,000,000 values once its YAML aliases are expanded"),
    ("check-recursive-alias", ["egress-proxy", "check", "--spec", "{recursive.yaml}"], 1, "{recursive.yaml}: document contains itself"),
    ("check-directory", ["egress-proxy", "check", "--spec", "{adir}"], 1, "{adir}: is a directory, not a spec file"),
    ("check-missing", ["egress-proxy", "check", "--spec", "{adir}/none.yaml"], 1, "{adir}/none.yaml: file not found"),
    ("check-unreadable", ["egress-proxy", "check", "--spec", "{unreadable.yaml}"], 1, "{unreadable.yaml}: cannot read (Permission denied)"),
    ("check-spec-dir-bad-file", ["egress-proxy", "check", "--spec-dir", "{specs}"], 1, "{specs}/team-b.yaml: network.allowlist[0].domain: '*.com'"),
    ("check-nothing", ["egress-proxy", "check"], 2, "one of the arguments --spec --spec-dir is required"),
    ("no-command", ["egress-proxy"], 2, "the following arguments are required: command"),
    ("unknown-command", ["egress-proxy", "serve"], 2, "argument command: invalid choice: 'serve'"),
    # -- egress-proxy redirect-rules
    ("rules-proxy-port-range", ["egress-proxy", "redirect-rules", "--proxy-uid", "1", "--proxy-port", "70000"], 2, "--proxy-port: 70000 is out of range (1-65535)"),
    ("rules-proxy-port-zero", ["egress-proxy", "redirect-rules", "--proxy-uid", "1", "--proxy-port", "0"], 2, "--proxy-port: 0 is out of range"),
    ("rules-proxy-port-word", ["egress-proxy", "redirect-rules", "--proxy-uid", "1", "--proxy-port", "abc"], 2, "argument --proxy-port: invalid int value: 'abc'"),
    ("rules-uid-negative", ["egress-proxy", "redirect-rules", "--proxy-uid", "-1"], 2, "argument --proxy-uid: '-1' is negative"),
    ("rules-uid-word", ["egress-proxy", "redirect-rules", "--proxy-uid", "root"], 2, "argument --proxy-uid: 'root' is not a number"),
    ("rules-uid-too-big", ["egress-proxy", "redirect-rules", "--proxy-uid", "99999999999"], 2, "--proxy-uid: 99999999999 is not a valid uid"),
    ("rules-mark-too-big", ["egress-proxy", "redirect-rules", "--proxy-mark", "0x1ffffffff"], 2, "--proxy-mark: 8589934591 is out of range"),
    ("rules-no-exemption", ["egress-proxy", "redirect-rules"], 2, "--proxy-uid or --proxy-mark is required"),
    ("rules-dns-port-zero", ["egress-proxy", "redirect-rules", "--proxy-uid", "1", "--dns-port", "0"], 2, "--dns-port: 0 is out of range"),
    ("rules-dns-port-range", ["egress-proxy", "redirect-rules", "--proxy-uid", "1", "--dns-port", "65536"], 2, "--dns-port: 65536 is out of range"),
    ("rules-dns-not-ip", ["egress-proxy", "redirect-rules", "--proxy-uid", "1", "--dns", "1.2.3"], 2, "--dns: '1.2.3' is not an IPv4 or IPv6 address"),
    ("rules-dns-and-dns-port", ["egress-proxy", "redirect-rules", "--proxy-uid", "1", "--dns", "192.0.2.1", "--dns-port", "5353"], 2, "--dns and --dns-port exclude each other"),
    # -- egress-hooks
    ("hooks-event-bogus", ["egress-hooks", "dispatch", "bogus"], 2, "argument EVENT: invalid choice: 'bogus'"),
    ("hooks-no-command", ["egress-hooks"], 2, "the following arguments are required: command"),
    ("hooks-config-missing", ["egress-hooks", "check", "--config", "{adir}/none.json"], 2, "--config {adir}/none.json: no such file"),
    ("hooks-config-directory", ["egress-hooks", "check", "--config", "{adir}"], 2, "--config {adir}: is a directory, not a hooks.json file"),
    ("hooks-config-device", ["egress-hooks", "check", "--config", "/dev/zero"], 2, "--config /dev/zero: not a regular file"),
    ("hooks-workspace-missing", ["egress-hooks", "check", "--workspace", "{adir}/none"], 2, "--workspace {adir}/none: no such directory"),
    ("hooks-dispatch-workspace-file", ["egress-hooks", "dispatch", "pre_tool_execution", "--workspace", "{good.yaml}"], 2, "--workspace {good.yaml}: no such directory"),
    ("hooks-ca-file-missing", ["egress-hooks", "dispatch", "pre_tool_execution", "--ca-file", "{adir}/none.pem"], 2, "--ca-file {adir}/none.pem: no such file"),
    ("hooks-ca-file-directory", ["egress-hooks", "dispatch", "pre_tool_execution", "--ca-file", "{adir}"], 2, "--ca-file {adir}: is a directory"),
    ("hooks-ca-file-not-pem", ["egress-hooks", "dispatch", "pre_tool_execution", "--ca-file", "{notpem.pem}"], 2, "--ca-file {notpem.pem}: not a PEM CA bundle"),
    ("hooks-proxy-scheme", ["egress-hooks", "dispatch", "pre_tool_execution", "--proxy", "socks5://proxy.test:1080"], 2, "--proxy 'socks5://proxy.test:1080': expected http://HOST:PORT"),
    ("hooks-proxy-port", ["egress-hooks", "dispatch", "pre_tool_execution", "--proxy", f"http://team-a:{SECRET}@gw.test:99999"], 2, "--proxy 'http://gw.test:99999': not a valid URL"),
    ("hooks-proxy-bad-brackets", ["egress-hooks", "dispatch", "pre_tool_execution", "--proxy", f"http://env:{SECRET}@[gw.test:8080"], 2, "--proxy: not a valid URL (Invalid IPv6 URL)"),
    ("hooks-proxy-no-host", ["egress-hooks", "dispatch", "pre_tool_execution", "--proxy", "http://"], 2, "--proxy 'http://': expected http://HOST:PORT"),
    ("hooks-event-not-json", ["egress-hooks", "dispatch", "pre_tool_execution", "--config", "{hooks-ok.json}"], 2, "event on stdin is not JSON"),
    ("hooks-check-binary", ["egress-hooks", "check", "--config", "{junk.yaml}"], 1, "{junk.yaml}: not UTF-8"),
    ("hooks-check-empty", ["egress-hooks", "check", "--config", "{hooks-empty.json}"], 1, "{hooks-empty.json}: invalid JSON at line 1 column 1"),
    ("hooks-check-list", ["egress-hooks", "check", "--config", "{list.yaml}"], 1, "{list.yaml}: invalid JSON"),
    ("hooks-check-deep", ["egress-hooks", "check", "--config", "{hooks-deep.json}"], 1, "{hooks-deep.json}: invalid JSON: nested too deeply"),
    ("hooks-check-50mb", ["egress-hooks", "check", "--config", "{hooks-big.json}"], 1, "{hooks-big.json}: larger than 4 MiB, not a hooks.json"),
    ("hooks-check-unreadable", ["egress-hooks", "check", "--config", "{unreadable.yaml}"], 1, "{unreadable.yaml}: cannot read: Permission denied"),
    ("hooks-operator-config-missing", ["egress-hooks", "check", "--operator-config", "{adir}/none.json"], 2, "--operator-config {adir}/none.json: no such file"),
    ("hooks-operator-config-directory", ["egress-hooks", "dispatch", "pre_tool_execution", "--operator-config", "{adir}"], 2, "--operator-config {adir}: is a directory, not a hooks.json file"),
    ("hooks-budget-zero", ["egress-hooks", "dispatch", "pre_tool_execution", "--budget", "0"], 2, "argument --budget: must be more than 0 and at most 600 seconds, got 0"),
    ("hooks-budget-word", ["egress-hooks", "serve", "--listen", "unix:{adir}/s.sock", "--budget", "soon"], 2, "argument --budget: not a number of seconds: 'soon'"),
    ("hooks-server-no-port", ["egress-hooks", "dispatch", "pre_tool_execution", "--server", "localhost"], 2, "--server 'localhost': expected unix:PATH or HOST:PORT"),
    ("hooks-fail-closed-without-server", ["egress-hooks", "dispatch", "pre_tool_execution", "--fail-closed"], 2, "--fail-closed applies to --server"),
    ("hooks-no-workspace-hooks-with-server", ["egress-hooks", "dispatch", "pre_tool_execution", "--server", "unix:/x", "--no-workspace-hooks"], 2, "--no-workspace-hooks cannot be used with --server"),
    ("hooks-serve-listen-public", ["egress-hooks", "serve", "--listen", "0.0.0.0:8123"], 2, "--listen 0.0.0.0:8123: TCP listens on loopback only"),
    ("hooks-serve-listen-port", ["egress-hooks", "serve", "--listen", "127.0.0.1:http"], 2, "--listen '127.0.0.1:http': the port must be a number"),
    ("hooks-serve-listen-not-socket", ["egress-hooks", "serve", "--listen", "unix:{good.yaml}"], 1, "--listen {good.yaml} exists and is not a socket; not replacing it"),
]


def _fill(text: str, files: dict[str, str]) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.parametrize(("argv", "status", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_value_gets_one_specific_line(files, tmp_path, argv, status, words):
    tool, *args = [_fill(a, files) for a in argv]
    command = [script(tool), *args]
    if args[:1] == ["run"]:
        # Listen nowhere fixed (nor in ~/.egress-proxy) should a case get past validation.
        command[2:2] = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--confdir", files["confdir"]]
    if "unreadable" in " ".join(args) and os.geteuid() == 0:
        # Root reads any file: drop the capabilities that let it (as uid 0, still owner).
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    loader = args[:1] == ["check"] or "--config" in args
    started = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        preexec_fn=_limit_memory if loader else None,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == status, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert _fill(words, files) in lines[0], lines[0]
    assert SECRET not in output
    if loader:
        assert elapsed < LOADER_SECONDS, f"took {elapsed:.1f}s"


def test_every_flag_has_a_bad_value_case():
    """A new flag of `run`, `check`, `redirect-rules` or `egress-hooks` needs a row above
    (flags that take no value, or whose every value is valid, are listed here)."""

    no_bad_value = {"--report-only", "--apply", "--help", "--version"}
    probed = {arg for _, argv, *_ in CASES for arg in argv if arg.startswith("--")}
    missing = {flag for flags in cli_flags().values() for flag in flags} - probed - no_bad_value
    assert not missing, f"flags without a bad-value case: {sorted(missing)}"


@pytest.mark.parametrize(
    ("prefix", "env_path", "words"),
    [
        (["setpriv", "--bounding-set", "-net_admin"], None, "redirect-rules --apply: nft failed (exit 1): "),
        ([], "/nonexistent", "redirect-rules --apply: cannot run nft (No such file or directory)"),
    ],
    ids=["without-net-admin", "without-nft"],
)
def test_redirect_rules_apply_failure_is_one_line(prefix, env_path, words):
    """`--apply` where nft cannot do it: the rules are still printed on stdout, the failure
    is one line on stderr, exit 1 (docs/transparent.md: Redirect rules)."""
    if prefix and os.geteuid() != 0:
        pytest.skip("dropping CAP_NET_ADMIN from the bounding set needs root")
    env = {**os.environ, "PATH": env_path} if env_path else None
    done = subprocess.run(
        [*prefix, script("egress-proxy"), "redirect-rules", "--proxy-uid", "1", "--apply"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("#") or "table inet egress_redirect" in done.stdout
    assert len(done.stderr.splitlines()) == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
