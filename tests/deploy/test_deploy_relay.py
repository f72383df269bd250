"""The relay sidecar in every deployment (plain StatefulSet, Prometheus Operator CR patch,
kube-prometheus-stack values): ports (write on loopback, telemetry on 9202), probes, config mount and
environment, the relay config itself (checked by the real `gpu-relay check-config`), the PodMonitor
and the NetworkPolicy, and the kube-prometheus-stack values changing nothing cluster-wide."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.render import (
    DEPLOY,
    EXPORTER_NS,
    K8S_VERSION,
    MONITORING_NS,
    RELAY_POD_LABEL,
    ROOT,
    anchored,
    container,
    find,
    ingress_allowed,
    port_number,
    render,
)
from tests.helpers import require_binary

RELAY_CONFIG = DEPLOY / "relay" / "relay.yaml"
VALUES = DEPLOY / "examples" / "kube-prometheus-stack-values.yaml"
WRITE_URL = "http://127.0.0.1:9201/api/v1/write"
# Labels the Prometheus Operator puts on the pods of a `Prometheus` named NAME (its statefulset.go).
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator"}

# The critical metrics the AMP destination keeps (brief / DESIGN.md), and what it must not keep.
CRITICAL = [
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
]
NOT_CRITICAL = ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL_extra", "x_DCGM_FI_DEV_GPU_UTIL", "gpu_relay_queue_bytes"]

# The relay config's keys (DESIGN.md plus RELAY-INTERFACES.md item 4 and issue 10's remote_write).
RELAY_KEYS: dict[str, set[str]] = {
    "": {"server", "external_labels", "global", "storage", "scrape", "destinations", "remote_write"},
    "server": {"listen", "max_request_bytes", "telemetry_listen", "max_concurrent_requests", "read_timeout",
               "idle_timeout", "enable_lifecycle"},
    "storage": {"path"},
    "destination": {"name", "url", "sigv4", "headers", "write_relabel_configs", "prune_labels", "aggregate",
                    "limits", "queue", "dry_run", "send_metadata"},
    "sigv4": {"region", "role_arn", "external_id", "profile", "service", "access_key", "secret_key"},
    "limits": {"max_series", "max_series_per_metric"},
    "queue": {"max_samples_per_send", "batch_send_deadline", "max_shards", "min_backoff", "max_backoff",
              "max_sample_age", "max_disk"},
}


@dataclass(frozen=True)
class Sidecar:
    """One deployment's Prometheus pod with the relay: its containers/volumes, pod labels, namespace,
    the docs applied with it, and its remote_write entries in Prometheus's own (snake_case) terms."""

    name: str
    pod: dict[str, Any]
    labels: dict[str, str]
    namespace: str
    docs: list[dict[str, Any]]
    remote_write: list[dict[str, Any]]


def _operator_rw(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's camelCase remoteWrite in Prometheus's config terms (what it generates)."""
    out = []
    for e in entries:
        rules = [
            {("source_labels" if k == "sourceLabels" else k): v for k, v in r.items()}
            for r in e.get("writeRelabelConfigs", [])
        ]
        out.append({"url": e["url"], "write_relabel_configs": rules})
    return out


def _statefulset() -> Sidecar:
    docs = render("overlays/prometheus-statefulset")
    tpl = find(docs, "StatefulSet")["spec"]["template"]
    prom = yaml.safe_load(find(docs, "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    return Sidecar("prometheus-statefulset", tpl["spec"], tpl["metadata"]["labels"], EXPORTER_NS, docs,
                   prom["remote_write"])


def _operator() -> Sidecar:
    docs = render("overlays/prometheus-operator")
    cr = find(docs, "Prometheus")
    labels = {**OPERATOR_POD_LABELS, **cr["spec"].get("podMetadata", {}).get("labels", {})}
    return Sidecar("prometheus-operator", cr["spec"], labels, cr["metadata"]["namespace"], docs,
                   _operator_rw(cr["spec"]["remoteWrite"]))


def _kube_prometheus_stack() -> Sidecar:
    spec = yaml.safe_load(VALUES.read_text())["prometheus"]["prometheusSpec"]
    labels = {**OPERATOR_POD_LABELS, **spec.get("podMetadata", {}).get("labels", {})}
    # additionalRemoteWrite: appended by the chart after the user's own remoteWrite, which stays
    assert "remoteWrite" not in spec
    return Sidecar("kube-prometheus-stack", spec, labels, MONITORING_NS, render("overlays/kube-prometheus-stack"),
                   _operator_rw(spec["additionalRemoteWrite"]))


SIDECARS = {"prometheus-statefulset": _statefulset, "prometheus-operator": _operator,
            "kube-prometheus-stack": _kube_prometheus_stack}


@pytest.fixture(params=list(SIDECARS))
def sidecar(request: pytest.FixtureRequest) -> Sidecar:
    return SIDECARS[request.param]()


def relay_of(s: Sidecar) -> dict[str, Any]:
    return container(s.pod, "gpu-relay")


def relay_config() -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(RELAY_CONFIG.read_text())
    return cfg


# -- the sidecar container ---------------------------------------------------------------------------


def test_relay_sidecar_declares_only_the_telemetry_port_9202(sidecar: Sidecar) -> None:
    relay = relay_of(sidecar)
    assert relay["args"] == ["gpu-relay", "run", "--config", "/etc/gpu-relay/relay.yaml"]
    assert [(p["name"], p["containerPort"]) for p in relay["ports"]] == [("telemetry", 9202)]


def test_relay_sidecar_probes_healthy_and_ready_on_the_telemetry_port(sidecar: Sidecar) -> None:
    relay = relay_of(sidecar)
    for probe, path in (("livenessProbe", "/-/healthy"), ("readinessProbe", "/-/ready")):
        get = relay[probe]["httpGet"]
        assert (get["path"], port_number(relay, get["port"])) == (path, 9202), probe


def test_relay_sidecar_mounts_the_config_directory_so_configmap_updates_reach_the_file(sidecar: Sidecar) -> None:
    relay = relay_of(sidecar)
    (mount,) = [m for m in relay["volumeMounts"] if m["mountPath"] == "/etc/gpu-relay"]
    assert "subPath" not in mount and "subPathExpr" not in mount  # subPath mounts never see updates
    (vol,) = [v for v in sidecar.pod["volumes"] if v["name"] == mount["name"]]
    cm = find(sidecar.docs, "ConfigMap", vol["configMap"]["name"])
    assert cm["metadata"].get("namespace") == sidecar.namespace
    assert cm["data"]["relay.yaml"] == RELAY_CONFIG.read_text()


def test_relay_sidecar_environment_provides_every_variable_of_the_config(sidecar: Sidecar) -> None:
    relay = relay_of(sidecar)
    wanted = set(re.findall(r"\$\{(\w+)", RELAY_CONFIG.read_text()))
    assert wanted == {"AMP_REMOTE_WRITE_URL", "AWS_REGION", "CLUSTER_NAME", "POD_NAME"}
    env = {e["name"]: e for e in relay["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["GPU_RELAY_LOG_FORMAT"]["value"] == "json"  # one JSON object per line for the log stack
    (src,) = relay["envFrom"]
    assert src == {"configMapRef": {"name": "gpu-relay-env"}}  # not optional: no pod without it
    readme = (ROOT / "README.md").read_text()
    create = re.search(r"kubectl -n \S+ create configmap gpu-relay-env(?:[^\n]*\\\n)*[^\n]*", readme)
    assert create, "the README shows how to create gpu-relay-env"
    assert set(re.findall(r"--from-literal=(\w+)=", create.group(0))) == wanted - {"POD_NAME"}


def test_relay_sidecar_runs_read_only_as_the_image_user(sidecar: Sidecar) -> None:
    sc = relay_of(sidecar)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["runAsUser"] == 65532 and sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in relay_of(sidecar)["volumeMounts"]}
    assert {relay_config()["storage"]["path"], "/tmp"} <= mounts


def test_prometheus_remote_writes_to_the_relay_on_loopback(sidecar: Sidecar) -> None:
    (rw,) = sidecar.remote_write
    assert rw["url"] == WRITE_URL
    keep = rw["write_relabel_configs"][0]
    assert keep["action"] == "keep" and all(anchored(keep["regex"]).match(m) for m in CRITICAL)


@pytest.mark.parametrize("name", ["prometheus-operator", "kube-prometheus-stack"])
def test_operator_prometheus_drops_its_per_replica_label_before_the_relay(name: str) -> None:
    # The operator adds prometheus_replica to all remote-written series; two replicas' series would
    # then differ and AMP could not deduplicate them on cluster + __replica__.
    (rw,) = SIDECARS[name]().remote_write
    drops = [r for r in rw["write_relabel_configs"] if r["action"] == "labeldrop"]
    assert any(anchored(r["regex"]).match("prometheus_replica") for r in drops)
    assert not any(anchored(r["regex"]).match("cluster") for r in drops)


def test_values_sidecar_is_the_operator_patch_sidecar() -> None:
    values, operator = _kube_prometheus_stack(), _operator()
    assert values.pod["containers"] == operator.pod["containers"]
    assert values.pod["volumes"] == operator.pod["volumes"]
    assert values.remote_write == operator.remote_write
    assert values.labels == operator.labels


def test_values_sidecar_is_a_valid_container_with_its_volumes() -> None:
    spec = _kube_prometheus_stack().pod
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "prometheus"},
           "spec": {"containers": spec["containers"], "volumes": spec["volumes"]}}
    assert kubernetes_validate.validate(pod, K8S_VERSION, strict=True) == K8S_VERSION


def _walk_keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from _walk_keys(v)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_keys(item)


def test_values_change_nothing_cluster_wide() -> None:
    values = yaml.safe_load(VALUES.read_text())
    keys = set(_walk_keys(values))
    assert not {k for k in keys if k.endswith("NilUsesHelmValues") or k.endswith("Selector")}
    assert set(values) == {"prometheus"} and set(values["prometheus"]) == {"prometheusSpec"}
    # Instead, what the chart selects by default (release label) is on our monitors and rules.
    docs = render("overlays/kube-prometheus-stack")
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        objs = [d for d in docs if d["kind"] == kind]  # every one (two PrometheusRules: alerts and waste)
        assert objs, kind
        for obj in objs:
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", (kind, obj["metadata"]["name"])


def test_relay_service_accounts_use_irsa_and_the_config_does_not_assume_the_same_role() -> None:
    sas = [find(_statefulset().docs, "ServiceAccount", "prometheus"),
           find(_operator().docs, "ServiceAccount", "gpu-telemetry-prometheus")]
    # the values file sets no role: a placeholder would replace the release's own IRSA annotation
    assert "serviceAccount" not in yaml.safe_load(VALUES.read_text())["prometheus"]
    assert "--set-string 'prometheus.serviceAccount.annotations.eks" in VALUES.read_text()
    for sa in sas:
        annotations = sa.get("metadata", sa).get("annotations")
        assert re.fullmatch(r"arn:aws:iam::\d{12}:role/.+", annotations["eks.amazonaws.com/role-arn"])
    for dest in relay_config()["destinations"]:
        assert "role_arn" not in dest.get("sigv4", {})
        assert "X-Scope-OrgID" not in dest.get("headers", {})


def test_operator_serviceaccount_is_the_one_the_cr_runs_as_and_may_discover_targets() -> None:
    docs = _operator().docs
    cr = find(docs, "Prometheus")
    sa = find(docs, "ServiceAccount", cr["spec"]["serviceAccountName"])
    binding = find(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    role = find(docs, "ClusterRole", binding["roleRef"]["name"])
    core = next(r for r in role["rules"] if r["apiGroups"] == [""])
    assert {"pods", "services", "endpoints"} <= set(core["resources"]) and "list" in core["verbs"]


def test_statefulset_keeps_the_relay_queue_on_a_claim_and_scrapes_its_telemetry() -> None:
    s = _statefulset()
    sts = find(s.docs, "StatefulSet")
    mounts = {m["mountPath"]: m["name"] for m in relay_of(s)["volumeMounts"]}
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    assert mounts["/var/lib/gpu-relay"] in claims
    assert s.pod["serviceAccountName"] == "prometheus"
    prom = yaml.safe_load(find(s.docs, "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["gpu-relay"]["static_configs"] == [{"targets": ["127.0.0.1:9202"]}]
    assert jobs["gpu-exporter"]["honor_labels"] is True


def test_statefulset_prometheus_config_passes_promtool_check_config(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    cfg = yaml.safe_load(find(_statefulset().docs, "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
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


# -- ports: the write endpoint is never exposed -----------------------------------------------------


def test_no_service_and_no_container_exposes_the_write_port(sidecar: Sidecar) -> None:
    for doc in sidecar.docs:
        if doc["kind"] == "Service":
            ports = {p["port"] for p in doc["spec"]["ports"]} | {p.get("targetPort") for p in doc["spec"]["ports"]}
            assert 9201 not in ports, doc["metadata"]["name"]
    for c in sidecar.pod["containers"]:
        assert 9201 not in {p["containerPort"] for p in c.get("ports", [])}, c["name"]


# -- the PodMonitor and the NetworkPolicy -------------------------------------------------------------


def test_podmonitor_scrapes_the_telemetry_port_of_every_relay_sidecar(sidecar: Sidecar) -> None:
    pm = find(render("monitoring"), "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= sidecar.labels.items()
    assert dict([RELAY_POD_LABEL]).items() <= sidecar.labels.items()
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert port_number(relay_of(sidecar), ep["port"]) == 9202 and ep["path"] == "/metrics"
    assert {"action": "replace", "targetLabel": "job", "replacement": "gpu-relay"} in ep["relabelings"]


def test_operator_prometheus_selects_the_monitors_and_rules() -> None:
    docs = _operator().docs
    spec = find(docs, "Prometheus")["spec"]
    for kind, sel in (("ServiceMonitor", "serviceMonitor"), ("PodMonitor", "podMonitor"), ("PrometheusRule", "rule")):
        objs = [d for d in docs if d["kind"] == kind]  # every one (two PrometheusRules: alerts and waste)
        assert objs, kind
        for obj in objs:
            assert spec[sel + "Selector"]["matchLabels"].items() <= obj["metadata"]["labels"].items(), kind
            ns_labels = {"kubernetes.io/metadata.name": obj["metadata"]["namespace"]}
            assert spec[sel + "NamespaceSelector"]["matchLabels"].items() <= ns_labels.items(), kind


PROM_LABELS = {"app.kubernetes.io/name": "prometheus"}


@pytest.mark.parametrize(
    ("port", "src_ns", "src_labels", "allowed"),
    [
        (9202, MONITORING_NS, {}, True),  # the cluster's Prometheus scrapes the telemetry port
        (9202, "default", {}, False),
        (9202, "ml-team", PROM_LABELS, False),  # a Prometheus of another namespace
        (9201, MONITORING_NS, PROM_LABELS, False),  # the write port, from anywhere outside the pod
        (9201, "default", {}, False),
        (9090, "default", {}, False),  # no catch-all (issue 20 point 8): Prometheus's API not cluster-wide
        (9090, MONITORING_NS, {}, True),  # Grafana and the monitoring Prometheus
        (8080, "default", {}, False),  # the operator's config-reloader
        (8080, MONITORING_NS, {}, True),
        (65535, "default", {}, False),
    ],
)
def test_networkpolicy_limits_the_telemetry_port_to_the_monitoring_namespace(
    sidecar: Sidecar, port: int, src_ns: str, src_labels: dict[str, str], allowed: bool
) -> None:
    policies = [d for d in sidecar.docs if d["kind"] == "NetworkPolicy"]
    assert policies, "the relay's NetworkPolicy is applied with the sidecar"
    assert ingress_allowed(policies, sidecar.namespace, sidecar.labels, port, src_ns=src_ns,
                           src_pod_labels=src_labels) is allowed


def test_networkpolicy_admits_the_ha_peer_prometheus_of_the_same_namespace(sidecar: Sidecar) -> None:
    policies = [d for d in sidecar.docs if d["kind"] == "NetworkPolicy"]
    assert ingress_allowed(policies, sidecar.namespace, sidecar.labels, 9202, src_ns=sidecar.namespace,
                           src_pod_labels=PROM_LABELS)
    assert ingress_allowed(policies, sidecar.namespace, sidecar.labels, 9202, src_ns=sidecar.namespace,
                           src_pod_labels={"app": "other"}) is (sidecar.namespace == MONITORING_NS)


def test_networkpolicy_leaves_pods_without_the_relay_alone() -> None:
    policies = [d for d in _operator().docs if d["kind"] == "NetworkPolicy"]
    assert ingress_allowed(policies, MONITORING_NS, {"app.kubernetes.io/name": "grafana"}, 9202,
                           src_ns="default")
    assert not ingress_allowed(policies, MONITORING_NS, dict([RELAY_POD_LABEL]), 9202, src_ns="default")


# -- the relay config -----------------------------------------------------------------------------------


def test_relay_config_listens_for_writes_on_loopback_and_telemetry_on_9202() -> None:
    server = relay_config()["server"]
    assert server["listen"] == "127.0.0.1:9201"
    assert server["telemetry_listen"] == ":9202"


def test_relay_config_is_ready_for_amp_ha_with_cluster_and_replica_from_the_environment() -> None:
    assert relay_config()["external_labels"] == {"cluster": "${CLUSTER_NAME}", "__replica__": "${POD_NAME}"}


def test_relay_config_has_no_placeholder_workspace() -> None:
    text = RELAY_CONFIG.read_text()
    assert "ws-EXAMPLE" not in text and "111122223333" not in text
    (amp,) = relay_config()["destinations"]
    assert amp["url"] == "${AMP_REMOTE_WRITE_URL}" and amp["sigv4"] == {"region": "${AWS_REGION}"}


@pytest.mark.parametrize("path", [RELAY_CONFIG, DEPLOY / "examples" / "relay.yaml"], ids=["sidecar", "example"])
def test_amp_destination_keeps_only_the_critical_gpu_metrics_and_prunes_constant_labels(path: Path) -> None:
    cfg = yaml.safe_load(path.read_text())
    (amp,) = [d for d in cfg["destinations"] if d["name"] == "amp"]
    (keep,) = amp["write_relabel_configs"]
    assert (keep["action"], keep["source_labels"]) == ("keep", ["__name__"])
    regex = anchored(keep["regex"])
    assert [m for m in CRITICAL if not regex.match(m)] == []
    assert [m for m in NOT_CRITICAL if regex.match(m)] == []
    assert {"pci_bus_id", "DCGM_FI_DRIVER_VERSION"} <= set(amp["prune_labels"])


@pytest.mark.parametrize("path", [RELAY_CONFIG, DEPLOY / "examples" / "relay.yaml"], ids=["sidecar", "example"])
def test_relay_config_uses_only_config_keys(path: Path) -> None:
    cfg = yaml.safe_load(path.read_text())
    assert set(cfg) <= RELAY_KEYS[""]
    assert set(cfg["server"]) <= RELAY_KEYS["server"]
    assert set(cfg["storage"]) <= RELAY_KEYS["storage"]
    for dest in cfg["destinations"]:
        assert set(dest) <= RELAY_KEYS["destination"]
        for section in ("sigv4", "limits", "queue"):
            assert set(dest.get(section, {})) <= RELAY_KEYS[section], section


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "gpu-relay"
    clean = {k: v for k, v in os.environ.items() if k not in {"AMP_REMOTE_WRITE_URL", "AWS_REGION",
                                                                 "CLUSTER_NAME", "POD_NAME"}}
    return subprocess.run([str(exe), "check-config", str(path)], capture_output=True, text=True, timeout=60,
                          env={**clean, **env})


SIDECAR_ENV = {
    "AMP_REMOTE_WRITE_URL": "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1a2b3c4d-5e6f"
                            "-7a8b-9c0d-1e2f3a4b5c6d/api/v1/remote_write",
    "AWS_REGION": "eu-west-1",
    "CLUSTER_NAME": "gpu-prod",
    "POD_NAME": "prometheus-gpu-telemetry-0",
}


@pytest.fixture(scope="module")
def env_expansion(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip until the relay understands what the sidecar config uses (issue 10: env expansion,
    __replica__ in external_labels, server.telemetry_listen; the relay-config helper's part)."""
    probe = tmp_path_factory.mktemp("probe") / "relay.yaml"
    probe.write_text(
        'server: {listen: "127.0.0.1:9201", telemetry_listen: ":9202"}\n'
        'external_labels: {cluster: "${GPU_RELAY_PROBE_UNSET:-c}", __replica__: r}\n'
        f"storage: {{path: {probe.parent / 'q'}}}\n"
        "destinations: [{name: d, url: 'http://127.0.0.1:1/api/v1/write'}]\n"
    )
    if check_config(probe, {}).returncode != 0:
        pytest.skip("gpu-relay check-config does not yet accept env expansion / __replica__ / telemetry_listen")


def _sidecar_config_with_writable_storage(tmp_path: Path) -> Path:
    path = tmp_path / "relay.yaml"  # storage.path must be writable here (check-config checks it)
    path.write_text(RELAY_CONFIG.read_text().replace("/var/lib/gpu-relay", str(tmp_path / "q")))
    return path


def test_sidecar_relay_config_passes_check_config_with_its_environment(env_expansion: None, tmp_path: Path) -> None:
    out = check_config(_sidecar_config_with_writable_storage(tmp_path), SIDECAR_ENV)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("missing", ["AMP_REMOTE_WRITE_URL", "AWS_REGION", "CLUSTER_NAME"])
def test_sidecar_relay_config_is_refused_naming_the_variable_when_its_environment_is_missing(
    env_expansion: None, tmp_path: Path, missing: str
) -> None:
    env = {k: v for k, v in SIDECAR_ENV.items() if k != missing}
    path = _sidecar_config_with_writable_storage(tmp_path)
    out = check_config(path, env)
    assert out.returncode != 0
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "${" + missing in text)
    assert re.search(rf"relay\.yaml:{line}\b.*{missing}", out.stdout + out.stderr), out.stdout + out.stderr


def test_example_relay_config_passes_check_config(tmp_path: Path) -> None:
    out = check_config(DEPLOY / "examples" / "relay.yaml", {})
    assert out.returncode == 0, out.stdout + out.stderr
