#!/usr/bin/env bash
# One command for a fresh machine: install egress-proxy into .venv and run it on
# the bundled example spec. Extra arguments go to `egress-proxy run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
# The example injects a GitHub token from the environment; a placeholder keeps the
# five-minute start working (set EXAMPLE_GITHUB_TOKEN to try injection for real).
export EXAMPLE_GITHUB_TOKEN="${EXAMPLE_GITHUB_TOKEN:-placeholder-token}"
exec .venv/bin/egress-proxy run --spec examples/spec.yaml "$@"
