"""The docs' examples, run as written with the installed `egress-proxy check`: the example
spec (README and docs/spec.md) is valid, the `check` output shown is what `check` prints,
and the command in examples/spec.yaml's header works."""

from __future__ import annotations

import os
import re
import socket
import subprocess

from documented import README, REPO, page, script, section


def check(path, env_extra=None, cwd=None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [script("egress-proxy"), "check", "--spec", str(path)], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def test_readme_spec_example_is_valid(tmp_path):
    for text in (section(README.read_text(encoding="utf-8"), "## An environment spec"), page("spec.md")):
        example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
        path = tmp_path / "spec.yaml"
        path.write_text(example, encoding="utf-8")
        done = check(path, {"GITHUB_TOKEN": "ghp_example"})
        assert done.returncode == 0, done.stderr
        assert "ok (3 allowlist entries, mode enforce)" in done.stdout


def test_readme_check_output_is_what_check_prints(tmp_path):
    """The `$ egress-proxy check --spec bad.yaml` block: a spec with the two problems it
    shows gets exactly those lines, and exit 1."""
    text = page("spec.md")
    block = re.search(r"```\n\$ egress-proxy check --spec bad.yaml\n(.*?)```", text, re.S)
    assert block, "docs/spec.md has no `check` example"
    (tmp_path / "bad.yaml").write_text(
        'network:\n  allowlist:\n    - domain: "*.com"\n    - domain: "*"\n      transform: {Authorization: "Bearer x"}\n',
        encoding="utf-8",
    )
    done = check("bad.yaml", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == block.group(1).splitlines()


def test_example_spec_header_command_works():
    header = (REPO / "examples" / "spec.yaml").read_text(encoding="utf-8")
    command = re.search(r"^# `(EXAMPLE_GITHUB_TOKEN=x) \.venv/bin/egress-proxy check --spec examples/spec.yaml`", header, re.M)
    assert command, "examples/spec.yaml's header no longer shows the check command"
    done = check("examples/spec.yaml", {"EXAMPLE_GITHUB_TOKEN": "x"}, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("examples/spec.yaml: ok (")
    # Without the variable, as the header warns, the reference cannot be resolved.
    env = {k: v for k, v in os.environ.items() if k != "EXAMPLE_GITHUB_TOKEN"}
    done = subprocess.run(
        [script("egress-proxy"), "check", "--spec", "examples/spec.yaml"], capture_output=True, text=True, timeout=60, env=env, cwd=REPO
    )
    assert done.returncode == 1 and "EXAMPLE_GITHUB_TOKEN is not set" in done.stderr


def test_readme_hooks_example_as_written():
    """docs/hooks.md's first example: the commands run in the repository as shown (the
    installed scripts in place of `.venv/bin/`), and print what the comments say."""
    text = section(page("hooks.md"), "## A first example")
    block = re.search(r"```sh\n(.*?)```", text, re.S).group(1).splitlines()
    bin_dir = os.path.dirname(script("egress-hooks"))
    claims = []
    for i, line in enumerate(block):
        if line.startswith("#"):
            continue
        command, _, comment = line.partition("  # ")
        expected = comment.strip() or block[i + 1].removeprefix("# ").strip()
        claims.append((command.replace(".venv/bin/", bin_dir + "/"), expected))
    assert len(claims) == 2
    for command, expected in claims:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected, (command, done.stdout)


def test_readme_port_taken_message_is_what_run_says(tmp_path):
    """The quick start quotes the error for a port already taken; with a port of ours
    taken, `egress-proxy run` prints that line (with our port) and nothing else."""
    text = section(README.read_text(encoding="utf-8"), "## Quick start")
    quoted = re.search(r"`(--listen 127\.0\.0\.1:8080: cannot listen[^`]*)`", text)
    assert quoted, "the quick start no longer quotes the port-taken error"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [script("egress-proxy"), "run", "--spec", str(REPO / "examples" / "spec.yaml"), "--listen", f"127.0.0.1:{port}",
             "--metrics-listen", "127.0.0.1:0", "--confdir", str(tmp_path / "conf")],
            capture_output=True, text=True, timeout=60, env={**os.environ, "EXAMPLE_GITHUB_TOKEN": "x"},
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "egress-proxy: " + quoted.group(1).replace("8080", str(port))
