"""Agent mode: gpu-relay scrapes a simulated exporter itself (no Prometheus) and feeds the same
pipeline; a dry-run destination reports what it would ship."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.procs import running, start_exporter, start_relay
from tests.helpers import wait_until
from tests.rw_receiver import recording_receiver

pytestmark = pytest.mark.e2e


def test_relay_scrapes_targets_and_forwards_kept_series(tmp_path: Path) -> None:
    exporter, exp_url = start_exporter(tmp_path, gpus=4, interval="1s")
    with running(exporter), recording_receiver() as rx:
        cfg = f"""
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'q'}}}
scrape:
  - job_name: gpu
    scrape_interval: 1s
    static_configs: [{{targets: ["{exp_url.removeprefix('http://')}"]}}]
destinations:
  - name: home
    url: {rx.url}
    write_relabel_configs:
      - {{source_labels: [__name__], regex: "DCGM_FI_DEV_GPU_UTIL|up", action: keep}}
    prune_labels: [pci_bus_id]
    queue: {{batch_send_deadline: 200ms}}
  - name: amp
    url: https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-X/api/v1/remote_write
    sigv4: {{region: us-east-1}}
    dry_run: true
"""
        relay, url = start_relay(tmp_path, cfg)
        with running(relay):

            def names() -> set[str]:
                return {dict(labels)["__name__"] for labels, _, _ in rx.snapshot()}

            assert wait_until(lambda: names() == {"DCGM_FI_DEV_GPU_UTIL", "up"}, timeout=20), (names(), relay.tail())
            for labels, _ts, _v in rx.snapshot():
                d = dict(labels)
                assert d["job"] == "gpu"
                assert d["instance"] == exp_url.removeprefix("http://")
                assert "pci_bus_id" not in d
            ups = [v for labels, _ts, v in rx.snapshot() if dict(labels)["__name__"] == "up"]
            assert ups and all(v == 1.0 for v in ups)

            with urllib.request.urlopen(f"{url}/api/v1/cardinality?destination=amp", timeout=5) as r:
                snap = json.load(r)
            assert snap["dry_run"] is True
            assert snap["active_series"]["out"] >= 4 * 23  # every default series of 4 GPUs, nothing sent
            assert not (tmp_path / "q" / "amp.queue.db").exists()
