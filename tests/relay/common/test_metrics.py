"""relay.common.metrics: no ``_created`` series on the relay's /metrics (issue 21 point 12), in the
text format and in OpenMetrics, scraped from a running ``gpu-relay``."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from relay.common.metrics import RelayMetrics
from tests.e2e.procs import running, start_relay


def _names(text: str) -> set[str]:
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


def test_counters_and_histograms_render_without_created_series_in_both_formats() -> None:
    metrics = RelayMetrics(CollectorRegistry())
    metrics.samples_received_total.inc(3)
    metrics.requests_received_total.labels("204").inc()
    metrics.send_duration_seconds.labels("amp").observe(0.2)
    for text in (generate_latest(metrics.registry).decode(), generate_openmetrics(metrics.registry).decode()):
        names = _names(text)
        assert "gpu_relay_samples_received_total" in names and "gpu_relay_send_duration_seconds_count" in names
        assert not [n for n in names if n.endswith("_created")], sorted(n for n in names if n.endswith("_created"))


@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text; version=1.0.0"])
def test_the_running_relays_metrics_have_no_created_series(tmp_path: Path, accept: str) -> None:
    config = (f'server: {{listen: "127.0.0.1:@PORT@"}}\nstorage: {{path: {tmp_path / "queues"}}}\n'
              "destinations:\n  - name: local\n    url: http://127.0.0.1:1/api/v1/write\n")
    proc, url = start_relay(tmp_path, config)
    with running(proc):
        req = urllib.request.Request(url + "/metrics", headers={"Accept": accept})
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
    names = _names(text)
    assert "gpu_relay_samples_received_total" in names or "gpu_relay_samples_received" in names
    assert [n for n in names if n.endswith("_created")] == []
