"""End to end with real processes: native histograms (RW 1.0 and 2.0, histogram-only series and
series with float samples too) sent to `gpu-relay run` are delivered to a real Prometheus remote-write
receiver with native histograms enabled (issue 8 defect 3)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import snappy

from relay.proto import remote_v1_pb2 as v1pb
from relay.proto import remote_v2_pb2 as v2pb
from tests.e2e.procs import Proc, prom_query, running, start_relay
from tests.helpers import free_port, require_binary, wait_until

pytestmark = pytest.mark.e2e

RW1 = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
       "X-Prometheus-Remote-Write-Version": "0.1.0"}
RW2 = {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
       "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "2.0.0"}


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url + "/api/v1/write", data=snappy.compress(body), headers=headers,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _v1_histogram(count: int, ts: int) -> v1pb.Histogram:
    return v1pb.Histogram(count_int=count, sum=2.5 * count, schema=0, zero_threshold=1e-128,
                          positive_spans=[v1pb.BucketSpan(offset=0, length=1)], positive_deltas=[count],
                          timestamp=ts)


def _start_receiver(tmp: Path) -> tuple[Proc, str]:
    port = free_port()
    d = tmp / "receiver"
    d.mkdir()
    (d / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
    proc = Proc([require_binary("prometheus"), f"--config.file={d / 'prometheus.yml'}",
                 f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.path={d / 'data'}",
                 "--log.level=warn", "--web.enable-remote-write-receiver",
                 "--enable-feature=native-histograms"], d / "log.txt")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/-/ready")
    return proc, url


def _count(url: str, metric: str) -> float | None:
    got = prom_query(url, f"histogram_count({metric})")
    return float(got[0]["value"][1]) if got else None


def test_native_histograms_rw1_and_rw2_reach_a_real_prometheus_through_the_relay_process(tmp_path: Path) -> None:
    receiver, recv_url = _start_receiver(tmp_path)
    with running(receiver):
        relay, url = start_relay(tmp_path, f"""
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: prom
    url: {recv_url}/api/v1/write
    queue: {{batch_send_deadline: 100ms}}
""")
        with running(relay):
            now = int(time.time() * 1000)
            v1 = v1pb.WriteRequest(timeseries=[
                v1pb.TimeSeries(labels=[v1pb.Label(name="__name__", value="h_only_v1")],
                                histograms=[_v1_histogram(7, now)]),
                v1pb.TimeSeries(labels=[v1pb.Label(name="__name__", value="h_mixed_v1")],
                                samples=[v1pb.Sample(value=3.0, timestamp=now - 2000)],
                                histograms=[_v1_histogram(5, now)]),
                v1pb.TimeSeries(labels=[v1pb.Label(name="__name__", value="f_v1")],
                                samples=[v1pb.Sample(value=1.0, timestamp=now)]),
            ])
            assert _post(url, v1.SerializeToString(), RW1) == 204
            v2 = v2pb.Request(symbols=["", "__name__", "h_only_v2"], timeseries=[
                v2pb.TimeSeries(labels_refs=[1, 2], histograms=[v2pb.Histogram(
                    count_int=9, sum=4.0, schema=0, zero_threshold=1e-128,
                    positive_spans=[v2pb.BucketSpan(offset=0, length=1)], positive_deltas=[9],
                    timestamp=now)]),
            ])
            assert _post(url, v2.SerializeToString(), RW2) == 204
            # each series goes out on its shard's own schedule: wait for all of them, not for the last one posted
            names = ("h_only_v1", "h_mixed_v1", "h_only_v2")
            assert wait_until(lambda: all(_count(recv_url, m) is not None for m in names)
                              and prom_query(recv_url, "f_v1"), timeout=30), relay.tail()
            assert _count(recv_url, "h_only_v1") == 7.0
            assert _count(recv_url, "h_mixed_v1") == 5.0
            assert _count(recv_url, "h_only_v2") == 9.0
            assert float(prom_query(recv_url, "f_v1")[0]["value"][1]) == 1.0
