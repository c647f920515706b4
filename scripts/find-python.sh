#!/usr/bin/env bash
# Prints the path of a Python >= 3.12: PATH first, then pyenv's versions folder.
# (pyenv shims can point at versions that are not activated, so each candidate is
# asked for its own version instead of trusting its name.)
# Usage: scripts/find-python.sh [--other-than X.Y]   (a Python >= 3.12 that is not X.Y)
set -euo pipefail
other_than=
if [ "${1:-}" = "--other-than" ]; then other_than=${2:?--other-than needs a version such as 3.13}; fi
ok() {
  "$1" -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(0 if sys.version_info >= (3, 12) and v != sys.argv[1] else 1)' "$other_than" >/dev/null 2>&1
}
for name in python3.13 python3.12 python3 python; do
  if p=$(command -v "$name" 2>/dev/null) && ok "$p"; then echo "$p"; exit 0; fi
done
root=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
for p in $(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do
  if ok "$p"; then echo "$p"; exit 0; fi
done
echo "error: no Python >= 3.12${other_than:+ other than $other_than} found on PATH or in pyenv ($root/versions)" >&2
exit 1
