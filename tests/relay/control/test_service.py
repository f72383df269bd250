"""The integrated relay over HTTP: relay.service.Runtime behind relay.server.RelayHTTPServer on an
ephemeral 127.0.0.1 port, real snappy remote-write requests, a recording receiver downstream; plus
one `gpu-relay run` subprocess reloaded with SIGHUP."""

from __future__ import annotations

import ctypes
import ctypes.util
import http.client
import json
import os
import re
import signal
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import snappy

from relay.common.labels import Labels
from relay.config.config import load_config
from relay.control.report import fetch_and_render
from relay.control.service import Runtime
from relay.ingest import wire
from relay.ingest.server import RelayHTTPServer
from relay.proto import remote_v1_pb2, remote_v2_pb2
from relay.state.cost import SECONDS_PER_MONTH
from tests.e2e.procs import running, start_relay
from tests.helpers import free_port, wait_until
from tests.rw_receiver import RecordingServer

STALE_BITS = 0x7FF0000000000002
STALE_NAN = struct.unpack("<d", struct.pack("<Q", STALE_BITS))[0]
RW1 = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
       "X-Prometheus-Remote-Write-Version": "0.1.0"}
RW1_LOWER = {k.lower(): v for k, v in RW1.items()}
RW2 = {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
       "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "2.0.0"}
MAX_REQUEST = 4096
POLL = 0.02
QUEUE = "{batch_send_deadline: 20ms, max_shards: 2, min_backoff: 10ms, max_backoff: 50ms}"
Series = tuple[Labels, list[tuple[int, float]]]


def S(name: str, **labels: str) -> Labels:
    return tuple(sorted({"__name__": name, **labels}.items()))


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Relay:
    runtime: Runtime
    server: RelayHTTPServer
    config_path: Path
    thread: threading.Thread

    @property
    def url(self) -> str:
        return self.server.url

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        host, port = self.server.server_address[0], self.server.server_address[1]
        conn = http.client.HTTPConnection(str(host), int(port), timeout=10)
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post_raw(self, raw: bytes, headers: Mapping[str, str] = RW1) -> tuple[int, dict[str, str], bytes]:
        return self.request("POST", "/api/v1/write", snappy.compress(raw), headers)

    def post(self, series: list[Series], metadata: bytes = b"") -> int:
        return self.post_raw(wire.encode_write_request(series, metadata))[0]

    def metric(self, name: str, **labels: str) -> float:
        v = self.runtime.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v

    def get_json(self, path: str) -> tuple[int, Any]:
        status, headers, body = self.request("GET", path)
        assert headers["content-type"] == "application/json"
        return status, json.loads(body)


class StartRelay(Protocol):
    def __call__(self, destinations: str, head: str = "") -> Relay: ...


@pytest.fixture
def start(tmp_path: Path) -> Iterator[StartRelay]:
    started: list[Relay] = []

    def go(destinations: str, head: str = "") -> Relay:
        path = tmp_path / "relay.yaml"
        path.write_text(config_text(tmp_path, destinations, head))
        runtime = Runtime(str(path), load_config(path))
        try:
            # the lifecycle API (POST /-/reload) on, as `run --web.enable-lifecycle` does
            server = RelayHTTPServer(("127.0.0.1", 0), runtime, enable_lifecycle=True)
        except BaseException:
            runtime.stop()
            raise
        runtime.start()
        # serve_forever's default 0.5 s poll makes every shutdown() wait that long: poll faster
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL}, daemon=True)
        thread.start()
        relay = Relay(runtime, server, path, thread)
        started.append(relay)
        return relay

    yield go
    for r in started:
        r.server.shutdown()
        r.server.server_close()
        r.thread.join(5)
        r.runtime.stop()


@contextmanager
def receiver() -> Iterator[RecordingServer]:
    """tests.rw_receiver's recording server, polled fast so that shutting it down is quick."""
    srv = RecordingServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": POLL}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


@pytest.fixture
def rx() -> Iterator[RecordingServer]:
    with receiver() as srv:
        yield srv


def config_text(tmp_path: Path, destinations: str, head: str = "") -> str:
    return (f"server: {{listen: '127.0.0.1:9201', max_request_bytes: {MAX_REQUEST}}}\n"
            f"storage: {{path: {tmp_path / 'queues'}}}\n{head}destinations:\n{destinations}")


def simple_dest(url: str, extra: str = "") -> str:
    return f"  - name: rx\n    url: {url}\n    queue: {QUEUE}\n{extra}"


def received(rx: RecordingServer, n: int, timeout: float = 10.0) -> set[tuple[Labels, int, float]]:
    """The receiver's samples once it holds at least ``n`` (or the timeout)."""
    wait_until(lambda: len(rx.snapshot()) >= n, timeout=timeout, interval=0.02)
    return {(tuple(lb), ts, v) for lb, ts, v in rx.snapshot()}


# ---- the write endpoint -------------------------------------------------------------------------


def test_rw1_is_204_and_reaches_the_receiver(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    t = now_ms()
    status, headers, body = relay.post_raw(wire.encode_write_request([(S("up", job="a"), [(t, 1.0)])]))
    assert (status, body) == (204, b"")
    assert "x-prometheus-remote-write-samples-written" not in headers
    assert received(rx, 1) == {(S("up", job="a"), t, 1.0)}
    assert rx.requests[0]["Content-Encoding"] == "snappy"
    assert rx.requests[0]["X-Prometheus-Remote-Write-Version"] == "0.1.0"
    assert relay.metric("gpu_relay_requests_received_total", code="204") == 1
    assert relay.metric("gpu_relay_samples_received_total") == 1
    assert wait_until(lambda: relay.metric("gpu_relay_samples_sent_total", destination="rx") == 1)


def _v2_request(t: int) -> bytes:
    symbols = ["", "__name__", "gpu_util", "gpu", "0", "1", "trace_id", "abc", "rpc_latency"]
    req = remote_v2_pb2.Request(symbols=symbols)
    ts = req.timeseries.add(labels_refs=[1, 2, 3, 4])
    ts.samples.add(value=10.0, timestamp=t)
    ts.samples.add(value=11.0, timestamp=t + 1000)
    ts.exemplars.add(labels_refs=[6, 7], value=10.0, timestamp=t)
    ts.metadata.type = remote_v2_pb2.Metadata.METRIC_TYPE_GAUGE
    ts2 = req.timeseries.add(labels_refs=[1, 2, 3, 5])
    ts2.samples.add(value=20.0, timestamp=t)
    h = req.timeseries.add(labels_refs=[1, 8])
    hist = h.histograms.add(count_int=3, sum=1.5, schema=0, zero_threshold=1e-128, timestamp=t)
    hist.positive_spans.add(offset=0, length=1)
    hist.positive_deltas.append(3)
    return bytes(req.SerializeToString())


def test_rw2_is_204_with_written_headers(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    t = now_ms()
    status, headers, body = relay.post_raw(_v2_request(t), RW2)
    assert (status, body) == (204, b"")
    assert headers["x-prometheus-remote-write-samples-written"] == "3"
    assert headers["x-prometheus-remote-write-histograms-written"] == "1"
    assert headers["x-prometheus-remote-write-exemplars-written"] == "1"
    assert received(rx, 3) == {
        (S("gpu_util", gpu="0"), t, 10.0),
        (S("gpu_util", gpu="0"), t + 1000, 11.0),
        (S("gpu_util", gpu="1"), t, 20.0),
    }
    assert relay.metric("gpu_relay_samples_received_total") == 3


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({"Content-Type": "text/plain", "Content-Encoding": "snappy"}, b"unsupported content type"),
        ({"Content-Type": "application/json"}, b"unsupported content type"),
        ({"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v3.Request"},
         b"unsupported remote-write message"),
        ({"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}, b"Content-Encoding"),
        ({"Content-Type": "application/x-protobuf", "Content-Encoding": "br"}, b"Content-Encoding"),
    ],
)
def test_415(start: StartRelay, rx: RecordingServer, headers: dict[str, str], needle: bytes) -> None:
    relay = start(simple_dest(rx.url))
    status, _, body = relay.post_raw(wire.encode_write_request([(S("up"), [(now_ms(), 1.0)])]), headers)
    assert status == 415
    assert needle in body
    assert body.endswith(b"\n") and body.count(b"\n") == 1
    assert relay.metric("gpu_relay_requests_received_total", code="415") == 1
    assert relay.metric("gpu_relay_samples_received_total") == 0


def test_413_when_the_snappy_header_is_over_the_limit(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    raw = wire.encode_write_request([(S("big", pad="x" * (MAX_REQUEST + 100)), [(now_ms(), 1.0)])])
    assert len(raw) > MAX_REQUEST
    body = snappy.compress(raw)
    assert len(body) < MAX_REQUEST  # the compressed body itself is small: only the header tells
    assert wire.snappy_uncompressed_length(body) == len(raw)
    status, _, reply = relay.request("POST", "/api/v1/write", body, RW1)
    assert status == 413
    assert reply == f"decompressed body of {len(raw)} bytes exceeds the limit of {MAX_REQUEST} bytes\n".encode()
    # exactly at the limit is fine
    pad = MAX_REQUEST - len(wire.encode_write_request([(S("big", pad=""), [(1, 1.0)])]))
    at_limit = wire.encode_write_request([(S("big", pad="y" * pad), [(now_ms(), 1.0)])])
    # adjust for the varint length growing past 127/16383 bytes
    at_limit = wire.encode_write_request(
        [(S("big", pad="y" * (pad - (len(at_limit) - MAX_REQUEST))), [(now_ms(), 1.0)])])
    assert len(at_limit) == MAX_REQUEST
    assert relay.post_raw(at_limit)[0] == 204


def test_413_on_content_length_before_reading_the_body(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    host, port = relay.server.server_address[0], relay.server.server_address[1]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=10)
    try:
        conn.putrequest("POST", "/api/v1/write")
        for k, v in RW1.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(10 * MAX_REQUEST))
        conn.endheaders()  # no body sent: the relay must answer from the header alone
        resp = conn.getresponse()
        assert resp.status == 413
        limit = MAX_REQUEST + MAX_REQUEST // 5 + 64
        assert resp.read() == f"request body of {10 * MAX_REQUEST} bytes is over the limit of {limit}\n".encode()
    finally:
        conn.close()
    assert relay.post([(S("up"), [(now_ms(), 1.0)])]) == 204


def _label(name: bytes, value: bytes) -> bytes:
    return wire.encode_label_pair(name, value)


def _series_bytes(label_entries: bytes, t: int) -> bytes:
    return wire.wrap_series(label_entries, wire.encode_sample(t, 1.0))


BAD_RAW: dict[str, tuple[Callable[[int], bytes], bytes]] = {
    "corrupt snappy": (lambda t: b"", b""),  # replaced below: the body itself is not snappy
    "corrupt protobuf": (lambda t: b"\x0a\x50\x0a\x02", b"malformed protobuf"),
    "invalid utf-8 value": (
        lambda t: _series_bytes(_label(b"__name__", b"m") + _label(b"gpu", b"\xff\xfe"), t),
        b"invalid UTF-8 in the value of label 'gpu'"),
    "invalid utf-8 name": (
        lambda t: _series_bytes(_label(b"__name__", b"m") + _label(b"g\xc3", b"0"), t),
        b"invalid UTF-8 in a label name"),
    "empty label name": (
        lambda t: _series_bytes(_label(b"__name__", b"m") + _label(b"", b"0"), t), b"empty label name"),
    "duplicate label names": (
        lambda t: _series_bytes(_label(b"__name__", b"m") + _label(b"gpu", b"0") + _label(b"gpu", b"1"), t),
        b"duplicate label name 'gpu'"),
}


@pytest.mark.parametrize("case", sorted(BAD_RAW))
def test_400_one_line_and_the_next_request_is_fine(start: StartRelay, rx: RecordingServer, case: str) -> None:
    relay = start(simple_dest(rx.url))
    t = now_ms()
    make, needle = BAD_RAW[case]
    # a good series first in the same request: the whole request is refused, none of it is sent
    good_first = wire.encode_write_request([(S("good", n="0"), [(t, 5.0)])])
    if case == "corrupt snappy":
        body = b"\x20" + b"\xff" * 40  # announces 32 bytes, then garbage
        needle = b"corrupt snappy body"
    else:
        body = snappy.compress(good_first + make(t))
    status, _, reply = relay.request("POST", "/api/v1/write", body, RW1)
    assert status == 400, reply
    assert needle in reply
    assert reply.endswith(b"\n") and reply.count(b"\n") == 1
    assert relay.metric("gpu_relay_requests_received_total", code="400") == 1
    # right after: a good request goes through, and only it reaches the receiver
    assert relay.post([(S("good", n="0"), [(t + 1000, 6.0)])]) == 204
    assert received(rx, 1) == {(S("good", n="0"), t + 1000, 6.0)}
    time.sleep(0.1)  # nothing of the refused request trails behind
    assert received(rx, 1) == {(S("good", n="0"), t + 1000, 6.0)}
    assert relay.metric("gpu_relay_samples_received_total") == 1


# ---- rules end to end ---------------------------------------------------------------------------


def test_rules_reach_the_receiver_exactly(start: StartRelay, rx: RecordingServer) -> None:
    with receiver() as rx2:
        relay = start(
            simple_dest(rx.url, """\
    write_relabel_configs:
      - source_labels: [__name__]
        regex: DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED
        action: keep
      - source_labels: [gpu]
        target_label: device
        replacement: nvidia$1
    prune_labels: [pci_bus_id, DCGM_FI_DRIVER_VERSION]
""") + f"  - name: everything\n    url: {rx2.url}\n    queue: {QUEUE}\n",
            head="""\
external_labels: {cluster: gpu-prod, region: eu-west-1}
global:
  relabel_configs:
    - source_labels: [namespace]
      regex: kube-system
      action: drop
    - regex: Hostname
      action: labeldrop
""")
        t = now_ms()
        common = {"pci_bus_id": "00000000:18:00.0", "DCGM_FI_DRIVER_VERSION": "550.54", "Hostname": "n1"}
        series = [
            (S("DCGM_FI_DEV_GPU_UTIL", gpu="0", cluster="mine", **common), [(t, 87.0), (t + 15_000, 88.0)]),
            (S("DCGM_FI_DEV_FB_USED", gpu="1", **common), [(t, 1024.0)]),
            (S("DCGM_FI_DEV_POWER_USAGE", gpu="0", **common), [(t, 300.0)]),
            (S("DCGM_FI_DEV_GPU_UTIL", gpu="2", namespace="kube-system", **common), [(t, 1.0)]),
        ]
        assert relay.post(series) == 204
        ext = {"region": "eu-west-1"}
        assert received(rx, 3) == {
            (S("DCGM_FI_DEV_GPU_UTIL", gpu="0", device="nvidia0", cluster="mine", **ext), t, 87.0),
            (S("DCGM_FI_DEV_GPU_UTIL", gpu="0", device="nvidia0", cluster="mine", **ext), t + 15_000, 88.0),
            (S("DCGM_FI_DEV_FB_USED", gpu="1", device="nvidia1", cluster="gpu-prod", **ext), t, 1024.0),
        }
        keep = {"pci_bus_id": "00000000:18:00.0", "DCGM_FI_DRIVER_VERSION": "550.54", "region": "eu-west-1"}
        assert received(rx2, 4) == {
            (S("DCGM_FI_DEV_GPU_UTIL", gpu="0", cluster="mine", **keep), t, 87.0),
            (S("DCGM_FI_DEV_GPU_UTIL", gpu="0", cluster="mine", **keep), t + 15_000, 88.0),
            (S("DCGM_FI_DEV_FB_USED", gpu="1", cluster="gpu-prod", **keep), t, 1024.0),
            (S("DCGM_FI_DEV_POWER_USAGE", gpu="0", cluster="gpu-prod", **keep), t, 300.0),
        }
        # labels arrive sorted on the wire, as Prometheus requires
        for lb, _, _ in rx.snapshot() | rx2.snapshot():
            assert list(lb) == sorted(lb)
        assert relay.metric("gpu_relay_samples_dropped_total", destination="rx", reason="rules") == 2
        assert relay.metric("gpu_relay_samples_dropped_total", destination="everything", reason="rules") == 1


def test_stale_marker_arrives_byte_exact(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    t = now_ms()
    assert relay.post([(S("up", job="a"), [(t, 1.0), (t + 1000, STALE_NAN)])]) == 204
    got = received(rx, 2)
    values = {ts: v for _, ts, v in got}
    assert values[t] == 1.0
    assert struct.unpack("<Q", struct.pack("<d", values[t + 1000]))[0] == STALE_BITS


def test_metadata_only_request_is_accepted(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    # metadata goes only where its family's series go (issue 8, defect 2): send a gpu_util sample first
    assert relay.post([(S("gpu_util", gpu="0"), [(now_ms(), 1.0)])]) == 204
    received(rx, 1)
    with rx.lock:
        rx.requests.clear()
    req = remote_v1_pb2.WriteRequest()
    md = req.metadata.add()
    md.metric_family_name = "gpu_util"
    md.type = remote_v1_pb2.MetricMetadata.GAUGE
    md.help = "GPU utilization"
    status, _, body = relay.post_raw(req.SerializeToString())
    assert (status, body) == (204, b"")
    assert wait_until(lambda: len(rx.requests) == 1)
    assert len(rx.snapshot()) == 1  # the metadata request carried no samples
    assert relay.metric("gpu_relay_samples_received_total") == 1


def test_collision_through_http(start: StartRelay, rx: RecordingServer, caplog: pytest.LogCaptureFixture) -> None:
    relay = start(simple_dest(rx.url, "    prune_labels: [pod]\n"))
    t = now_ms()
    assert relay.post([(S("gpu_util", gpu="0", pod="a"), [(t, 1.0)]),
                       (S("gpu_util", gpu="0", pod="b"), [(t, 2.0)])]) == 204
    assert received(rx, 1) == {(S("gpu_util", gpu="0"), t, 1.0)}
    assert relay.metric("gpu_relay_samples_dropped_total", destination="rx", reason="collision") == 1
    msgs = [r.getMessage() for r in caplog.records if r.name == "relay.limits"]
    assert len(msgs) == 1 and "destination rx" in msgs[0] and "aggregate rule" in msgs[0]


# ---- dry run and the cardinality endpoint -------------------------------------------------------


AMP_URL = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"
DRY = f"""\
  - name: dry
    url: {AMP_URL}
    dry_run: true
    write_relabel_configs: [{{source_labels: [__name__], regex: "a_.*", action: keep}}]
  - name: other
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
"""


def test_dry_run_sends_nothing_and_reports(start: StartRelay, tmp_path: Path) -> None:
    began = time.monotonic()
    relay = start(DRY)
    t = now_ms()
    assert relay.post([
        (S("a_x", gpu="0"), [(t, 1.0), (t + 1, 1.0)]),
        (S("a_x", gpu="1"), [(t, 1.0), (t + 1, 1.0)]),
        (S("b_y", gpu="0"), [(t, 1.0), (t + 1, 1.0)]),
    ]) == 204
    elapsed = time.monotonic() - began
    assert not list((tmp_path / "queues").glob("*.queue.db*"))
    status, snap = relay.get_json("/api/v1/cardinality?destination=dry")
    assert status == 200
    assert snap["destination"] == "dry" and snap["dry_run"] is True
    assert snap["all_destinations"] == ["dry", "other"]
    assert snap["active_series"] == {"in": 3, "out": 2}
    assert snap["top_metrics"] == {
        "in": [{"metric": "a_x", "series": 2}, {"metric": "b_y", "series": 1}],
        "out": [{"metric": "a_x", "series": 2}],
    }
    assert snap["top_labels"]["in"] == [{"label": "gpu", "distinct_values": 2}]
    assert snap["top_labels"]["out"] == [{"label": "gpu", "distinct_values": 2}]
    assert snap["dropped"] == {"rules": {"series": 0, "samples": 2}}
    rate_in, rate_out = snap["samples_per_second"]["in"], snap["samples_per_second"]["out"]
    assert 6 / max(1.0, elapsed + 1) <= rate_in <= 6.0
    assert rate_out == pytest.approx(rate_in * 4 / 6)
    cost = snap["estimated_cost"]
    assert cost["active_series"] == 2
    assert cost["samples_per_second"] == rate_out
    assert cost["samples_per_month"] == pytest.approx(rate_out * SECONDS_PER_MONTH)
    assert cost["total_usd"] > 0
    assert snap["estimated_cost_without_rules"]["active_series"] == 3
    # the first destination is the default; limit trims the lists
    status, default = relay.get_json("/api/v1/cardinality?limit=1")
    assert status == 200 and default["destination"] == "dry"
    assert default["top_metrics"]["in"] == [{"metric": "a_x", "series": 2}]
    status, other = relay.get_json("/api/v1/cardinality?destination=other")
    assert status == 200 and other["active_series"] == {"in": 3, "out": 3}
    # the AMP bill only for AMP destinations (issue 10): "other" is not an AMP workspace
    assert other["estimated_cost"] is None and other["amp_region"] is None
    assert snap["amp_region"] == "us-east-1"
    assert "us-east-1 list prices" in cost["price_table"]["region_note"]
    assert "HA duplicates" in cost["leaves_out"]
    assert relay.metric("gpu_relay_samples_kept_total", destination="dry") == 4
    assert relay.metric("gpu_relay_active_series", destination="dry", direction="out") == 2


def test_cardinality_errors(start: StartRelay) -> None:
    relay = start(DRY)
    status, body = relay.get_json("/api/v1/cardinality?destination=nope")
    assert status == 404
    assert body == {"status": "error", "error": "unknown destination 'nope'", "destinations": ["dry", "other"]}
    status, body = relay.get_json("/api/v1/cardinality?destination=dry&limit=ten")
    assert status == 400
    assert body == {"status": "error", "error": "limit must be an integer"}


def test_report_renders_a_running_runtime(start: StartRelay) -> None:
    relay = start(DRY)
    t = now_ms()
    assert relay.post([(S("a_x", gpu="0"), [(t, 1.0)]), (S("b_y", gpu="0"), [(t, 1.0)])]) == 204
    text = fetch_and_render(relay.url, "dry", 5)
    assert text.startswith("== destination dry ==\n")
    assert re.search(r"^  state +dry run$", text, re.M), text
    assert re.search(r"^  dry_run +true$", text, re.M), text
    assert re.search(r"^  active series +in 2, out 1$", text, re.M), text
    assert re.search(r"^top metrics by series, in\n.*\n  a_x +1\n  b_y +1$", text, re.M), text
    assert re.search(r"^  rules +- +1$", text, re.M), text  # rule drops are counted in samples only
    assert "estimated AMP bill per month" in text
    # no destination named: every destination, one block each; the AMP bill only for the AMP one
    text = fetch_and_render(relay.url, None, 5)
    assert [ln for ln in text.splitlines() if ln.startswith("== ")] == [
        "== destination dry ==", "== destination other =="]
    other = text[text.index("== destination other =="):]
    assert "estimated AMP bill" not in other and "no AMP bill" in other


def test_report_cli_names_an_unknown_destination_in_the_relays_words(
        start: StartRelay, capsys: pytest.CaptureFixture[str]) -> None:
    from relay.control.cli import main

    relay = start(DRY)
    assert main(["report", "--url", relay.url, "--destination", "nope"]) == 1
    err = capsys.readouterr().err
    assert err == "gpu-relay report: unknown destination 'nope' (destinations: dry, other)\n"


# ---- health, metrics ----------------------------------------------------------------------------

RELAY_METRICS = (
    "gpu_relay_samples_received_total", "gpu_relay_requests_received_total", "gpu_relay_config_reloads_total",
    "gpu_relay_samples_kept_total", "gpu_relay_samples_dropped_total", "gpu_relay_queue_samples",
    "gpu_relay_queue_bytes", "gpu_relay_oldest_queued_sample_age_seconds", "gpu_relay_samples_sent_total",
    "gpu_relay_samples_failed_total", "gpu_relay_samples_retried_total", "gpu_relay_send_duration_seconds",
    "gpu_relay_series_limit_dropped_total", "gpu_relay_series_dropped_total", "gpu_relay_active_series",
)


def test_health_ready_index_and_404(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    assert relay.request("GET", "/-/healthy")[::2] == (200, b"gpu-relay is Healthy.\n")
    assert relay.request("GET", "/-/ready")[::2] == (200, b"gpu-relay is Ready.\n")
    status, _, body = relay.request("GET", "/")
    assert status == 200 and b"/api/v1/write" in body
    assert f"on <code>{relay.runtime.config.server.listen}</code>".encode() in body  # the write address
    assert relay.request("GET", "/nope")[0] == 404
    assert relay.request("POST", "/nope", b"")[0] == 404


def test_metrics_exposes_relay_names(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    t = now_ms()
    assert relay.post([(S("up"), [(t, 1.0)])]) == 204
    assert wait_until(lambda: relay.metric("gpu_relay_samples_sent_total", destination="rx") == 1)
    queue = relay.runtime.destinations["rx"].queue
    assert queue is not None
    assert wait_until(lambda: queue.depth() == (0, 0))  # acked just after being counted as sent
    status, headers, body = relay.request("GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    text = body.decode()
    names = set(re.findall(r"^(gpu_relay_[a-z_]+?)(?:_bucket|_count|_sum|_created)?(?:\{| )", text, re.M))
    for name in RELAY_METRICS:
        assert f"# HELP {name} " in text, name
    assert {"gpu_relay_samples_received_total", "gpu_relay_samples_sent_total", "gpu_relay_queue_samples",
            "gpu_relay_active_series"} <= names
    assert "gpu_relay_samples_received_total 1.0" in text
    assert 'gpu_relay_requests_received_total{code="204"} 1.0' in text
    assert 'gpu_relay_active_series{destination="rx",direction="out"} 1.0' in text
    assert 'gpu_relay_queue_samples{destination="rx"} 0.0' in text
    status, headers, body = relay.request("GET", "/metrics", headers={"Accept": "application/openmetrics-text"})
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


# ---- queue overflow -----------------------------------------------------------------------------


def test_queue_full_still_answers_204(start: StartRelay) -> None:
    dead = f"http://127.0.0.1:{free_port()}/api/v1/write"
    relay = start(f"""\
  - name: dead
    url: {dead}
    queue: {{max_disk: 2KiB, max_shards: 1, batch_send_deadline: 10ms, min_backoff: 10ms, max_backoff: 20ms}}
""")
    t = now_ms()
    for i in range(15):
        batch = [(S("m", gpu=str(g), pad="x" * 40), [(t + i, float(i))]) for g in range(4)]
        assert relay.post(batch) == 204
    dropped = relay.metric("gpu_relay_samples_dropped_total", destination="dead", reason="queue_full")
    assert dropped > 0
    assert relay.metric("gpu_relay_samples_sent_total", destination="dead") == 0
    samples, _ = relay.runtime.destinations["dead"].queue.depth()  # type: ignore[union-attr]
    assert samples + dropped == 60
    before = dropped
    assert relay.post([(S("m", gpu=str(g), pad="x" * 40), [(t + 99, 1.0)]) for g in range(4)]) == 204
    assert relay.metric("gpu_relay_samples_dropped_total", destination="dead", reason="queue_full") > before
    _, _, body = relay.request("GET", "/metrics")
    assert re.search(rb'gpu_relay_samples_dropped_total\{destination="dead",reason="queue_full"\} [1-9]', body)


# ---- reload -------------------------------------------------------------------------------------


def test_reload_applies_a_good_config_and_refuses_a_broken_one(start: StartRelay, rx: RecordingServer,
                                                             tmp_path: Path) -> None:
    relay = start(simple_dest(rx.url))
    t = now_ms()
    assert relay.post([(S("m", step="1"), [(t, 1.0)])]) == 204
    assert received(rx, 1) == {(S("m", step="1"), t, 1.0)}

    # a valid new config: a rule that adds a label
    relabel = """\
    write_relabel_configs:
      - target_label: generation
        replacement: "2"
"""
    relay.config_path.write_text(config_text(tmp_path, simple_dest(rx.url, relabel)))
    status, _, body = relay.request("POST", "/-/reload", b"")
    assert (status, body) == (200, b"configuration reloaded\n")
    assert relay.metric("gpu_relay_config_reloads_total", result="success") == 1
    assert relay.post([(S("m", step="2"), [(t + 1, 2.0)])]) == 204
    assert (S("m", step="2", generation="2"), t + 1, 2.0) in received(rx, 2)

    # a broken file: 400 with file:line, the running config stays
    broken = config_text(tmp_path, simple_dest(rx.url, relabel)).replace(
        "max_backoff: 50ms", "max_backoff: 5q")
    relay.config_path.write_text(broken)
    line = next(i for i, text in enumerate(broken.splitlines(), 1) if "5q" in text)
    status, _, body = relay.request("POST", "/-/reload", b"")
    assert status == 400
    assert body.decode().startswith("reload refused, keeping the running configuration:\n")
    assert f'{relay.config_path}:{line}: destinations[0].queue.max_backoff: invalid duration "5q"' in body.decode()
    assert relay.metric("gpu_relay_config_reloads_total", result="failure") == 1
    assert relay.metric("gpu_relay_config_reloads_total", result="success") == 1
    assert relay.post([(S("m", step="3"), [(t + 2, 3.0)])]) == 204
    assert (S("m", step="3", generation="2"), t + 2, 3.0) in received(rx, 3)
    assert len(received(rx, 3)) == 3

    # a file that cannot be read at all is refused the same way
    relay.config_path.unlink()
    status, _, body = relay.request("POST", "/-/reload", b"")
    assert status == 400 and b"cannot read the config" in body
    assert relay.metric("gpu_relay_config_reloads_total", result="failure") == 2
    assert relay.post([(S("m", step="4"), [(t + 3, 4.0)])]) == 204
    assert (S("m", step="4", generation="2"), t + 3, 4.0) in received(rx, 4)


def test_reload_keeps_queued_data_and_swaps_destinations(start: StartRelay, rx: RecordingServer,
                                                         tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/api/v1/write"
    relay = start(f"  - name: d\n    url: {dead}\n    queue: {QUEUE}\n")
    t = now_ms()
    assert relay.post([(S("m", i="0"), [(t, 1.0)])]) == 204
    # the destination now points at a live receiver: its queue file is reopened, nothing lost
    relay.config_path.write_text(config_text(tmp_path, f"  - name: d\n    url: {rx.url}\n    queue: {QUEUE}\n"))
    assert relay.request("POST", "/-/reload", b"")[0] == 200
    assert relay.post([(S("m", i="1"), [(t, 2.0)])]) == 204
    assert received(rx, 2) == {(S("m", i="0"), t, 1.0), (S("m", i="1"), t, 2.0)}


# ---- `gpu-relay run` and SIGHUP -----------------------------------------------------------------


def _http_metric(url: str, line_prefix: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(line_prefix + " "):
                return float(line.split()[-1])
    return 0.0


def _http_post(url: str, series: list[Series]) -> int:
    req = urllib.request.Request(url + "/api/v1/write", data=snappy.compress(wire.encode_write_request(series)),
                                 headers=RW1, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _out_metrics(url: str) -> set[str]:
    with urllib.request.urlopen(url + "/api/v1/cardinality?destination=dry&limit=100", timeout=5) as r:
        snap = json.load(r)
    return {m["metric"] for m in snap["top_metrics"]["out"]}


def _signal_other_thread(pid: int, sig: int) -> None:
    """Deliver ``sig`` to a thread of ``pid`` other than its main thread, as the kernel may do with a
    process-directed signal (tgkill(2) through glibc; else a plain kill)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    if not hasattr(libc, "tgkill") or not tids:
        os.kill(pid, sig)
        return
    assert libc.tgkill(pid, tids[-1], sig) == 0, ctypes.get_errno()


def test_sighup_reloads_a_running_process(tmp_path: Path) -> None:
    def cfg(regex: str, backoff: str = "50ms") -> str:
        return f"""\
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: dry
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    write_relabel_configs: [{{source_labels: [__name__], regex: "{regex}", action: keep}}]
    queue: {{max_backoff: {backoff}}}
"""

    proc, url = start_relay(tmp_path, cfg("a_.*"))
    port = url.rsplit(":", 1)[1]
    path = tmp_path / "relay.yaml"
    success = 'gpu_relay_config_reloads_total{result="success"}'
    failure = 'gpu_relay_config_reloads_total{result="failure"}'
    with running(proc):
        t = now_ms()
        assert _http_post(url, [(S("a_1"), [(t, 1.0)]), (S("b_1"), [(t, 1.0)])]) == 204
        assert _out_metrics(url) == {"a_1"}

        path.write_text(cfg("b_.*").replace("@PORT@", port))
        proc.p.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _http_metric(url, success) == 1.0, timeout=10), proc.tail()
        assert _http_post(url, [(S("a_2"), [(t, 1.0)]), (S("b_2"), [(t, 1.0)])]) == 204
        assert _out_metrics(url) == {"a_1", "b_2"}

        path.write_text(cfg("c_.*", backoff="5q").replace("@PORT@", port))
        _signal_other_thread(proc.p.pid, signal.SIGHUP)  # handled even when not the main thread's
        assert wait_until(lambda: _http_metric(url, failure) == 1.0, timeout=10), proc.tail()
        assert _http_metric(url, success) == 1.0
        assert _http_post(url, [(S("b_3"), [(t, 1.0)]), (S("c_3"), [(t, 1.0)])]) == 204
        assert _out_metrics(url) == {"a_1", "b_2", "b_3"}
        assert proc.p.poll() is None
        assert 'destinations[0].queue.max_backoff: invalid duration "5q"' in proc.tail(80)
        _signal_other_thread(proc.p.pid, signal.SIGTERM)
        assert proc.p.wait(10) == 0  # a clean stop, not the SIGKILL Proc.stop falls back to


def _raw_exchange(relay: Relay, request: bytes) -> bytes:
    """Send raw bytes, then read everything the relay answers until it closes or goes quiet."""
    host, port = relay.server.server_address[0], relay.server.server_address[1]
    with socket.create_connection((str(host), int(port)), timeout=5) as sock:
        sock.sendall(request)
        sock.settimeout(0.5)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def test_reload_without_content_length_answers_once(start: StartRelay, rx: RecordingServer) -> None:
    # `curl -X POST http://127.0.0.1:9201/-/reload` sends no Content-Length and no body
    relay = start(simple_dest(rx.url))
    answer = _raw_exchange(relay, b"POST /-/reload HTTP/1.1\r\nHost: relay\r\n\r\n")
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"\r\n\r\nconfiguration reloaded\n")
    assert relay.metric("gpu_relay_config_reloads_total", result="success") == 1
    # with an (ignored) body and its length, the connection stays usable for a second request
    answer = _raw_exchange(relay, b"POST /-/reload HTTP/1.1\r\nHost: relay\r\nContent-Length: 2\r\n\r\n{}"
                                  b"GET /-/healthy HTTP/1.1\r\nHost: relay\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 ") == 2, answer
    assert relay.metric("gpu_relay_config_reloads_total", result="success") == 2


def test_write_without_content_length_is_411(start: StartRelay, rx: RecordingServer) -> None:
    relay = start(simple_dest(rx.url))
    answer = _raw_exchange(relay, b"POST /api/v1/write HTTP/1.1\r\nHost: relay\r\n"
                                  b"Content-Type: application/x-protobuf\r\n\r\n")
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    assert answer.startswith(b"HTTP/1.1 411 ")
    assert relay.metric("gpu_relay_samples_received_total") == 0


def test_reload_keeps_aggregation_windows_in_progress(tmp_path: Path) -> None:
    t0 = 1_699_999_980_000  # a multiple of 30 s
    path = tmp_path / "relay.yaml"
    agg = """\
    aggregate:
      - match: '{__name__=~"gpu_util|xid_errors_total"}'
        without: [gpu]
        interval: 30s
        outputs: [sum, total]
"""
    path.write_text(config_text(tmp_path, simple_dest("http://127.0.0.1:1/api/v1/write", agg)))
    runtime = Runtime(str(path), load_config(path), clock=lambda: t0 / 1000)
    try:
        def write(series: list[Series]) -> None:
            reply = runtime.write(RW1_LOWER, snappy.compress(wire.encode_write_request(series)))
            assert reply.status == 204

        write([(S("gpu_util", gpu=str(g)), [(t0 + 1000, 1.0 + g)]) for g in range(3)]
              + [(S("xid_errors_total", gpu=str(g)), [(t0 + 1000, 2.0)]) for g in range(2)])
        # a reload mid-window, with a change that does not touch these series
        junk = "global: {relabel_configs: [{source_labels: [__name__], regex: junk, action: drop}]}\n"
        path.write_text(config_text(tmp_path, simple_dest("http://127.0.0.1:1/api/v1/write", agg), junk))
        assert runtime.reload_config() == (True, "configuration reloaded")
        write([(S("gpu_util", gpu="0"), [(t0 + 20_000, 10.0)])]
              + [(S("xid_errors_total", gpu=str(g)), [(t0 + 40_000, 3.0)]) for g in range(2)])
        runtime.pipeline.flush_aggregates((t0 + 70_000) / 1000)
        queue = runtime.destinations["rx"].queue
        assert queue is not None
        got = {(lb, ts, v) for shard in queue.shards() for e in queue.peek(shard, 1 << 20)
               for lb, samples in wire.decode_write_request(e.payload) for ts, v in samples}
        assert got == {
            (S("gpu_util:30s_without_gpu_sum"), t0 + 30_000, 15.0),  # 10 (latest of gpu 0) + 2 + 3
            (S("xid_errors_total:30s_without_gpu_total"), t0 + 30_000, 4.0),
            (S("xid_errors_total:30s_without_gpu_total"), t0 + 60_000, 6.0),
        }
    finally:
        runtime.stop()


def test_reload_removing_a_destination_forgets_it(start: StartRelay, rx: RecordingServer, tmp_path: Path) -> None:
    relay = start(simple_dest(rx.url) + "  - name: gone\n    url: http://127.0.0.1:1/api/v1/write\n"
                  "    dry_run: true\n")
    assert relay.post([(S("up"), [(now_ms(), 1.0)])]) == 204
    assert relay.metric("gpu_relay_samples_kept_total", destination="gone") == 1
    relay.config_path.write_text(config_text(tmp_path, simple_dest(rx.url)))
    assert relay.request("POST", "/-/reload", b"")[0] == 200
    status, body = relay.get_json("/api/v1/cardinality?destination=gone")
    assert status == 404 and body["destinations"] == ["rx"]
    text = relay.request("GET", "/metrics")[2].decode()
    assert 'destination="gone"' not in text
    assert 'gpu_relay_samples_kept_total{destination="rx"} 1.0' in text
