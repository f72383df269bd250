"""``import-prometheus`` reads the prometheus-operator's camelCase remote write (issue 20 point 7):
a kube-prometheus-stack values file, a Prometheus resource, a bare list; check-config names the
snake_case key for a camelCase one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from relay.config.config import ConfigError, load_config, parse_config
from relay.config.operator import camel_to_snake
from relay.config.promimport import ImportError_, import_prometheus
from relay.control.cli import main

AMP = "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/api/v1/remote_write"
ENTRY: dict[str, Any] = {
    "url": AMP,
    "sigv4": {"region": "us-west-2", "roleArn": "arn:aws:iam::123456789012:role/amp"},
    "writeRelabelConfigs": [
        {"sourceLabels": ["__name__"], "regex": "DCGM_.*|container_gpu_usage_seconds_total", "action": "Keep"},
        {"sourceLabels": ["instance"], "regex": "(?P<host>[^:]+):.*", "targetLabel": "host",
         "replacement": "${host}"},
        {"regex": "pod_uid", "action": "labeldrop"},
    ],
    "queueConfig": {"maxSamplesPerSend": 2000, "batchSendDeadline": "5s", "minBackoff": "50ms",
                    "maxShards": 4, "sampleAgeLimit": "1h", "retryOnRateLimit": True},
    "remoteTimeout": "30s",
    "headers": {"X-Team-Name": "gpu"},
}
FORMS = {
    "kube-prometheus-stack values": {"prometheus": {"prometheusSpec": {
        "externalLabels": {"cluster": "prod"}, "remoteWrite": [ENTRY]}}},
    "Prometheus resource": {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
                            "metadata": {"name": "k8s"},
                            "spec": {"externalLabels": {"cluster": "prod"}, "remoteWrite": [ENTRY]}},
    "bare list": [ENTRY],
}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_operator_form_imports_to_the_relay_config_prometheus_yml_would_give(tmp_path: Path, form: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(FORMS[form]))
    imported = import_prometheus(path)
    (tmp_path / "relay.yaml").write_text(imported.relay_config)
    (d,) = load_config(tmp_path / "relay.yaml", env={}).destinations
    assert d.url == AMP and d.sigv4 is not None and d.sigv4.role_arn == "arn:aws:iam::123456789012:role/amp"
    keep, replace, drop = d.write_relabel_configs
    assert (keep.action, keep.source_labels, keep.regex.pattern) == (
        "keep", ("__name__",), "DCGM_.*|container_gpu_usage_seconds_total")
    assert (replace.target_label, replace.replacement) == ("host", "${host}")  # a group, kept as written
    assert (drop.action, drop.regex.pattern) == ("labeldrop", "pod_uid")
    assert (d.queue.max_samples_per_send, d.queue.batch_send_deadline, d.queue.max_shards) == (2000, 5.0, 4)
    assert (d.queue.min_backoff, d.queue.max_sample_age) == (0.05, 3600.0)
    assert d.headers == {"X-Team-Name": "gpu"}
    config = load_config(tmp_path / "relay.yaml", env={})
    assert dict(config.external_labels) == ({} if form == "bare list" else {"cluster": "prod"})


def test_the_entry_for_prometheus_comes_back_in_the_operator_s_form_at_the_same_place(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(FORMS["kube-prometheus-stack values"]))
    entry = yaml.safe_load(import_prometheus(path).prometheus_entry)
    (rw,) = entry["prometheus"]["prometheusSpec"]["remoteWrite"]
    assert rw["url"] == "http://127.0.0.1:9201/api/v1/write"
    assert rw["writeRelabelConfigs"] == [{"sourceLabels": ["__name__"], "action": "keep",
                                          "regex": "(?:DCGM_.*|container_gpu_usage_seconds_total)"}]


def test_a_secret_reference_is_left_out_with_a_note_naming_it(tmp_path: Path) -> None:
    entry = {"url": "http://h:1/w", "basicAuth": {"username": {"name": "rw", "key": "user"},
                                                  "password": {"name": "rw", "key": "pass"}}}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump([entry]))
    imported = import_prometheus(path)
    assert any("[0].basicAuth.password is a Kubernetes Secret reference (rw/pass)" in n for n in imported.skipped)
    assert "name: rw" not in imported.relay_config


def test_a_values_file_without_remote_write_says_where_it_looked(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("prometheus:\n  prometheusSpec:\n    replicas: 2\n")
    with pytest.raises(ImportError_, match=r"prometheus\.prometheusSpec\.remoteWrite"):
        import_prometheus(path)


@pytest.mark.parametrize(
    ("camel", "snake"),
    [("writeRelabelConfigs", "write_relabel_configs"), ("sourceLabels", "source_labels"),
     ("targetLabel", "target_label"), ("queueConfig", "queue_config"), ("maxSamplesPerSend", "max_samples_per_send"),
     ("enableHTTP2", "enable_http2"), ("roundRobinDNS", "round_robin_dns"), ("retryOnRateLimit", "retry_on_http_429"),
     ("useFIPSSTSEndpoint", "use_fips_sts_endpoint"), ("roleArn", "role_arn"), ("azureAd", "azuread")],
)
def test_operator_keys_map_to_prometheus_keys(camel: str, snake: str) -> None:
    assert camel_to_snake(camel) == snake


@pytest.mark.parametrize(
    ("entry", "line", "message"),
    [
        ("    writeRelabelConfigs: []\n", 4,
         "destinations[0].writeRelabelConfigs: unknown key writeRelabelConfigs: did you mean write_relabel_configs?"),
        ("    queue: {maxShards: 2}\n", 4, "destinations[0].queue.maxShards: unknown key maxShards: did you mean "
                                           "max_shards?"),
        ("    write_relabel_configs:\n      - {sourceLabels: [a], action: keep}\n", 5,
         "unknown field 'sourceLabels' in relabel config: did you mean source_labels?"),
    ],
)
def test_check_config_names_the_snake_case_key_for_a_camel_case_one(entry: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(f"destinations:\n  - name: d\n    url: http://h:1/w\n{entry}", "relay.yaml", env={})
    (issue,) = e.value.errors
    assert str(issue).startswith(f"relay.yaml:{line}: ") and message in str(issue), str(issue)


def test_check_config_hint_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text("remote_write:\n  - url: http://h:1/w\n    writeRelabelConfigs: []\n")
    assert main(["check-config", str(path)]) == 1
    assert "unknown key writeRelabelConfigs: did you mean write_relabel_configs?" in capsys.readouterr().err
