"""The chart README's examples as a user copies them, and the pod snippets NOTES.txt
prints: each renders with the real helm and passes `kubernetes-validate --strict`
(what cannot run without a cluster is at least rendered and validated). The main
docs/kubernetes.md's install command and sandbox pod are in test_chart.py.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helm.chart_util import CHART, REPO, all_containers, container, find_tool, kubernetes_validate, one, pod_spec

CHART_README = CHART / "README.md"
KUBERNETES_VERSION = "1.35.0"
CRD_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")
FILE_REF = re.compile(r"\$\{file:([^}]+)\}")


def readme_blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", CHART_README.read_text(encoding="utf-8"), re.S)


def block_starting(language: str, first_line: str) -> str:
    found = [b for lang, b in readme_blocks() if lang == language and b.startswith(first_line)]
    assert len(found) == 1, f"the chart README has {len(found)} {language} blocks starting {first_line!r}"
    return found[0]


def validate(docs: list[dict], tmp_path: Path) -> None:
    files = []
    for i, doc in enumerate(d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)):
        path = tmp_path / f"{i:02d}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        files.append(path)
    assert files
    out = kubernetes_validate(KUBERNETES_VERSION, *files)
    assert out.returncode == 0, out.stdout + out.stderr


def helm_run(helm: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], check=False, capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_file_references_mounted(docs: list[dict], container_name: str = "egress-proxy") -> None:
    """Every `${file:}` in the rendered specs points into a volume mounted into the proxy."""
    specs = "\n".join(v for d in docs if d["kind"] == "ConfigMap" for v in d.get("data", {}).values())
    workloads = [d for d in docs if d["kind"] in ("Deployment",)]
    assert workloads
    mounts = [m["mountPath"] for m in container(pod_spec(workloads[0]), container_name)["volumeMounts"]]
    references = FILE_REF.findall(specs)
    assert references
    for path in references:
        assert any(path.startswith(mount.rstrip("/") + "/") for mount in mounts), (path, mounts)


def test_install_with_my_values_as_written(helm, tmp_path):
    """`helm install egress charts/egress-proxy -n sandboxes -f my-values.yaml` with the
    README's my-values.yaml: rendered (and installed with --dry-run=client, which prints
    NOTES), every manifest valid, the Secret mounted where the spec references it."""
    commands = block_starting("sh", "kubectl create namespace")
    [install] = [line for line in commands.splitlines() if line.startswith("helm install")]
    values_text = block_starting("yaml", "# my-values.yaml")
    (tmp_path / "my-values.yaml").write_text(values_text, encoding="utf-8")
    args = shlex.split(install)[2:]  # egress charts/egress-proxy -n sandboxes -f my-values.yaml
    args = [str(tmp_path / a) if a == "my-values.yaml" else a for a in args]
    out = helm_run(helm, "template", *args)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    validate(docs, tmp_path)
    assert_file_references_mounted(docs)
    spec = yaml.safe_load(one(docs, "ConfigMap", "-spec")["data"]["spec.yaml"])
    assert [e["domain"] for e in spec["network"]["allowlist"]] == ["api.github.com", "pypi.org", "*.pythonhosted.org"]
    out = helm_run(helm, "install", *args, "--dry-run=client")
    assert out.returncode == 0, out.stderr
    assert "egress-proxy is running as a gateway: egress-egress-proxy.sandboxes.svc:8080" in out.stdout


def test_environments_example_as_written(helm, tmp_path):
    """The "Many environments" values: one ConfigMap key per environment, each
    environment's Secret mounted where its spec references it, manifests valid, and the
    rendered specs accepted by `egress-proxy check --spec-dir`."""
    values = tmp_path / "environments.yaml"
    values.write_text(block_starting("yaml", "environments:"), encoding="utf-8")
    out = helm_run(helm, "template", "egress", str(CHART), "-n", "sandboxes", "-f", str(values))
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    validate(docs, tmp_path)
    data = one(docs, "ConfigMap", "-environments")["data"]
    assert sorted(data) == ["team-a.yaml", "team-b.yaml"]
    assert_file_references_mounted(docs)
    # `check --spec-dir` on the rendered files, with the referenced secret files in place.
    root = tmp_path / "root"
    specs = tmp_path / "specs"
    specs.mkdir()
    for name, text in data.items():
        for path in FILE_REF.findall(text):
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("value-for-the-test\n")
            text = text.replace("${file:" + path + "}", "${file:" + str(target) + "}")
        (specs / name).write_text(text, encoding="utf-8")
    checked = subprocess.run(
        [find_tool("egress-proxy"), "check", "--spec-dir", str(specs)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 environments" in checked.stdout


def test_sidecar_example_as_written(helm, tmp_path):
    """The "Sidecar pattern" values and template, put into a parent chart as the README
    says: `helm lint --strict` passes, the Pod renders and is valid, with the proxy's
    init containers in the documented order."""
    parent = tmp_path / "sandbox-app"
    (parent / "templates").mkdir(parents=True)
    (parent / "charts").mkdir()
    shutil.copytree(CHART, parent / "charts" / "egress-proxy")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: sandbox-app\nversion: 0.1.0\nicon: https://example.com/icon.png\n"
        "dependencies:\n  - name: egress-proxy\n    version: 0.1.0\n",
        encoding="utf-8",
    )
    (parent / "values.yaml").write_text(block_starting("yaml", "# values of your chart"), encoding="utf-8")
    (parent / "templates" / "sandbox.yaml").write_text(block_starting("yaml", "# templates/sandbox.yaml"), encoding="utf-8")
    out = helm_run(helm, "lint", "--strict", str(parent))
    assert out.returncode == 0, out.stdout + out.stderr
    out = helm_run(helm, "template", "rel", str(parent), "-n", "sandboxes")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    validate(docs, tmp_path)
    pod = one(docs, "Pod")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["prepare-ca", "redirect-rules", "egress-proxy"]
    sandbox = container(pod["spec"], "sandbox")
    assert sandbox["securityContext"]["runAsUser"] != 10001
    assert {c["name"] for c in all_containers(pod["spec"])} == {"prepare-ca", "redirect-rules", "egress-proxy", "sandbox"}


def notes(helm: str, tmp_path: Path, values: dict) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    out = helm_run(helm, "install", "egress", str(CHART), "-n", "sandboxes", "--dry-run=client", "-f", str(path))
    assert out.returncode == 0, out.stderr
    return out.stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"service": {"clusterIP": "10.96.200.53"}},
        {"dns": {"enabled": False}},
        {"environments": {"team-a": {"secretName": "egress-team-a", "spec": {"allowlist": [{"domain": "pypi.org"}]}}}},
    ],
    ids=["default", "cluster-ip", "no-dns", "environments"],
)
def test_notes_pod_snippet_is_a_valid_pod(helm, tmp_path, values):
    """The pod settings NOTES prints ("Point a sandbox pod at it"), pasted into a Pod
    (with the image a real pod needs), are valid Kubernetes."""
    text = notes(helm, tmp_path, values)
    snippet = text.split("Point a sandbox pod at it:\n", 1)[1].split("\n\n", 1)[0]
    pod = yaml.safe_load(snippet.replace("<a Secret holding only the token>", "team-a-proxy-token"))
    assert set(pod) == {"metadata", "spec"}, pod
    pod = {"apiVersion": "v1", "kind": "Pod", **pod}
    pod["metadata"]["name"] = "sandbox"
    container(pod["spec"], "sandbox")["image"] = "python:3.12-slim"
    validate([pod], tmp_path)
    env = {e["name"]: e.get("value") for e in container(pod["spec"], "sandbox")["env"]}
    assert env["HTTPS_PROXY"].endswith("egress-egress-proxy.sandboxes.svc:8080")
    if values.get("service"):
        assert pod["spec"]["dnsConfig"]["nameservers"] == ["10.96.200.53"]
