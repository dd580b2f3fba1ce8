"""deploy/kubernetes/lattice.yaml is valid Kubernetes (strict schema check with
kubernetes-validate, no cluster needed): a Deployment whose readiness probe reads /health and
whose pods are annotated for Prometheus to scrape /metrics, and a Service in front."""
from __future__ import annotations

import pathlib

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "deploy" / "kubernetes" / "lattice.yaml"


def test_kubernetes_manifest_is_valid_and_probes_health():
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    version = kubernetes_validate.latest_version()
    for d in docs:
        kubernetes_validate.validate(d, version, strict=True)
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Deployment", "Service"}
    pod = kinds["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["args"][0] == "serve"
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    port = container["ports"][0]["containerPort"]
    assert str(port) in container["args"] and pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert kinds["Service"]["spec"]["selector"] == kinds["Deployment"]["spec"]["selector"]["matchLabels"]
