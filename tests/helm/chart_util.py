"""Helpers for the Helm chart tests: where things are, `helm template`, manifest lookups."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "egress-proxy"
CI_VALUES = {
    p.stem.removesuffix("-values"): p
    for p in sorted((CHART / "ci").glob("*-values.yaml"))
}
BIN = Path(sys.executable).parent


def find_tool(name: str) -> str:
    """A console script of this environment (egress-proxy, kubernetes-validate), else PATH."""
    local = BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        pytest.fail(
            f"{name} not found next to {sys.executable} or on PATH (scripts/install.sh --test installs it)"
        )
    return found


def kubernetes_validate(version: str, *files: str | Path) -> subprocess.CompletedProcess:
    """`kubernetes-validate --strict` for one Kubernetes version, kept offline."""
    return subprocess.run(
        [find_tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, *map(str, files)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        # A proxy that refuses everything: the validation must not need the network.
        env={**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"},
    )


def find_helm() -> str:
    local = REPO / ".tools" / "helm"
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if not found:
        pytest.fail(
            "helm not found at .tools/helm or on PATH: run scripts/fetch-helm.sh"
        )
    return found


def helm_template(
    helm: str,
    *values_files: Path,
    set_values: dict[str, str] | None = None,
    chart: Path = CHART,
    extra=(),
) -> subprocess.CompletedProcess[str]:
    cmd = [helm, "template", "rel", str(chart), "--namespace", "sandboxes"]
    for f in values_files:
        cmd += ["-f", str(f)]
    for key, value in (set_values or {}).items():
        cmd += ["--set-string" if isinstance(value, str) else "--set", f"{key}={value}"]
    cmd += list(extra)
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [
        d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(found) == 1, (
        f"expected one {kind} named *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def all_containers(spec: dict) -> list[dict]:
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def container(spec: dict, name: str) -> dict:
    found = [c for c in all_containers(spec) if c["name"] == name]
    assert len(found) == 1, (
        f"container {name!r}: {[c['name'] for c in all_containers(spec)]}"
    )
    return found[0]
