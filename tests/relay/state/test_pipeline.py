"""relay.pipeline.Pipeline driven directly, in process: real config text, real durable queues in
tmp_path (read back with peek), an injected clock for aggregation. Every expected value is exact."""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from relay.common.labels import Labels
from relay.common.metrics import RelayMetrics
from relay.config.config import Config, parse_config
from relay.delivery.queue.durable import DurableQueue
from relay.ingest import wire
from relay.proto import remote_v1_pb2
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.pipeline import AGGREGATE_GRACE_MS, Pipeline

STALE_BITS = 0x7FF0000000000002
STALE_NAN = struct.unpack("<d", struct.pack("<Q", STALE_BITS))[0]
T0 = 1_699_999_980_000  # a multiple of 30 s in ms: aggregation windows start here
Series = tuple[Labels, list[tuple[int, float]]]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Harness:
    pipeline: Pipeline
    registry: CollectorRegistry
    queues: dict[str, DurableQueue | None]
    config: Config
    clock: Clock

    def ingest(self, series: list[Series], metadata: bytes = b"") -> int:
        return self.pipeline.ingest(wire.encode_write_request(series, metadata)).samples

    def queued(self, dest: str) -> list[Series]:
        """Everything queued for a destination, in shard then queue order (labels sorted)."""
        q = self.queues[dest]
        assert q is not None
        out: list[Series] = []
        for shard in q.shards():
            for entry in q.peek(shard, 1 << 30):
                out.extend(wire.decode_write_request(entry.payload))
        return out

    def queued_set(self, dest: str) -> set[tuple[Labels, int, float]]:
        return {(lb, ts, v) for lb, samples in self.queued(dest) for ts, v in samples}

    def payloads(self, dest: str) -> list[bytes]:
        q = self.queues[dest]
        assert q is not None
        return [e.payload for shard in q.shards() for e in q.peek(shard, 1 << 30)]

    def value(self, name: str, **labels: str) -> float:
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v


MakeHarness = Callable[..., Harness]


def _config(tmp_path: Path, destinations: str, head: str = "") -> str:
    return f"storage: {{path: {tmp_path / 'q'}}}\n{head}destinations:\n{destinations}"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[MakeHarness]:
    with harnesses(tmp_path) as build:
        yield build


@contextmanager
def harnesses(tmp_path: Path) -> Iterator[MakeHarness]:
    """Builds harnesses whose queues live in tmp_path; closes them on exit."""
    opened: list[DurableQueue] = []

    def build(text: str, now: float = T0 / 1000) -> Harness:
        config = parse_config(text)
        registry = CollectorRegistry()
        metrics = RelayMetrics(registry)
        cm = CardinalityMetrics(registry)
        stats = [DestinationStats(d.name, window_s=d.limits.window, metrics=cm) for d in config.destinations]
        queues: dict[str, DurableQueue | None] = {}
        for d in config.destinations:
            if d.dry_run:
                queues[d.name] = None
            else:
                q = DurableQueue(tmp_path / "q" / f"{d.name}.queue.db", d.queue.max_disk)
                opened.append(q)
                queues[d.name] = q
        clock = Clock(now)
        p = Pipeline(config, metrics, stats, [queues[d.name] for d in config.destinations],
                     cardinality=cm, clock=clock)
        return Harness(p, registry, queues, config, clock)

    try:
        yield build
    finally:
        for q in opened:
            q.close()


def S(name: str, **labels: str) -> Labels:
    return tuple(sorted({"__name__": name, **labels}.items()))


# ---- stateless rules ----------------------------------------------------------------------------


def test_external_global_write_relabel_and_prune_exact(make: MakeHarness, tmp_path: Path) -> None:
    text = _config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    write_relabel_configs:
      - source_labels: [__name__]
        regex: gpu_util|gpu_temp
        action: keep
    prune_labels: [pci_bus_id]
    queue: {max_shards: 1}
  - name: all
    url: http://127.0.0.1:1/api/v1/write
    queue: {max_shards: 3}
""", head="""\
external_labels: {cluster: prod, region: eu}
global:
  relabel_configs:
    - source_labels: [__name__]
      regex: junk_.*
      action: drop
    - target_label: env
      replacement: test
""")
    h = make(text)
    n = h.ingest([
        (S("gpu_util", gpu="0", pci_bus_id="00:01", cluster="mine"), [(T0, 50.0)]),
        (S("gpu_temp", gpu="0", pci_bus_id="00:01"), [(T0, 40.0), (T0 + 15_000, 41.0)]),
        (S("fb_used", gpu="0"), [(T0, 7.0)]),
        (S("junk_metric", gpu="0"), [(T0, 1.0)]),
    ])
    assert n == 5
    assert h.queued_set("amp") == {
        (S("gpu_util", gpu="0", cluster="mine", region="eu", env="test"), T0, 50.0),
        (S("gpu_temp", gpu="0", cluster="prod", region="eu", env="test"), T0, 40.0),
        (S("gpu_temp", gpu="0", cluster="prod", region="eu", env="test"), T0 + 15_000, 41.0),
    }
    assert h.queued_set("all") == {
        (S("gpu_util", gpu="0", pci_bus_id="00:01", cluster="mine", region="eu", env="test"), T0, 50.0),
        (S("gpu_temp", gpu="0", pci_bus_id="00:01", cluster="prod", region="eu", env="test"), T0, 40.0),
        (S("gpu_temp", gpu="0", pci_bus_id="00:01", cluster="prod", region="eu", env="test"),
         T0 + 15_000, 41.0),
        (S("fb_used", gpu="0", cluster="prod", region="eu", env="test"), T0, 7.0),
    }
    # per-destination accounting: junk (1 sample) dropped globally, fb_used (1) by amp's keep rule
    assert h.value("gpu_relay_samples_received_total") == 5
    assert h.value("gpu_relay_samples_kept_total", destination="amp") == 3
    assert h.value("gpu_relay_samples_kept_total", destination="all") == 4
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="rules") == 2
    assert h.value("gpu_relay_samples_dropped_total", destination="all", reason="rules") == 1
    # the same series again hit the decision cache and give the same result
    h.ingest([(S("gpu_util", gpu="0", pci_bus_id="00:01", cluster="mine"), [(T0 + 30_000, 51.0)])])
    assert (S("gpu_util", gpu="0", cluster="mine", region="eu", env="test"), T0 + 30_000, 51.0) \
        in h.queued_set("amp")
    assert h.value("gpu_relay_samples_kept_total", destination="amp") == 4


def test_per_series_order_and_sharding(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: d
    url: http://127.0.0.1:1/api/v1/write
    queue: {max_shards: 4}
"""))
    for i in range(5):
        h.ingest([(S("m", gpu=str(g)), [(T0 + i * 1000, float(i))]) for g in range(8)])
    q = h.queues["d"]
    assert q is not None
    shard_of: dict[Labels, int] = {}
    for shard in q.shards():
        assert 0 <= shard < 4
        per_series: dict[Labels, list[int]] = {}
        for e in q.peek(shard, 1 << 30):
            for lb, samples in wire.decode_write_request(e.payload):
                assert shard_of.setdefault(lb, shard) == shard  # a series lives on one shard
                per_series.setdefault(lb, []).extend(ts for ts, _ in samples)
        for stamps in per_series.values():
            assert stamps == [T0 + i * 1000 for i in range(5)]
    assert len(shard_of) == 8
    assert q.depth()[0] == 40


def test_stale_marker_is_byte_exact(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: d
    url: http://127.0.0.1:1/api/v1/write
    prune_labels: [pod]
    queue: {max_shards: 1}
""", head="external_labels: {cluster: c}\n"))
    h.ingest([(S("m", gpu="0", pod="p"), [(T0, 1.5), (T0 + 1000, STALE_NAN)])])
    out = h.queued("d")
    assert [lb for lb, _ in out] == [S("m", gpu="0", cluster="c")]
    (_, v1), (_, v2) = out[0][1]
    assert v1 == 1.5
    assert struct.pack("<d", v2) == struct.pack("<Q", STALE_BITS)
    stale_entry = b"\x09" + struct.pack("<Q", STALE_BITS)
    assert any(stale_entry in p for p in h.payloads("d"))
    # and protobuf decoding of the queued bytes sees the same bits
    req = remote_v1_pb2.WriteRequest.FromString(h.payloads("d")[0])
    assert struct.unpack("<Q", struct.pack("<d", req.timeseries[0].samples[1].value))[0] == STALE_BITS


def _metadata_entry(family: str, kind: int) -> bytes:
    req = remote_v1_pb2.WriteRequest()
    md = req.metadata.add()
    md.metric_family_name = family
    md.type = kind
    md.help = "help text"
    return bytes(req.SerializeToString())


def test_metadata_only_request_is_queued_for_destinations_keeping_the_family(
        make: MakeHarness, tmp_path: Path) -> None:
    # issue 8, defect 2: metadata follows each destination's rules (it used to go to every one)
    h = make(_config(tmp_path, """\
  - name: a
    url: http://127.0.0.1:1/api/v1/write
  - name: b
    url: http://127.0.0.1:1/api/v1/write
    write_relabel_configs: [{source_labels: [__name__], regex: nothing, action: keep}]
"""))
    h.ingest([(S("gpu_util", gpu="0"), [(T0, 1.0)])])
    before = h.payloads("a")
    md = _metadata_entry("gpu_util", remote_v1_pb2.MetricMetadata.GAUGE)
    result = h.pipeline.ingest(md)
    assert (result.series, result.samples) == (0, 0)
    added = [p for p in h.payloads("a") if p not in before]
    assert added == [md]
    req = remote_v1_pb2.WriteRequest.FromString(added[0])
    assert [m.metric_family_name for m in req.metadata] == ["gpu_util"]
    assert h.payloads("b") == []
    assert h.value("gpu_relay_samples_received_total") == 1


# ---- collisions ---------------------------------------------------------------------------------


def test_prune_collision_keeps_first_counts_and_warns(make: MakeHarness, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    prune_labels: [pod]
    queue: {max_shards: 1}
"""))
    caplog.set_level(logging.WARNING)
    h.ingest([
        (S("gpu_util", gpu="0", pod="a"), [(T0, 1.0)]),
        (S("gpu_util", gpu="0", pod="b"), [(T0, 2.0), (T0 + 1000, 3.0)]),
        (S("gpu_util", gpu="1", pod="a"), [(T0, 4.0)]),
    ])
    assert h.queued_set("amp") == {
        (S("gpu_util", gpu="0"), T0, 1.0),
        (S("gpu_util", gpu="1"), T0, 4.0),
    }
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="collision") == 2
    assert h.value("gpu_relay_series_dropped_total", destination="amp", reason="collision") == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "relay.limits"]
    msgs = [r.getMessage() for r in warnings]
    assert len(msgs) == 1, msgs
    assert "destination amp" in msgs[0]
    assert "prune_labels ['pod']" in msgs[0]
    assert 'gpu_util{gpu="0"}' in msgs[0]
    assert "aggregate rule" in msgs[0]
    # the loser stays dropped on later requests (cached decision), the owner keeps flowing
    h.ingest([
        (S("gpu_util", gpu="0", pod="b"), [(T0 + 2000, 5.0)]),
        (S("gpu_util", gpu="0", pod="a"), [(T0 + 2000, 6.0)]),
    ])
    assert (S("gpu_util", gpu="0"), T0 + 2000, 6.0) in h.queued_set("amp")
    assert (S("gpu_util", gpu="0"), T0 + 2000, 5.0) not in h.queued_set("amp")
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="collision") == 3
    snap = h.pipeline.stages[0].stats.snapshot()
    assert snap["dropped"]["collision"] == {"series": 1, "samples": 3}


# ---- aggregation --------------------------------------------------------------------------------


AGG_DEST = """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    aggregate:
      - match: '{__name__="gpu_util"}'
        without: [gpu, pod]
        interval: 30s
        outputs: [avg, max, sum]
    queue: {max_shards: 2}
"""


def test_aggregate_two_windows_exact(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, AGG_DEST, head="external_labels: {cluster: c}\n"))
    base = {"node": "n1"}

    def gu(g: str) -> Labels:
        return S("gpu_util", gpu=g, pod=f"p{g}", **base)

    # window [T0, T0+30s): gpu0 1 then 4, gpu1 2, gpu2 3; a pass-through series alongside
    h.ingest([(gu("0"), [(T0 + 5_000, 1.0), (T0 + 20_000, 4.0)]), (gu("1"), [(T0 + 10_000, 2.0)]),
              (gu("2"), [(T0 + 10_000, 3.0)]), (S("gpu_temp", gpu="0"), [(T0 + 10_000, 60.0)])])
    # window [T0+30s, T0+60s): 10, 20, 30
    h.ingest([(gu("0"), [(T0 + 40_000, 10.0)]), (gu("1"), [(T0 + 40_000, 20.0)]),
              (gu("2"), [(T0 + 45_000, 30.0)])])
    # raw gpu_util never queued, gpu_temp passes through
    assert h.queued_set("amp") == {(S("gpu_temp", gpu="0", cluster="c"), T0 + 10_000, 60.0)}
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="aggregated") == 7

    def out(output: str) -> Labels:
        return S(f"gpu_util:30s_without_gpu_pod_{output}", node="n1", cluster="c")

    # not yet: the first window ends at T0+30s and closes AGGREGATE_GRACE_MS later
    h.pipeline.flush_aggregates((T0 + 30_000 + AGGREGATE_GRACE_MS - 1) / 1000)
    assert len(h.queued_set("amp")) == 1
    h.pipeline.flush_aggregates((T0 + 30_000 + AGGREGATE_GRACE_MS) / 1000)
    first = h.queued_set("amp") - {(S("gpu_temp", gpu="0", cluster="c"), T0 + 10_000, 60.0)}
    assert first == {
        (out("avg"), T0 + 30_000, 2.5),  # (1+4+2+3)/4 samples
        (out("max"), T0 + 30_000, 4.0),
        (out("sum"), T0 + 30_000, 9.0),  # latest per series: 4+2+3
    }
    h.pipeline.flush_aggregates((T0 + 60_000 + AGGREGATE_GRACE_MS) / 1000)
    second = h.queued_set("amp") - first - {(S("gpu_temp", gpu="0", cluster="c"), T0 + 10_000, 60.0)}
    assert second == {
        (out("avg"), T0 + 60_000, 20.0),
        (out("max"), T0 + 60_000, 30.0),
        (out("sum"), T0 + 60_000, 60.0),
    }
    # flushing again emits nothing new
    h.pipeline.flush_aggregates((T0 + 60_000 + AGGREGATE_GRACE_MS) / 1000)
    assert len(h.queued_set("amp")) == 7
    # the aggregated outputs are counted as active series out; the 3 raw inputs are not
    snap = h.pipeline.stages[0].stats.snapshot()
    assert snap["active_series"] == {"in": 4, "out": 4}
    assert {m["metric"] for m in snap["top_metrics"]["out"]} == {
        "gpu_temp", "gpu_util:30s_without_gpu_pod_avg", "gpu_util:30s_without_gpu_pod_max",
        "gpu_util:30s_without_gpu_pod_sum"}


def test_aggregate_counter_total_uses_metadata_type(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    aggregate:
      - match: '{__name__="xid_errors"}'
        without: [gpu]
        interval: 30s
        outputs: [total, sum]
"""))
    md = _metadata_entry("xid_errors", remote_v1_pb2.MetricMetadata.COUNTER)
    h.ingest([(S("xid_errors", gpu="0"), [(T0 + 1000, 5.0)]), (S("xid_errors", gpu="1"), [(T0 + 1000, 1.0)])],
             metadata=md)
    h.ingest([(S("xid_errors", gpu="0"), [(T0 + 31_000, 7.0)]), (S("xid_errors", gpu="1"), [(T0 + 31_000, 1.0)])])
    h.pipeline.flush_aggregates((T0 + 60_000 + AGGREGATE_GRACE_MS) / 1000)
    got = {(lb, ts, v) for lb, ts, v in h.queued_set("amp")}
    # counters: "total" is the running increase (first sample counts in full), "sum" is not emitted
    assert got == {
        (S("xid_errors:30s_without_gpu_total"), T0 + 30_000, 6.0),
        (S("xid_errors:30s_without_gpu_total"), T0 + 60_000, 8.0),
    }


def test_aggregate_stale_marker_does_not_poison_outputs(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, AGG_DEST))
    h.ingest([(S("gpu_util", gpu="0"), [(T0 + 1000, 3.0), (T0 + 2000, STALE_NAN)]),
              (S("gpu_util", gpu="1"), [(T0 + 1000, 5.0)])])
    h.pipeline.flush_aggregates((T0 + 30_000 + AGGREGATE_GRACE_MS) / 1000)
    values = {lb[0][1]: v for lb, _, v in h.queued_set("amp")}
    assert values == {"gpu_util:30s_without_gpu_pod_avg": 4.0, "gpu_util:30s_without_gpu_pod_max": 5.0,
                      "gpu_util:30s_without_gpu_pod_sum": 8.0}
    assert not any(math.isnan(v) for v in values.values())


# ---- limits -------------------------------------------------------------------------------------


def test_max_series_per_metric(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    limits: {max_series_per_metric: 2}
    queue: {max_shards: 1}
"""))
    batch1 = [(S("m", gpu=str(g)), [(T0, float(g)), (T0 + 1, float(g))]) for g in range(3)]
    batch1.append((S("other", gpu="9"), [(T0, 9.0)]))
    h.ingest(batch1)
    assert h.queued_set("amp") == {
        (S("m", gpu="0"), T0, 0.0), (S("m", gpu="0"), T0 + 1, 0.0),
        (S("m", gpu="1"), T0, 1.0), (S("m", gpu="1"), T0 + 1, 1.0),
        (S("other", gpu="9"), T0, 9.0),
    }
    lim = {"destination": "amp", "metric": "m", "limit": "max_series_per_metric"}
    assert h.value("gpu_relay_series_limit_dropped_total", **lim) == 1
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="series_limit") == 2
    # admitted series keep flowing; the third is refused again (and counted again)
    h.ingest([(S("m", gpu=str(g)), [(T0 + 15_000, 10.0 + g)]) for g in range(3)])
    new = {x for x in h.queued_set("amp") if x[1] == T0 + 15_000}
    assert new == {(S("m", gpu="0"), T0 + 15_000, 10.0), (S("m", gpu="1"), T0 + 15_000, 11.0)}
    assert h.value("gpu_relay_series_limit_dropped_total", **lim) == 2
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="series_limit") == 3
    assert h.value("gpu_relay_samples_kept_total", destination="amp") == 7
    snap = h.pipeline.stages[0].stats.snapshot()
    assert snap["active_series"] == {"in": 4, "out": 3}
    assert snap["dropped"]["series_limit"]["samples"] == 3


def test_max_series_total(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    limits: {max_series: 2}
"""))
    h.ingest([(S(f"m{i}"), [(T0, float(i))]) for i in range(4)])
    assert h.queued_set("amp") == {(S("m0"), T0, 0.0), (S("m1"), T0, 1.0)}
    for metric in ("m2", "m3"):
        assert h.value("gpu_relay_series_limit_dropped_total", destination="amp", metric=metric,
                       limit="max_series") == 1
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="series_limit") == 2


def test_amp_per_series_limits(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
"""))
    many = S("wide", **{f"l{i:02d}": "v" for i in range(70)})  # 70 labels + __name__ = 71
    assert len(many) == 71
    ok70 = S("wide", **{f"l{i:02d}": "v" for i in range(69)})  # exactly 70: allowed
    long_value = S("long", pod="x" * 3000)
    good = S("good", gpu="0")
    h.ingest([(many, [(T0, 1.0)]), (long_value, [(T0, 2.0), (T0 + 1, 2.0)]), (good, [(T0, 3.0)]),
              (ok70, [(T0, 4.0)])])
    assert h.queued_set("amp") == {(good, T0, 3.0), (ok70, T0, 4.0)}
    assert h.value("gpu_relay_samples_dropped_total", destination="amp",
                   reason="max_label_names_per_series") == 1
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="label_value_too_long") == 2
    assert h.value("gpu_relay_series_dropped_total", destination="amp", reason="label_value_too_long") == 1
    assert h.value("gpu_relay_samples_kept_total", destination="amp") == 2


def test_external_labels_count_toward_amp_label_limit(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
""", head="external_labels: {cluster: c}\n"))
    s = S("wide", **{f"l{i:02d}": "v" for i in range(69)})  # 70 in, 71 after external_labels
    h.ingest([(s, [(T0, 1.0)])])
    assert h.queued_set("amp") == set()
    assert h.value("gpu_relay_samples_dropped_total", destination="amp",
                   reason="max_label_names_per_series") == 1


# ---- queue overflow, dry run ----------------------------------------------------------------------


def test_queue_full_drops_oldest_and_counts(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: d
    url: http://127.0.0.1:1/api/v1/write
    queue: {max_disk: 2KiB, max_shards: 1}
"""))
    dropped = 0
    for i in range(20):
        r = h.pipeline.ingest(wire.encode_write_request(
            [(S("m", gpu=str(g), pad="x" * 40), [(T0 + i, 1.0)]) for g in range(4)]))
        dropped += r.dropped_samples
    q = h.queues["d"]
    assert q is not None
    samples, nbytes = q.depth()
    assert dropped > 0
    assert samples + dropped == 80
    entries = sum(len(q.peek(s, 1 << 30)) for s in q.shards())
    assert nbytes + 64 * entries <= 2048  # relay.queue.ENTRY_OVERHEAD_BYTES per entry
    assert h.value("gpu_relay_samples_dropped_total", destination="d", reason="queue_full") == dropped
    assert h.pipeline.stages[0].stats.snapshot()["dropped"]["queue_full"]["samples"] == dropped
    # what is left is the newest data
    stamps = {ts for _, ts, _ in h.queued_set("d")}
    assert max(stamps) == T0 + 19


def test_dry_run_queues_nothing_but_accounts(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: dry
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    write_relabel_configs: [{source_labels: [__name__], regex: keep_me, action: keep}]
"""))
    h.ingest([(S("keep_me", gpu="0"), [(T0, 1.0)]), (S("drop_me", gpu="0"), [(T0, 1.0)])])
    assert not (tmp_path / "q" / "dry.queue.db").exists()
    assert h.value("gpu_relay_samples_kept_total", destination="dry") == 1
    snap = h.pipeline.stages[0].stats.snapshot()
    assert snap["active_series"] == {"in": 2, "out": 1}


def test_invalid_label_set_raises_400(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: d
    url: http://127.0.0.1:1/api/v1/write
"""))
    bad = wire.wrap_series(wire.encode_label_pair(b"__name__", b"m") + wire.encode_label_pair(b"a", b"\xff"),
                           wire.encode_sample(T0, 1.0))
    with pytest.raises(wire.WireError) as e:
        h.pipeline.ingest(bad)
    assert e.value.status == 400
    assert h.payloads("d") == []


def test_previous_pipeline_hands_over_unchanged_aggregators(make: MakeHarness, tmp_path: Path) -> None:
    text = _config(tmp_path, AGG_DEST)
    h = make(text)
    h.ingest([(S("gpu_util", gpu=str(g)), [(T0 + 1000, 1.0 + g)]) for g in range(3)])
    old = h.pipeline
    same = Pipeline(old.config, old.metrics, [s.stats for s in old.stages], [s.queue for s in old.stages],
                    clock=h.clock, previous=old)
    assert same.stages[0].aggregator is old.stages[0].aggregator
    assert same.lock is old.lock
    changed_cfg = parse_config(text.replace("outputs: [avg, max, sum]", "outputs: [sum]"))
    changed = Pipeline(changed_cfg, old.metrics, [s.stats for s in old.stages], [s.queue for s in old.stages],
                       clock=h.clock, previous=old)
    assert changed.stages[0].aggregator is not old.stages[0].aggregator
    same.flush_aggregates((T0 + 30_000 + AGGREGATE_GRACE_MS) / 1000)
    assert {(lb[0][1], ts, v) for lb, ts, v in h.queued_set("amp")} == {
        ("gpu_util:30s_without_gpu_pod_avg", T0 + 30_000, 2.0),
        ("gpu_util:30s_without_gpu_pod_max", T0 + 30_000, 3.0),
        ("gpu_util:30s_without_gpu_pod_sum", T0 + 30_000, 6.0),
    }


def test_aggregate_outputs_are_subject_to_the_destination_series_limit(tmp_path: Path) -> None:
    """DESIGN.md orders aggregate before limits: aggregate outputs count against max_series."""
    from prometheus_client import CollectorRegistry

    from relay.common.metrics import RelayMetrics
    from relay.config.config import parse_config
    from relay.delivery.queue.durable import DurableQueue
    from relay.state.cardinality import CardinalityMetrics, DestinationStats
    from relay.state.pipeline import Pipeline

    t0 = 1_699_999_980_000
    cfg = parse_config(f"""storage: {{path: {tmp_path}}}
destinations:
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    aggregate:
      - match: '{{__name__="m"}}'
        without: [gpu]
        interval: 30s
        outputs: [avg]
    limits: {{max_series: 1}}
    queue: {{max_shards: 1}}
""")
    reg = CollectorRegistry()
    rm, cm = RelayMetrics(reg), CardinalityMetrics(reg)
    stats = [DestinationStats("amp", metrics=cm)]
    q = DurableQueue(tmp_path / "amp.db", 1 << 30)
    now = [t0 / 1000]
    p = Pipeline(cfg, rm, stats, [q], cardinality=cm, clock=lambda: now[0])
    series = [(tuple(sorted({"__name__": "m", "node": str(n), "gpu": str(g)}.items())), [(t0 + 1000, float(g))])
              for n in range(5) for g in range(2)]
    p.ingest(wire.encode_write_request(series))
    now[0] = t0 / 1000 + 60
    p.flush_aggregates()
    out = [lb for s in q.shards() for e in q.peek(s, 1 << 30) for lb, _ in wire.decode_write_request(e.payload)]
    assert [dict(x)["node"] for x in out] == ["0"]
    assert reg.get_sample_value(
        "gpu_relay_samples_dropped_total", {"destination": "amp", "reason": "series_limit"}) == 4
    q.close()
