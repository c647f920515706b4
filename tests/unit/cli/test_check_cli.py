"""`egress-proxy check --spec FILE` as users run it: a real subprocess per spec."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CANARY = "canary-51d0e2-SECRET-do-not-print"


def _command() -> list[str]:
    # The installed console script when there is one, else the module it points at.
    script = Path(sys.executable).with_name("egress-proxy")
    if script.exists():
        return [str(script)]
    if found := shutil.which("egress-proxy"):
        return [found]
    return [sys.executable, "-m", "egress.cli"]


def run_check(
    path: Path, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in {"CANARY_TOKEN", "API_TOKEN"}
    }
    env["PYTHONPATH"] = str(ROOT)
    env.update(env_extra or {})
    return subprocess.run(
        [*_command(), "check", "--spec", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _write(tmp_path: Path, network: dict, name: str = "spec.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"type": "remote", "network": network}))
    return path


def _entry(transform: dict) -> dict:
    return {
        "allowlist": [
            {"domain": "ok.example.com"},
            {"domain": "api.example.com", "transform": transform},
        ]
    }


BAD = [
    ({"allowlist": [{"domain": "*host"}]}, "network.allowlist[0].domain"),
    ({"allowlist": [{"domain": "*.com"}]}, "network.allowlist[0].domain"),
    ({"allowlist": [{"domain": "*.co.uk"}]}, "network.allowlist[0].domain"),
    (
        {"allowlist": [{"domain": "*", "transform": {"Authorization": "x"}}]},
        "network.allowlist[0].transform",
    ),
    (_entry({"Bad Header": "v"}), "network.allowlist[1].transform"),
    (_entry({"X:Y": "v"}), "network.allowlist[1].transform"),
    (_entry({"Host": "h.example"}), "network.allowlist[1].transform.Host"),
    (_entry({"X-A": "a\r\nX-Evil: 1"}), "network.allowlist[1].transform.X-A"),
    (_entry({"X-A": "a\0b"}), "network.allowlist[1].transform.X-A"),
    (
        _entry({"X-A": "${env:MISSING_EGRESS_TEST_VAR}"}),
        "network.allowlist[1].transform.X-A",
    ),
    (
        _entry({"X-A": "${file:/nonexistent/egress-test}"}),
        "network.allowlist[1].transform.X-A",
    ),
    (_entry({"X-A": "${file:relative/path}"}), "network.allowlist[1].transform.X-A"),
    (_entry({"X-A": "${vault:x}"}), "network.allowlist[1].transform.X-A"),
    (
        {"allowlist": [{"domain": "a.example.com"}, {"domain": "A.example.com"}]},
        "network.allowlist[1].domain",
    ),
    (
        {"allowlist": [{"domain": "a.example.com", "bogus": 1}]},
        "network.allowlist[0].bogus",
    ),
    ({"allowlist": [], "mode": "block"}, "network.mode"),
    ({"allowlist": [], "allowCidrs": ["127.0.0.0/8"]}, "network.allowCidrs[0]"),
]


@pytest.mark.parametrize(
    ("network", "path"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)]
)
def test_bad_spec(tmp_path, network, path):
    spec = _write(tmp_path, network)
    result = run_check(spec)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines == [line for line in lines if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{spec}: {path}: ")
    assert result.stdout == ""


def test_several_problems_one_line_each(tmp_path):
    spec = _write(
        tmp_path,
        {
            "mode": "block",
            "allowlist": [
                {"domain": "*.com"},
                {
                    "domain": "ok.example.com",
                    "transform": {"Bad Header": "x", "X-A": "a\r\nb"},
                },
                {"domain": "*", "transform": {"A": "b"}},
            ],
        },
    )
    result = run_check(spec)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    fields = [
        re.match(rf"{re.escape(str(spec))}: (\S+): ", line).group(1)
        for line in result.stderr.splitlines()
    ]
    assert sorted(fields) == sorted(
        [
            "network.mode",
            "network.allowlist[0].domain",
            "network.allowlist[1].transform",
            "network.allowlist[1].transform.X-A",
            "network.allowlist[2].transform",
        ]
    )


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_secret_never_printed(tmp_path, suffix):
    network = {
        "allowlist": [
            {
                "domain": "a.example.com",
                "transform": {"Authorization": "Bearer ${env:CANARY_TOKEN}"},
            },
            {
                "domain": "b.example.com",
                "transform": {"X-Other": "${env:CANARY_TOKEN}"},
            },
        ]
    }
    path = tmp_path / f"spec.{suffix}"
    path.write_text(json.dumps({"network": network}))
    # The value itself carries the CR/LF problem, so the validator has to look at it.
    result = run_check(path, {"CANARY_TOKEN": f"{CANARY}\r\nX-Evil: 1"})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 2
    assert all("CR or LF" in line for line in result.stderr.splitlines())
    assert CANARY not in result.stderr + result.stdout
    assert "51d0e2" not in result.stderr + result.stdout


def test_valid_spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "type: remote\n"
        "network:\n"
        "  mode: report\n"
        "  allowCidrs: [10.0.0.0/8]\n"
        "  allowlist:\n"
        "    - domain: telemetry.example.com\n"
        "      transform:\n"
        "        Authorization: Bearer ${env:API_TOKEN}\n"
        "    - domain: '*.example.org'\n"
        "    - domain: '*'\n"
    )
    result = run_check(path, {"API_TOKEN": CANARY})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "3 allowlist entries" in result.stdout
    assert "report" in result.stdout
    assert CANARY not in result.stdout


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("spec.json", '{\n  "network": {\n    "allowlist": [,]\n  }\n}\n', 3),
        (
            "spec.yaml",
            "network:\n  allowlist:\n    - domain: a.example.com\n   - domain: b\n",
            4,
        ),
        ("spec.yaml", "network: {allowlist: [\n\n", 3),
    ],
)
def test_malformed_document(tmp_path, name, text, line):
    path = tmp_path / name
    path.write_text(text)
    result = run_check(path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert f"line {line}" in result.stderr


@pytest.mark.parametrize("kind", ["missing", "nested"])
def test_unusable_file(tmp_path, kind):
    path = tmp_path / "spec.json"
    if kind == "nested":
        path.write_text("[" * 50000)
    result = run_check(path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1
