"""End to end with real processes: Prometheus scrapes a simulated exporter and remote-writes to
gpu-relay, which forwards to a second real Prometheus (remote-write receiver) and to a receiver
that recomputes SigV4 with botocore; plus kill -9 durability and a dead destination."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import snappy

from relay.ingest import wire
from tests.e2e.procs import prom_query, prom_series, running, start_exporter, start_prometheus, start_relay
from tests.helpers import free_port, wait_until
from tests.rw_receiver import recording_receiver

pytestmark = pytest.mark.e2e

KEPT = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"}
PRUNED = {"pci_bus_id", "DCGM_FI_DRIVER_VERSION"}


def _post(url: str, series: list[tuple[tuple[tuple[str, str], ...], list[tuple[int, float]]]]) -> int:
    body = snappy.compress(wire.encode_write_request(series))
    req = urllib.request.Request(
        url + "/api/v1/write",
        data=body,
        headers={
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def test_prometheus_to_relay_to_prometheus_and_sigv4(tmp_path: Path) -> None:
    from tests.sigv4_receiver import SigV4Receiver

    with SigV4Receiver("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region="us-east-1",
                       service="aps") as amp:
        receiver, recv_url = start_prometheus(tmp_path, "global: {scrape_interval: 1m}\n", receiver=True,
                                              name="receiver")
        with running(receiver):
            exporter, exp_url = start_exporter(tmp_path, gpus=8, interval="1s")
            with running(exporter):
                relay_cfg = f"""
server: {{listen: "127.0.0.1:@PORT@"}}
external_labels: {{cluster: e2e}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: home
    url: {recv_url}/api/v1/write
    write_relabel_configs:
      - source_labels: [__name__]
        regex: {'|'.join(sorted(KEPT))}
        action: keep
    prune_labels: [pci_bus_id, DCGM_FI_DRIVER_VERSION]
    queue: {{batch_send_deadline: 500ms, max_shards: 2}}
  - name: amp
    url: {amp.url}
    sigv4: {{region: us-east-1}}
    write_relabel_configs:
      - source_labels: [__name__]
        regex: DCGM_FI_DEV_GPU_UTIL
        action: keep
    queue: {{batch_send_deadline: 500ms, max_shards: 2}}
"""
                env = {
                    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
                    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                    "AWS_CONFIG_FILE": str(tmp_path / "none"),
                    "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                    "AWS_EC2_METADATA_DISABLED": "true",
                }
                relay, relay_url = start_relay(tmp_path, relay_cfg, env=env)
                with running(relay):
                    sender, _ = start_prometheus(
                        tmp_path,
                        f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: gpu
    static_configs: [{{targets: ["{exp_url.removeprefix('http://')}"]}}]
remote_write:
  - url: {relay_url}/api/v1/write
    queue_config: {{batch_send_deadline: 500ms}}
""",
                        name="sender",
                    )
                    with running(sender):

                        def all_there() -> bool:
                            res = prom_query(recv_url, 'count by (__name__) ({__name__=~".+"})')
                            got = {r["metric"]["__name__"]: int(r["value"][1]) for r in res}
                            return got == {k: 8 for k in KEPT}

                        assert wait_until(all_there, timeout=45, interval=1), (
                            prom_query(recv_url, 'count by (__name__) ({__name__=~".+"})'), relay.tail())
                        series = prom_series(recv_url, '{__name__=~".+"}')
                        assert {s["__name__"] for s in series} == KEPT
                        for s in series:
                            assert not PRUNED & s.keys(), s
                            assert s["cluster"] == "e2e"
                            assert s["job"] == "gpu"
                            assert {"gpu", "UUID", "device", "modelName", "Hostname"} <= s.keys()

                        assert wait_until(lambda: len(amp.series()) >= 8, timeout=30), relay.tail()
                        names = {dict(s)["__name__"] for s in amp.series()}
                        assert names == {"DCGM_FI_DEV_GPU_UTIL"}
                        assert amp.rejected == 0
                        assert amp.accepted > 0


def test_kill9_under_load_loses_no_acknowledged_sample(tmp_path: Path) -> None:
    with recording_receiver() as rx:
        port = free_port()
        cfg = f"""
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: sink
    url: {rx.url}
    queue: {{batch_send_deadline: 200ms, max_shards: 4, max_samples_per_send: 500}}
"""
        relay, url = start_relay(tmp_path, cfg, port=port)
        acked: set[tuple[tuple[tuple[str, str], ...], int, float]] = set()
        stop = threading.Event()
        sent = [0]

        def load() -> None:
            ts = int(time.time() * 1000) - 60_000  # recent: max_sample_age counts from the sample's time
            while not stop.is_set():
                ts += 1000
                batch = [
                    ((("__name__", "load_metric"), ("i", str(i))), [(ts, float(i))]) for i in range(200)
                ]
                if _post(url, batch) == 204:
                    for labels, samples in batch:
                        for t, v in samples:
                            acked.add((labels, t, v))
                sent[0] += 1

        t = threading.Thread(target=load, daemon=True)
        t.start()
        try:
            assert wait_until(lambda: len(acked) >= 4000, timeout=30)
            relay.kill9()
            time.sleep(0.3)
            relay2, _ = start_relay(tmp_path, cfg, port=port)
            with running(relay2):
                assert wait_until(lambda: len(acked) >= 12000, timeout=30)
                stop.set()
                t.join(10)
                assert wait_until(lambda: acked <= rx.snapshot(), timeout=60), (
                    f"{len(acked - rx.snapshot())} acknowledged samples missing; relay log:\n{relay2.tail()}")
        finally:
            stop.set()
            relay.stop()


def test_dead_destination_does_not_stall_the_other(tmp_path: Path) -> None:
    dead_port = free_port()
    with recording_receiver() as rx:
        cfg = f"""
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: dead
    url: http://127.0.0.1:{dead_port}/api/v1/write
    queue: {{batch_send_deadline: 100ms, min_backoff: 50ms, max_backoff: 200ms}}
  - name: alive
    url: {rx.url}
    queue: {{batch_send_deadline: 100ms}}
"""
        relay, url = start_relay(tmp_path, cfg)
        with running(relay):
            base = int(time.time() * 1000)  # recent: max_sample_age counts from the sample's time
            for k in range(20):
                series = [((("__name__", "m"), ("k", str(k))), [(base + k, 1.0)])]
                assert _post(url, series) == 204
            assert wait_until(lambda: len(rx.snapshot()) == 20, timeout=10), relay.tail()

            def dead_queued() -> bool:
                with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                    text = r.read().decode()
                for line in text.splitlines():
                    if line.startswith('gpu_relay_queue_samples{destination="dead"}'):
                        return float(line.split()[-1]) == 20
                return False

            assert wait_until(dead_queued, timeout=10)
