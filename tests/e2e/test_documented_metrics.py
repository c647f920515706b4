"""The metric table and audit-log examples of docs/operations.md against a real proxy: every metric a
running `egress-proxy` exposes on /metrics (with `--dns-listen`, and as a `--spec-dir`
gateway) is in the table with its type and labels, every metric in the table is
exposed, and every audit line the proxy writes has the fields of the docs' example for
its event. Real clients (curl, dig) make the traffic that fills the series.
"""

from __future__ import annotations

import json
import re

import pytest
from documented import page, readme_metrics, section

SPEC = """network:
  allowCidrs: [198.18.0.0/15]
  allowlist:
    - domain: plain.test
    - domain: passthrough.test
    - domain: api.example.test
      transform:
        Authorization: "Bearer documented-canary"
"""
# Recorded by the hook dispatcher embedded as a library, never by the proxy (docs/operations.md says so).
NOT_FROM_THE_PROXY = {"egress_hook_runs_total"}
# The docs' `info` is the OpenMetrics type; the Prometheus text format calls it a gauge.
TYPE_ALIASES = {"info": "gauge"}


def scrape(proxy) -> tuple[dict[str, str], dict[str, set[frozenset[str]]]]:
    """(metric name -> type, metric name -> label-name sets of its samples) from /metrics."""
    status, body = proxy.get_ops("/metrics")
    assert status == 200, body
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, re.M))
    labels: dict[str, set[frozenset[str]]] = {}
    for name, label_text in re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{(.*?)\})? \S+$", body, re.M):
        family = next((t for t in types if name == t or name in (t + "_bucket", t + "_count", t + "_sum")), None)
        assert family, f"sample {name} has no # TYPE line"
        names = frozenset(re.findall(r'(\w+)="', label_text or "")) - {"le"}
        labels.setdefault(family, set()).add(names)
    return types, labels


def check_against_readme(types: dict[str, str], labels: dict[str, set[frozenset[str]]]) -> None:
    documented = readme_metrics()
    text = page("operations.md")
    for name, kind in types.items():
        if not name.startswith("egress_"):
            # prometheus-client's own process and runtime metrics
            prefix = name.split("_", 1)[0]
            assert prefix in ("process", "python"), f"{name} is exposed but not ours nor prometheus-client's"
            assert f"`{prefix}_*`" in section(text, "## Metrics and health"), f"docs/operations.md does not mention {prefix}_*"
            continue
        assert name in documented, f"{name} is exposed but missing from the metric table of docs/operations.md"
        doc_type, doc_labels = documented[name]
        assert TYPE_ALIASES.get(doc_type, doc_type) == kind, f"{name}: docs say {doc_type}, /metrics says {kind}"
        for sample_labels in labels.get(name, ()):
            assert sample_labels == doc_labels, f"{name}: docs labels {sorted(doc_labels)}, /metrics {sorted(sample_labels)}"


def audit_examples() -> dict[str, list[frozenset[str]]]:
    """The audit-log JSON examples of docs/operations.md: event -> the field sets shown for it."""
    examples: dict[str, list[frozenset[str]]] = {}
    for line in re.findall(r"^(\{\"time\".*\})$", section(page("operations.md"), "## Audit log"), re.M):
        entry = json.loads(line)
        examples.setdefault(entry["event"], []).append(frozenset(entry))
    return examples


@pytest.fixture(scope="module")
def proxy_with_traffic(lab):
    dns_port = lab.free_port()
    proxy = lab.start_proxy(SPEC, "--dns-listen", f"127.0.0.1:{dns_port}")
    try:
        curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "-x", proxy.url]
        results = {
            "plain allowed": lab.exec(*curl, "http://plain.test/"),
            "plain blocked": lab.exec(*curl, "http://other.test/"),
            "tunnel blocked": lab.exec(*curl, "https://other.test/"),
            "passthrough": lab.exec(*curl, "--cacert", str(lab.upstream_ca), "https://passthrough.test/"),
            "injected": lab.exec(*curl, "--cacert", str(proxy.ca), "https://api.example.test/"),
            "dns blocked": lab.exec("dig", "+tries=2", "+time=3", "-p", str(dns_port), "@127.0.0.1", "other.test", "TXT"),
            "dns allowed": lab.exec("dig", "+tries=2", "+time=3", "-p", str(dns_port), "@127.0.0.1", "plain.test", "A"),
        }
        assert results["plain allowed"].stdout == "200", results
        assert results["plain blocked"].stdout == "403", results
        assert results["passthrough"].stdout == "200", results
        assert results["injected"].stdout == "200", results
        assert "status: NXDOMAIN" in results["dns blocked"].stdout, results["dns blocked"].stdout
        assert "status: NOERROR" in results["dns allowed"].stdout, results["dns allowed"].stdout
        yield proxy
    finally:
        proxy.stop()


def test_metrics_of_a_proxy_with_dns_are_documented(proxy_with_traffic):
    types, labels = scrape(proxy_with_traffic)
    # The traffic above filled these: their label sets are compared with the docs'.
    for name in ("egress_requests_total", "egress_dns_queries_total", "egress_credential_injections_total"):
        assert labels.get(name), f"no {name} sample after the traffic"
    check_against_readme(types, labels)
    missing = set(readme_metrics()) - set(types) - NOT_FROM_THE_PROXY
    assert not missing, f"The metric table of docs/operations.md lists metrics the proxy does not expose: {sorted(missing)}"


def test_metrics_of_a_gateway_are_documented(lab, tmp_path):
    directory = tmp_path / "envs"
    directory.mkdir()
    (directory / "team-a.yaml").write_text(
        "network:\n  proxyToken: documented-token-a\n  allowCidrs: [198.18.0.0/15]\n  allowlist:\n    - domain: plain.test\n"
    )
    proxy = lab.start_proxy(None, spec_dir=directory)
    try:
        url = proxy.url.replace("http://", "http://team-a:documented-token-a@")
        curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"]
        assert lab.exec(*curl, "-x", url, "http://plain.test/").stdout == "200"
        assert lab.exec(*curl, "-x", proxy.url, "http://plain.test/").stdout == "407"
        types, labels = scrape(proxy)
        assert labels.get("egress_requests_total")
        check_against_readme(types, labels)
        assert "egress_environments" in types and "egress_environment_reloads_total" in types
    finally:
        proxy.stop()


def test_audit_lines_have_the_fields_readme_shows(proxy_with_traffic):
    examples = audit_examples()
    seen = set()
    for entry in proxy_with_traffic.audit():
        event = entry["event"]
        assert event in examples, f"docs/operations.md shows no audit line for event {event!r}: {entry}"
        assert frozenset(entry) in examples[event], f"{event} line has fields {sorted(entry)}, the docs show {examples[event]}"
        seen.add(event)
    assert seen >= {"request", "tunnel", "tunnel_closed", "dns"}, seen


def test_metrics_of_workers_are_documented(lab):
    """`--workers 2`: the supervisor's aggregated /metrics has documented names and labels only."""
    proxy = lab.start_proxy(SPEC, "--workers", "2")
    try:
        curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "-x", proxy.url]
        assert lab.exec(*curl, "http://other.test/").stdout == "403"
        types, labels = scrape(proxy)
        assert labels.get("egress_requests_total"), types
        check_against_readme(types, labels)
    finally:
        proxy.stop()
