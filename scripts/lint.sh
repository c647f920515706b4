#!/usr/bin/env bash
# Static checks: ruff (pyflakes, bugbear, pyupgrade, import order) on the code and its
# tests, and mypy on egress/, both configured in pyproject.toml. Installs the versions
# pinned in the `lint` extra into .venv first (scripts/install.sh makes .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t pins < <(.venv/bin/python -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["lint"]))')
.venv/bin/python -m pip --isolated --disable-pip-version-check -q install "${pins[@]}"
echo "ruff: egress/ addons/ tests/ bench/ examples/"
.venv/bin/ruff check egress/ addons/ tests/ bench/ examples/
echo "mypy: egress/"
.venv/bin/mypy
