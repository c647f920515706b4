"""podman for the image tests: whether it can run here, the image build, containers by name.

Every podman call goes through scripts/podman.sh (runc, ulimits within the host's
limits). Containers and pods are named after the pytest process and removed by
that name; nothing else in podman's storage is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from e2e.support.lab import hosts_file_text, http_get_in_netns

REPO = Path(__file__).resolve().parents[2]
PODMAN = str(REPO / "scripts" / "podman.sh")
BUILD_IMAGE = str(REPO / "scripts" / "build-image.sh")
# Set by scripts/test.sh where it could install podman: there a podman that cannot
# run is a failure, not a reason to skip.
REQUIRE_ENV = "EGRESS_REQUIRE_IMAGE_TESTS"
BUILD_TIMEOUT = 900


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}... exited {out.returncode}: {out.stderr.strip()}")
    return out


def why_podman_cannot_run() -> str | None:
    """None when rootful podman with runc works here, else the reason (for a skip)."""
    if not os.uname().sysname == "Linux":
        return "podman containers need Linux"
    if os.geteuid() != 0:
        return "needs root: the tests put containers into network namespaces they create"
    for tool in ("podman", "runc", "ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/test.sh installs it with apt)"
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=60, check=False)
    if info.returncode != 0:
        return f"`podman info` fails: {info.stderr.strip()[:300]}"
    if info.stdout.strip() != "runc":
        return f"podman uses {info.stdout.strip()!r}, not runc (set by scripts/podman.sh)"
    return None


def build_image(tag: str) -> tuple[str, float]:
    """scripts/build-image.sh (registry base if pullable, else the local base): (reference, seconds)."""
    started = time.monotonic()
    out = subprocess.run(
        [BUILD_IMAGE, "--tag", tag], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
    )
    if out.returncode != 0:
        raise AssertionError(f"scripts/build-image.sh exited {out.returncode}:\n{out.stderr[-4000:]}")
    return out.stdout.strip().splitlines()[-1], time.monotonic() - started


def remove_container(name: str) -> None:
    podman("rm", "--force", "--time", "2", name, check=False, timeout=60)


def remove_pod(name: str) -> None:
    podman("pod", "rm", "--force", "--time", "2", name, check=False, timeout=90)


def remove_stale(prefixes: tuple[str, ...] = ("egress-image-", "egress-pod-")) -> None:
    """Pods, containers and image tags these tests made in earlier pytest processes that
    are gone (killed before their teardown): named PREFIX + PID, removed by that name."""

    def dead(name: str, prefix: str) -> bool:
        pid = name.removeprefix(prefix)
        if not pid.isdigit() or int(pid) == os.getpid():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    pods = podman("pod", "ps", "--format", "{{.Name}}", check=False).stdout.split()
    containers = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    for prefix in prefixes:
        for pod in pods:
            if pod.startswith(prefix) and dead(pod, prefix):
                remove_pod(pod)
        for container in containers:
            if container.startswith(prefix) and "-" not in container.removeprefix(prefix) and dead(container, prefix):
                remove_container(container)
    tag_prefix = "localhost/egress-proxy:test-"
    for ref in podman("images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split():
        if ref.startswith(tag_prefix) and dead(ref, tag_prefix):
            podman("untag", ref, ref, check=False)


def container_logs(name: str) -> str:
    out = podman("logs", name, check=False, timeout=30)
    return out.stdout + out.stderr


def wait_http_ok(netns: str, port: int, path: str, deadline_s: float, alive=lambda: True) -> float:
    """Polls until GET answers 200; returns when it did (time.monotonic()). Raises on timeout."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if http_get_in_netns(netns, port, path, timeout=1.0)[0] == 200:
            return time.monotonic()
        if not alive():
            raise AssertionError(f"the container exited before {path} answered 200")
        time.sleep(0.05)
    raise AssertionError(f"{path} on port {port} did not answer 200 within {deadline_s} s")


def hosts_file(path: Path) -> Path:
    """/etc/hosts for containers: the test host names (podman's --add-host is ignored for
    pods without a network of podman's own, so the file is mounted, as kubelet does)."""
    path.write_text(hosts_file_text())
    path.chmod(0o644)
    return path


def write_configmap_dir(directory: Path, files: dict[str, str | bytes], mode: int = 0o644) -> Path:
    """Lays out `files` the way kubelet mounts a ConfigMap or Secret volume:
    KEY -> ..data/KEY, ..data -> ..<timestamp>/ (a new version is a new directory and
    an atomic rename of the `..data` symlink). Returns the new version's directory."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    previous = (directory / "..data").resolve() if (directory / "..data").is_symlink() else None
    version = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    version.mkdir()
    version.chmod(0o755)
    for key, content in files.items():
        path = version / key
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
        path.chmod(mode)
    tmp_link = directory / "..data_tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(version.name)
    tmp_link.rename(directory / "..data")  # the swap a ConfigMap update makes
    for key in files:
        link = directory / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")
    if previous is not None:  # kubelet removes the old version once the link points away
        shutil.rmtree(previous)
    return version
