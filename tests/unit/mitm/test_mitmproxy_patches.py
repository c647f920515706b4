"""Every mitmproxy internal that egress/mitm/patches/ replaces is there, with the shape
the patch expects, on the pinned mitmproxy; another release is refused before anything
is changed. This is the test that fails first when mitmproxy changes under us."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

from egress.mitm import patches


@pytest.mark.parametrize(
    "target", [t for ts in patches.TARGETS.values() for t in ts], ids=lambda t: f"{t.module}:{t.path}"
)
def test_every_patched_target_exists_with_its_shape(target):
    assert target.problem() is None


def test_every_patch_module_is_listed_and_installed():
    modules = {m.name for m in pkgutil.iter_modules(patches.__path__)}
    assert modules == set(patches.TARGETS) == set(patches._INSTALLERS)
    assert patches.problems() == []


def test_a_changed_target_is_reported():
    moved = patches.Target("mitmproxy.proxy.layers.http._http1", "Http1Server.read_headers", "generator", ("self", "data"))
    assert "parameters ('self', 'event')" in moved.problem()
    assert patches.Target("mitmproxy.http", "MessageData.no_such", "function").problem().endswith("missing")
    assert "not a coroutine" in patches.Target("mitmproxy.http", "Request.make", "coroutine").problem()


def test_another_mitmproxy_release_is_refused_before_anything_is_patched():
    # A fresh interpreter: the version is faked, nothing may be patched, the message names both releases.
    code = (
        "import mitmproxy.version, mitmproxy.http as h\n"
        "mitmproxy.version.VERSION = '13.0.0'\n"
        "before = h.MessageData.__post_init__\n"
        "from egress.mitm import patches\n"
        "try:\n"
        "    patches.install_all()\n"
        "except patches.PatchError as e:\n"
        "    print(e)\n"
        "assert h.MessageData.__post_init__ is before\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "mitmproxy 13.0.0 is installed; egress needs mitmproxy 12.3.1" in done.stdout
