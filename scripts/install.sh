#!/usr/bin/env bash
# Creates .venv with a Python >= 3.12 and installs egress-proxy into it from a
# freshly built wheel (so what runs is what users install, not the source tree).
# Usage: scripts/install.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."
# One install at a time: concurrent runs would share setuptools' build/ directory.
exec 9>"${TMPDIR:-/tmp}/egress-install.lock"
flock 9
py=$(scripts/find-python.sh)
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  rm -rf .venv
  "$py" -m venv .venv
fi
# --isolated: ignore machine-wide pip configuration (constraints, find-links) so the
# pins in pyproject.toml are what gets installed.
pip=(.venv/bin/python -m pip --isolated --disable-pip-version-check -q)
"${pip[@]}" install "setuptools==84.2.1" "wheel==0.48.0" "build==1.6.1"
dist=$(mktemp -d)
trap 'rm -rf "$dist" build' EXIT
rm -rf build
.venv/bin/python -m build --wheel --no-isolation --outdir "$dist" . >/dev/null 2>&1 || .venv/bin/python -m build --wheel --no-isolation --outdir "$dist" .
wheel=$(ls "$dist"/egress_proxy-*.whl)
if [ "${1:-}" = "--test" ]; then
  "${pip[@]}" install --force-reinstall --no-deps "$wheel"
  "${pip[@]}" install "${wheel}[test]"
else
  "${pip[@]}" install --force-reinstall --no-deps "$wheel"
  "${pip[@]}" install "$wheel"
fi
rm -rf build
