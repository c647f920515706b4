#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 and installs egress-proxy into it from a
# freshly built wheel (so what runs is what users install, not the source tree).
# Usage: scripts/install.sh [--test]
# EGRESS_VENV (default .venv) and EGRESS_PYTHON (default: scripts/find-python.sh) choose
# another venv and interpreter (scripts/test-unit-other-python.sh uses them).
set -euo pipefail
cd "$(dirname "$0")/.."
# One install at a time: concurrent runs would share setuptools' build/ directory.
exec 9>"${TMPDIR:-/tmp}/egress-install.lock"
flock 9
py=${EGRESS_PYTHON:-$(scripts/find-python.sh)}
venv=${EGRESS_VENV:-.venv}
# With EGRESS_PYTHON, an existing venv of another minor version is made anew.
want=${EGRESS_PYTHON:+$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12) or sys.argv[1] not in ("", "%d.%d" % sys.version_info[:2]))' "$want"; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi
# --isolated: ignore machine-wide pip configuration (constraints, find-links) so the
# pins in pyproject.toml are what gets installed.
pip=("$venv/bin/python" -m pip --isolated --disable-pip-version-check -q)
"${pip[@]}" install "setuptools==84.2.1" "wheel==0.48.0" "build==1.6.1"
dist=$(mktemp -d)
trap 'rm -rf "$dist" build' EXIT
rm -rf build
"$venv/bin/python" -m build --wheel --no-isolation --outdir "$dist" . >/dev/null 2>&1 || "$venv/bin/python" -m build --wheel --no-isolation --outdir "$dist" .
wheel=$(ls "$dist"/egress_proxy-*.whl)
if [ "${1:-}" = "--test" ]; then
  "${pip[@]}" install --force-reinstall --no-deps "$wheel"
  "${pip[@]}" install "${wheel}[test]"
else
  "${pip[@]}" install --force-reinstall --no-deps "$wheel"
  "${pip[@]}" install "$wheel"
fi
rm -rf build
