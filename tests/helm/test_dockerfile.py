"""The Dockerfile, checked statically: the dependency pins, the user the chart expects,
the entrypoint the chart's commands rely on. The image itself is built and run with
podman by tests/image/ (skipped where podman cannot run)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import tomllib

import yaml
from helm.chart_util import CHART, REPO
from packaging.requirements import Requirement

DOCKERFILE = (REPO / "Dockerfile").read_text(encoding="utf-8")
CONSTRAINTS = REPO / "docker" / "constraints.txt"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_multi_stage_with_pinned_base():
    froms = [arg for op, arg in _instructions() if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build")
    base = next(
        arg
        for op, arg in _instructions()
        if op == "ARG" and arg.startswith("PYTHON_IMAGE=")
    )
    assert re.fullmatch(
        r"PYTHON_IMAGE=python:3\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base
    ), base


def test_runs_as_the_chart_user_with_egress_proxy_entrypoint():
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    ops = _instructions()
    user = [arg for op, arg in ops if op == "USER"][-1]
    uid = values["podSecurityContext"]["runAsUser"]
    assert user == f"{uid}:{values['podSecurityContext']['runAsGroup']}" and uid != 0
    assert values["sidecar"]["proxyUid"] == uid
    assert json.loads([arg for op, arg in ops if op == "ENTRYPOINT"][-1]) == [
        "egress-proxy"
    ]
    # The transparent init container pipes the rules to nft.
    assert "nftables" in DOCKERFILE


def test_constraints_pin_every_runtime_dependency():
    """docker/constraints.txt pins the whole runtime closure; the direct dependencies at
    exactly the versions of pyproject.toml. Regenerate it after changing them."""
    pins = {_norm(k): v for k, v in _pins().items()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"
    ]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        (spec,) = req.specifier
        assert spec.operator == "==", dep
        assert pins.get(_norm(req.name)) == spec.version, (
            f"{req.name}: {pins.get(_norm(req.name))} != {spec.version}"
        )

    seen: set[str] = set()

    def walk(name: str) -> None:
        dist = importlib.metadata.distribution(name)
        key = _norm(dist.metadata["Name"])
        if key in seen:
            return
        seen.add(key)
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                walk(req.name)

    walk("egress-proxy")
    missing = sorted(seen - set(pins) - {"egress-proxy"})
    assert not missing, f"not pinned in {CONSTRAINTS.relative_to(REPO)}: {missing}"


def test_build_context_is_minimal():
    """.dockerignore excludes everything but what the Dockerfile copies (no .venv, .git, tests)."""
    ignore = {
        line.strip().rstrip("/")
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    }
    assert "*" in ignore
    for op, arg in _instructions():
        if op == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                assert f"!{source.rstrip('/')}" in ignore, source
