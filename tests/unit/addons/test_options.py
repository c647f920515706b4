"""Every `egress-proxy run` flag is an `egress_*` option of the same meaning, declared by
the addon that reads it (SPEC §8): the chain loaded into a real mitmproxy master, its
options compared with the flags of the installed command's `--help`."""

from __future__ import annotations

import asyncio
import re

import pytest
from documented import cli_help
from mitmproxy import master, options
from mitmproxy.addons import core, proxyserver

from egress.addons import chain
from egress.net.limits import DEFAULTS

# mitmproxy's own options (SPEC §8: the listen address and the mode stay mitmproxy's).
MITMPROXY_OWN = {"--listen": "listen_host", "--mode": "mode", "--confdir": "confdir", "--set": None}


@pytest.fixture(scope="module")
def loaded():
    async def load():
        m = master.Master(options.Options())
        m.addons.add(core.Core(), proxyserver.Proxyserver(), *chain())
        return m.options

    return asyncio.run(load())


def run_flags() -> set[str]:
    return set(re.findall(r"^\s+(--[a-z][a-z0-9-]+)", cli_help(("egress-proxy", "run")), re.M)) - {"--help"}


def test_every_run_flag_is_an_egress_option(loaded):
    flags = run_flags()
    assert "--spec" in flags and "--upstream-proxy" in flags  # the help was read
    for flag in sorted(flags - MITMPROXY_OWN.keys()):
        name = "egress_" + flag[2:].replace("-", "_")
        assert name in loaded, f"{flag}: no option {name}"
        assert loaded._options[name].help.strip(), name


def test_every_egress_option_is_a_run_flag_or_a_limit(loaded):
    """The other way round: no option that `egress-proxy run` cannot set (except the limits
    and credential settings set with --set, documented in docs/operations.md and docs/credentials.md)."""
    flags = {"egress_" + f[2:].replace("-", "_") for f in run_flags()}
    extra = {"egress_max_header_bytes", "egress_max_h2_resets", "egress_credential_timeout", "egress_sign_max_body", "egress_scrub_echoes"}
    assert {n for n in loaded.keys() if n.startswith("egress_")} == flags - {"egress_listen", "egress_mode", "egress_confdir", "egress_set"} | extra


def test_limit_defaults_have_one_source(loaded):
    for name, default in DEFAULTS.items():
        assert loaded._options[name].default == default, name
        flag = "--" + name.removeprefix("egress_").replace("_", "-")
        if flag in run_flags():
            entries = re.split(r"\n(?=  -)", cli_help(("egress-proxy", "run")))
            entry = next(e for e in entries if e.strip().startswith(f"{flag} N"))
            assert f"(default {default})" in " ".join(entry.split()), entry
