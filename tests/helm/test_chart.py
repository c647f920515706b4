"""The Helm chart, checked with the real tools: `helm lint --strict`, `helm template`
validated offline by `kubernetes-validate --strict`, the rendered spec accepted by
`egress-proxy check`, the sidecar init command compared with `egress-proxy
redirect-rules`, and the rendered proxy command run for real.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml
from cryptography import x509
from helm.chart_util import (
    CHART,
    CI_VALUES,
    REPO,
    all_containers,
    by_kind,
    container,
    find_tool,
    helm_template,
    kubernetes_validate,
    one,
    pod_spec,
)
from http_head import recv_head

# kubernetes-validate bundles schemas up to its own version; these are current releases.
KUBERNETES_VERSIONS = ["1.34.0", "1.35.0"]
# Kinds from CRDs, which kubernetes-validate does not know; test_crd_resources checks them.
CRD_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")
PATTERNS = {"default": [], **{name: [path] for name, path in CI_VALUES.items()}}
FILE_REF = re.compile(r"\$\{file:([^}]+)\}")


def write_values(tmp_path: Path, name: str, values: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


# --- helm lint / kubernetes-validate -----------------------------------------------------


def test_ci_values_cover_both_patterns():
    assert {"gateway", "sidecar"} <= set(CI_VALUES), CI_VALUES


@pytest.mark.parametrize("pattern", PATTERNS)
def test_helm_lint_strict(helm, pattern):
    cmd = [helm, "lint", "--strict", str(CHART)]
    for f in PATTERNS[pattern]:
        cmd += ["-f", str(f)]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


CA_SOURCES = {
    "generate": {},
    "secret": {"ca": {"source": "secret", "secretName": "corp-egress-ca"}},
    "certManager": {"ca": {"source": "certManager"}},
}


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("ca_source", CA_SOURCES)
def test_manifests_valid_for_kubernetes(render, tmp_path, pattern, ca_source):
    extra = (
        [write_values(tmp_path, "ca", CA_SOURCES[ca_source])]
        if CA_SOURCES[ca_source]
        else []
    )
    docs = render(*PATTERNS[pattern], *extra)
    core = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
    assert core
    files = []
    for i, doc in enumerate(core):
        path = tmp_path / f"{i:02d}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        files.append(str(path))
    # Every version for the default CA; the CA variants change few objects: newest only.
    versions = (
        KUBERNETES_VERSIONS if ca_source == "generate" else KUBERNETES_VERSIONS[-1:]
    )
    for version in versions:
        out = kubernetes_validate(version, *files)
        assert out.returncode == 0, f"kubernetes {version}:\n{out.stdout}{out.stderr}"


def test_kubernetes_validate_rejects_a_broken_manifest(tmp_path):
    """The validation above would catch a mistake: an unknown field under --strict."""
    bad = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "data": {},
        "dta": {},
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad), encoding="utf-8")
    out = kubernetes_validate(KUBERNETES_VERSIONS[0], path)
    assert out.returncode != 0 and "dta" in out.stdout + out.stderr


def test_crd_resources(render):
    """ServiceMonitor and cert-manager objects (CRDs, not in kubernetes-validate): checked by hand."""
    docs = render(CI_VALUES["gateway"])
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = one(docs, "Service")
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [
        "metrics"
    ] and "metrics" in port_names
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"

    docs = render(set_values={"ca.source": "certManager"})
    cert = one(docs, "Certificate")
    issuer = one(docs, "Issuer")
    assert cert["apiVersion"] == issuer["apiVersion"] == "cert-manager.io/v1"
    assert cert["spec"]["isCA"] is True and "cert sign" in cert["spec"]["usages"]
    assert cert["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert "selfSigned" in issuer["spec"]
    ca_volume = next(
        v for v in pod_spec(one(docs, "Deployment"))["volumes"] if v["name"] == "ca"
    )
    assert ca_volume["secret"]["secretName"] == cert["spec"]["secretName"]
    assert not by_kind(docs, "Secret"), (
        "cert-manager writes the CA Secret, the chart must not"
    )


# --- spec ConfigMap, secrets ---------------------------------------------------------------


def _secret_mounts(spec: dict, container_name: str) -> dict[str, str]:
    """mountPath → Secret name for the Secret volumes a container mounts."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {}
    for m in container(spec, container_name)["volumeMounts"]:
        secret = volumes[m["name"]].get("secret")
        if secret and "subPath" not in m:
            mounts[m["mountPath"]] = secret["secretName"]
    return mounts


@pytest.mark.parametrize("pattern", ["gateway", "sidecar"])
def test_spec_configmap_accepted_by_check_and_secrets_only_referenced(
    render, tmp_path, pattern
):
    values = yaml.safe_load(CI_VALUES[pattern].read_text(encoding="utf-8"))
    docs = render(CI_VALUES[pattern])
    spec_text = one(docs, "ConfigMap", "-spec")["data"]["spec.yaml"]
    workload = one(docs, "Deployment")
    mounts = _secret_mounts(pod_spec(workload), "egress-proxy")

    # Every ${file:} reference points into a Secret the proxy container mounts.
    refs = FILE_REF.findall(spec_text)
    assert refs, "the CI values exercise transform secrets"
    secret_values = {}
    for ref in refs:
        directory, _, key = ref.rpartition("/")
        assert directory in mounts, (
            f"${{file:{ref}}} is not inside a mounted Secret ({sorted(mounts)})"
        )
        # What kubelet would put there: test values that must never show up in a manifest.
        secret_values[ref] = f"sk-test-{mounts[directory]}-{key}-do-not-render"

    # `egress-proxy check` accepts the rendered spec, with the files where the pod has them.
    root = tmp_path / "secrets"
    for ref, value in secret_values.items():
        target = root / ref.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value + "\n", encoding="utf-8")
    local_spec = tmp_path / "spec.yaml"
    local_spec.write_text(
        FILE_REF.sub(lambda m: f"${{file:{root}{m.group(1)}}}", spec_text),
        encoding="utf-8",
    )
    out = subprocess.run(
        [find_tool("egress-proxy"), "check", "--spec", str(local_spec)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        f"{len(values['environment']['network']['allowlist'])} allowlist entries"
        in out.stdout
    )

    # The spec in the ConfigMap is the one from values, secrets as references only.
    assert yaml.safe_load(spec_text) == values["environment"]
    rendered = helm_template_text(render, CI_VALUES[pattern])
    for value in secret_values.values():
        assert value not in rendered


def helm_template_text(render, *files) -> str:
    return yaml.safe_dump_all(render(*files))


def test_no_manifest_contains_a_transform_secret(helm, render, tmp_path):
    """A literal secret in `environment` is refused by the schema and, without it, by the
    template; with references, no manifest of any pattern carries a secret value."""
    secret = "sk-live-0123456789abcdef"
    leaky = {
        "environment": {
            "network": {
                "allowlist": [
                    {
                        "domain": "api.example.com",
                        "transform": {"Authorization": f"Bearer {secret}"},
                    }
                ]
            }
        }
    }
    path = write_values(tmp_path, "leaky", leaky)
    out = helm_template(helm, path)
    assert (
        out.returncode != 0 and "transform" in out.stderr and secret not in out.stdout
    )
    out = helm_template(helm, path, extra=["--skip-schema-validation"])
    assert out.returncode != 0 and secret not in out.stdout
    assert "must reference a secret" in out.stderr and secret not in out.stderr
    # The bare `network` form of the spec is guarded the same way.
    bare = write_values(
        tmp_path, "bare", {"environment": leaky["environment"]["network"]}
    )
    out = helm_template(helm, bare, extra=["--skip-schema-validation"])
    assert (
        out.returncode != 0
        and "environment.allowlist[0].transform.Authorization" in out.stderr
    )

    for files in PATTERNS.values():
        for doc in render(*files):
            if doc["kind"] in ("ConfigMap", "Secret"):
                data = doc.get("data", {})
                text = "\n".join(
                    base64.b64decode(v).decode() if doc["kind"] == "Secret" else v
                    for v in data.values()
                )
                # Only the CA (generated by helm) may live in a Secret; nothing in a ConfigMap is a key.
                assert "PRIVATE KEY" not in text or doc["kind"] == "Secret", doc[
                    "metadata"
                ]["name"]


# --- CA ------------------------------------------------------------------------------------


def test_generated_ca_is_shared_and_published_without_key(render):
    docs = render(CI_VALUES["gateway"])
    secret = one(docs, "Secret", "-ca")
    assert secret["type"] == "kubernetes.io/tls"
    crt = base64.b64decode(secret["data"]["tls.crt"])
    published = one(docs, "ConfigMap", "-ca-cert")["data"]
    assert (
        list(published) == ["ca.crt"]
        and published["ca.crt"].strip() == crt.decode().strip()
    )
    cert = x509.load_pem_x509_certificate(crt)
    assert (
        cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    )
    # One Secret for all replicas: the Deployment mounts exactly this one.
    ca_volume = next(
        v for v in pod_spec(one(docs, "Deployment"))["volumes"] if v["name"] == "ca"
    )
    assert ca_volume["secret"]["secretName"] == secret["metadata"]["name"]


def test_existing_ca_secret_published_from_values(render, tmp_path):
    pem = one(render(), "ConfigMap", "-ca-cert")["data"]["ca.crt"]
    values = write_values(
        tmp_path,
        "ca",
        {"ca": {"source": "secret", "secretName": "corp-ca", "certificate": pem}},
    )
    docs = render(values)
    assert not by_kind(docs, "Secret")
    assert one(docs, "ConfigMap", "-ca-cert")["data"]["ca.crt"].strip() == pem.strip()
    ca_volume = next(
        v for v in pod_spec(one(docs, "Deployment"))["volumes"] if v["name"] == "ca"
    )
    assert ca_volume["secret"]["secretName"] == "corp-ca"


# --- security, probes, scaling -------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["gateway", "sidecar"])
def test_pod_security(render, pattern):
    docs = render(CI_VALUES[pattern])
    spec = pod_spec(one(docs, "Deployment"))
    assert spec["automountServiceAccountToken"] is False
    for c in all_containers(spec):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert sc.get(
            "seccompProfile", spec["securityContext"].get("seccompProfile")
        ) == {"type": "RuntimeDefault"}
        assert not sc.get("privileged"), c["name"]
        assert "resources" in c and c["resources"]["limits"]["memory"], c["name"]
        if c["name"] == "redirect-rules":
            # nft needs CAP_NET_ADMIN effective, which Kubernetes gives only to UID 0.
            assert sc["capabilities"]["add"] == ["NET_ADMIN"] and sc["runAsUser"] == 0
        else:
            assert "add" not in sc["capabilities"], c["name"]
            uid = sc.get("runAsUser", spec["securityContext"].get("runAsUser"))
            assert uid and uid != 0, c["name"]
            assert (
                sc.get("runAsNonRoot", spec["securityContext"].get("runAsNonRoot"))
                is True
            ), c["name"]


def test_gateway_objects(render):
    docs = render(CI_VALUES["gateway"])
    deployment = one(docs, "Deployment")
    spec = pod_spec(deployment)
    proxy = container(spec, "egress-proxy")
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations["prometheus.io/scrape"] == "true"
        and annotations["prometheus.io/port"] == "9090"
    )
    assert {t["topologyKey"] for t in spec["topologySpreadConstraints"]} == {
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    }
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    service = one(docs, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_network_policy_lets_sandboxes_reach_only_the_proxy_and_its_dns(render):
    docs = render(CI_VALUES["gateway"])
    policies = {p["metadata"]["name"]: p for p in by_kind(docs, "NetworkPolicy")}
    sandbox = policies["rel-egress-proxy-sandbox-egress"]["spec"]
    assert sandbox["policyTypes"] == ["Egress"]
    assert sandbox["podSelector"] == {"matchLabels": {"egress-proxy/sandbox": "true"}}
    # One peer only, the proxy pods: DNS goes to the gateway's listener, not to kube-dns.
    (to_proxy,) = sandbox["egress"]
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert to_proxy["to"] == [
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "sandboxes"}
            },
            "podSelector": {"matchLabels": selector},
        }
    ]
    assert to_proxy["ports"] == [
        {"port": 8080, "protocol": "TCP"},
        {"port": 5353, "protocol": "UDP"},
        {"port": 5353, "protocol": "TCP"},
    ]
    assert "kube-dns" not in json.dumps(sandbox) and "ipBlock" not in json.dumps(sandbox), "no way out but the proxy"
    proxy = policies["rel-egress-proxy"]["spec"]
    assert proxy["policyTypes"] == ["Ingress"]
    assert proxy["ingress"][0]["ports"] == [
        {"port": "proxy", "protocol": "TCP"},
        {"port": "dns-udp", "protocol": "UDP"},
        {"port": "dns-tcp", "protocol": "TCP"},
    ]
    # The sidecar pattern has no NetworkPolicy: pods, not containers, are what it selects.
    assert not by_kind(render(CI_VALUES["sidecar"]), "NetworkPolicy")


def test_gateway_serves_dns_on_its_service(render):
    docs = render(CI_VALUES["gateway"])
    service = one(docs, "Service")
    dns_ports = [p for p in service["spec"]["ports"] if p["port"] == 53]
    assert dns_ports == [
        {"name": "dns-udp", "port": 53, "targetPort": "dns-udp", "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "targetPort": "dns-tcp", "protocol": "TCP"},
    ]
    proxy = container(pod_spec(one(docs, "Deployment")), "egress-proxy")
    assert proxy["args"][proxy["args"].index("--dns-listen") + 1] == "0.0.0.0:5353"
    ports = {p["name"]: (p["containerPort"], p["protocol"]) for p in proxy["ports"]}
    assert ports["dns-udp"] == (5353, "UDP") and ports["dns-tcp"] == (5353, "TCP")


def test_dns_disabled_falls_back_to_cluster_dns(render, tmp_path):
    values = write_values(tmp_path, "nodns", {"dns": {"enabled": False}, "sidecar": {"dnsServers": ["10.96.0.10"]}})
    docs = render(CI_VALUES["gateway"], values)
    sandbox = one(docs, "NetworkPolicy", "-sandbox-egress")["spec"]
    to_proxy, to_dns = sandbox["egress"]
    assert to_proxy["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert {p["port"] for p in to_dns["ports"]} == {53} and "kube-dns" in json.dumps(to_dns)
    assert all(p["port"] != 53 for p in one(docs, "Service")["spec"]["ports"])
    assert "--dns-listen" not in container(pod_spec(one(docs, "Deployment")), "egress-proxy")["args"]
    sidecar = render(CI_VALUES["sidecar"], values)
    init = container(pod_spec(one(sidecar, "Deployment", "-sandbox-example")), "redirect-rules")
    assert "--dns-port" not in init["args"] and init["args"][init["args"].index("--dns") + 1] == "10.96.0.10"


@pytest.mark.parametrize("pattern", ["gateway", "sidecar"])
def test_parent_proxy_credentials_mounted_from_a_secret_never_in_args(render, helm, tmp_path, pattern):
    parent = {"url": "http://proxy.corp.example:3128", "authSecretName": "corp-proxy", "authKey": "user-pass"}
    values = write_values(tmp_path, "parent", {"proxy": {"upstreamProxy": parent}})
    docs = render(CI_VALUES[pattern], values)
    spec = pod_spec(one(docs, "Deployment"))
    proxy = container(spec, "egress-proxy")
    args = proxy["args"]
    assert args[args.index("--upstream-proxy") + 1] == "http://proxy.corp.example:3128"
    reference = args[args.index("--upstream-proxy-auth") + 1]
    mount = next(m for m in proxy["volumeMounts"] if m["name"] == "parent-auth")
    assert reference == f"${{file:{mount['mountPath']}/user-pass}}" and mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == "parent-auth")
    assert volume["secret"]["secretName"] == "corp-proxy"
    assert volume["secret"]["items"] == [{"key": "user-pass", "path": "user-pass"}]
    for other in all_containers(spec):
        if other["name"] != "egress-proxy":
            assert "parent-auth" not in json.dumps(other.get("volumeMounts", []))
    out = helm_template(helm, write_values(tmp_path, "orphan", {"proxy": {"upstreamProxy": {"authSecretName": "x"}}}))
    assert out.returncode != 0 and "authSecretName needs proxy.upstreamProxy.url" in out.stderr, out.stderr


def test_notes_give_the_sandbox_the_gateway_as_only_nameserver(helm, tmp_path):
    values = write_values(tmp_path, "ip", {"service": {"clusterIP": "10.96.200.53"}})
    out = subprocess.run(
        [helm, "install", "rel", str(CHART), "-n", "sandboxes", "--dry-run=client", "-f", str(CI_VALUES["gateway"]), "-f", str(values)],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    assert 'dnsPolicy: "None"' in notes and 'nameservers: ["10.96.200.53"]' in notes
    docs = [d for d in yaml.safe_load_all(out.stdout.split("NOTES:", 1)[0].split("---", 1)[1]) if d]
    assert one(docs, "Service")["spec"]["clusterIP"] == "10.96.200.53"
    # Without a fixed IP the notes say how to read it.
    out = subprocess.run(
        [helm, "install", "rel", str(CHART), "-n", "sandboxes", "--dry-run=client", "-f", str(CI_VALUES["gateway"])],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "GATEWAY_SERVICE_IP" in out.stdout and "get service rel-egress-proxy -o jsonpath" in out.stdout


def test_spec_configmap_mounted_for_reload(render):
    """Reload without a restart: the ConfigMap is mounted as a directory (kubelet updates
    those; subPath mounts never change) and no spec checksum rolls the pods."""
    for pattern in ("gateway", "sidecar"):
        docs = render(CI_VALUES[pattern])
        workload = one(docs, "Deployment")
        spec = pod_spec(workload)
        proxy = container(spec, "egress-proxy")
        spec_volume = next(
            v
            for v in spec["volumes"]
            if v.get("configMap", {}).get("name", "").endswith("-spec")
        )
        mount = next(
            m for m in proxy["volumeMounts"] if m["name"] == spec_volume["name"]
        )
        assert "subPath" not in mount
        spec_arg = proxy["args"][proxy["args"].index("--spec") + 1]
        assert spec_arg == f"{mount['mountPath']}/spec.yaml"
        for m in proxy["volumeMounts"]:
            assert "subPath" not in m, (
                "secret rotation and spec updates need directory mounts"
            )
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        spec_text = one(docs, "ConfigMap", "-spec")["data"]["spec.yaml"]
        assert not any("spec" in k for k in annotations), annotations
        assert spec_text not in json.dumps(annotations)


# --- values.schema.json --------------------------------------------------------------------


SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))


def _with(path: str, value) -> dict:
    values = json.loads(json.dumps(DEFAULTS))
    node = values
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return values


BAD_VALUES = {
    "unknown pattern": ("pattern", "mesh"),
    "literal transform secret": (
        "environment",
        {
            "network": {
                "allowlist": [
                    {
                        "domain": "a.example.com",
                        "transform": {"Authorization": "Bearer sk-123"},
                    }
                ]
            }
        },
    ),
    "port out of range": ("proxy.port", 70000),
    "root proxy uid": ("sidecar.proxyUid", 0),
    "unknown CA source": ("ca.source", "vault"),
    "misspelt key": ("replicaCont", 3),
    "dns not an IP": ("sidecar.dnsServers", ["kube-dns.kube-system"]),
    "parent proxy over https": ("proxy.upstreamProxy", {"url": "https://proxy.corp.example:3128"}),
    "parent proxy with a password in the url": ("proxy.upstreamProxy", {"url": "http://u:pw@proxy.corp.example:3128"}),
}


def test_schema_accepts_defaults_and_ci_values():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(DEFAULTS, SCHEMA)
    for path in CI_VALUES.values():
        merged = {**DEFAULTS, **yaml.safe_load(path.read_text(encoding="utf-8"))}
        jsonschema.validate(merged, SCHEMA)


@pytest.mark.parametrize("case", BAD_VALUES)
def test_schema_rejects_bad_values(case):
    path, value = BAD_VALUES[case]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_with(path, value), SCHEMA)


def test_helm_enforces_the_schema(helm, tmp_path):
    out = helm_template(helm, write_values(tmp_path, "bad", {"pattern": "mesh"}))
    assert (
        out.returncode != 0 and "schema" in out.stderr and "/pattern" in out.stderr
    ), out.stderr
    out = helm_template(helm, write_values(tmp_path, "bad", {"proxy": {"port": 0}}))
    assert out.returncode != 0 and "/proxy/port" in out.stderr, out.stderr


# --- sidecar / transparent -----------------------------------------------------------------


def _redirect_rules_available() -> str:
    exe = find_tool("egress-proxy")
    out = subprocess.run(
        [exe, "redirect-rules", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        pytest.fail(
            "`egress-proxy redirect-rules` does not exist in the installed egress-proxy (transparent-mode issue); "
            f"the sidecar init command cannot be compared with it:\n{out.stderr.strip()}"
        )
    return exe


SIDECAR_CASES = {
    "defaults": {"sidecar": {}},
    "cluster_dns": {"dns": {"enabled": False}, "sidecar": {"dnsServers": ["10.96.0.10"]}},
    "custom": {
        "dns": {"port": 15053},
        "proxy": {"port": 15001},
        "sidecar": {
            "proxyUid": 1337,
            "proxyMark": "0x539",
            "dnsServers": ["169.254.20.10", "fd00:10:96::a"],
        },
    },
}


@pytest.mark.parametrize("case", SIDECAR_CASES)
def test_sidecar_init_command_equals_redirect_rules_output(render, tmp_path, case):
    exe = _redirect_rules_available()
    values = SIDECAR_CASES[case]
    docs = render(CI_VALUES["sidecar"], write_values(tmp_path, case, values))
    spec = pod_spec(one(docs, "Deployment", "-sandbox-example"))
    init = container(spec, "redirect-rules")
    proxy = container(spec, "egress-proxy")

    # Same image as the proxy, whose ENTRYPOINT is egress-proxy; applied with --apply.
    assert "command" not in init and init["image"] == proxy["image"]
    assert init["args"][0] == "redirect-rules" and init["args"][-1] == "--apply"

    port = values.get("proxy", {}).get("port", 8080)
    uid = values["sidecar"].get("proxyUid", 10001)
    expected_args = [
        "redirect-rules",
        "--proxy-port",
        str(port),
        "--proxy-uid",
        str(uid),
    ]
    if "proxyMark" in values["sidecar"]:
        expected_args += ["--proxy-mark", values["sidecar"]["proxyMark"]]
    if values.get("dns", {}).get("enabled", True):
        # All DNS to the proxy's listener, which the proxy serves on loopback.
        dns_port = values.get("dns", {}).get("port", 5353)
        expected_args += ["--dns-port", str(dns_port)]
    else:
        for ip in values["sidecar"]["dnsServers"]:
            expected_args += ["--dns", ip]
    printed = subprocess.run(
        [exe, *expected_args], check=False, capture_output=True, text=True, timeout=30
    )
    assert printed.returncode == 0, printed.stderr
    rendered = subprocess.run(
        [exe, *init["args"][:-1]],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert (
        rendered.stdout == printed.stdout and f"redirect to :{port}" in printed.stdout
    )

    # The rules exempt exactly the proxy: its UID and its transparent port.
    assert proxy["securityContext"]["runAsUser"] == uid
    assert proxy["args"][proxy["args"].index("--mode") + 1] == "transparent"
    # Loopback only (the redirect targets it; the proxy adds ::1 itself): not reachable from other pods.
    assert proxy["args"][proxy["args"].index("--listen") + 1] == f"127.0.0.1:{port}"
    if "--dns-port" in expected_args:
        assert proxy["args"][proxy["args"].index("--dns-listen") + 1] == f"127.0.0.1:{dns_port}"
        assert f"th dport 53 redirect to :{dns_port}" in printed.stdout
    else:
        assert "--dns-listen" not in proxy["args"]
    assert [p["name"] for p in proxy["ports"]] == ["metrics"]
    sandbox = container(spec, "sandbox")
    assert sandbox["securityContext"]["runAsUser"] != uid
    # Order: CA, rules, then the proxy (native sidecar) before the sandbox starts.
    assert [c["name"] for c in spec["initContainers"]] == [
        "prepare-ca",
        "redirect-rules",
        "egress-proxy",
    ]
    assert proxy["restartPolicy"] == "Always"


@pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to create a network namespace"
)
def test_sidecar_init_command_applies_with_net_admin_only(render):
    """The rendered init command really loads its rules with nft, in a fresh network
    namespace, holding CAP_NET_ADMIN and nothing else (as the container does)."""
    exe = _redirect_rules_available()
    for tool in ("unshare", "setpriv", "nft"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} not found (scripts/test.sh installs nftables)")
    spec = pod_spec(one(render(CI_VALUES["sidecar"]), "Deployment", "-sandbox-example"))
    init = container(spec, "redirect-rules")
    script = 'setpriv --bounding-set=-all,+net_admin --inh-caps=-all --no-new-privs -- "$@" && nft list table inet egress_redirect'
    out = subprocess.run(
        ["unshare", "--net", "sh", "-c", script, "sh", exe, *init["args"]],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"{Path(exe).parent}:{os.environ.get('PATH', '')}"},
    )
    assert out.returncode == 0, out.stderr
    assert "redirect to :8080" in out.stdout and "meta skuid 10001" in out.stdout


def test_sidecar_templates_can_be_included_from_a_parent_chart(helm, tmp_path):
    """A user's chart depending on this one includes the sidecar into its own pod."""
    parent = tmp_path / "sandbox-app"
    shutil.copytree(Path(__file__).parent / "parent-chart", parent)
    (parent / "charts").mkdir()
    shutil.copytree(CHART, parent / "charts" / "egress-proxy")
    out = subprocess.run(
        [helm, "lint", "--strict", str(parent)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    out = helm_template(helm, chart=parent)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    pod = one(docs, "Pod")
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ["prepare-ca", "redirect-rules", "egress-proxy"]
    # The pod points at the subchart's own ConfigMaps and Secret.
    configmaps = {d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")}
    secrets = {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    for v in pod["spec"]["volumes"]:
        if "configMap" in v:
            assert v["configMap"]["name"] in configmaps
        if "secret" in v and v["name"] == "ca":
            assert v["secret"]["secretName"] in secrets
    init = container(pod["spec"], "redirect-rules")
    # DNS goes to the proxy's listener by default; the parent's dnsServers are not used.
    assert init["args"][init["args"].index("--dns-port") + 1] == "5353" and "--dns" not in init["args"]


# --- the rendered proxy command, run for real ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kubelet_configmap(directory: Path, files: dict[str, str], generation: int) -> None:
    """Lay out (or update) a ConfigMap volume the way kubelet does: files are symlinks
    to `..data/<key>`, `..data` a symlink to a timestamped directory swapped atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"..2025_01_01_00_00_0{generation}.000"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text, encoding="utf-8")
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)
    tmp_link = directory / "..data_tmp"
    tmp_link.symlink_to(target.name)
    os.replace(tmp_link, directory / "..data")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def test_rendered_gateway_runs_and_reloads_a_configmap_update(render, tmp_path):
    """The gateway container's command, with the pod's paths mapped into a temporary
    directory: prepare-ca builds a confdir mitmproxy accepts from the rendered CA Secret,
    the proxy becomes ready on /readyz, and a kubelet-style ConfigMap swap is reloaded
    without a restart."""
    port, metrics_port = _free_port(), _free_port()
    values = write_values(
        tmp_path, "ports", {"proxy": {"port": port, "metricsPort": metrics_port}}
    )
    docs = render(CI_VALUES["gateway"], values)
    spec = pod_spec(one(docs, "Deployment"))
    proxy = container(spec, "egress-proxy")
    prepare = container(spec, "prepare-ca")
    root = tmp_path / "pod"

    def local(path: str) -> str:
        return str(root / path.lstrip("/"))

    # Volumes as kubelet would mount them.
    ca_secret = one(docs, "Secret", "-ca")
    mounts = {
        m["name"]: m["mountPath"]
        for m in proxy["volumeMounts"] + prepare["volumeMounts"]
    }
    _kubelet_configmap(
        Path(local(mounts["ca"])),
        {k: base64.b64decode(v).decode() for k, v in ca_secret["data"].items()},
        1,
    )
    for m in proxy["volumeMounts"]:
        if m["name"].startswith("secret-"):
            _kubelet_configmap(
                Path(local(m["mountPath"])), {"token": "t0k3n", "team": "blue"}, 1
            )
    spec_cm = one(docs, "ConfigMap", "-spec")["data"]
    spec_dir = Path(local(mounts["spec"]))
    rewrite = lambda text: FILE_REF.sub(
        lambda m: f"${{file:{local(m.group(1))}}}", text
    )
    _kubelet_configmap(spec_dir, {k: rewrite(v) for k, v in spec_cm.items()}, 1)
    Path(local(mounts["confdir"])).mkdir(parents=True)
    upstream = Path(local(mounts["upstream-ca"]))
    _kubelet_configmap(
        upstream, {"ca.crt": base64.b64decode(ca_secret["data"]["ca.crt"]).decode()}, 1
    )

    # prepare-ca, as rendered, on the mapped paths.
    paths = "|".join(
        re.escape(p) for p in sorted(set(mounts.values()), key=len, reverse=True)
    )
    script = re.sub(
        rf"(?<![\w/])({paths})", lambda m: local(m.group(1)), prepare["args"][0]
    )
    subprocess.run([*prepare["command"], script], check=True, timeout=30)
    confdir = Path(local(mounts["confdir"]))
    ca_pem = (confdir / "mitmproxy-ca.pem").read_bytes()
    assert (confdir / "mitmproxy-ca.pem").stat().st_mode & 0o077 == 0

    args = [local(a) if a.startswith("/") else a for a in proxy["args"]]
    args = [a.replace("0.0.0.0:", "127.0.0.1:") for a in args]
    proc = subprocess.Popen(
        [find_tool("egress-proxy"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{metrics_port}"
        deadline = time.monotonic() + 20
        while _get(f"{base}/readyz")[0] != 200:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "proxy not ready"
            time.sleep(0.1)
        assert _get(f"{base}/healthz")[0] == 200
        # mitmproxy used the CA from the Secret (it only generates one when none is there).
        assert (confdir / "mitmproxy-ca.pem").read_bytes() == ca_pem
        assert (confdir / "mitmproxy-dhparam.pem").exists()

        # A ConfigMap update, as kubelet applies it: the proxy reloads, same process.
        new_env = yaml.safe_load(spec_cm["spec.yaml"])
        new_env["network"]["allowlist"].append({"domain": "files.example.com"})
        _kubelet_configmap(spec_dir, {"spec.yaml": rewrite(yaml.safe_dump(new_env))}, 2)
        deadline = time.monotonic() + 15
        pattern = re.compile(
            r'^egress_config_reloads_total\{result="success"\} ([0-9.]+)$', re.MULTILINE
        )
        while True:
            m = pattern.search(_get(f"{base}/metrics")[1])
            if m and float(m.group(1)) >= 1:
                break
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "ConfigMap update not reloaded"
            time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- docs/kubernetes.md ---------------------------------------------------------------------


def test_readme_install_command_and_sandbox_pod(helm, tmp_path):
    """docs/kubernetes.md: the install command renders, and the sandbox pod example is a
    valid Pod that names the Service, port, CA ConfigMap and label the chart creates."""
    section = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    install = next(
        b
        for b in re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
        if "helm install" in b
    )
    command = shlex.split(
        install.split("helm install", 1)[1].replace("\\\n", " ").split("\n")[0]
    )
    release, chart, *flags = command
    namespace = flags[flags.index("-n") + 1]
    out = subprocess.run(
        [helm, "template", release, str(REPO / chart), *flags],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert yaml.safe_load(one(docs, "ConfigMap", "-spec")["data"]["spec.yaml"])[
        "network"
    ]["allowlist"][0]["transform"]

    pod = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod), encoding="utf-8")
    valid = kubernetes_validate(KUBERNETES_VERSIONS[0], path)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    service = one(docs, "Service")
    proxy_port = next(
        p["port"] for p in service["spec"]["ports"] if p["name"] == "proxy"
    )
    env = {e["name"]: e["value"] for e in container(pod["spec"], "sandbox")["env"]}
    assert (
        env["HTTPS_PROXY"]
        == f"http://{service['metadata']['name']}.{namespace}.svc:{proxy_port}"
    )
    ca_cm = next(
        v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v
    )
    assert ca_cm == one(docs, "ConfigMap", "-ca-cert")["metadata"]["name"]
    policy = one(docs, "NetworkPolicy", "-sandbox-egress")
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= pod["metadata"]["labels"].items()
    )
    assert pod["metadata"]["namespace"] == namespace == policy["metadata"]["namespace"]
    # DNS: the gateway's Service is the pod's only nameserver, and the proxy's own name
    # (which the gateway's DNS does not answer) is mapped to it.
    cluster_ip = service["spec"]["clusterIP"]
    assert pod["spec"]["dnsPolicy"] == "None" and pod["spec"]["dnsConfig"]["nameservers"] == [cluster_ip]
    assert pod["spec"]["hostAliases"] == [{"ip": cluster_ip, "hostnames": [f"{service['metadata']['name']}.{namespace}.svc"]}]
    assert {p["port"] for p in service["spec"]["ports"] if p["protocol"] == "UDP"} == {53}


# --- many environments in one gateway (--spec-dir) -------------------------------------------


def test_environments_configmap_accepted_by_check_spec_dir(render, tmp_path):
    values_file = CI_VALUES["gateway-environments"]
    values = yaml.safe_load(values_file.read_text(encoding="utf-8"))
    docs = render(values_file)
    data = one(docs, "ConfigMap", "-environments")["data"]
    assert sorted(data) == sorted(f"{env}.yaml" for env in values["environments"])
    workload = one(docs, "Deployment")
    spec = pod_spec(workload)
    proxy = container(spec, "egress-proxy")
    assert "--spec" not in proxy["args"]
    spec_dir = proxy["args"][proxy["args"].index("--spec-dir") + 1]
    spec_volume = next(v for v in spec["volumes"] if v.get("configMap", {}).get("name", "").endswith("-environments"))
    mount = next(m for m in proxy["volumeMounts"] if m["name"] == spec_volume["name"])
    assert mount["mountPath"] == spec_dir and "subPath" not in mount
    mounts = _secret_mounts(spec, "egress-proxy")

    # Every ${file:} (tokens and transforms) points into the environment's own Secret.
    root = tmp_path / "secrets"
    secret_values = {}
    for name, text in data.items():
        environment = name.removesuffix(".yaml")
        for ref in FILE_REF.findall(text):
            directory, _, key = ref.rpartition("/")
            assert mounts.get(directory) == values["environments"][environment]["secretName"], (ref, mounts)
            assert directory.endswith(f"/{environment}")
            secret_values[ref] = f"sk-test-{environment}-{key}-do-not-render"
            target = root / ref.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(secret_values[ref] + "\n", encoding="utf-8")
    assert any(ref.endswith("/team-a/proxyToken") for ref in secret_values), "the chart sets proxyToken from the Secret"
    local = tmp_path / "environments"
    local.mkdir()
    for name, text in data.items():
        (local / name).write_text(FILE_REF.sub(lambda m: f"${{file:{root}{m.group(1)}}}", text), encoding="utf-8")
    out = subprocess.run(
        [find_tool("egress-proxy"), "check", "--spec-dir", str(local)],
        check=False, capture_output=True, text=True, timeout=60, env={**os.environ, "FROZEN_TOKEN": "frozen-token"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok (3 environments, 3 allowlist entries)" in out.stdout
    rendered = helm_template_text(render, values_file)
    for value in secret_values.values():
        assert value not in rendered


ENVIRONMENT_ERRORS = {
    "sidecar": ({"pattern": "sidecar", "sidecar": {"dnsServers": ["10.96.0.10"]}, "environments": {"a": {"secretName": "s", "spec": {"allowlist": []}}}},
                "only with pattern: gateway"),
    "literal token": ({"environments": {"a": {"spec": {"network": {"proxyToken": "tok-123", "allowlist": []}}}}},
                      "proxyToken"),
    "literal transform": ({"environments": {"a": {"secretName": "s", "spec": {"allowlist": [
        {"domain": "x.example.com", "transform": {"Authorization": "Bearer sk-123"}}]}}}}, "transform"),
    "bad id": ({"environments": {"Team_A": {"secretName": "s", "spec": {"allowlist": []}}}}, "Team_A"),
    "no token": ({"environments": {"a": {"spec": {"allowlist": []}}}}, "would refuse every client"),
    "no spec": ({"environments": {"a": {"secretName": "s"}}}, "environments.a.spec: missing"),
}  # fmt: skip


@pytest.mark.parametrize("case", ENVIRONMENT_ERRORS)
def test_environments_bad_values_are_refused(helm, tmp_path, case):
    values, message = ENVIRONMENT_ERRORS[case]
    out = helm_template(helm, write_values(tmp_path, "bad", values))
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert "sk-123" not in out.stdout and "tok-123" not in out.stdout


def test_environments_from_an_existing_configmap(render, tmp_path):
    values = {"existingEnvironmentsConfigMap": "my-envs", "environments": {"team-a": {"secretName": "egress-team-a"}}}
    docs = render(write_values(tmp_path, "existing", values))
    assert not [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith(("-environments", "-spec"))]
    spec = pod_spec(one(docs, "Deployment"))
    assert {"name": "spec", "configMap": {"name": "my-envs"}} in spec["volumes"]
    assert _secret_mounts(spec, "egress-proxy")["/var/run/secrets/egress-proxy/environments/team-a"] == "egress-team-a"
    assert "--spec-dir" in container(spec, "egress-proxy")["args"]


def test_environments_notes_print_the_proxy_url_form(helm, tmp_path):
    out = subprocess.run(
        [helm, "install", "rel", str(CHART), "--namespace", "sandboxes", "--dry-run=client",
         "-f", str(CI_VALUES["gateway-environments"])],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    notes = out.stdout[out.stdout.index("NOTES:") :]
    assert "HTTPS_PROXY=http://ENV_ID:TOKEN@rel-egress-proxy.sandboxes.svc:8080" in notes
    assert 'value: "http://frozen:$(EGRESS_PROXY_TOKEN)@rel-egress-proxy.sandboxes.svc:8080"' in notes
    assert "Environments (3): frozen, team-a, team-b.prod" in notes


def test_environments_as_bare_specs_with_environment_secrets(render, tmp_path):
    """`environments` as id -> spec (the issue's form), Secrets from `environmentSecrets`."""
    values = {
        "environments": {
            "env-a": {"network": {"allowlist": [{"domain": "api.example.com", "transform": {
                "Authorization": "Bearer ${file:/var/run/secrets/egress-proxy/environments/env-a/api}"}}]}},
            "env-b": {"allowlist": [{"domain": "pypi.org"}]},
        },
        "environmentSecrets": {"env-a": "secret-a", "env-b": "secret-b"},
    }  # fmt: skip
    jsonschema.validate({**DEFAULTS, **values}, SCHEMA)
    docs = render(write_values(tmp_path, "bare", values))
    data = one(docs, "ConfigMap", "-environments")["data"]
    assert yaml.safe_load(data["env-b.yaml"]) == {
        "allowlist": [{"domain": "pypi.org"}],
        "proxyToken": "${file:/var/run/secrets/egress-proxy/environments/env-b/proxyToken}",
    }
    assert yaml.safe_load(data["env-a.yaml"])["network"]["proxyToken"].endswith("/env-a/proxyToken}")
    mounts = _secret_mounts(pod_spec(one(docs, "Deployment")), "egress-proxy")
    assert mounts["/var/run/secrets/egress-proxy/environments/env-a"] == "secret-a"
    assert mounts["/var/run/secrets/egress-proxy/environments/env-b"] == "secret-b"


def test_existing_configmap_with_environment_secrets(render, tmp_path):
    values = {"existingEnvironmentsConfigMap": "my-envs", "environmentSecrets": {"team-a": "egress-team-a"}}
    jsonschema.validate({**DEFAULTS, **values}, SCHEMA)
    spec = pod_spec(one(render(write_values(tmp_path, "existing", values)), "Deployment"))
    assert {"name": "spec", "configMap": {"name": "my-envs"}} in spec["volumes"]
    assert _secret_mounts(spec, "egress-proxy")["/var/run/secrets/egress-proxy/environments/team-a"] == "egress-team-a"


def _proxy_status(port: int, request: str) -> tuple[int, str]:
    """One raw request to the proxy on loopback: (status, X-Egress-Denied)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request.encode())
        data = recv_head(sock)
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
    return int(head[0].split()[1]), headers.get("x-egress-denied", "")


def test_rendered_environments_gateway_runs_proves_environments_and_reloads_one(render, tmp_path):
    """The rendered gateway with `environments`, run for real on the pod's paths: the token
    from the environment's Secret proves it, anything else gets 407, and a ConfigMap swap
    that changes one environment reloads that one. No request leaves loopback: the
    allowed-credentials request names a host no allowlist has (refused before any lookup)."""
    port, metrics_port = _free_port(), _free_port()
    values = write_values(tmp_path, "ports", {"proxy": {"port": port, "metricsPort": metrics_port}})
    docs = render(CI_VALUES["gateway-environments"], values)
    spec = pod_spec(one(docs, "Deployment"))
    proxy, prepare = container(spec, "egress-proxy"), container(spec, "prepare-ca")
    root = tmp_path / "pod"

    def local(path: str) -> str:
        return str(root / path.lstrip("/"))

    mounts = {m["name"]: m["mountPath"] for m in proxy["volumeMounts"] + prepare["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    ca_secret = one(docs, "Secret", "-ca")
    _kubelet_configmap(Path(local(mounts["ca"])), {k: base64.b64decode(v).decode() for k, v in ca_secret["data"].items()}, 1)
    tokens = {}
    for m in proxy["volumeMounts"]:
        secret = volumes[m["name"]].get("secret", {}).get("secretName", "")
        if m["name"].startswith("env-"):
            tokens[m["mountPath"].rsplit("/", 1)[1]] = f"tok-{secret}-0123456789"
            files = {"proxyToken": tokens[m["mountPath"].rsplit("/", 1)[1]], "github-token": f"sk-{secret}-do-not-render"}
            _kubelet_configmap(Path(local(m["mountPath"])), files, 1)
    assert sorted(tokens) == ["team-a", "team-b.prod"]
    environments = one(docs, "ConfigMap", "-environments")["data"]
    spec_dir = Path(local(mounts["spec"]))
    rewrite = lambda text: FILE_REF.sub(lambda m: f"${{file:{local(m.group(1))}}}", text)  # noqa: E731
    _kubelet_configmap(spec_dir, {k: rewrite(v) for k, v in environments.items()}, 1)
    Path(local(mounts["confdir"])).mkdir(parents=True)
    paths = "|".join(re.escape(p) for p in sorted(set(mounts.values()), key=len, reverse=True))
    subprocess.run([*prepare["command"], re.sub(rf"(?<![\w/])({paths})", lambda m: local(m.group(1)), prepare["args"][0])],
                   check=True, timeout=30)  # fmt: skip

    args = [local(a) if a.startswith("/") else a for a in proxy["args"]]
    args = [a.replace("0.0.0.0:", "127.0.0.1:") for a in args]
    assert "--spec-dir" in args
    proc = subprocess.Popen([find_tool("egress-proxy"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FROZEN_TOKEN": "frozen-0123456789"})  # fmt: skip
    try:
        base = f"http://127.0.0.1:{metrics_port}"
        deadline = time.monotonic() + 20
        while _get(f"{base}/readyz")[0] != 200:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "proxy not ready"
            time.sleep(0.1)

        def ask(user: str | None, password: str = "") -> tuple[int, str]:
            auth = f"Proxy-Authorization: Basic {base64.b64encode(f'{user}:{password}'.encode()).decode()}\r\n" if user else ""
            return _proxy_status(port, f"GET http://not-listed.invalid/ HTTP/1.1\r\nHost: not-listed.invalid\r\n{auth}\r\n")

        for environment, token in (*tokens.items(), ("frozen", "frozen-0123456789")):
            assert ask(environment, token) == (403, "not_allowlisted")
            assert ask(environment, token + "x") == (407, "proxy_auth_required")
        assert ask(None) == (407, "proxy_auth_required")
        assert ask("team-a", tokens["team-b.prod"]) == (407, "proxy_auth_required")

        # A ConfigMap update that changes team-a only (kubelet swaps every file's link).
        changed = yaml.safe_load(environments["team-a.yaml"])
        changed["network"]["allowlist"].append({"domain": "files.example.com"})
        _kubelet_configmap(spec_dir, {**{k: rewrite(v) for k, v in environments.items()},
                                      "team-a.yaml": rewrite(yaml.safe_dump(changed))}, 2)  # fmt: skip
        pattern = re.compile(r'^egress_environment_reloads_total\{environment="([^"]*)",result="success"\} ([0-9.]+)$', re.MULTILINE)
        deadline = time.monotonic() + 15
        while not (reloaded := {e: float(n) for e, n in pattern.findall(_get(f"{base}/metrics")[1])}):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "ConfigMap update not reloaded"
            time.sleep(0.2)
        time.sleep(1.5)  # a few more polls: nothing else is reloaded
        reloaded = {e: float(n) for e, n in pattern.findall(_get(f"{base}/metrics")[1])}
        assert reloaded == {"team-a": 1.0}
        assert ask("team-a", tokens["team-a"]) == (403, "not_allowlisted")
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    for token in tokens.values():
        assert token not in err
