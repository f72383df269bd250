"""deploy/jobwatch renders with `kubectl kustomize`, validates against the Kubernetes schemas, and
says what the issue asks: one non-root read-only replica on :9403, read-only RBAC (tokenreviews
only with the push component), metrics admitted from the monitoring namespace only."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30"
Doc = dict[str, Any]


def render(path: str) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    out = subprocess.run([kubectl, "kustomize", str(ROOT / path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[Doc], kind: str, name: str = "gpu-jobwatch") -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.fixture(scope="module")
def base() -> list[Doc]:
    return render("deploy/jobwatch")


@pytest.fixture(scope="module")
def push() -> list[Doc]:
    return render("deploy/overlays/jobwatch-push")


def test_every_document_validates(base: list[Doc], push: list[Doc]) -> None:
    for doc in base + push:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def test_base_is_plain_kubernetes_kinds(base: list[Doc]) -> None:
    assert sorted(d["kind"] for d in base) == ["ClusterRole", "ClusterRoleBinding", "Deployment",
                                                "NetworkPolicy", "Service", "ServiceAccount"]
    assert all(d["metadata"].get("namespace", "gpu-telemetry") == "gpu-telemetry" for d in base)


def test_deployment_one_non_root_read_only_replica(base: list[Doc]) -> None:
    dep = find(base, "Deployment")
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-jobwatch"
    (c,) = pod["containers"]
    assert c["command"] == ["gpu-jobwatch"]
    assert "--listen=:9403" in c["args"]
    assert not any(a.startswith("--push-listen") for a in c["args"])  # push is opt-in
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_rbac_is_read_only_without_push(base: list[Doc]) -> None:
    rules = find(base, "ClusterRole")["rules"]
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in rules)
    granted = {(g, res) for r in rules for g in r["apiGroups"] for res in r["resources"]}
    assert granted == {("", "pods"), ("", "nodes"), ("trainer.kubeflow.org", "trainjobs")}
    binding = find(base, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-jobwatch", "namespace": "gpu-telemetry"}]


def test_push_component_adds_only_tokenreviews_and_its_port(base: list[Doc], push: list[Doc]) -> None:
    role = find(push, "ClusterRole", "gpu-jobwatch-push")
    assert role["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
                              "verbs": ["create"]}]
    assert find(push, "ClusterRole") == find(base, "ClusterRole")  # the read-only role is unchanged
    c = find(push, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--push-listen=:9411" in c["args"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9403, "push": 9411}
    assert {p["name"]: p["port"] for p in find(push, "Service")["spec"]["ports"]} == {"metrics": 9403, "push": 9411}
    assert [p["port"] for p in find(base, "Service")["spec"]["ports"]] == [9403]
    ingress = find(push, "NetworkPolicy", "gpu-jobwatch-push")["spec"]["ingress"]
    assert ingress == [{"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 9411}]}]


def test_metrics_port_only_from_the_monitoring_namespace(base: list[Doc]) -> None:
    pol = find(base, "NetworkPolicy")
    assert pol["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "gpu-jobwatch"}}
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    assert pol["spec"]["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": 9403}]}]


def test_servicemonitor_scrapes_the_metrics_port_keeping_workload_labels(push: list[Doc]) -> None:
    sm = find(push, "ServiceMonitor")
    assert sm["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "gpu-jobwatch"}}
    (ep,) = sm["spec"]["endpoints"]
    assert (ep["port"], ep["path"], ep["honorLabels"]) == ("metrics", "/metrics", True)
    known = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "relabelings"}
    assert set(ep) <= known


def test_kubernetes_validate_catches_a_misspelt_field(base: list[Doc]) -> None:
    dep = copy.deepcopy(find(base, "Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
