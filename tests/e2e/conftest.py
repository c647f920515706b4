"""Fixtures for end-to-end tests: one lab (namespaces + upstreams) per session,
and the real proxies the tests talk to."""

from __future__ import annotations

import os
import shutil

import pytest

from e2e.support.lab import Lab

pytestmark = pytest.mark.e2e


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("end-to-end tests need root and iproute2 (they create network namespaces)")
    lab = Lab(tmp_path_factory.mktemp("lab"))
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()
