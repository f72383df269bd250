"""Shared helpers of the deploy tests: render a kustomization with the real `kubectl kustomize`, find
documents, check the Prometheus Operator kinds that kubernetes-validate has no schema for, and decide
what a NetworkPolicy admits (the semantics of networking.k8s.io/v1, for the policies we write)."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import require_binary

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30"  # oldest Kubernetes these manifests target (EKS standard support)
EXPORTER_NS = "gpu-telemetry"
MONITORING_NS = "monitoring"
RELAY_POD_LABEL = ("gpu-telemetry/relay-sidecar", "true")  # on every pod that runs the relay sidecar

# Every kustomization a user may apply (bases first), relative to deploy/.
KUSTOMIZATIONS = [
    "exporter",
    "monitoring",
    "relay",
    "overlays/prometheus-operator",
    "overlays/prometheus-statefulset",
    "overlays/kube-prometheus-stack",
]
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Prometheus"}

Doc = dict[str, Any]


@functools.cache
def _render(path: str) -> str:
    kubectl = require_binary("kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"kubectl kustomize deploy/{path}:\n{out.stderr}"
    return out.stdout


def render(path: str) -> list[Doc]:
    """The documents `kubectl kustomize deploy/<path>` prints (a fresh copy per call)."""
    return [d for d in yaml.safe_load_all(_render(path)) if d]


def find(docs: Sequence[Doc], kind: str, name: str | None = None) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def container(pod_spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(matches) == 1, name
    return matches[0]


def port_number(c: Mapping[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (p,) = [p["containerPort"] for p in c.get("ports", []) if p["name"] == port]
    return int(p)


def anchored(regex: str) -> re.Pattern[str]:
    return re.compile(f"^(?:{regex})$")  # Prometheus relabel regexes are fully anchored


def load_yaml_file(rel: str) -> list[Doc]:
    with open(DEPLOY / rel) as f:
        return [d for d in yaml.safe_load_all(f) if d]


# -- Prometheus Operator kinds: a structural check of our own ----------------------------------------
# kubernetes-validate bundles only the core Kubernetes schemas. These are the fields of
# monitoring.coreos.com/v1 (Prometheus Operator API reference, v0.7x) that our manifests may use; an
# unknown or misspelt key is an error, as the operator's CRD schema (structural, pruning) would
# silently drop it. Values of type Container / Volume are checked by kubernetes-validate separately.

_RELABEL = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
_SELECTOR = {"matchLabels", "matchExpressions"}
_ENDPOINT = {
    "port", "path", "scheme", "params", "interval", "scrapeTimeout", "honorLabels", "honorTimestamps",
    "relabelings", "metricRelabelings", "followRedirects", "enableHttp2", "filterRunning",
}
_QUEUE = {
    "capacity", "minShards", "maxShards", "maxSamplesPerSend", "batchSendDeadline", "minBackoff",
    "maxBackoff", "retryOnRateLimit", "sampleAgeLimit",
}
_REMOTE_WRITE = {
    "url", "name", "remoteTimeout", "headers", "writeRelabelConfigs", "queueConfig", "metadataConfig",
    "sendExemplars", "sendNativeHistograms",
}
SCHEMA: dict[str, dict[str, set[str]]] = {
    "ServiceMonitor": {
        "spec": {"jobLabel", "targetLabels", "podTargetLabels", "endpoints", "selector", "namespaceSelector",
                 "sampleLimit"},
        "spec.endpoints[]": _ENDPOINT,
        "spec.endpoints[].relabelings[]": _RELABEL,
        "spec.endpoints[].metricRelabelings[]": _RELABEL,
        "spec.selector": _SELECTOR,
        "spec.namespaceSelector": {"any", "matchNames"},
    },
    "PodMonitor": {
        "spec": {"jobLabel", "podTargetLabels", "podMetricsEndpoints", "selector", "namespaceSelector",
                 "sampleLimit"},
        "spec.podMetricsEndpoints[]": _ENDPOINT,
        "spec.podMetricsEndpoints[].relabelings[]": _RELABEL,
        "spec.podMetricsEndpoints[].metricRelabelings[]": _RELABEL,
        "spec.selector": _SELECTOR,
        "spec.namespaceSelector": {"any", "matchNames"},
    },
    "PrometheusRule": {
        "spec": {"groups"},
        "spec.groups[]": {"name", "interval", "rules", "limit", "labels"},
        "spec.groups[].rules[]": {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"},
    },
    "Prometheus": {
        "spec": {
            "replicas", "version", "image", "serviceAccountName", "podMetadata", "securityContext",
            "resources", "retention", "storage", "externalLabels", "replicaExternalLabelName",
            "serviceMonitorSelector", "serviceMonitorNamespaceSelector", "podMonitorSelector",
            "podMonitorNamespaceSelector", "ruleSelector", "ruleNamespaceSelector", "remoteWrite",
            "containers", "volumes", "scrapeInterval", "evaluationInterval",
        },
        "spec.podMetadata": {"labels", "annotations"},
        "spec.remoteWrite[]": _REMOTE_WRITE,
        "spec.remoteWrite[].writeRelabelConfigs[]": _RELABEL,
        "spec.remoteWrite[].queueConfig": _QUEUE,
        "spec.serviceMonitorSelector": _SELECTOR,
        "spec.serviceMonitorNamespaceSelector": _SELECTOR,
        "spec.podMonitorSelector": _SELECTOR,
        "spec.podMonitorNamespaceSelector": _SELECTOR,
        "spec.ruleSelector": _SELECTOR,
        "spec.ruleNamespaceSelector": _SELECTOR,
    },
}
_METADATA = {"name", "namespace", "labels", "annotations"}


def _walk(node: Any, path: str) -> list[tuple[str, Any]]:
    """(schema path, value) for the node and everything under it, lists written as `[]`."""
    out = [(path, node)]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _walk(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for item in node:
            out += _walk(item, f"{path}[]")
    return out


def crd_errors(doc: Doc) -> list[str]:
    """What is wrong with a monitoring.coreos.com/v1 document, as `kind/name: path: message`."""
    kind = doc.get("kind", "")
    where = f"{kind}/{doc.get('metadata', {}).get('name', '?')}"
    if doc.get("apiVersion") != "monitoring.coreos.com/v1":
        return [f"{where}: apiVersion must be monitoring.coreos.com/v1, not {doc.get('apiVersion')!r}"]
    if kind not in SCHEMA:
        return [f"{where}: no structural schema for kind {kind!r}"]
    errors = [f"{where}: {k}: unknown top-level field" for k in doc if k not in {"apiVersion", "kind",
                                                                                  "metadata", "spec"}]
    meta = doc.get("metadata", {})
    errors += [f"{where}: metadata.{k}: unknown field" for k in meta if k not in _METADATA]
    if not meta.get("name") or not meta.get("namespace"):
        errors.append(f"{where}: metadata: name and namespace are required")
    for path, value in _walk(doc.get("spec", {}), "spec"):
        allowed = SCHEMA[kind].get(path)
        if allowed is not None:
            if not isinstance(value, dict):
                errors.append(f"{where}: {path}: must be a mapping")
                continue
            errors += [f"{where}: {path}.{k}: unknown field" for k in value if k not in allowed]
    for path, value in _walk(doc.get("spec", {}), "spec"):
        if path.endswith("matchLabels") and not all(isinstance(v, str) for v in value.values()):
            errors.append(f"{where}: {path}: label values must be strings")
    return errors


# -- NetworkPolicy semantics (networking.k8s.io/v1) ---------------------------------------------------


def _labels_match(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are modelled"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, src_ns: str, src_ns_labels: Mapping[str, str],
                  src_pod_labels: Mapping[str, str]) -> bool:
    assert "ipBlock" not in peer, "ipBlock peers are not modelled"
    ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
    if ns_sel is None:  # podSelector alone: pods of the policy's own namespace
        return src_ns == policy_ns and _labels_match(pod_sel or {}, src_pod_labels)
    return _labels_match(ns_sel, src_ns_labels) and (pod_sel is None or _labels_match(pod_sel, src_pod_labels))


def _port_matches(rule_port: Mapping[str, Any], port: int, protocol: str) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    if "port" not in rule_port:
        return True
    start = rule_port["port"]
    assert isinstance(start, int), "named ports are not modelled"
    return bool(start <= port <= rule_port.get("endPort", start))


def ingress_allowed(policies: Sequence[Doc], pod_ns: str, pod_labels: Mapping[str, str], port: int, *,
                    src_ns: str, src_pod_labels: Mapping[str, str] | None = None,
                    protocol: str = "TCP") -> bool:
    """Whether a connection from a pod in `src_ns` to `port` of a pod is admitted by these policies:
    isolated for ingress by any policy selecting it, then admitted if any rule of those allows it."""
    src_ns_labels = {"kubernetes.io/metadata.name": src_ns}  # set by the API server on every namespace
    selecting = [
        p for p in policies
        if p["metadata"].get("namespace") == pod_ns and _labels_match(p["spec"]["podSelector"], pod_labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress", []):
            peers = rule.get("from")
            peer_ok = not peers or any(
                _peer_matches(peer, pod_ns, src_ns, src_ns_labels, src_pod_labels or {}) for peer in peers
            )
            ports = rule.get("ports")
            port_ok = not ports or any(_port_matches(rp, port, protocol) for rp in ports)
            if peer_ok and port_ok:
                return True
    return False


# -- alerts.yaml under promtool ------------------------------------------------------------------------

ALERTS = "monitoring/alerts.yaml"


def rule_groups() -> list[dict[str, Any]]:
    rule = find(load_yaml_file(ALERTS), "PrometheusRule")
    assert rule["metadata"]["name"] and rule["metadata"]["namespace"] == EXPORTER_NS
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alert_rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def write_rules(directory: Path) -> Path:
    path = directory / "alerts.rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}))
    return path


def promtool_test(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    write_rules(tmp_path)
    spec = {"rule_files": ["alerts.rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts.test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", "alerts.test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
