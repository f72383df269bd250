"""VictoriaMetrics interop with real binaries: vmagent scrapes a simulated gpu-exporter and remote-writes
to gpu-relay, which keeps the critical metrics, prunes labels and forwards to a real single-node
victoria-metrics; and gpu-relay as the sender to a vmagent (which forwards to the same VM)."""

from __future__ import annotations

import contextlib
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.procs import Proc, prom_query, prom_series, running, start_exporter, start_relay
from tests.helpers import free_port, require_binary, wait_until

pytestmark = pytest.mark.e2e

KEPT = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"}
VIA_VMAGENT = {"DCGM_FI_DEV_GPU_UTIL"}  # what the relay's second destination (a vmagent) keeps
PRUNED = {"pci_bus_id", "DCGM_FI_DRIVER_VERSION"}
GPUS = 4
# exporter labels less the pruned ones, plus what the scrape and the relay add
EXPECTED_LABELS = {"__name__", "gpu", "UUID", "device", "modelName", "Hostname", "job", "instance", "cluster"}


def start_victoria_metrics(tmp: Path) -> tuple[Proc, str]:
    binary = require_binary("victoria-metrics")
    port = free_port()
    d = tmp / "vm"
    d.mkdir()
    proc = Proc([binary, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={d / 'data'}",
                 "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN"], d / "log.txt")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


def start_vmagent(tmp: Path, name: str, remote_write: str, *extra: str) -> tuple[Proc, str]:
    binary = require_binary("vmagent")
    port = free_port()
    d = tmp / name
    d.mkdir()
    proc = Proc([binary, f"-httpListenAddr=127.0.0.1:{port}", f"-remoteWrite.url={remote_write}",
                 f"-remoteWrite.tmpDataPath={d / 'queue'}", "-remoteWrite.flushInterval=500ms",
                 "-loggerLevel=WARN", *extra], d / "log.txt")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


def _names(vm_url: str, selector: str) -> dict[str, int]:
    with contextlib.suppress(OSError):  # make the last second's rows searchable now, not on VM's flush tick
        urllib.request.urlopen(vm_url + "/internal/force_flush", timeout=5).close()
    res = prom_query(vm_url, f"count by (__name__) ({selector})")
    return {r["metric"]["__name__"]: int(r["value"][1]) for r in res}


def test_vmagent_to_relay_to_victoria_metrics_and_relay_to_vmagent(tmp_path: Path) -> None:
    require_binary("vmagent")
    vm, vm_url = start_victoria_metrics(tmp_path)
    with running(vm):
        receiver, receiver_url = start_vmagent(tmp_path, "vmagent-receiver", f"{vm_url}/api/v1/write",
                                               "-remoteWrite.label=via=vmagent")
        with running(receiver):
            exporter, exp_url = start_exporter(tmp_path, gpus=GPUS, interval="1s")
            with running(exporter):
                relay_cfg = f"""
server: {{listen: "127.0.0.1:@PORT@"}}
external_labels: {{cluster: e2e}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: vm
    url: {vm_url}/api/v1/write
    write_relabel_configs:
      - source_labels: [__name__]
        regex: {'|'.join(sorted(KEPT))}
        action: keep
    prune_labels: [{', '.join(sorted(PRUNED))}]
    queue: {{batch_send_deadline: 500ms, max_shards: 2}}
  - name: vmagent
    url: {receiver_url}/api/v1/write
    write_relabel_configs:
      - source_labels: [__name__]
        regex: {'|'.join(sorted(VIA_VMAGENT))}
        action: keep
    prune_labels: [{', '.join(sorted(PRUNED))}]
    queue: {{batch_send_deadline: 500ms, max_shards: 2}}
"""
                relay, relay_url = start_relay(tmp_path, relay_cfg)
                with running(relay):
                    scrape = tmp_path / "scrape.yml"
                    scrape.write_text(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: gpu
    static_configs: [{{targets: ["{exp_url.removeprefix('http://')}"]}}]
""")
                    scraper, _ = start_vmagent(tmp_path, "vmagent-scraper", f"{relay_url}/api/v1/write",
                                               f"-promscrape.config={scrape}")
                    with running(scraper):
                        direct = '{__name__=~".+", via=""}'
                        want = {k: GPUS for k in KEPT}
                        assert wait_until(lambda: _names(vm_url, direct) == want, timeout=25, interval=0.5), (
                            _names(vm_url, direct), relay.tail(), scraper.tail())
                        series = prom_series(vm_url, direct)
                        assert {s["__name__"] for s in series} == KEPT  # not up, scrape_*, other DCGM_*
                        assert len(series) == len(KEPT) * GPUS
                        for s in series:
                            assert s.keys() == EXPECTED_LABELS, s
                            assert s["cluster"] == "e2e" and s["job"] == "gpu", s
                            assert s["instance"] == exp_url.removeprefix("http://"), s
                        util = prom_query(vm_url, 'DCGM_FI_DEV_GPU_UTIL{via=""}')
                        assert len(util) == GPUS and all(0 <= float(r["value"][1]) <= 100 for r in util), util

                        # gpu-relay as the sender: its second destination is the receiving vmagent
                        via = '{via="vmagent"}'
                        want_via = {k: GPUS for k in VIA_VMAGENT}
                        assert wait_until(lambda: _names(vm_url, via) == want_via, timeout=15, interval=0.5), (
                            _names(vm_url, via), relay.tail(), receiver.tail())
                        for s in prom_series(vm_url, via):
                            assert s.keys() == EXPECTED_LABELS | {"via"}, s
