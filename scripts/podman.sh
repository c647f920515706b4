#!/usr/bin/env bash
# Runs podman with the settings scripts/build-image.sh and tests/image/ need on any
# machine, written to a containers.conf that CONTAINERS_CONF points at:
#   - runc as the OCI runtime: crun fails on hosts with the hybrid cgroup v1/v2 layout;
#   - default ulimits within the host's hard limits: podman's defaults (nofile
#     1048576) exceed them on many machines, and runc then fails to start anything.
# A CONTAINERS_CONF already set by the caller is used as it is.
# Usage: scripts/podman.sh PODMAN-ARGS...   (or `--print-conf`: the file's path)
set -euo pipefail
if [ -z "${CONTAINERS_CONF:-}" ]; then
  dir=${EGRESS_PODMAN_CONF_DIR:-/var/tmp/egress-podman}
  mkdir -p "$dir"
  cap() { # min(host hard limit, 32768); "unlimited" counts as high
    local hard=$1
    if [ "$hard" = unlimited ] || [ "$hard" -gt 32768 ]; then echo 32768; else echo "$hard"; fi
  }
  nofile=$(cap "$(ulimit -Hn)")
  nproc=$(cap "$(ulimit -Hu)")
  conf="$dir/containers.conf"
  want=$(printf '%s\n' \
    "# Written by scripts/podman.sh (egress); see the comment there." \
    "[containers]" \
    "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]" \
    "[engine]" \
    "runtime = \"runc\"")
  if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$want" ]; then
    tmp=$(mktemp "$dir/containers.conf.XXXXXX")
    printf '%s\n' "$want" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$conf"  # atomic: concurrent callers never read half a file
  fi
  export CONTAINERS_CONF="$conf"
fi
if [ "${1:-}" = "--print-conf" ]; then
  echo "$CONTAINERS_CONF"
  exit 0
fi
exec podman "$@"
