"""Fixtures for the image tests: podman that works (else a skip with the reason), the
image built from this tree by scripts/build-image.sh, and the e2e lab's test upstreams."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.support.lab import Lab
from image.podman_util import (
    REQUIRE_ENV,
    build_image,
    podman,
    remove_stale,
    why_podman_cannot_run,
)


def pytest_collection_modifyitems(items):
    for item in items:
        if "/image/" in str(item.fspath):
            item.add_marker(pytest.mark.image)


class ImageLab(Lab):
    """The e2e lab (upstream namespace, certificates, echo server) under names of its own,
    so it can live beside tests/e2e's lab in one pytest process."""

    def __init__(self, workdir: Path):
        super().__init__(workdir)
        self.id = 100000 + os.getpid() % 100000
        self.proxy_ns = f"egp-{self.id}"
        self.upstream_ns = f"egu-{self.id}"


@pytest.fixture(scope="session")
def podman_ready() -> None:
    reason = why_podman_cannot_run()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but podman cannot run: {reason}")
    pytest.skip(f"podman cannot run here: {reason}")


@pytest.fixture(scope="session")
def image(podman_ready) -> Iterator[str]:
    """The image built from this tree; tagged for this pytest process, untagged afterwards
    (the layers stay cached for the next build)."""
    remove_stale()
    ref, seconds = build_image(f"localhost/egress-proxy:test-{os.getpid()}")
    print(f"\nimage {ref} built in {seconds:.0f} s")
    yield ref
    podman("untag", ref, ref, check=False)


@pytest.fixture(scope="session")
def image_lab(podman_ready, tmp_path_factory) -> Iterator[Lab]:
    lab = ImageLab(tmp_path_factory.mktemp("image-lab"))
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()
