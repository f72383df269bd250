"""deploy/monitoring/alerts.yaml: structure, `promtool check rules`, and `promtool test rules` showing
that each alert fires on its fault (with the label sets the programs emit: the exporter's self-metrics
name the node in `Hostname`) and stays silent just before. Silence in normal operation, on series a
real exporter and relay emit, is tests/e2e/test_alerts_normal_operation.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.render import alert_rules, promtool_test, write_rules
from tests.helpers import require_binary


def test_alerts_cover_gpus_exporter_and_relay() -> None:
    rules = alert_rules()
    assert "pod" in rules["GPUIdleWhileHeldByPod"]["expr"] and rules["GPUIdleWhileHeldByPod"]["for"] == "30m"
    wanted_metric = {
        "GPUIdleWhileHeldByPod": "DCGM_FI_DEV_GPU_UTIL",
        "GPUXidErrors": "gpu_exporter_xid_errors_total",
        "GPUDown": "gpu_exporter_device_up",
        "GPUHighTemperature": "DCGM_FI_DEV_GPU_TEMP",
        "GPUExporterAbsent": 'up{job="gpu-exporter"}',
        "GPURelayDown": 'up{job="gpu-relay"}',
        "GPURelayQueueBacklog": "gpu_relay_oldest_queued_sample_age_seconds",
        "GPURelayDroppingSamples": "gpu_relay_samples_dropped_total",
        "GPURelaySeriesLimitDrops": "gpu_relay_series_limit_dropped_total",
    }
    for alert, metric in wanted_metric.items():
        assert metric in rules[alert]["expr"], alert
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"], name


@pytest.mark.parametrize("alert", ["GPUDown", "GPUXidErrors", "GPUXidErrorsCritical", "GPUIdleWhileHeldByPod",
                                   "GPUHighTemperature"])
def test_gpu_alerts_name_the_node(alert: str) -> None:
    assert "$labels.Hostname" in alert_rules()[alert]["annotations"]["summary"]


def test_alert_rules_pass_promtool_check_rules(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    out = subprocess.run([promtool, "check", "rules", str(write_rules(tmp_path))], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


# -- each alert fires on its fault ---------------------------------------------------------------------

GPU_A = 'gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0",Hostname="n1"'
GPU_B = 'gpu="1",UUID="GPU-b",pci_bus_id="00000000:2A:00.0",Hostname="n1"'
RELAY = 'job="gpu-relay",instance="10.0.0.7:9202"'


def fires(t: str, alert: str, *expected: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": t, "alertname": alert, "exp_alerts": list(expected)}


def alert(labels: dict[str, str], summary: str, description: str | None = None, *, name: str) -> dict[str, Any]:
    """One expected alert. promtool compares every annotation: a description without templates is
    the rule's own text; a templated one must be given, rendered."""
    if description is None:
        description = alert_rules()[name]["annotations"]["description"]
        assert "{{" not in description, f"{name}: give the rendered description"
    return {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}


def silent(t: str, alert: str) -> dict[str, Any]:
    return {"eval_time": t, "alertname": alert, "exp_alerts": []}


def faults() -> list[dict[str, Any]]:
    return [
        {   # GPUs: idle while held, down, hot; XIDs counted up and XIDs born at their first event
            "interval": "1m",
            "input_series": [
                {"series": 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1",pod="train-0",'
                           'namespace="ml",container="main"}', "values": "0x40"},
                {"series": 'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",Hostname="n1"}', "values": "0x40"},
                {"series": f"gpu_exporter_device_up{{{GPU_A}}}", "values": "1 1 0x40"},
                {"series": f"gpu_exporter_device_up{{{GPU_B}}}", "values": "1x40"},
                {"series": f'gpu_exporter_xid_errors_total{{{GPU_B},xid="79"}}', "values": "_x15 1x25"},
                {"series": f'gpu_exporter_xid_errors_total{{{GPU_B},xid="13"}}', "values": "0 0 1 1 1 1"},
                {"series": 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="n1"}', "values": "90x20"},
                {"series": 'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",Hostname="n1"}', "values": "80x20"},
            ],
            "alert_rule_test": [
                silent("29m", "GPUIdleWhileHeldByPod"),
                fires("35m", "GPUIdleWhileHeldByPod", {
                    "exp_labels": {"severity": "warning", "gpu": "0", "UUID": "GPU-a", "Hostname": "n1",
                                   "pod": "train-0", "namespace": "ml", "container": "main"},
                    "exp_annotations": {
                        "summary": "GPU 0 on n1 idle for 30m while held by a pod",
                        "description": "ml/train-0 (container main) holds GPU GPU-a but has not used it for 30 "
                                       "minutes. Free it for other jobs."}}),
                silent("3m", "GPUDown"),
                fires("5m", "GPUDown", {
                    "exp_labels": {"severity": "critical", "gpu": "0", "UUID": "GPU-a",
                                   "pci_bus_id": "00000000:18:00.0", "Hostname": "n1"},
                    "exp_annotations": {
                        "summary": "GPU 0 (GPU-a) on n1 stopped answering NVML",
                        "description": "gpu-exporter cannot read the GPU at 00000000:18:00.0 (lost, reset required "
                                       "or a driver fault); its /health on that node says why. The other GPUs "
                                       "keep being served."}}),
                fires("4m", "GPUXidErrors", {
                    "exp_labels": {"severity": "warning", "gpu": "1", "UUID": "GPU-b", "Hostname": "n1", "xid": "13"},
                    "exp_annotations": {
                        "summary": "XID 13 on GPU 1 of n1",
                        "description": "The driver reported XID 13 on GPU GPU-b of node n1 in the last 10 minutes. "
                                       "See NVIDIA's XID catalogue; 13/31/43/45 usually point at the application."}}),
                silent("4m", "GPUXidErrorsCritical"),
                # XID 79's counter is born at 1 at minute 16: no earlier sample, still an alert.
                fires("20m", "GPUXidErrorsCritical", {
                    "exp_labels": {"severity": "critical", "gpu": "1", "UUID": "GPU-b", "Hostname": "n1", "xid": "79"},
                    "exp_annotations": {
                        "summary": "Critical XID 79 on GPU 1 of n1",
                        "description": "GPU GPU-b on node n1 reported XID 79; drain the node and check the GPU."}}),
                silent("30m", "GPUXidErrorsCritical"),  # 10 minutes later, with no new XID
                silent("9m", "GPUHighTemperature"),
                fires("12m", "GPUHighTemperature", alert(
                    {"severity": "warning", "gpu": "0", "UUID": "GPU-a", "Hostname": "n1"},
                    "GPU 0 on n1 at 90 °C", name="GPUHighTemperature")),
            ],
        },
        {   # XIDs the exporter counted before this Prometheus started are no new event
            "interval": "1m",
            "input_series": [
                {"series": f"gpu_exporter_device_up{{{GPU_B}}}", "values": "1x20"},
                {"series": f'gpu_exporter_xid_errors_total{{{GPU_B},xid="79"}}', "values": "3x20"},
            ],
            "alert_rule_test": [silent("5m", "GPUXidErrors"), silent("5m", "GPUXidErrorsCritical"),
                                silent("15m", "GPUXidErrors")],
        },
        {   # the exporter: absent, down, stale, kubelet failing
            "interval": "1m",
            "input_series": [
                {"series": 'up{job="prometheus",instance="127.0.0.1:9090"}', "values": "1x30"},
            ],
            "alert_rule_test": [
                silent("9m", "GPUExporterAbsent"),
                fires("11m", "GPUExporterAbsent", alert({"severity": "critical", "job": "gpu-exporter"},
                                                        "No gpu-exporter target is scraped", name="GPUExporterAbsent")),
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {"series": 'up{job="gpu-exporter",instance="10.0.0.1:9400"}', "values": "0x30"},
                {"series": 'gpu_exporter_last_collection_timestamp_seconds{Hostname="n1",instance="10.0.0.1:9400"}',
                 "values": "0x30"},
                {"series": 'gpu_exporter_last_collection_timestamp_seconds{Hostname="n2",instance="10.0.0.2:9400"}',
                 "values": "0+60x30"},
                {"series": 'gpu_exporter_kubelet_errors_total{Hostname="n1",instance="10.0.0.1:9400"}',
                 "values": "0+1x40"},
            ],
            "alert_rule_test": [
                silent("4m", "GPUExporterDown"),
                fires("6m", "GPUExporterDown", alert(
                    {"severity": "warning", "job": "gpu-exporter", "instance": "10.0.0.1:9400"},
                    "gpu-exporter at 10.0.0.1:9400 cannot be scraped", name="GPUExporterDown")),
                fires("8m", "GPUExporterCollectionStale", alert(
                    {"severity": "warning", "Hostname": "n1", "instance": "10.0.0.1:9400"},
                    "gpu-exporter on n1 (10.0.0.1:9400) serves stale values",
                    "The last collection cycle finished 8m 0s ago.", name="GPUExporterCollectionStale")),
                silent("10m", "GPUExporterPodAttributionFailing"),
                fires("20m", "GPUExporterPodAttributionFailing", alert(
                    {"severity": "warning", "Hostname": "n1", "instance": "10.0.0.1:9400"},
                    "gpu-exporter on n1 (10.0.0.1:9400) cannot ask the kubelet which pod holds its GPUs",
                    name="GPUExporterPodAttributionFailing")),
            ],
        },
        {   # the relay: down, backlog, queue nearly full, losing samples, failing sends, bad reload, limits
            "interval": "1m",
            "input_series": [
                {"series": f"up{{{RELAY}}}", "values": "0x30"},
                {"series": f'gpu_relay_oldest_queued_sample_age_seconds{{{RELAY},destination="amp"}}',
                 "values": "0+60x60"},
                {"series": f'gpu_relay_queue_bytes{{{RELAY},destination="amp"}}', "values": "900x30"},
                {"series": f'gpu_relay_queue_max_bytes{{{RELAY},destination="amp"}}', "values": "1000x30"},
                {"series": f"gpu_relay_samples_received_total{{{RELAY}}}", "values": "0+1000x40"},
                {"series": f'gpu_relay_samples_dropped_total{{{RELAY},destination="amp",reason="queue_full"}}',
                 "values": "0+100x30"},
                {"series": f'gpu_relay_samples_dropped_total{{{RELAY},destination="amp",reason="rules"}}',
                 "values": "0+900x30"},
                {"series": f'gpu_relay_samples_dropped_total{{{RELAY},destination="amp",reason="aggregated"}}',
                 "values": "0+50x30"},
                # One batch refused with 403 at minute 11: the counter is born at its value.
                {"series": f'gpu_relay_samples_failed_total{{{RELAY},destination="amp",reason="http_403"}}',
                 "values": "_x10 500x29"},
                {"series": f"gpu_relay_config_last_reload_successful{{{RELAY}}}", "values": "1 1 0x30"},
                {"series": f'gpu_relay_series_limit_dropped_total{{{RELAY},destination="amp",metric="m",'
                           f'limit="max_series"}}', "values": "0+5x30"},
            ],
            "alert_rule_test": [
                silent("4m", "GPURelayDown"),
                fires("6m", "GPURelayDown", alert(
                    {"severity": "warning", "job": "gpu-relay", "instance": "10.0.0.7:9202"},
                    "gpu-relay at 10.0.0.7:9202 cannot be scraped", name="GPURelayDown")),
                silent("10m", "GPURelayQueueBacklog"),
                fires("20m", "GPURelayQueueBacklog", {
                    "exp_labels": {"severity": "warning", "destination": "amp", "job": "gpu-relay",
                                   "instance": "10.0.0.7:9202"},
                    "exp_annotations": {
                        "summary": "gpu-relay queue for amp is 20m 0s behind",
                        "description": "The destination is slow, throttling (429) or down. Samples older than "
                                       "the queue's max_sample_age are dropped, not sent."}}),
                silent("33m", "GPURelayQueueBacklogCritical"),
                fires("37m", "GPURelayQueueBacklogCritical", alert(
                    {"severity": "critical", "destination": "amp", "job": "gpu-relay", "instance": "10.0.0.7:9202"},
                    "gpu-relay queue for amp is 37m 0s behind", name="GPURelayQueueBacklogCritical")),
                fires("11m", "GPURelayQueueNearlyFull", alert(
                    {"severity": "warning", "destination": "amp", "job": "gpu-relay", "instance": "10.0.0.7:9202"},
                    "gpu-relay queue for amp is 90% full", name="GPURelayQueueNearlyFull")),
                # queue_full alerts; rules and aggregated (the configuration working) do not.
                fires("15m", "GPURelayDroppingSamples", alert(
                    {"severity": "warning", "destination": "amp", "reason": "queue_full"},
                    "gpu-relay drops samples for amp (queue_full)",
                    "Samples are lost before sending: queue_full means the durable queue reached max_disk; "
                    "collision that pruning made two series identical; the others name an AMP limit a series "
                    "breaks. See /api/v1/cardinality?destination=amp.", name="GPURelayDroppingSamples")),
                fires("12m", "GPURelaySendFailures", alert(
                    {"severity": "warning", "destination": "amp", "reason": "http_403"},
                    "amp rejects samples from gpu-relay (http_403)", name="GPURelaySendFailures")),
                silent("25m", "GPURelaySendFailures"),  # a one-off, 10 minutes later
                silent("3m", "GPURelayConfigReloadFailed"),
                fires("8m", "GPURelayConfigReloadFailed", alert(
                    {"severity": "warning", "job": "gpu-relay", "instance": "10.0.0.7:9202"},
                    "gpu-relay at 10.0.0.7:9202 refused its new configuration", name="GPURelayConfigReloadFailed")),
                fires("10m", "GPURelaySeriesLimitDrops", alert(
                    {"severity": "warning", "destination": "amp"}, "gpu-relay hit the series limit for amp",
                    "New series over the destination's limits (max_series, max_series_per_metric) are dropped. "
                    "Check /api/v1/cardinality?destination=amp for what grew.", name="GPURelaySeriesLimitDrops")),
            ],
        },
    ]


def test_each_alert_fires_on_its_fault_and_not_before(tmp_path: Path) -> None:
    out = promtool_test(tmp_path, faults())
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_fault_test() -> None:
    fired = {t["alertname"] for group in faults() for t in group["alert_rule_test"] if t["exp_alerts"]}
    assert fired == set(alert_rules())


def test_promtool_test_catches_an_alert_that_does_not_fire(tmp_path: Path) -> None:
    wrong = [{**faults()[0], "alert_rule_test": [fires("5m", "GPUHighTemperature", {"exp_labels": {}})]}]
    assert promtool_test(tmp_path, wrong).returncode != 0
