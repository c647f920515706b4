"""Runs a rendered Kubernetes pod spec as a `podman pod`: the part of kubelet the
sidecar pattern relies on, so a test can take every command, argument, mount and
security setting from `helm template` instead of copying them.

What is translated (anything else in the spec is an error, never silently dropped;
`resources`, `imagePullPolicy` and liveness/readiness probes are accepted and ignored):
- init containers run one after another to completion (exit 0), except native
  sidecars (`restartPolicy: Always`), which are started and must pass their
  startupProbe (httpGet) before the next one; then the containers are started;
- `command` replaces the image's entrypoint, `args` its CMD; `env` values;
- securityContext (pod-level merged under container-level): runAsUser/runAsGroup,
  runAsNonRoot (refused for uid 0 as kubelet does), readOnlyRootFilesystem (no
  tmpfs added: Kubernetes adds none), capabilities drop/add, privileged,
  allowPrivilegeEscalation, seccompProfile RuntimeDefault;
- volumes: configMap and secret (laid out with kubelet's `..data` symlink,
  mounted read-only, `items` and `defaultMode` honoured), emptyDir (mode 0777).

The pod gets no network of podman's own (`--network none`): the test attaches the
pod's network namespace to a name and wires it itself. /etc/hosts and
/etc/resolv.conf are files the test gives, mounted into every container as kubelet
mounts its own.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from image.podman_util import http_get_in_netns, podman, write_configmap_dir

SUPPORTED_CONTAINER_KEYS = {
    "name", "image", "imagePullPolicy", "command", "args", "env", "ports", "resources",
    "securityContext", "volumeMounts", "restartPolicy", "startupProbe", "livenessProbe",
    "readinessProbe",
}  # fmt: skip
SUPPORTED_SECURITY_KEYS = {
    "runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "capabilities",
    "privileged", "allowPrivilegeEscalation", "seccompProfile",
}  # fmt: skip


def objects_from_manifests(docs: list[dict]) -> dict[tuple[str, str], dict[str, bytes]]:
    """ConfigMaps and Secrets of a rendered chart: (kind, name) -> {key: bytes}."""
    found: dict[tuple[str, str], dict[str, bytes]] = {}
    for doc in docs:
        kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
        if kind == "ConfigMap":
            files = {k: v.encode() for k, v in (doc.get("data") or {}).items()}
            files |= {k: base64.b64decode(v) for k, v in (doc.get("binaryData") or {}).items()}
        elif kind == "Secret":
            files = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
            files |= {k: v.encode() for k, v in (doc.get("stringData") or {}).items()}
        else:
            continue
        found[(kind, name)] = files
    return found


@dataclass
class KubePod:
    name: str
    spec: dict
    objects: dict[tuple[str, str], dict[str, bytes]]
    workdir: Path
    hosts_file: Path
    resolv_file: Path
    # Test-only additions, by container name: extra `-v` specs (say which, in the test).
    extra_mounts: dict[str, list[str]] = field(default_factory=dict)
    # Where probes come from, as kubelet's come from the node: a namespace outside the
    # pod and the pod's address (a probe from inside would meet the pod's redirect rules).
    probe_netns: str = ""
    pod_ip: str = ""
    _volumes: dict[str, tuple[Path, bool]] = field(default_factory=dict)

    # -- the pod ----------------------------------------------------------------
    def create(self) -> int:
        """Creates the pod with its infra container running; returns the infra PID
        (whose network namespace the test attaches to a name)."""
        unknown = set(self.spec) - {
            "initContainers", "containers", "volumes", "securityContext",
            "automountServiceAccountToken", "serviceAccountName", "terminationGracePeriodSeconds",
        }  # fmt: skip
        if unknown:
            raise ValueError(f"pod spec: not translated to podman: {sorted(unknown)}")
        podman("pod", "create", "--name", self.name, "--network", "none")
        podman("pod", "start", self.name)
        infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", self.name).stdout.strip()
        return int(podman("inspect", "--format", "{{.State.Pid}}", infra).stdout.strip())

    def start(self, probe_netns: str, pod_ip: str, startup_timeout: float = 60) -> None:
        """Init containers in order, then the containers (detached)."""
        self.probe_netns, self.pod_ip = probe_netns, pod_ip
        self._make_volumes()
        for container in self.spec.get("initContainers", []):
            if container.get("restartPolicy") == "Always":
                self._run(container, detach=True)
                self._wait_startup(container, startup_timeout)
            else:
                out = self._run(container, detach=False)
                if out.returncode != 0:
                    raise AssertionError(
                        f"init container {container['name']} exited {out.returncode}: {out.stdout}{out.stderr}"
                    )
        for container in self.spec["containers"]:
            self._run(container, detach=True)

    def remove(self) -> None:
        podman("pod", "rm", "--force", "--time", "2", self.name, check=False, timeout=120)

    def container_name(self, name: str) -> str:
        return f"{self.name}-{name}"

    def exec(self, container: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.container_name(container), *cmd, check=False, timeout=timeout)

    def logs(self, container: str) -> str:
        out = podman("logs", self.container_name(container), check=False, timeout=30)
        return out.stdout + out.stderr

    def container_spec(self, name: str) -> dict:
        (found,) = [
            c for c in self.spec.get("initContainers", []) + self.spec["containers"] if c["name"] == name
        ]
        return found

    # -- translation ------------------------------------------------------------
    def _make_volumes(self) -> None:
        for volume in self.spec.get("volumes", []):
            path = self.workdir / "volumes" / volume["name"]
            if "emptyDir" in volume:
                path.mkdir(parents=True)
                path.chmod(0o777)
                self._volumes[volume["name"]] = (path, False)
            elif "configMap" in volume or "secret" in volume:
                kind = "ConfigMap" if "configMap" in volume else "Secret"
                source = volume["configMap"] if kind == "ConfigMap" else volume["secret"]
                object_name = source["name"] if kind == "ConfigMap" else source["secretName"]
                data = self.objects.get((kind, object_name))
                if data is None:
                    raise ValueError(f"volume {volume['name']}: {kind} {object_name!r} neither rendered nor given")
                if "items" in source:
                    data = {item["path"]: data[item["key"]] for item in source["items"]}
                write_configmap_dir(path, data, mode=int(source.get("defaultMode", 0o644)))
                self._volumes[volume["name"]] = (path, True)  # kubelet mounts these read-only
            else:
                raise ValueError(f"volume {volume['name']}: type not translated to podman: {sorted(volume)}")

    def _security(self, container: dict) -> dict:
        pod_level = self.spec.get("securityContext") or {}
        unknown_pod = set(pod_level) - {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"}
        if unknown_pod:
            raise ValueError(f"pod securityContext not translated to podman: {sorted(unknown_pod)}")
        merged = {**pod_level, **(container.get("securityContext") or {})}
        unknown = set(merged) - SUPPORTED_SECURITY_KEYS
        if unknown:
            raise ValueError(f"container {container['name']}: securityContext not translated: {sorted(unknown)}")
        return merged

    def _run(self, container: dict, detach: bool) -> subprocess.CompletedProcess[str]:
        unknown = set(container) - SUPPORTED_CONTAINER_KEYS
        if unknown:
            raise ValueError(f"container {container['name']}: not translated to podman: {sorted(unknown)}")
        sc = self._security(container)
        args = ["run", "--pod", self.name, "--name", self.container_name(container["name"]), "--image-volume", "ignore"]
        image = container["image"]
        uid = sc.get("runAsUser")
        if uid is not None:
            args += ["--user", f"{uid}:{sc.get('runAsGroup', uid)}"]
        if sc.get("runAsNonRoot"):
            effective = uid if uid is not None else self._image_uid(image)
            if effective in (None, 0):
                raise AssertionError(f"container {container['name']}: runAsNonRoot but it would run as root")
        if sc.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]
        caps = sc.get("capabilities") or {}
        for cap in caps.get("drop", []):
            args += ["--cap-drop", cap]
        for cap in caps.get("add", []):
            args += ["--cap-add", cap]
        if sc.get("privileged"):
            args.append("--privileged")
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        seccomp = (sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
        if seccomp == "Unconfined":
            args += ["--security-opt", "seccomp=unconfined"]
        elif seccomp != "RuntimeDefault":
            raise ValueError(f"container {container['name']}: seccompProfile {seccomp} not translated")
        for env in container.get("env", []):
            if "value" not in env:
                raise ValueError(f"container {container['name']}: env {env['name']}: only `value` is translated")
            args += ["--env", f"{env['name']}={env['value']}"]
        args += ["-v", f"{self.hosts_file}:/etc/hosts:ro", "-v", f"{self.resolv_file}:/etc/resolv.conf:ro"]
        for mount in container.get("volumeMounts", []):
            if "subPath" in mount:
                raise ValueError(f"container {container['name']}: subPath mounts are not translated")
            path, always_ro = self._volumes[mount["name"]]
            read_only = always_ro or mount.get("readOnly", False)
            args += ["-v", f"{path}:{mount['mountPath']}{':ro' if read_only else ''}"]
        for extra in self.extra_mounts.get(container["name"], []):
            args += ["-v", extra]
        if "command" in container:
            args += ["--entrypoint", json.dumps(container["command"])]
        if detach:
            args.insert(1, "--detach")
        args += [image, *container.get("args", [])]
        return podman(*args, check=detach, timeout=120)

    def _image_uid(self, image: str) -> int | None:
        user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
        head = user.split(":")[0]
        return int(head) if head.isdigit() else (0 if head in ("", "root") else None)

    def _wait_startup(self, container: dict, timeout: float) -> None:
        probe = container.get("startupProbe") or container.get("readinessProbe")
        if probe is None:
            return
        if "httpGet" not in probe:
            raise ValueError(f"container {container['name']}: only httpGet probes are translated")
        port = probe["httpGet"]["port"]
        if isinstance(port, str):
            (port,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
        path = probe["httpGet"].get("path", "/")
        limit = min(timeout, probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if 200 <= http_get_in_netns(self.probe_netns, port, path, timeout=1.0, host=self.pod_ip)[0] < 400:
                return
            state = podman("inspect", "--format", "{{.State.Running}}", self.container_name(container["name"]))
            if state.stdout.strip() != "true":
                raise AssertionError(f"{container['name']} exited: {self.logs(container['name'])[-2000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{container['name']}: startupProbe {path} not passed within {limit} s")

