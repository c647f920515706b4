"""Fixtures for the Helm chart tests: the real helm binary and rendered manifests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helm.chart_util import CHART, find_helm, helm_template

Render = Callable[..., list[dict]]


@pytest.fixture(scope="session")
def helm() -> str:
    return find_helm()


@pytest.fixture(scope="session")
def render(helm: str) -> Render:
    """`helm template` → list of manifests (dicts), in output order; fails the test on a render error."""

    def _render(
        *values_files: Path,
        set_values: dict | None = None,
        chart: Path = CHART,
        extra=(),
    ) -> list[dict]:
        out = helm_template(
            helm, *values_files, set_values=set_values, chart=chart, extra=extra
        )
        assert out.returncode == 0, out.stderr
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]

    return _render
