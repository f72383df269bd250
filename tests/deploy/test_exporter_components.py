"""deploy/exporter additions: the collectors file (dcgm-exporter's default set plus what the waste
rules need) and the pod-metadata component (RBAC only when a pod flag needs it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from exporter.counters_csv import load_counters, shipped_text
from tests.helpers import REPO_ROOT, require_binary

EXPORTER = REPO_ROOT / "deploy" / "exporter"


def test_collectors_file_is_dcgm_exporters_default_set_plus_the_waste_fields() -> None:
    names = [s.field for s in load_counters(str(EXPORTER / "collectors.csv"))]
    upstream = [ln.split(",")[0].strip() for ln in shipped_text("default-counters.csv").splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert [n for n in names if n in upstream] == upstream  # every default row, in dcgm-exporter's order
    for wanted in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_PROF_NVLINK_TX_BYTES",
                   "DCGM_FI_PROF_NVLINK_RX_BYTES"):
        assert wanted in names


def test_base_gives_no_token_and_the_component_adds_get_pods_and_the_flags(tmp_path: Path) -> None:
    require_binary("kubectl")
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(EXPORTER, tmp_path)],
        "components": [os.path.relpath(EXPORTER / "pod-metadata", tmp_path)]}))
    out = subprocess.run(["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)],
                         check=True, capture_output=True, text=True).stdout
    docs = {d["kind"]: d for d in yaml.safe_load_all(out) if d}
    assert docs["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert docs["ClusterRoleBinding"]["subjects"][0]["name"] == "gpu-exporter"
    assert docs["ServiceAccount"]["automountServiceAccountToken"] is True
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert {"--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels"} <= set(pod["containers"][0]["args"])
    base = subprocess.run(["kubectl", "kustomize", str(EXPORTER)], check=True, capture_output=True, text=True).stdout
    assert "ClusterRole" not in base
