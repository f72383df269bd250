"""The exporter's deploy: `kubectl apply -k deploy/` installs deploy/exporter (deploy/daemonset.yaml is
its DaemonSet), the DaemonSet's contract (where it schedules, args, probes, securityContext, the
collectors ConfigMap), the optional profiling component, and the overlays running the same exporter.

Scheduling is checked with the semantics of the Kubernetes scheduler for the fields we use:
nodeSelectorTerms are ORed, a term's matchExpressions ANDed (In / Exists); a NoSchedule or NoExecute
taint needs a toleration with its key (operator Exists: any value) and its effect (empty: every effect).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from exporter.counters_csv import load_counters
from tests.deploy.render import (
    DEPLOY,
    EXPORTER_NS,
    K8S_VERSION,
    ROOT,
    anchored,
    container,
    find,
    port_number,
    render,
)
from tests.helpers import require_binary

# -- exporter DaemonSet ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exporter_docs() -> list[dict[str, Any]]:
    return render("exporter")


def exporter_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = find(docs, "DaemonSet")["spec"]["template"]["spec"]
    return pod


def test_daemonset_runs_only_on_gpu_nodes_and_tolerates_the_gpu_taint(
    exporter_docs: list[dict[str, Any]],
) -> None:
    pod = exporter_pod(exporter_docs)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    gfd = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    assert any(gfd in t["matchExpressions"] for t in terms)  # GFD's label: one alternative among several
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in pod["tolerations"])
    assert pod["priorityClassName"] == "system-node-critical"


def test_daemonset_exporter_args_env_resources_and_kubelet_socket(
    exporter_docs: list[dict[str, Any]],
) -> None:
    pod = exporter_pod(exporter_docs)
    c = container(pod, "gpu-exporter")
    assert c["args"] == ["--listen=:9400", "--kubernetes", "--interval=5s",
                         "--collectors=/etc/gpu-exporter/collectors.csv"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["GPU_EXPORTER_LOG_FORMAT"]["value"] == "json"
    assert c["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    (vol,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert vol["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert mount == {"name": vol["name"], "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}


def test_daemonset_liveness_is_health_and_readiness_is_ready_on_the_port_named_metrics(
    exporter_docs: list[dict[str, Any]],
) -> None:
    # Issue 7: /health is liveness (200 unless the collection loop is stuck, even with every GPU
    # lost: restarting cannot fix hardware); /ready is readiness (503 while no GPU is up).
    c = container(exporter_pod(exporter_docs), "gpu-exporter")
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("metrics", 9400)]
    live, ready = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
    assert (live["path"], live["port"], port_number(c, live["port"])) == ("/health", "metrics", 9400)
    assert (ready["path"], ready["port"], port_number(c, ready["port"])) == ("/ready", "metrics", 9400)
    # A node whose GPUs are all down stays unready, never restart-loops: liveness is patient.
    probe = c["livenessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 60


def test_daemonset_security_context_is_locked_down_and_keeps_its_reasoning(
    exporter_docs: list[dict[str, Any]],
) -> None:
    pod = exporter_pod(exporter_docs)
    sc = container(pod, "gpu-exporter")["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}  # SYS_ADMIN for GPM is opt-in (commented)
    assert sc.get("privileged", False) is False
    # uid 0 only for the root-owned kubelet socket, and only with --kubernetes (see the manifest).
    assert sc["runAsUser"] != 0 or "--kubernetes" in container(pod, "gpu-exporter")["args"]
    assert pod["automountServiceAccountToken"] is False
    assert find(exporter_docs, "ServiceAccount")["automountServiceAccountToken"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    text = (DEPLOY / "daemonset.yaml").read_text()
    for reason in ("kubelet.sock owned by root", "NVreg_RestrictProfilingToAdminUsers", "SYS_ADMIN"):
        assert reason in text


def test_service_exposes_port_9400_named_metrics_for_the_daemonset_pods(
    exporter_docs: list[dict[str, Any]],
) -> None:
    svc = find(exporter_docs, "Service")
    pod_labels = find(exporter_docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", 9400)]
    namespaced = [d for d in exporter_docs if d["kind"] != "Namespace"]
    assert {d["metadata"].get("namespace") for d in namespaced} == {EXPORTER_NS}


def test_servicemonitor_selects_the_service_every_15s_and_honours_pod_labels(
    exporter_docs: list[dict[str, Any]],
) -> None:
    sm = find(render("monitoring"), "ServiceMonitor")
    assert sm["metadata"]["namespace"] == EXPORTER_NS
    svc = find(exporter_docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert EXPORTER_NS in sm["spec"]["namespaceSelector"]["matchNames"]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["interval"] == "15s"
    assert ep["honorLabels"] is True
    # The target's own pod/namespace/container labels must not attribute unheld GPUs to the exporter pod.
    drops = [r for r in ep["relabelings"] if r["action"] == "labeldrop"]
    assert any(
        anchored(r["regex"]).match(label) for r in drops for label in ("pod", "namespace", "container")
    )


@pytest.mark.parametrize("overlay", ["overlays/prometheus-operator", "overlays/kube-prometheus-stack",
                                     "overlays/prometheus-statefulset"])
def test_every_overlay_runs_the_same_exporter(overlay: str, exporter_docs: list[dict[str, Any]]) -> None:
    assert find(render(overlay), "DaemonSet", "gpu-exporter") == find(exporter_docs, "DaemonSet")


def test_daemonset_args_and_env_are_accepted_by_the_exporter_flag_parser() -> None:
    if not (ROOT / "exporter" / "settings.py").exists():
        pytest.skip("exporter/settings.py is not written yet")
    settings = pytest.importorskip("exporter.settings")
    c = container(find(render("exporter"), "DaemonSet")["spec"]["template"]["spec"], "gpu-exporter")
    env = {e["name"]: e.get("value", "gpu-node-1") for e in c["env"]}
    s = settings.load_settings(c["args"], env)
    assert (s.listen_port, s.interval_s, s.kubernetes) == (9400, 5.0, True)
    assert s.pod_resources_socket.startswith("/var/lib/kubelet/pod-resources/")
    assert s.hostname == "gpu-node-1"
    # -f names the file the collectors ConfigMap is mounted as, and that file loads.
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "collectors"]
    assert s.collectors == f"{mount['mountPath']}/collectors.csv"
    names = [spec.field for spec in load_counters(str(DEPLOY / "exporter" / "collectors.csv"))]
    assert "DCGM_FI_DEV_GPU_UTIL" in names and "DCGM_FI_PROF_SM_ACTIVE" in names



# -- deploy/ is the exporter -----------------------------------------------------------------------------


def test_kubectl_apply_k_deploy_installs_the_exporter_base() -> None:
    docs = render(".")
    assert docs == render("exporter")
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "DaemonSet", "Namespace", "Service", "ServiceAccount"]
    for doc in docs:  # the same documents test_deploy validates for deploy/exporter, checked here again
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def test_deploy_daemonset_yaml_is_the_exporters_daemonset() -> None:
    path = DEPLOY / "daemonset.yaml"
    assert path.resolve() == (DEPLOY / "exporter" / "daemonset.yaml").resolve()
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert find(docs, "DaemonSet")["metadata"]["name"] == "gpu-exporter"


def test_collectors_configmap_is_mounted_read_only_where_the_args_point(
    exporter_docs: list[dict[str, Any]],
) -> None:
    pod = exporter_pod(exporter_docs)
    (vol,) = [v for v in pod["volumes"] if v["name"] == "collectors"]
    cm = find(exporter_docs, "ConfigMap")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]  # kustomize's hashed name, rewritten
    assert cm["metadata"]["name"].startswith("gpu-exporter-collectors-")
    assert cm["data"]["collectors.csv"] == (DEPLOY / "exporter" / "collectors.csv").read_text()
    c = container(pod, "gpu-exporter")
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "collectors"]
    assert mount["readOnly"] is True and f"--collectors={mount['mountPath']}/collectors.csv" in c["args"]
    assert mount["mountPath"] != "/etc/dcgm-exporter"  # the image's dcgm-exporter CSVs stay visible


# -- where the DaemonSet schedules ------------------------------------------------------------------------


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    op, key = expr["operator"], expr["key"]
    if op == "In":
        return key in labels and labels[key] in expr["values"]
    if op == "Exists":
        return key in labels
    raise AssertionError(f"operator {op} not modelled")


def _affinity_admits(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(set(t) == {"matchExpressions"} for t in terms)
    selector_ok = all(labels.get(k) == v for k, v in pod.get("nodeSelector", {}).items())
    return selector_ok and any(all(_expression_matches(e, labels) for e in t["matchExpressions"]) for t in terms)


def _tolerates(pod: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    for t in pod.get("tolerations", []):
        key_ok = t.get("key") == taint["key"] or (not t.get("key") and t.get("operator") == "Exists")
        value_ok = t.get("operator") == "Exists" or t.get("value") == taint.get("value")
        if key_ok and value_ok and t.get("effect", "") in ("", taint["effect"]):
            return True
    return False


def _schedules(pod: Mapping[str, Any], labels: Mapping[str, str], taints: list[dict[str, str]]) -> bool:
    hard = [t for t in taints if t["effect"] in ("NoSchedule", "NoExecute")]
    return _affinity_admits(pod, labels) and all(_tolerates(pod, t) for t in hard)


MNG = {"eks.amazonaws.com/nodegroup": "gpu", "eks.amazonaws.com/capacityType": "ON_DEMAND",
       "eks.amazonaws.com/nodegroup-image": "ami-0123456789abcdef0", "kubernetes.io/arch": "amd64",
       "kubernetes.io/os": "linux"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(("node", "labels", "taints", "runs"), [
    # A plain EKS managed node group on the EKS GPU AMI with NVIDIA's device plugin: no GPU label at all.
    ("EKS MNG p5.48xlarge (H100), tainted", {**MNG, "node.kubernetes.io/instance-type": "p5.48xlarge"},
     [GPU_TAINT], True),
    ("EKS MNG p5en.48xlarge (H200)", {**MNG, "node.kubernetes.io/instance-type": "p5en.48xlarge"}, [], True),
    ("EKS MNG p5e.48xlarge (H200)", {**MNG, "node.kubernetes.io/instance-type": "p5e.48xlarge"}, [], True),
    ("EKS MNG p4d.24xlarge (A100)", {**MNG, "node.kubernetes.io/instance-type": "p4d.24xlarge"}, [], True),
    ("EKS MNG g6e.xlarge (L40S), NoExecute taint", {**MNG, "node.kubernetes.io/instance-type": "g6e.xlarge"},
     [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"}], True),
    ("EKS MNG g4dn.xlarge (T4)", {**MNG, "node.kubernetes.io/instance-type": "g4dn.xlarge"}, [GPU_TAINT], True),
    ("GPU Feature Discovery, on-prem", {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": "dgx-1"},
     [], True),
    ("Karpenter", {"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
                   "node.kubernetes.io/instance-type": "g6.48xlarge"}, [GPU_TAINT], True),
    ("EKS Auto Mode", {"eks.amazonaws.com/instance-gpu-manufacturer": "nvidia",
                       "node.kubernetes.io/instance-type": "p5.4xlarge"}, [], True),
    ("own label for the cluster autoscaler", {"k8s.amazonaws.com/accelerator": "nvidia-tesla-t4"}, [], True),
    ("EKS MNG m5.xlarge (CPU)", {**MNG, "node.kubernetes.io/instance-type": "m5.xlarge"}, [], False),
    ("EKS MNG inf2.xlarge (Inferentia, no NVML)", {**MNG, "node.kubernetes.io/instance-type": "inf2.xlarge"},
     [], False),
    ("EKS MNG trn1.32xlarge (Trainium)", {**MNG, "node.kubernetes.io/instance-type": "trn1.32xlarge"}, [], False),
    ("Karpenter, AMD GPU", {"karpenter.k8s.aws/instance-gpu-manufacturer": "amd",
                            "node.kubernetes.io/instance-type": "g4ad.xlarge"}, [], False),
    ("GFD says no GPU", {"nvidia.com/gpu.present": "false"}, [], False),
    ("GPU node with a taint of its own", {**MNG, "node.kubernetes.io/instance-type": "p5.48xlarge"},
     [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}], False),
])
def test_daemonset_schedules_on_gpu_nodes_of_every_provisioner_and_nowhere_else(
    exporter_docs: list[dict[str, Any]], node: str, labels: dict[str, str], taints: list[dict[str, str]],
    runs: bool,
) -> None:
    assert _schedules(exporter_pod(exporter_docs), labels, taints) is runs, node


def test_instance_type_term_lists_only_nvidia_gpu_instance_types(exporter_docs: list[dict[str, Any]]) -> None:
    terms = exporter_pod(exporter_docs)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (types,) = [e["values"] for t in terms for e in t["matchExpressions"]
                if e["key"] == "node.kubernetes.io/instance-type"]
    families = {t.split(".")[0] for t in types}
    assert families == {"p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "g4dn", "g5", "g5g", "g6",
                        "g6e", "gr6"}
    assert len(types) == len(set(types))


# -- the profiling component -----------------------------------------------------------------------------


def _render_with(tmp_path: Path, components: list[str]) -> list[dict[str, Any]]:
    kubectl = require_binary("kubectl")
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "exporter", tmp_path)],
        "components": [os.path.relpath(DEPLOY / c, tmp_path) for c in components]}))
    out = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_profiling_component_adds_sys_admin_and_nothing_else(tmp_path: Path) -> None:
    docs = _render_with(tmp_path, ["exporter/profiling"])
    ds = find(docs, "DaemonSet")
    sc = container(ds["spec"]["template"]["spec"], "gpu-exporter")["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert kubernetes_validate.validate(ds, K8S_VERSION, strict=True) == K8S_VERSION
    base = find(render("exporter"), "DaemonSet")
    container(base["spec"]["template"]["spec"], "gpu-exporter")["securityContext"]["capabilities"]["add"] = [
        "SYS_ADMIN"]
    assert ds == base  # the one difference


def test_profiling_component_composes_with_pod_metadata(tmp_path: Path) -> None:
    if not (DEPLOY / "exporter" / "pod-metadata" / "kustomization.yaml").exists():
        pytest.skip("deploy/exporter/pod-metadata is not written yet")
    docs = _render_with(tmp_path, ["exporter/profiling", "exporter/pod-metadata"])
    c = container(find(docs, "DaemonSet")["spec"]["template"]["spec"], "gpu-exporter")
    assert c["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    assert "--kubernetes-enable-pod-uid" in c["args"]


def test_host_pid_component_sets_host_pid_and_nothing_else(tmp_path: Path) -> None:
    docs = _render_with(tmp_path, ["exporter/host-pid"])
    ds = find(docs, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    assert kubernetes_validate.validate(ds, K8S_VERSION, strict=True) == K8S_VERSION
    base = find(render("exporter"), "DaemonSet")
    assert "hostPID" not in base["spec"]["template"]["spec"]  # the base stays in its own PID namespace
    base["spec"]["template"]["spec"]["hostPID"] = True
    assert ds == base  # the one difference
