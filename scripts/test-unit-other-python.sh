#!/usr/bin/env bash
# Runs the unit tests (tests/unit) under a second Python: 3.12 when .venv has 3.13,
# and the other way round. Address classification and host parsing lean on the
# standard library's `ipaddress`, whose answers changed between releases; the
# decision must not (issue 14). Uses its own venv, .venv-other, from the same wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
main=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if ! py=$(scripts/find-python.sh --other-than "$main"); then
  if [ -n "${CI:-}" ]; then
    echo "error: CI runs tests/unit under a second Python >= 3.12 and found none besides $main" >&2
    exit 1
  fi
  echo "warning: no Python >= 3.12 other than $main; tests/unit ran under $main only" >&2
  exit 0
fi
echo "tests/unit under $("$py" -c 'import sys; print(sys.version.split()[0])') ($py), in .venv-other"
EGRESS_VENV=.venv-other EGRESS_PYTHON="$py" scripts/install.sh --test
.venv-other/bin/pytest -q -p no:cacheprovider tests/unit
