"""No alert of deploy/monitoring/alerts.yaml fires in normal operation, on the series a real gpu-exporter
(simulated GPUs) and a real gpu-relay emit: the relay scrapes the exporter and sends to a receiver,
its destination's rules drop most families (reason="rules") and an aggregation folds one family
(reason="aggregated"), both intended. Two snapshots of each /metrics become an hour of promtool input:
counters grow at the rate measured between the snapshots, gauges hold their value, and
`*_timestamp_seconds` gauges advance with the clock (as they do)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.render import alert_rules, promtool_test
from tests.e2e.procs import running, start_exporter, start_relay
from tests.helpers import wait_until
from tests.rw_receiver import recording_receiver

pytestmark = pytest.mark.e2e

MINUTES = 70
EXPORTER_TARGET = {"job": "gpu-exporter", "instance": "10.0.0.1:9400"}
RELAY_TARGET = {"job": "gpu-relay", "instance": "10.0.0.7:9202"}

Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(url: str) -> dict[Sample, tuple[float, str]]:
    """(name, labels) -> (value, kind) where kind is counter | gauge (histogram parts are counters)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[Sample, tuple[float, str]] = {}
    for family in text_string_to_metric_families(text):
        kind = "counter" if family.type in {"counter", "histogram", "summary"} else "gauge"
        for s in family.samples:
            if s.name.endswith("_created"):
                continue  # prometheus_client's creation timestamps: Prometheus ignores them too
            out[(s.name, tuple(sorted(s.labels.items())))] = (float(s.value), kind)
    return out


def relay_sample(samples: dict[Sample, tuple[float, str]], name: str, **labels: str) -> float:
    return sum(v for (n, lb), (v, _) in samples.items() if n == name and labels.items() <= dict(lb).items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def promtool_series(first: dict[Sample, tuple[float, str]], second: dict[Sample, tuple[float, str]],
                    seconds: float, target: dict[str, str]) -> list[dict[str, str]]:
    series = []
    for (name, labels), (value, kind) in second.items():
        lb = {**dict(labels), **target}
        selector = name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(lb.items())) + "}"
        if kind == "counter":
            per_minute = max(0.0, value - first.get((name, labels), (value, kind))[0]) * 60 / seconds
            values = f"{value}+{per_minute}x{MINUTES}"
        elif name.endswith("_timestamp_seconds"):
            values = f"0+60x{MINUTES}"  # promtool's clock starts at 0
        else:
            values = f"{value}x{MINUTES}"
        series.append({"series": selector, "values": values})
    up = [{"series": f'up{{job="{t["job"]}",instance="{t["instance"]}"}}', "values": f"1x{MINUTES}"}
          for t in (target,)]
    return series + up


def test_no_alert_fires_on_what_a_healthy_exporter_and_relay_emit(tmp_path: Path) -> None:
    exporter, exp_url = start_exporter(tmp_path, gpus=4, interval="1s")
    with running(exporter), recording_receiver() as rx:
        cfg = f"""
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'q'}}}
scrape:
  - job_name: gpu-exporter
    scrape_interval: 1s
    static_configs: [{{targets: ["{exp_url.removeprefix('http://')}"]}}]
destinations:
  - name: home
    url: {rx.url}
    write_relabel_configs:
      - {{source_labels: [__name__], regex: "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_POWER_USAGE", action: keep}}
    aggregate:
      - match: DCGM_FI_DEV_POWER_USAGE
        without: [gpu, UUID, pci_bus_id, device, modelName]
        interval: 1s
        outputs: [sum]
    queue: {{batch_send_deadline: 200ms}}
"""
        relay, url = start_relay(tmp_path, cfg)
        with running(relay):

            def working() -> bool:
                m = scrape(url + "/metrics")
                return all(relay_sample(m, name, **labels) > 0 for name, labels in [
                    ("gpu_relay_samples_sent_total", {"destination": "home"}),
                    ("gpu_relay_samples_dropped_total", {"destination": "home", "reason": "rules"}),
                    ("gpu_relay_samples_dropped_total", {"destination": "home", "reason": "aggregated"}),
                ])

            assert wait_until(working, timeout=30, interval=0.5), relay.tail()
            first = (scrape(exp_url + "/metrics"), scrape(url + "/metrics"))
            started = time.monotonic()
            time.sleep(3)
            second = (scrape(exp_url + "/metrics"), scrape(url + "/metrics"))
            seconds = time.monotonic() - started
    assert rx.snapshot(), "the receiver got samples"
    series = (promtool_series(first[0], second[0], seconds, EXPORTER_TARGET)
              + promtool_series(first[1], second[1], seconds, RELAY_TARGET))
    names = {s["series"].split("{")[0] for s in series}
    assert {"gpu_exporter_device_up", "gpu_exporter_last_collection_timestamp_seconds", "DCGM_FI_DEV_GPU_TEMP",
            "gpu_relay_samples_dropped_total", "gpu_relay_oldest_queued_sample_age_seconds"} <= names
    checks: list[dict[str, Any]] = [
        {"eval_time": f"{t}m", "alertname": name, "exp_alerts": []}
        for name in sorted(alert_rules()) for t in (5, 15, 30, 45, 60)
    ]
    out = promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": checks}])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
