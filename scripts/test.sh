#!/usr/bin/env bash
# One command for a fresh machine: installs system tools the tests drive (Debian/apt),
# builds and installs the package into .venv, then runs the whole test suite.
# End-to-end tests create network namespaces and therefore need root.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
# podman, runc, mmdebstrap, newuidmap: tests/image/ builds and runs the container image.
# caddy: a Go TLS server (crypto/tls) for tests/e2e/test_attack_tunnel.py.
# kdig, drill, busybox, musl-gcc, wget, dnspython: the DNS clients of tests/e2e/test_dns_clients.py.
for tool in curl git node caddy ip nft iptables prometheus promtool wrk hey nginx squid openssl dnsmasq dig dnsperf getent podman runc mmdebstrap newuidmap kdig drill busybox musl-gcc wget; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
/usr/bin/python3 -c "import dns.resolver" >/dev/null 2>&1 || need+=("python3-dnspython")
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq curl git nodejs caddy iproute2 nftables iptables prometheus wrk hey nginx-light squid openssl \
      dnsmasq-base bind9-dnsutils dnsperf podman runc mmdebstrap uidmap \
      knot-dnsutils ldnsutils busybox musl-tools wget python3-dnspython >/dev/null
    # The Debian packages start services we do not want; tests start their own.
    for svc in prometheus nginx squid caddy; do systemctl stop "$svc" >/dev/null 2>&1 || service "$svc" stop >/dev/null 2>&1 || true; done
  else
    echo "warning: missing tools (${need[*]}); tests that need them will fail" >&2
  fi
fi
scripts/install.sh --test
scripts/fetch-helm.sh
scripts/fetch-undici.sh
if [ $# -eq 0 ]; then
  # The full run (CI): static checks, and the unit tests under a second Python too.
  scripts/lint.sh
  scripts/test-unit-other-python.sh
fi
exec .venv/bin/pytest "$@"
