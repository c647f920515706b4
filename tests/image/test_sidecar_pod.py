"""The chart's sidecar pattern run as a pod: `helm template` renders the example
sandbox Deployment, and its pod spec — init containers (prepare-ca, `redirect-rules
--apply` with NET_ADMIN only, the proxy as a native sidecar), the sandbox container,
volumes, args and securityContexts — is run as a `podman pod` by kube_pod.KubePod,
nothing copied from the chart by hand. Only the image (built from this tree), the
test's environment spec and DNS server are chosen through chart values.

The pod's network namespace is wired like transparent_lab's sandbox namespace: a veth
to the lab's upstream namespace (198.18.0.0/15 only). The sandbox container has no
proxy settings and no capabilities; the kernel's redirect rules send its traffic to
the proxy.

Test-only additions (said where they are made): the test upstreams' CA and the
stdlib client e2e/sandbox_client.py are mounted into the sandbox container, and
Secrets the chart references but does not create (the transform token, the upstream
CA) are given by the test, as an operator would create them.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator

import pytest
import yaml
from e2e.support.clients import as_received
from e2e.support.lab import HERE as E2E_DIR
from e2e.support.lab import HOSTS, Lab, run
from e2e.support.transparent_lab import RESOLVER_V4, SANDBOX_GW_V4, SANDBOX_V4, Sandbox
from helm.chart_util import find_helm, helm_template, one, pod_spec
from image.kube_pod import KubePod, objects_from_manifests
from image.podman_util import hosts_file, podman, remove_pod

SECRET = "pod-test-secret-" + secrets.token_hex(8)
UPSTREAM_CA_SECRET, TOKEN_SECRET = "test-upstream-ca", "api-token"


def chart_values(image: str) -> dict:
    repository, tag = image.rsplit(":", 1)
    return {
        "pattern": "sidecar",
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "sidecar": {"dnsServers": [RESOLVER_V4], "example": {"image": image}},
        "proxy": {"upstreamCA": {"secretName": UPSTREAM_CA_SECRET}},
        "transformSecrets": [{"name": TOKEN_SECRET}],
        "environment": {
            "network": {
                "allowCidrs": ["198.18.0.0/15"],  # the test upstreams (benchmarking range)
                "allowlist": [
                    {
                        "domain": "api.example.test",
                        "transform": {
                            "Authorization": f"Bearer ${{file:/var/run/secrets/egress-proxy/{TOKEN_SECRET}/token}}"
                        },
                    },
                    {"domain": "passthrough.test"},
                ],
            }
        },
    }


class PodNetwork(Sandbox):
    """transparent_lab's sandbox namespace, made from the pod's own network namespace
    (attached to a name through the infra container's PID) instead of a new one."""

    def __init__(self, lab: Lab, infra_pid: int):
        super().__init__(lab)
        self.infra_pid = infra_pid

    def _create_namespace(self) -> None:
        run(["ip", "netns", "attach", self.proxy_ns, str(self.infra_pid)])

    def start(self) -> None:
        super().start()
        # A default route so that a connection to any address (metadata, say) leaves the
        # socket layer and meets the redirect rules; unredirected packets would end in the
        # upstream namespace, which routes nowhere.
        run(["ip", "netns", "exec", self.proxy_ns, "ip", "route", "add", "default", "via", SANDBOX_GW_V4])


class SidecarPod:
    def __init__(self, kube: KubePod, network: PodNetwork, ca_file: str, lab):
        self.kube, self.network, self.ca_file = kube, network, ca_file
        self.lab = lab  # the upstreams' namespace and their request log

    def client(self, *args: str) -> dict:
        """e2e/sandbox_client.py in the sandbox container, as the container's own user."""
        out = self.kube.exec("sandbox", "python3", "-I", "/test/sandbox_client.py", *args)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


@pytest.fixture(scope="module")
def pod(image, image_lab, tmp_path_factory) -> Iterator[SidecarPod]:
    workdir = tmp_path_factory.mktemp("sidecar-pod")
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(chart_values(image)))
    rendered = helm_template(find_helm(), values_file)
    assert rendered.returncode == 0, rendered.stderr
    docs = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    spec = pod_spec(one(docs, "Deployment", "-sandbox-example"))
    objects = objects_from_manifests(docs)
    # Secrets the chart references but leaves to the operator:
    objects[("Secret", TOKEN_SECRET)] = {"token": SECRET.encode()}
    objects[("Secret", UPSTREAM_CA_SECRET)] = {"ca.crt": image_lab.upstream_ca.read_bytes()}
    resolv = workdir / "resolv.conf"
    resolv.write_text(f"options timeout:1 attempts:1\nnameserver {RESOLVER_V4}\n")
    resolv.chmod(0o644)
    (workdir / "upstream-ca.pem").write_bytes(image_lab.upstream_ca.read_bytes())
    (workdir / "upstream-ca.pem").chmod(0o644)
    kube = KubePod(
        name=f"egress-pod-{os.getpid()}",
        spec=spec,
        objects=objects,
        workdir=workdir,
        hosts_file=hosts_file(workdir / "hosts"),
        resolv_file=resolv,
        extra_mounts={  # test-only: a client and the test upstreams' CA for the sandbox
            "sandbox": [
                f"{E2E_DIR / 'sandbox_client.py'}:/test/sandbox_client.py:ro",
                f"{workdir / 'upstream-ca.pem'}:/test/upstream-ca.pem:ro",
            ]
        },
    )
    remove_pod(kube.name)
    network = None
    try:
        network = PodNetwork(image_lab, kube.create())
        network.start()
        kube.start(image_lab.upstream_ns, SANDBOX_V4)
        env = {e["name"]: e["value"] for e in kube.container_spec("sandbox").get("env", [])}
        yield SidecarPod(kube, network, env["EGRESS_PROXY_CA_FILE"], image_lab)
    finally:
        logs = kube.logs("egress-proxy")
        kube.remove()
        if network is not None:
            network.stop()
        assert SECRET not in logs, "the injected secret appeared in the proxy's output"


def _status(pod: SidecarPod, container: str) -> dict[str, str]:
    text = pod.kube.exec(container, "cat", "/proc/self/status").stdout
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines())}


def test_pod_runs_the_rendered_containers(pod: SidecarPod):
    rules = pod.kube.container_spec("redirect-rules")
    assert rules["args"][0] == "redirect-rules" and "--apply" in rules["args"]
    assert rules["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", pod.kube.container_name("redirect-rules"))
    assert exit_code.stdout.strip() == "0"
    table = run(["ip", "netns", "exec", pod.network.proxy_ns, "nft", "list", "table", "inet", "egress_redirect"])
    assert "redirect to" in table.stdout
    proxy = _status(pod, "egress-proxy")
    assert proxy["Uid"].split()[0] == "10001" and int(proxy["CapEff"], 16) == 0
    sandbox = _status(pod, "sandbox")
    assert sandbox["Uid"].split()[0] == "1000"
    for caps in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(sandbox[caps], 16) == 0, (caps, sandbox[caps])
    env = pod.kube.exec("sandbox", "env").stdout
    proxy_vars = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
    assert not [line for line in env.splitlines() if line.split("=", 1)[0].lower() in proxy_vars], env


def test_allowlisted_https_with_injection(pod: SidecarPod):
    answer = pod.client(
        "https", "api.example.test", "443", "--sni", "api.example.test", "--ca", pod.ca_file,
        "--path", "/inject", "--header", "Authorization: Bearer from-the-sandbox",
    )  # fmt: skip
    assert answer.get("status") == 200, answer
    echo = json.loads(answer["body"])
    assert echo["local"] == HOSTS["api.example.test"]
    # The upstream received the secret (its own log); the echo the sandbox read has it masked.
    assert [v for k, v in as_received(pod.lab, echo)["headers"] if k.lower() == "authorization"] == [f"Bearer {SECRET}"]
    assert SECRET not in answer["body"]
    assert answer["issuer"] == "egress-proxy CA"  # the chart's generated CA intercepted it


def test_allowlisted_https_without_transform_is_passed_through(pod: SidecarPod):
    answer = pod.client(
        "https", "passthrough.test", "443", "--sni", "passthrough.test", "--ca", "/test/upstream-ca.pem"
    )
    assert answer.get("status") == 200, answer
    assert answer["issuer"] == "egress test upstream CA"
    assert json.loads(answer["body"])["local"] == HOSTS["passthrough.test"]


def test_name_off_the_allowlist_is_refused(pod: SidecarPod):
    tls = pod.client("https", "other.test", "443", "--sni", "other.test", "--ca", "/test/upstream-ca.pem")
    assert "error" in tls, tls  # the tunnel is closed
    plain = pod.client("http", "other.test", "80", "--host", "other.test")
    assert plain["status"] == 403 and plain["headers"]["x-egress-denied"] == "not_allowlisted"


def test_loopback_and_metadata_are_refused(pod: SidecarPod):
    ports = pod.kube.container_spec("egress-proxy")["ports"]
    metrics_port = str(next(p["containerPort"] for p in ports if p["name"] == "metrics"))
    loopback = pod.client("http", "127.0.0.1", metrics_port, "--host", f"127.0.0.1:{metrics_port}", "--path", "/metrics")
    assert loopback["status"] == 403 and loopback["headers"]["x-egress-denied"] == "loopback", loopback
    assert "egress_requests_total" not in loopback["body"]
    metadata = pod.client("http", "169.254.169.254", "80", "--host", "169.254.169.254", "--path", "/latest/meta-data/")
    assert metadata["status"] == 403 and metadata["headers"]["x-egress-denied"] == "not_allowlisted", metadata


def test_sandbox_cannot_remove_the_rules(pod: SidecarPod):
    flush = pod.kube.exec("sandbox", "nft", "flush", "ruleset")
    assert flush.returncode != 0 and "Operation not permitted" in flush.stderr, flush
    table = run(["ip", "netns", "exec", pod.network.proxy_ns, "nft", "list", "table", "inet", "egress_redirect"])
    assert "redirect to" in table.stdout
    still = pod.client("http", "other.test", "80", "--host", "other.test")
    assert still["status"] == 403
