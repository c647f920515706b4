"""The address decision is the same under every supported Python.

`ipaddress.is_global` answers differently under Python 3.12.1 and 3.13.0 (the
CVE-2024-4032 tables): a classifier that fell back to it dialled ORCHIDv2 under one
and refused it under the other. This runs the installed `egress/policy/addresses.py` (it
imports only the standard library) under each interpreter found and compares every
decision over the registry table and an SSRF-style corpus.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import egress.policy.addresses

# Run in each interpreter: decisions for the samples of every table entry, plus corpus.
PROBE = r"""
import importlib.util, ipaddress, json, sys
spec = importlib.util.spec_from_file_location("addresses_probe", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["addresses_probe"] = mod
spec.loader.exec_module(mod)
addresses = set(json.loads(sys.argv[2]))
for entry in (*mod.IPV4_RANGES, *mod.IPV6_RANGES):
    n = entry.network
    for i in (0, n.num_addresses // 2, n.num_addresses - 1):
        addresses.add(str(n[i]))
out = {}
for a in sorted(addresses):
    ip = ipaddress.ip_address(a)
    out[a] = [mod.classify_address(ip).value, mod.forbidden_reason(ip), ip.is_global]
print(json.dumps({"version": sys.version.split()[0], "decisions": out}))
"""
CORPUS = [
    # the list, found by a public SSRF corpus with allowlist `*`
    "2001:20::1", "2001:1::1", "2001:1::2", "2001:3::1", "2001:4:112::1", "2001:30::1",
    "2001:10::1", "2001:1::3", "5f00::1", "3fff::1", "100:0:0:1::1",
    "192.0.0.9", "192.0.0.10", "192.0.0.170", "192.31.196.1", "192.52.193.1",
    "192.88.99.1", "192.88.99.2", "192.175.48.1", "2620:4f:8000::1",
    # wrapped forms
    "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1", "::127.0.0.1",
    "2001:0:4136:e378:8000:63bf:80ff:fffe", "::ffff:192.0.0.8", "64:ff9b::c000:9",
    # ordinary
    "8.8.8.8", "2606:4700:4700::1111", "fec0::1", "fe80::1", "ff02::1", "100.64.0.1",
]


def interpreters() -> list[str]:
    """Python 3.12 and 3.13 interpreters on this machine (pyenv's versions and PATH)."""
    found: dict[str, str] = {}
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [str(p) for p in sorted(root.glob("versions/3.1[2-9]*/bin/python3"))]
    candidates += [sys.executable]
    for candidate in candidates:
        try:
            version = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        found.setdefault(version, candidate)
    return list(found.values())


def run_probe(python: str) -> dict:
    result = subprocess.run(
        [python, "-I", "-c", PROBE, egress.policy.addresses.__file__, json.dumps(CORPUS)],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return json.loads(result.stdout)


def test_same_decision_under_every_interpreter():
    pythons = interpreters()
    versions = {run_probe(p)["version"][:4] for p in pythons}
    if not {"3.12", "3.13"} <= versions:
        pytest.skip(f"needs Python 3.12 and 3.13 (pyenv versions); found {sorted(versions)}")
    runs = [run_probe(p) for p in pythons]
    decisions = {r["version"]: {a: d[:2] for a, d in r["decisions"].items()} for r in runs}
    reference_version, reference = next(iter(decisions.items()))
    for version, theirs in decisions.items():
        differ = {a: (reference[a], theirs[a]) for a in reference if reference[a] != theirs[a]}
        assert not differ, f"{reference_version} vs {version}: {differ}"
    # The comparison means something only where `is_global` itself differs.
    is_global = {r["version"]: r["decisions"]["2001:20::1"][2] for r in runs}
    if {"3.12.1", "3.13.0"} <= is_global.keys():
        assert is_global["3.12.1"] != is_global["3.13.0"]
    assert reference["2001:20::1"] == ["not_a_locator", "forbidden_address"]
