#!/usr/bin/env bash
# Builds the egress-proxy container image from the Dockerfile with podman.
#
#   scripts/build-image.sh [--base auto|registry|local] [--tag NAME:TAG] [--rebuild-base]
#
# --base registry  the Dockerfile's own base (ARG PYTHON_IMAGE, python:*-slim) from
#                  docker.io: what a release is built on.
# --base local     a base made here without any container registry: mmdebstrap of
#                  Debian (SUITE, default trixie: Python 3.13) from the mirror apt
#                  already uses, with `python3 -m venv /usr/local` so the layout
#                  matches python:slim (python, pip on PATH in /usr/local/bin), then
#                  `podman import`. Cached as localhost/egress-base:SUITE; made again
#                  with --rebuild-base. For CI and air-gapped machines, not releases.
# --base auto      (default) registry if the base can be pulled, else local.
#
# The machine's CA bundle and pip index settings are mounted into the build's RUN
# steps only (never into the image), so the build works behind an intercepting
# proxy or a private index; on a plain machine nothing is mounted but the bundle.
# Logs go to stderr; the last line on stdout is the image reference.
set -euo pipefail
cd "$(dirname "$0")/.."
base=auto tag="" rebuild_base=0
suite=${EGRESS_BASE_SUITE:-trixie}
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --base=*) base=${1#--base=}; shift ;;
    --tag) tag=$2; shift 2 ;;
    --tag=*) tag=${1#--tag=}; shift ;;
    --rebuild-base) rebuild_base=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$base" in auto|registry|local) ;; *) echo "error: --base must be auto, registry or local, not '$base'" >&2; exit 2 ;; esac
podman=(scripts/podman.sh)
log() { echo "build-image: $*" >&2; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
tag=${tag:-localhost/egress-proxy:$version}

# The Dockerfile's default base, e.g. python:3.12.12-slim-bookworm, fully qualified
# (podman does not guess a registry for short names).
dockerfile_base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile | head -1)
[ -n "$dockerfile_base" ] || { echo "error: no 'ARG PYTHON_IMAGE=' in Dockerfile" >&2; exit 1; }
case "$dockerfile_base" in
  */*) registry_base=$dockerfile_base ;;
  *) registry_base=docker.io/library/$dockerfile_base ;;
esac

# The Debian mirror apt uses on this machine (deb822 .sources or one-line .list), else Debian's CDN.
debian_mirror() {
  local uri
  uri=$( { sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null
           sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' \
             /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null; } \
         | tr ' ' '\n' | grep -E '^https?://' | grep -E '/debian/?$' | head -1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

make_local_base() {
  local ref=localhost/egress-base:$suite mirror work
  if [ "$rebuild_base" = 0 ] && "${podman[@]}" image exists "$ref"; then
    log "local base $ref (cached; --rebuild-base to make it again)"
    echo "$ref"; return
  fi
  command -v mmdebstrap >/dev/null || { echo "error: --base local needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
  mirror=$(debian_mirror)
  if ! curl -fsS -o /dev/null --max-time 30 "$mirror/dists/$suite/InRelease"; then
    # bookworm's python3 is 3.11, below the package's requires-python (>= 3.12).
    echo "error: the mirror $mirror does not serve Debian $suite (needed for Python >= 3.12); set EGRESS_BASE_SUITE or use --base registry" >&2
    exit 1
  fi
  work=$(mktemp -d /var/tmp/egress-base.XXXXXX)
  log "making local base $ref: mmdebstrap $suite from $mirror"
  # python3-venv brings ensurepip; ca-certificates for pip's TLS; passwd (useradd) and
  # apt are in minbase, which the Dockerfile's final stage uses.
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --customize-hook='chroot "$1" python3 -m venv /usr/local' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$suite" "$work/rootfs.tar" "$mirror" >&2
  "${podman[@]}" import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$ref" >/dev/null
  rm -rf "$work"
  echo "$ref"
}

# RUN steps get the machine's trust store and pip settings, at the paths they name.
build_mounts=()
bundle=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
if [ -f "$bundle" ]; then
  build_mounts+=(-v "$bundle:/etc/ssl/certs/ca-certificates.crt:ro")
  [ "$bundle" = /etc/ssl/certs/ca-certificates.crt ] || build_mounts+=(-v "$bundle:$bundle:ro")
fi
pip_conf_dir=$(mktemp -d)
trap 'rm -rf "$pip_conf_dir"' EXIT
# The Dockerfile runs `pip --isolated` (environment and user config ignored, global
# config read): index settings from this machine's global config and PIP_* variables
# go into one global file. Local-only settings (find-links, constraints) stay out.
if command -v python3 >/dev/null && python3 - "$pip_conf_dir/pip.conf" <<'PY'
import configparser, os, sys
keys = ("index-url", "extra-index-url", "trusted-host", "cert", "client-cert", "timeout", "default-timeout", "retries", "proxy")
merged = {}
for path in ("/etc/xdg/pip/pip.conf", "/etc/pip.conf"):
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error:
        continue
    for section in ("global", "install"):
        if parser.has_section(section):
            merged.update({k: v for k, v in parser.items(section) if k in keys})
for key in keys:
    value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if value:
        merged[key] = value
if not merged:
    sys.exit(1)
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in merged.items()))
PY
then
  build_mounts+=(-v "$pip_conf_dir/pip.conf:/etc/pip.conf:ro")
  log "pip settings for the build: $(sed -n 's/ = .*//p' "$pip_conf_dir/pip.conf" | tr '\n' ' ')"
  for file in $(sed -n 's/^\(cert\|client-cert\) = //p' "$pip_conf_dir/pip.conf"); do
    [ -f "$file" ] && [ "$file" != /etc/ssl/certs/ca-certificates.crt ] && build_mounts+=(-v "$file:$file:ro")
  done
fi

case "$base" in
  registry) base_image=$registry_base ;;
  local) base_image=$(make_local_base) ;;
  auto)
    if "${podman[@]}" image exists "$registry_base" \
       || timeout 120 "${podman[@]}" pull -q "$registry_base" >/dev/null 2>&1; then
      base_image=$registry_base
    else
      log "cannot pull $registry_base; using a locally made base"
      base_image=$(make_local_base)
    fi ;;
esac
log "building $tag on $base_image"
# --network host: RUN steps (apt, pip) reach the network exactly as this machine does.
"${podman[@]}" build --network host --build-arg "PYTHON_IMAGE=$base_image" \
  "${build_mounts[@]}" -t "$tag" -f Dockerfile . >&2
echo "$tag"
