"""`--spec-dir` without sockets: which files are environments, per-file reload, proof of environment."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from egress.environments.registry import EnvironmentRegistry, environment_problem, load_directory, spec_files
from egress.environments.single import SpecHolder
from egress.ops import metrics
from egress.policy.spec import SpecError, parse_spec
from egress.wire import proxy_auth

TOKEN = "tok-9f1c2e-SECRET-do-not-print"


def spec_text(domain: str = "a.test", token: str | None = TOKEN) -> str:
    token_line = f"  proxyToken: {token}\n" if token is not None else ""
    return f"network:\n{token_line}  allowlist:\n    - domain: {domain}\n"


def configmap(directory: Path, files: dict[str, str], generation: int) -> None:
    """Lay out `files` as kubelet does for a mounted ConfigMap, swapping `..data` atomically."""
    directory.mkdir(exist_ok=True)
    target = directory / f"..2026_12_01_00_00_0{generation}.000000000"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    link = directory / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith(".") and entry.name not in files:
            entry.unlink()


# -- which files are environments ------------------------------------------------------


@pytest.mark.parametrize("stem", ["a", "env-a", "team.prod_1", "0", "a" * 63])
def test_valid_ids(stem):
    assert environment_problem(stem) is None


@pytest.mark.parametrize("stem", ["", "A", "Env", "-a", ".a", "_a", "a b", "a:b", "a/b", "a" * 64, "é", "a\n"])
def test_invalid_ids(stem):
    assert environment_problem(stem) is not None


def test_spec_files_skip_dotfiles_configmap_entries_and_other_names(tmp_path):
    configmap(tmp_path, {"a.yaml": spec_text(), "b.json": '{"allowlist": []}', "c.yml": spec_text()}, 1)
    (tmp_path / ".hidden.yaml").write_text("broken: [")
    (tmp_path / "README.md").write_text("x")
    (tmp_path / "sub.yaml").mkdir()
    assert [(f.environment, f.path.name) for f in spec_files(tmp_path)] == [("a", "a.yaml"), ("b", "b.json"), ("c", "c.yml")]


def test_load_directory_names_every_bad_file(tmp_path):
    (tmp_path / "Upper.yaml").write_text(spec_text())
    (tmp_path / "dup.yaml").write_text(spec_text())
    (tmp_path / "dup.json").write_text('{"allowlist": []}')
    (tmp_path / "bad.yaml").write_text("network:\n  allowlist: [{domain: '*host'}]\n")
    (tmp_path / "tok.yaml").write_text("network:\n  proxyToken: '${file:/nonexistent/token}'\n  allowlist: []\n")
    (tmp_path / "ok.yaml").write_text(spec_text())
    loaded, problems = load_directory(tmp_path)
    assert sorted(loaded) == ["ok"]
    text = "\n".join(problems)
    assert "Upper.yaml: file name is not a valid environment id" in text
    assert "dup.yaml: environment 'dup' is also defined by dup.json" in text
    assert "bad.yaml: network.allowlist[0].domain" in text
    assert "tok.yaml: network.proxyToken: ${file:/nonexistent/token}: file not found" in text
    assert len(problems) == 4
    assert loaded["ok"][1].environment == "ok"


def test_missing_directory_is_one_problem(tmp_path):
    assert load_directory(tmp_path / "nope") == ({}, [f"{tmp_path / 'nope'}: cannot list the spec directory (No such file or directory)"])


# -- proxyToken in the spec ---------------------------------------------------------------


def test_proxy_token_value_and_references(tmp_path):
    assert parse_spec(spec_text()).proxy_token.reveal() == TOKEN
    assert parse_spec(spec_text(token=None)).proxy_token is None
    (tmp_path / "t").write_text(TOKEN + "\n")
    spec = parse_spec(spec_text(token=f"${{file:{tmp_path / 't'}}}"))
    assert spec.proxy_token.reveal() == TOKEN and str(tmp_path / "t") in spec.secret_files
    assert parse_spec(spec_text(token="${env:GW_T}"), environ={"GW_T": TOKEN}).proxy_token.reveal() == TOKEN


@pytest.mark.parametrize(
    "value, problem",
    [("''", "is empty"), ("'a b'", "visible ASCII"), ("'tök'", "visible ASCII"), ("12", "must be a string"),
     ("'${env:GW_UNSET_X}'", "environment variable GW_UNSET_X is not set"), ("[a]", "must be a string")],
)  # fmt: skip
def test_bad_proxy_tokens_are_named_never_echoed(value, problem):
    with pytest.raises(SpecError) as err:
        parse_spec(f"network:\n  proxyToken: {value}\n  allowlist: []\n")
    assert len(err.value.problems) == 1
    assert "network.proxyToken" in err.value.problems[0] and problem in err.value.problems[0]
    assert "a b" not in err.value.problems[0] and "tök" not in err.value.problems[0]


def test_a_token_is_never_printed():
    spec = parse_spec(spec_text())
    assert TOKEN not in repr(spec) and TOKEN not in str(spec.proxy_token)


# -- proof of environment ---------------------------------------------------------------------


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


SPECS = {"env-a": parse_spec(spec_text()), "env-b": parse_spec(spec_text(token="other-token")), "open": parse_spec(spec_text(token=None))}


@pytest.mark.parametrize(
    "value, environment, named",
    [
        (header("env-a", TOKEN), "env-a", "env-a"),
        ("basic  " + base64.b64encode(f"env-a:{TOKEN}".encode()).decode() + " ", "env-a", "env-a"),
        (header("env-a", "other-token"), None, "env-a"),  # env-b's token does not open env-a
        (header("env-b", TOKEN), None, "env-b"),
        (header("env-z", TOKEN), None, ""),  # unknown: never named
        (header("open", ""), None, "open"),  # no token configured: refuses everyone
        (header("open", "x"), None, "open"),
        (header("env-a", TOKEN + "x"), None, "env-a"),
        (header("env-a", TOKEN[:-1]), None, "env-a"),
        (None, None, ""),
        ("", None, ""),
        ("Bearer " + TOKEN, None, ""),
        ("Basic", None, ""),
        ("Basic ***", None, ""),
        ("Basic " + base64.b64encode(b"env-a").decode(), None, ""),
        ("Basic " + base64.b64encode(b"\xff:\xfe").decode(), None, ""),
    ],
)
def test_authenticate(value, environment, named):
    result = proxy_auth.authenticate(value, SPECS.get)
    assert (result.environment, result.named) == (environment, named)


def test_token_with_colon_is_the_whole_password():
    spec = parse_spec(spec_text(token="'a:b:c'"))
    assert proxy_auth.authenticate(header("x", "a:b:c"), {"x": spec}.get).environment == "x"


# -- per-file reload ----------------------------------------------------------------------------


def counter(environment: str, result: str) -> float:
    return metrics.ENVIRONMENT_RELOADS.labels(environment, result)._value.get()


def test_registry_reloads_each_file_on_its_own(tmp_path, capsys):
    d = tmp_path / "envs"
    configmap(d, {"a.yaml": spec_text("a.test"), "b.yaml": spec_text("b.test")}, 1)
    registry = EnvironmentRegistry(d)
    assert registry.environments == ["a", "b"] and not registry.changed()
    spec_b = registry.spec("b")

    # Changed (a ConfigMap swap): a is new, b is the very same object.
    configmap(d, {"a.yaml": spec_text("a2.test"), "b.yaml": spec_text("b.test")}, 2)
    assert registry.changed()
    before = counter("a", "success")
    assert registry.reload("file_changed")
    assert registry.spec("a").allowlist.match("a2.test") is not None and registry.spec("b") is spec_b
    assert counter("a", "success") == before + 1 and not registry.changed()

    # Added.
    configmap(d, {"a.yaml": spec_text("a2.test"), "b.yaml": spec_text("b.test"), "c.yaml": spec_text("c.test")}, 3)
    assert registry.reload("file_changed") and registry.environments == ["a", "b", "c"]
    assert metrics.ENVIRONMENTS._value.get() == 3

    # Broken: the last good spec stays, the failure is counted with the environment, not retried.
    good_c = registry.spec("c")
    failures = counter("c", "failure")
    configmap(d, {"a.yaml": spec_text("a2.test"), "b.yaml": spec_text("b.test"), "c.yaml": "network: ["}, 4)
    assert not registry.reload("file_changed")
    assert registry.spec("c") is good_c and counter("c", "failure") == failures + 1
    assert not registry.changed()
    assert "environment_reload_failed" in capsys.readouterr().err

    # Removed: gone from the registry.
    configmap(d, {"a.yaml": spec_text("a2.test")}, 5)
    assert registry.changed() and registry.reload("file_changed")
    assert registry.environments == ["a"] and registry.spec("b") is None and registry.spec("c") is None
    assert metrics.ENVIRONMENTS._value.get() == 1


def test_registry_watches_secret_files_and_refuses_bad_names_later(tmp_path, capsys):
    d = tmp_path / "envs"
    d.mkdir()
    token_file = tmp_path / "token"
    token_file.write_text("one")
    (d / "a.yaml").write_text(spec_text(token=f"${{file:{token_file}}}"))
    registry = EnvironmentRegistry(d)
    assert registry.spec("a").proxy_token.reveal() == "one"
    token_file.write_text("two-longer")
    assert registry.changed() and registry.reload("file_changed")
    assert registry.spec("a").proxy_token.reveal() == "two-longer"

    (d / "Bad.yaml").write_text(spec_text())
    failures = counter("", "failure")
    assert not registry.reload("file_changed")
    assert counter("", "failure") == failures + 1 and registry.environments == ["a"]
    assert not registry.changed()  # not retried until the file changes
    assert TOKEN not in capsys.readouterr().err


def test_registry_start_is_strict(tmp_path):
    (tmp_path / "a.yaml").write_text("network: [")
    with pytest.raises(SpecError) as err:
        EnvironmentRegistry(tmp_path)
    assert "a.yaml" in err.value.problems[0]


# -- the CLI ----------------------------------------------------------------------------------------


def egress_proxy(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("egress-proxy")
    return subprocess.run([str(script), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)


def test_check_spec_dir(tmp_path):
    (tmp_path / "a.yaml").write_text(spec_text())
    (tmp_path / "open.yaml").write_text(spec_text(token=None))
    out = egress_proxy("check", "--spec-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{tmp_path / 'open.yaml'}: note: no network.proxyToken, so this environment refuses every client",
        f"{tmp_path}: ok (2 environments, 2 allowlist entries)",
    ]
    (tmp_path / "b.yaml").write_text("network:\n  proxyToken: 'a b'\n  allowlist: [{domain: 'x.test', extra: 1}]\n")
    out = egress_proxy("check", "--spec-dir", str(tmp_path))
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 2 and all(line.startswith(str(tmp_path / "b.yaml")) for line in out.stderr.splitlines())
    assert TOKEN not in out.stdout + out.stderr


def test_spec_and_spec_dir_are_exclusive(tmp_path):
    for command in ("run", "check"):
        out = egress_proxy(command, "--spec", "x.yaml", "--spec-dir", str(tmp_path))
        assert out.returncode == 2 and "not allowed with argument --spec" in out.stderr
        out = egress_proxy(command)
        assert out.returncode == 2 and "one of the arguments --spec --spec-dir is required" in out.stderr


def test_spec_dir_needs_regular_mode(tmp_path):
    (tmp_path / "a.yaml").write_text(spec_text())
    out = egress_proxy("run", "--spec-dir", str(tmp_path), "--mode", "transparent", "--confdir", str(tmp_path / "c"))
    assert out.returncode == 2 and "--spec-dir needs --mode regular" in out.stderr


def test_unreadable_directory_keeps_serving_and_is_reported_once(tmp_path, capsys):
    d = tmp_path / "envs"
    d.mkdir()
    (d / "a.yaml").write_text(spec_text())
    registry = EnvironmentRegistry(d)
    moved = tmp_path / "elsewhere"
    d.rename(moved)
    failures = counter("", "failure")
    for _ in range(3):
        assert not registry.reload("file_changed")
    assert registry.environments == ["a"] and counter("", "failure") == failures + 1
    assert capsys.readouterr().err.count("spec_dir_unreadable") == 1
    moved.rename(d)
    assert registry.reload("file_changed") and registry.environments == ["a"]


def test_traffic_of_no_client_connection_gets_a_spec_that_allows_nothing(tmp_path):
    """With --spec-dir, a check that names no client connection (a DNS query, a forgotten
    argument) is held to a spec that allows nothing, never to some environment's."""
    from egress.addons.environment_gate import ALLOWS_NOTHING, EnvironmentGate
    from egress.net.destinations import DestinationChecker
    from egress.net.resolver import LocalAddresses
    from egress.ops.audit import DecisionLog

    (tmp_path / "a.yaml").write_text(spec_text("'*'"))
    gate = EnvironmentGate(EnvironmentRegistry(tmp_path), DecisionLog())
    checker = DestinationChecker(gate.spec_for, LocalAddresses(["127.0.0.1"]))
    assert checker.spec is ALLOWS_NOTHING and checker.spec_for("some-client") is ALLOWS_NOTHING
    gate.bound["some-client"] = "a"
    assert checker.spec_for("some-client").environment == "a"
    single = tmp_path / "single.yaml"
    single.write_text(spec_text("'*'"))
    holder = SpecHolder(single)
    assert DestinationChecker(EnvironmentGate(holder, DecisionLog()).spec_for, LocalAddresses([])).spec is holder.spec
