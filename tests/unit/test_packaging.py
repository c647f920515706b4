"""The package as users install it: from a wheel, one top-level name."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path


def test_wheel_installs_only_the_egress_package():
    files = importlib.metadata.distribution("egress-proxy").files or []
    top_level = {f.parts[0] for f in files if not f.parts[0].endswith((".dist-info", ".data")) and f.parts[0] != ".."}
    assert top_level == {"egress"}


def test_console_scripts_run_from_the_installed_wheel(tmp_path):
    """`egress-proxy` and `egress-hooks` work outside the source tree (cwd elsewhere, no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import egress, sys; print(egress.__file__)"
    where = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    if os.environ.get("CI"):
        # What CI tests must be the installed wheel, not the checkout.
        assert "site-packages" in Path(where.stdout.strip()).parts, where.stdout
    bin_dir = Path(sys.executable).parent
    spec = tmp_path / "spec.yaml"
    spec.write_text("network: {allowlist: [{domain: example.com}]}\n")
    out = subprocess.run([bin_dir / "egress-proxy", "check", "--spec", spec], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([bin_dir / "egress-hooks", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "dispatch" in out.stdout


def test_version_flags_print_the_installed_package_version(tmp_path):
    """`--version` answers with the version of the installed distribution and exits 0."""
    import egress

    installed = importlib.metadata.version("egress-proxy")
    assert egress.__version__ == installed  # pyproject.toml and egress/__init__.py agree
    bin_dir = Path(sys.executable).parent
    for command in ("egress-proxy", "egress-hooks"):
        out = subprocess.run([bin_dir / command, "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"{command} {installed}\n"
        assert out.stderr == ""
