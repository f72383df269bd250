"""deploy/ manifests, the dashboard and the Dockerfile: schema-valid, consistent with each other and with
the programs' contract (flags, ports, metric names), and checked by the real tools where one exists
(kubernetes-validate's bundled schemas, promtool, gpu-relay check-config)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.helpers import require_binary

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30"  # oldest Kubernetes these manifests target (EKS standard support)
NAMESPACE = "gpu-telemetry"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # no bundled schema: checked structurally below

# The critical metrics the AMP destination keeps (brief / DESIGN.md), and what it must not keep.
CRITICAL = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
]
NOT_CRITICAL = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL_extra",
    "x_DCGM_FI_DEV_GPU_UTIL",
    "gpu_relay_queue_bytes",
]

# Metric names the programs define (DESIGN.md's default set; gpu_exporter_* / gpu_relay_* self-metrics).
DCGM_DEFAULT = {
    "DCGM_FI_DEV_" + n
    for n in [
        "SM_CLOCK",
        "MEM_CLOCK",
        "MEMORY_TEMP",
        "GPU_TEMP",
        "POWER_USAGE",
        "TOTAL_ENERGY_CONSUMPTION",
        "PCIE_REPLAY_COUNTER",
        "GPU_UTIL",
        "MEM_COPY_UTIL",
        "ENC_UTIL",
        "DEC_UTIL",
        "XID_ERRORS",
        "FB_FREE",
        "FB_USED",
        "FB_RESERVED",
        "NVLINK_BANDWIDTH_TOTAL",
        "UNCORRECTABLE_REMAPPED_ROWS",
        "CORRECTABLE_REMAPPED_ROWS",
        "ROW_REMAP_FAILURE",
    ]
} | {
    "DCGM_FI_PROF_" + n
    for n in ["GR_ENGINE_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE", "PCIE_TX_BYTES", "PCIE_RX_BYTES"]
}
EXPORTER_SELF = {
    "gpu_exporter_" + n
    for n in [
        "build_info",
        "device_up",
        "collection_duration_seconds",
        "collection_errors_total",
        "last_collection_timestamp_seconds",
        "kubelet_errors_total",
        "xid_errors_total",
    ]
}
RELAY_SELF = {
    "gpu_relay_" + n
    for n in [
        "samples_received_total",
        "requests_received_total",
        "config_reloads_total",
        "samples_kept_total",
        "samples_dropped_total",
        "queue_samples",
        "queue_bytes",
        "oldest_queued_sample_age_seconds",
        "samples_sent_total",
        "samples_failed_total",
        "samples_retried_total",
        "send_duration_seconds_bucket",
        "send_duration_seconds_sum",
        "send_duration_seconds_count",
        "series_limit_dropped_total",
    ]
}
KNOWN_METRICS = DCGM_DEFAULT | EXPORTER_SELF | RELAY_SELF

# DESIGN.md's relay config block: the keys each section may have (unknown keys are errors there).
RELAY_KEYS: dict[str, set[str]] = {
    "": {"server", "external_labels", "global", "storage", "scrape", "destinations"},
    "server": {"listen", "max_request_bytes"},
    "storage": {"path"},
    "destination": {
        "name",
        "url",
        "sigv4",
        "headers",
        "write_relabel_configs",
        "prune_labels",
        "aggregate",
        "limits",
        "queue",
        "dry_run",
    },
    "sigv4": {"region", "role_arn", "external_id", "profile", "service"},
    "limits": {"max_series", "max_series_per_metric"},
    "queue": {
        "max_samples_per_send",
        "batch_send_deadline",
        "max_shards",
        "min_backoff",
        "max_backoff",
        "max_sample_age",
        "max_disk",
    },
}


# -- helpers -----------------------------------------------------------------------------------------


def load_docs(name: str) -> list[dict[str, Any]]:
    with open(DEPLOY / name) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(matches) == 1, name
    return matches[0]


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (p,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(p)


def anchored(regex: str) -> re.Pattern[str]:
    return re.compile(f"^(?:{regex})$")  # Prometheus relabel regexes are fully anchored


def relay_config_in_configmap() -> dict[str, Any]:
    cm = find(load_docs("relay-sidecar.yaml"), "ConfigMap", "gpu-relay-config")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["relay.yaml"])
    return cfg


def relay_config_example() -> dict[str, Any]:
    with open(DEPLOY / "examples" / "relay.yaml") as f:
        cfg: dict[str, Any] = yaml.safe_load(f)
    return cfg


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))


# -- kubernetes-validate (bundled schemas, no network) ------------------------------------------------

K8S_DOCS = [
    pytest.param(doc, id=f"{name}:{doc['kind']}/{doc['metadata']['name']}")
    for name in ("daemonset.yaml", "relay-sidecar.yaml")
    for doc in load_docs(name)
    if doc["kind"] not in CRD_KINDS
]


@pytest.mark.parametrize("doc", K8S_DOCS)
def test_manifest_validates_against_the_kubernetes_schema_strictly(doc: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def test_kubernetes_validate_rejects_a_misspelt_field() -> None:
    ds = find(load_docs("daemonset.yaml"), "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def test_kube_prometheus_stack_sidecar_is_a_valid_container_with_its_volumes() -> None:
    with open(DEPLOY / "examples" / "kube-prometheus-stack-values.yaml") as f:
        values = yaml.safe_load(f)
    spec = values["prometheus"]["prometheusSpec"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "prometheus"},
        "spec": {"containers": spec["containers"], "volumes": spec["volumes"]},
    }
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    (relay,) = spec["containers"]
    assert relay["args"] == ["gpu-relay", "run", "--config", "/etc/gpu-relay/relay.yaml"]
    assert {m["name"] for m in relay["volumeMounts"]} <= {v["name"] for v in spec["volumes"]}
    assert [rw["url"] for rw in spec["remoteWrite"]] == ["http://127.0.0.1:9201/api/v1/write"]
    assert "eks.amazonaws.com/role-arn" in values["prometheus"]["serviceAccount"]["annotations"]


# -- daemonset.yaml ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exporter_docs() -> list[dict[str, Any]]:
    return load_docs("daemonset.yaml")


def test_daemonset_runs_only_on_gpu_nodes_and_tolerates_the_gpu_taint(
    exporter_docs: list[dict[str, Any]],
) -> None:
    pod = find(exporter_docs, "DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in terms[0][
        "matchExpressions"
    ]
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in pod["tolerations"])
    assert pod["priorityClassName"] == "system-node-critical"


def test_daemonset_exporter_args_env_resources_and_kubelet_socket(
    exporter_docs: list[dict[str, Any]],
) -> None:
    pod = find(exporter_docs, "DaemonSet")["spec"]["template"]["spec"]
    c = container(pod, "gpu-exporter")
    assert c["args"] == ["--listen=:9400", "--kubernetes", "--interval=5s"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "128Mi"},
    }
    (vol,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert vol["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    assert mount == {"name": vol["name"], "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}


def test_daemonset_probes_hit_health_on_9400(exporter_docs: list[dict[str, Any]]) -> None:
    c = container(find(exporter_docs, "DaemonSet")["spec"]["template"]["spec"], "gpu-exporter")
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert (get["path"], port_number(c, get["port"])) == ("/health", 9400)


def test_daemonset_security_context_is_locked_down(exporter_docs: list[dict[str, Any]]) -> None:
    pod = find(exporter_docs, "DaemonSet")["spec"]["template"]["spec"]
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


def test_service_exposes_port_9400_named_metrics_for_the_daemonset_pods(
    exporter_docs: list[dict[str, Any]],
) -> None:
    svc = find(exporter_docs, "Service")
    pod_labels = find(exporter_docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", 9400)]
    assert {d["metadata"].get("namespace", NAMESPACE) for d in exporter_docs} == {NAMESPACE}


# -- servicemonitor.yaml (CRD: structural) ---------------------------------------------------------


def test_servicemonitor_selects_the_service_every_15s_and_honours_pod_labels(
    exporter_docs: list[dict[str, Any]],
) -> None:
    (sm,) = load_docs("servicemonitor.yaml")
    assert (sm["apiVersion"], sm["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert sm["metadata"]["name"] and sm["metadata"]["namespace"] == NAMESPACE
    svc = find(exporter_docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert NAMESPACE in sm["spec"]["namespaceSelector"]["matchNames"]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["interval"] == "15s"
    assert ep["honorLabels"] is True
    # The target's own pod/namespace/container labels must not attribute unheld GPUs to the exporter pod.
    drops = [r for r in ep["relabelings"] if r["action"] == "labeldrop"]
    assert any(
        anchored(r["regex"]).match(label) for r in drops for label in ("pod", "namespace", "container")
    )


# -- alerts.yaml (CRD: structural, then promtool) ----------------------------------------------------


@pytest.fixture(scope="module")
def rule_groups() -> list[dict[str, Any]]:
    (rule,) = load_docs("alerts.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["name"] and rule["metadata"]["namespace"] == NAMESPACE
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


@pytest.fixture(scope="module")
def rules_file(rule_groups: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "alerts.rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule_groups}))
    return path


def test_alerts_cover_gpus_exporter_and_relay(rule_groups: list[dict[str, Any]]) -> None:
    rules = {r["alert"]: r for g in rule_groups for r in g["rules"]}
    assert "pod" in rules["GPUIdleWhileHeldByPod"]["expr"] and rules["GPUIdleWhileHeldByPod"]["for"] == "30m"
    wanted_metric = {
        "GPUIdleWhileHeldByPod": "DCGM_FI_DEV_GPU_UTIL",
        "GPUXidErrors": "gpu_exporter_xid_errors_total",
        "GPUDown": "gpu_exporter_device_up",
        "GPUHighTemperature": "DCGM_FI_DEV_GPU_TEMP",
        "GPUExporterAbsent": 'up{job="gpu-exporter"}',
        "GPURelayQueueBacklog": "gpu_relay_oldest_queued_sample_age_seconds",
        "GPURelayDroppingSamples": "gpu_relay_samples_dropped_total",
        "GPURelaySeriesLimitDrops": "gpu_relay_series_limit_dropped_total",
    }
    for alert, metric in wanted_metric.items():
        assert metric in rules[alert]["expr"], alert
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"], name


def test_alert_rules_pass_promtool_check_rules(rules_file: Path) -> None:
    promtool = require_binary("promtool")
    out = subprocess.run(
        [promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr


PROMTOOL_TESTS = """
rule_files: [alerts.rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: >-
          DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1",pod="train-0",namespace="ml",container="main"}
        values: '0x40'
      - series: 'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",Hostname="n1"}'
        values: '0x40'
      - series: >-
          DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",Hostname="n1",pod="busy",namespace="ml",container="main"}
        values: '0x20 50x20'
      - series: 'gpu_exporter_device_up{gpu="0",UUID="GPU-a",Hostname="n1"}'
        values: '1 1 0x10'
      - series: 'gpu_exporter_xid_errors_total{gpu="0",UUID="GPU-a",Hostname="n1",xid="79"}'
        values: '0 0 1 1 1'
      - series: 'gpu_relay_oldest_queued_sample_age_seconds{destination="amp"}'
        values: '0+60x30'
    alert_rule_test:
      - eval_time: 35m
        alertname: GPUIdleWhileHeldByPod
        exp_alerts:
          - exp_labels: {severity: warning, gpu: "0", UUID: GPU-a, Hostname: n1, pod: train-0,
                         namespace: ml, container: main}
            exp_annotations:
              summary: GPU 0 on n1 idle for 30m while held by a pod
              description: >-
                ml/train-0 (container main) holds GPU GPU-a but has not used it for 30 minutes. Free it
                for other jobs.
      - eval_time: 5m
        alertname: GPUDown
        exp_alerts:
          - exp_labels: {severity: critical, gpu: "0", UUID: GPU-a, Hostname: n1}
            exp_annotations:
              summary: GPU 0 (GPU-a) stopped answering NVML
              description: gpu-exporter cannot read the GPU (fallen off the bus, reset, or driver fault).
      - eval_time: 4m
        alertname: GPUXidErrorsCritical
        exp_alerts:
          - exp_labels: {severity: critical, gpu: "0", UUID: GPU-a, Hostname: n1, xid: "79"}
            exp_annotations:
              summary: Critical XID 79 on GPU 0 of n1
              description: GPU GPU-a reported XID 79; drain the node and check the GPU.
      - eval_time: 10m
        alertname: GPURelayQueueBacklog
        exp_alerts: []
      - eval_time: 20m
        alertname: GPURelayQueueBacklog
        exp_alerts:
          - exp_labels: {severity: warning, destination: amp}
            exp_annotations:
              summary: gpu-relay queue for amp is 20m 0s behind
              description: >-
                The destination is slow, throttling (429) or down. Samples older than the queue's
                max_sample_age are dropped, not sent.
"""


def test_alerts_fire_as_intended_in_promtool_unit_tests(rules_file: Path) -> None:
    promtool = require_binary("promtool")
    test_file = rules_file.parent / "alerts.test.yml"
    test_file.write_text(PROMTOOL_TESTS)
    out = subprocess.run(
        [promtool, "test", "rules", test_file.name],
        cwd=rules_file.parent,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- relay-sidecar.yaml and the relay config ---------------------------------------------------------


@pytest.fixture(scope="module")
def sidecar_docs() -> list[dict[str, Any]]:
    return load_docs("relay-sidecar.yaml")


def test_prometheus_remote_writes_to_the_relay_sidecar(sidecar_docs: list[dict[str, Any]]) -> None:
    prom_cfg = yaml.safe_load(find(sidecar_docs, "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    assert [rw["url"] for rw in prom_cfg["remote_write"]] == ["http://127.0.0.1:9201/api/v1/write"]
    keep = prom_cfg["remote_write"][0]["write_relabel_configs"][0]
    assert all(anchored(keep["regex"]).match(m) for m in CRITICAL)
    exporter_job = next(j for j in prom_cfg["scrape_configs"] if j["job_name"] == "gpu-exporter")
    assert exporter_job["honor_labels"] is True


def test_prometheus_config_passes_promtool_check_config(
    sidecar_docs: list[dict[str, Any]], tmp_path: Path
) -> None:
    promtool = require_binary("promtool")
    cfg = yaml.safe_load(find(sidecar_docs, "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    # Debian's promtool is built without Kubernetes service discovery: check that part by hand, then
    # let promtool check everything else with a static target in its place.
    for job in cfg["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs", []):
            assert sd["role"] in {"endpoints", "endpointslice", "pod", "service"}
            assert set(sd) <= {"role", "namespaces", "selectors"}
            job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_relay_sidecar_container_args_probes_and_queue_volume(sidecar_docs: list[dict[str, Any]]) -> None:
    sts = find(sidecar_docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    prom = container(pod, "prometheus")
    assert prom["image"].startswith("prom/prometheus:")
    relay = container(pod, "gpu-relay")
    assert relay["args"] == ["gpu-relay", "run", "--config", "/etc/gpu-relay/relay.yaml"]
    for probe, path in (("livenessProbe", "/-/healthy"), ("readinessProbe", "/-/ready")):
        get = relay[probe]["httpGet"]
        assert (get["path"], port_number(relay, get["port"])) == (path, 9201)
    mounts = {m["mountPath"]: m["name"] for m in relay["volumeMounts"]}
    assert relay_config_in_configmap()["storage"]["path"] == "/var/lib/gpu-relay"
    queue_volume = mounts["/var/lib/gpu-relay"]
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    volumes = {v["name"] for v in pod["volumes"]}
    assert queue_volume in claims | volumes
    assert mounts["/etc/gpu-relay"] in volumes
    assert relay["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == find(sidecar_docs, "ServiceAccount")["metadata"]["name"]


def test_relay_service_account_uses_irsa_and_config_does_not_assume_the_same_role(
    sidecar_docs: list[dict[str, Any]],
) -> None:
    sa = find(sidecar_docs, "ServiceAccount")
    assert re.fullmatch(
        r"arn:aws:iam::\d{12}:role/.+", sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    )
    for cfg in (relay_config_in_configmap(), relay_config_example()):
        for dest in cfg["destinations"]:
            assert "role_arn" not in dest.get("sigv4", {})
            assert "X-Scope-OrgID" not in dest.get("headers", {})


def test_configmap_relay_config_equals_the_standalone_example() -> None:
    assert relay_config_in_configmap() == relay_config_example()


def test_amp_destination_keeps_only_the_critical_gpu_metrics_and_prunes_constant_labels() -> None:
    (amp,) = relay_config_example()["destinations"]
    assert amp["url"].startswith("https://aps-workspaces.") and amp["url"].endswith("/api/v1/remote_write")
    assert "//" not in amp["url"].removeprefix("https://")
    (keep,) = amp["write_relabel_configs"]
    assert (keep["action"], keep["source_labels"]) == ("keep", ["__name__"])
    regex = anchored(keep["regex"])
    assert [m for m in CRITICAL if not regex.match(m)] == []
    assert [m for m in NOT_CRITICAL if regex.match(m)] == []
    assert {"pci_bus_id", "DCGM_FI_DRIVER_VERSION"} <= set(amp["prune_labels"])


def test_relay_config_uses_only_design_keys() -> None:
    cfg = relay_config_example()
    assert set(cfg) <= RELAY_KEYS[""]
    assert set(cfg["server"]) <= RELAY_KEYS["server"]
    assert set(cfg["storage"]) <= RELAY_KEYS["storage"]
    for dest in cfg["destinations"]:
        assert set(dest) <= RELAY_KEYS["destination"]
        for section in ("sigv4", "limits", "queue"):
            assert set(dest.get(section, {})) <= RELAY_KEYS[section], section


@pytest.mark.parametrize("source", ["example", "configmap"])
def test_relay_configs_pass_gpu_relay_check_config(source: str, tmp_path: Path) -> None:
    if not (ROOT / "relay" / "config.py").exists():
        pytest.skip("relay/config.py (gpu-relay check-config) is not written yet")
    if source == "example":
        path = DEPLOY / "examples" / "relay.yaml"
    else:
        path = tmp_path / "relay.yaml"
        cm = find(load_docs("relay-sidecar.yaml"), "ConfigMap", "gpu-relay-config")
        path.write_text(cm["data"]["relay.yaml"])
    exe = Path(sys.executable).parent / "gpu-relay"
    out = subprocess.run([str(exe), "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# -- dashboard.json ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    with open(DEPLOY / "dashboard.json") as f:
        d: dict[str, Any] = json.load(f)
    return d


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in iter_panels(dashboard["panels"]) for t in p.get("targets", [])]


_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label names
    in grouping clauses or selectors, strings, durations or Grafana variables."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # ranges
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    s = re.sub(r"\$\w+", "", s)
    names = set()
    for m in re.finditer(r"(?<![\w$])([a-zA-Z_:][\w:]*)(\s*\()?", s):
        if m.group(2) is None and m.group(1) not in _PROMQL_WORDS:
            names.add(m.group(1))
    return names


def test_metric_name_extraction_finds_only_metrics() -> None:
    expr = (
        'sum by (namespace) (rate(DCGM_FI_X{pod!="", a=~"b|c"}[5m]))'
        " / on(gpu) group_left() gpu_relay_y or vector(0)"
    )
    assert metric_names(expr) == {"DCGM_FI_X", "gpu_relay_y"}


def test_dashboard_is_a_grafana_dashboard_with_unique_panel_ids(dashboard: dict[str, Any]) -> None:
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["title"] and dashboard["uid"]
    ids = [p["id"] for p in iter_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)) > 10
    for p in iter_panels(dashboard["panels"]):
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys(), p["title"]


def test_dashboard_queries_use_only_metrics_the_programs_define(dashboard: dict[str, Any]) -> None:
    exprs = dashboard_exprs(dashboard)
    assert exprs
    unknown = {name: e for e in exprs for name in metric_names(e) if name not in KNOWN_METRICS}
    assert unknown == {}
    assert all(metric_names(e) for e in exprs)


def test_dashboard_answers_utilisation_idle_jobs_power_temp_memory_and_xid(dashboard: dict[str, Any]) -> None:
    panels = [p for p in iter_panels(dashboard["panels"]) if p.get("targets")]

    def names(p: dict[str, Any]) -> set[str]:
        return set().union(*(metric_names(t["expr"]) for t in p["targets"]))

    # "Why is this GPU at 50%?": utilisation next to SM/tensor/DRAM activity in one panel.
    assert any(
        {
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        }
        <= names(p)
        for p in panels
    )
    # "Which job is idle?": utilisation grouped by pod / namespace.
    grouped = [t["expr"] for p in panels for t in p["targets"] if "DCGM_FI_DEV_GPU_UTIL" in t["expr"]]
    assert any(re.search(r"by \([^)]*\bpod\b", e) for e in grouped)
    assert any(re.search(r"by \([^)]*\bnamespace\b", e) for e in grouped)
    used = set().union(*(names(p) for p in panels))
    assert {
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "gpu_exporter_xid_errors_total",
    } <= used


def test_dashboard_queries_parse_with_promtool(dashboard: dict[str, Any], tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    grafana_vars = {
        "$__rate_interval": "5m",
        "$__range": "6h",
        "$__interval": "1m",
        "$Hostname": ".*",
        "$gpu": ".*",
    }
    rules = []
    for i, expr in enumerate(dashboard_exprs(dashboard)):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


# -- Dockerfile --------------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n(?:\s*#[^\n]*\n)*", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, args = line.partition(" ")
            out.append((instr.upper(), args.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    instrs = dockerfile()
    last_from = max(i for i, (k, _) in enumerate(instrs) if k == "FROM")
    return instrs[last_from:]


def test_dockerfile_builds_a_wheel_then_installs_it_in_a_slim_runtime() -> None:
    instrs = dockerfile()
    froms = [a for k, a in instrs if k == "FROM"]
    assert froms == ["python:3.11-slim AS build", "python:3.11-slim"]
    assert any(k == "RUN" and "pip wheel" in a and a.rstrip().endswith(".") for k, a in instrs)
    runtime_runs = [a for k, a in final_stage() if k == "RUN"]
    assert any("pip install" in a and "--no-index" in a and "gpu-telemetry" in a for a in runtime_runs)


def test_dockerfile_copies_only_files_that_exist_and_are_not_dockerignored() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    sources = []
    for k, a in dockerfile():
        if k in {"COPY", "ADD"} and "--from" not in a:
            sources += shlex.split(a)[:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert src.rstrip("/") not in ignored, src


def test_dockerfile_runs_as_non_root_and_exposes_both_ports() -> None:
    stage = final_stage()
    (user,) = [a for k, a in stage if k == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) == 65532
    exposed = {p for k, a in stage if k == "EXPOSE" for p in a.split()}
    assert {"9400", "9201"} <= exposed


def entrypoint() -> list[str]:
    (ep,) = [a for k, a in final_stage() if k == "ENTRYPOINT"]
    parsed: list[str] = json.loads(ep)
    return parsed


def test_dockerfile_entrypoint_programs_are_console_scripts_of_the_project() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    named = set(re.findall(r"gpu-[a-z]+", " ".join(entrypoint()[:-1])))  # last item: the script's $0
    assert named == {"gpu-exporter", "gpu-relay"}
    assert named <= scripts.keys()
    missing = [
        t for t in scripts.values() if not (ROOT / (t.split(":")[0].replace(".", "/") + ".py")).exists()
    ]
    if missing:
        pytest.skip(f"console script modules not written yet: {missing}")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "gpu-exporter"),
        (
            ["--listen=:9400", "--kubernetes", "--interval=5s"],
            "gpu-exporter --listen=:9400 --kubernetes --interval=5s",
        ),
        (["gpu-exporter", "--backend=simulated"], "gpu-exporter --backend=simulated"),
        (
            ["gpu-relay", "run", "--config", "/etc/gpu-relay/relay.yaml"],
            "gpu-relay run --config /etc/gpu-relay/relay.yaml",
        ),
        (["gpu-relay", "check-config", "a b.yaml"], "gpu-relay check-config a b.yaml"),
    ],
)
def test_dockerfile_entrypoint_dispatches_on_the_first_argument(
    args: list[str], expected: str, tmp_path: Path
) -> None:
    for prog in ("gpu-exporter", "gpu-relay"):
        fake = tmp_path / prog
        fake.write_text(f'#!/bin/sh\necho {prog} "$@"\n')
        fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run([*entrypoint(), *args], capture_output=True, text=True, env=env, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_manifests_pass_arguments_the_entrypoint_dispatches_correctly() -> None:
    exporter = container(
        find(load_docs("daemonset.yaml"), "DaemonSet")["spec"]["template"]["spec"], "gpu-exporter"
    )
    assert exporter["args"][0].startswith("--") and "command" not in exporter
    relay = container(
        find(load_docs("relay-sidecar.yaml"), "StatefulSet")["spec"]["template"]["spec"], "gpu-relay"
    )
    assert relay["args"][0] == "gpu-relay" and "command" not in relay


def test_daemonset_args_and_env_are_accepted_by_the_exporter_flag_parser() -> None:
    if not (ROOT / "exporter" / "settings.py").exists():
        pytest.skip("exporter/settings.py is not written yet")
    settings = pytest.importorskip("exporter.settings")
    c = container(find(load_docs("daemonset.yaml"), "DaemonSet")["spec"]["template"]["spec"], "gpu-exporter")
    s = settings.load_settings(c["args"], {"NODE_NAME": "gpu-node-1"})
    assert (s.listen_port, s.interval_s, s.kubernetes) == (9400, 5.0, True)
    assert s.pod_resources_socket.startswith("/var/lib/kubelet/pod-resources/")
    assert s.hostname == "gpu-node-1"
