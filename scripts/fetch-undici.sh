#!/usr/bin/env bash
# Puts undici (Node's own fetch implementation, with ProxyAgent/EnvHttpProxyAgent) at
# .tools/node_modules/undici, for tests/e2e/test_attack_gateway.py: node 20's global
# fetch has no proxy support, and sandboxes that use a proxy from node do it through
# undici. Pinned; taken from the npm registry.
set -euo pipefail
cd "$(dirname "$0")/.."
version=6.29.1
installed=$(node -p 'require("./.tools/node_modules/undici/package.json").version' 2>/dev/null || true)
[ "$installed" = "$version" ] && exit 0
mkdir -p .tools
npm install -q --no-audit --no-fund --no-save --prefix .tools "undici@$version" >/dev/null
node -e 'require("./.tools/node_modules/undici").ProxyAgent' >/dev/null
