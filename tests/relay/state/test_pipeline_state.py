"""Per-series state of the pipeline (issue 8): keyed by the input series' canonical identity,
updated for every occurrence, never dependent on the decision cache. Same harness as
tests/relay/state/test_pipeline.py (real config text, real durable queues, injected clock)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from relay.common.labels import Labels
from relay.common.metrics import RelayMetrics
from relay.config.config import parse_config
from relay.delivery.queue.durable import DurableQueue
from relay.ingest import wire
from relay.proto import remote_v1_pb2
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.metadata import metadata_entries
from relay.state.pipeline import AGGREGATE_GRACE_MS, Pipeline
from relay.state.stage import decode_labels as pipeline_decode_labels
from relay.state.stage import decode_labels_canonical
from tests.relay.state.test_pipeline import T0, Clock, Harness, MakeHarness, S, _config, _metadata_entry, harnesses


@pytest.fixture(name="make")
def make_fixture(tmp_path: Path) -> Iterator[MakeHarness]:
    with harnesses(tmp_path) as build:
        yield build

GRACE = AGGREGATE_GRACE_MS


def _labels_bytes(pairs: list[tuple[str, str]]) -> bytes:
    return b"".join(wire.encode_label_pair(n.encode(), v.encode()) for n, v in pairs)


def _series_raw(pairs: list[tuple[str, str]], samples: list[tuple[int, float]]) -> bytes:
    """One TimeSeries with its Label entries in exactly the order given (not sorted)."""
    return wire.wrap_series(_labels_bytes(pairs), b"".join(wire.encode_sample(t, v) for t, v in samples))


def _histogram_series(labels: Labels, ts: int, count: int = 3) -> bytes:
    req = remote_v1_pb2.WriteRequest()
    s = req.timeseries.add()
    for n, v in labels:
        s.labels.add(name=n, value=v)
    h = s.histograms.add()
    h.count_int = count
    h.sum = 1.5
    h.schema = 0
    h.zero_count_int = 0
    h.timestamp = ts
    return bytes(req.SerializeToString())


def _values(h: Harness) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every relay counter sample in the registry, for exact comparison between two runs."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in h.registry.collect():
        for s in family.samples:
            if s.name.endswith("_created") or not s.name.startswith("gpu_relay_"):
                continue  # (process_* self-metrics differ between any two runs)
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _snapshot(h: Harness) -> list[dict[str, Any]]:
    snaps = []
    for stage in h.pipeline.stages:
        snap = stage.stats.snapshot()
        snap.pop("samples_per_second")
        snap.pop("estimated_cost")
        snap.pop("estimated_cost_without_rules")
        snaps.append(snap)
    return snaps


# ---- identity -----------------------------------------------------------------------------------


def test_same_series_with_labels_in_another_order_is_one_series_not_a_collision(
        make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    prune_labels: [pod]
    queue: {max_shards: 1}
"""))
    pairs = [("__name__", "gpu_util"), ("gpu", "0"), ("pod", "a")]
    h.pipeline.ingest(_series_raw(pairs, [(T0, 1.0)]))
    h.pipeline.ingest(_series_raw(list(reversed(pairs)), [(T0 + 1000, 2.0)]))
    assert h.queued_set("amp") == {(S("gpu_util", gpu="0"), T0, 1.0), (S("gpu_util", gpu="0"), T0 + 1000, 2.0)}
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="collision") == 0
    snap = h.pipeline.stages[0].stats.snapshot()
    assert snap["active_series"] == {"in": 1, "out": 1}


@pytest.mark.parametrize(("external", "splices"), [
    ("{cluster: c}", True), ("{cluster: c, zone: z}", True),
    ("{AAA: first, zzz: last}", False),  # never contiguous: each output is kept whole
])
def test_external_labels_spliced_into_cached_series_give_exact_sorted_output(
        make: MakeHarness, tmp_path: Path, external: str, splices: bool) -> None:
    h = make(_config(tmp_path, "  - name: d\n    url: http://127.0.0.1:1/api/v1/write\n    queue: {max_shards: 1}\n",
                     head=f"external_labels: {external}\n"))
    ext = dict(h.config.external_labels)
    inputs = [S("m", gpu="0"), S("m", UUID="u", gpu="1", zone="own"), S("m", cluster="mine"), S("a_metric"),
              S("m", zzzz="9", AA="1"), S("m", gpu="2", pod="p")]
    for step in range(2):  # the second round is served from the decision cache
        h.ingest([(lb, [(T0 + step, 1.0)]) for lb in inputs[:-1]])
        # the last one with its labels in reverse order (a key that is not canonical)
        h.pipeline.ingest(_series_raw(list(reversed(inputs[-1])), [(T0 + step, 1.0)]))
    spliced = [d for dec in h.pipeline.cache.young.values() for d in dec[1:] if d and d[1] > 0 and d[1] >> 65]
    assert bool(spliced) is splices
    want = {(tuple(sorted({**ext, **dict(lb)}.items())), T0 + step, 1.0) for lb in inputs for step in range(2)}
    assert h.queued_set("d") == want
    for payload in h.payloads("d"):  # and protobuf reads the labels sorted, as receivers require
        for ts in remote_v1_pb2.WriteRequest.FromString(payload).timeseries:
            names = [x.name for x in ts.labels]
            assert names == sorted(names)


MIXED_DESTS = """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    prune_labels: [pod]
    limits: {max_series_per_metric: 3}
    aggregate:
      - match: '{__name__="xid_total"}'
        without: [gpu]
        interval: 30s
        outputs: [total, count_series]
      - match: '{__name__="gpu_util"}'
        without: [gpu]
        interval: 30s
        outputs: [sum, avg, count_series]
    queue: {max_shards: 2}
  - name: all
    url: http://127.0.0.1:1/api/v1/write
    write_relabel_configs: [{source_labels: [__name__], regex: 'xid_total|temp', action: keep}]
    queue: {max_shards: 3}
"""


def _mixed_traffic(h: Harness) -> None:
    for step in range(6):
        ts = T0 + step * 10_000
        series: list[tuple[Labels, list[tuple[int, float]]]] = []
        for pod in "abc":
            for g in range(2):
                series.append((S("gpu_util", gpu=str(g), pod=pod, node="n"), [(ts, float(step + g))]))
                series.append((S("xid_total", gpu=str(g), pod=pod, node="n"), [(ts, float(step * 2 + g))]))
        for g in range(5):  # 5 temp series, limit 3 per metric; pods a/b collide after pruning
            series.append((S("temp", gpu=str(g), pod="a"), [(ts, 40.0 + g)]))
            series.append((S("temp", gpu=str(g), pod="b"), [(ts, 50.0 + g)]))
        series.append((S("wide", **{f"l{i:02d}": "v" for i in range(75)}), [(ts, 1.0)]))  # amp_violation
        h.ingest(series)
        h.clock.t = (ts + 5_000) / 1000
        h.pipeline.flush_aggregates()
    h.pipeline.flush_all()


@pytest.mark.parametrize("tiny", [1, 2_000])
def test_tiny_and_huge_decision_cache_give_identical_stats_limits_and_aggregates(
        tmp_path: Path, tiny: int) -> None:
    results = []
    for size, sub in ((tiny, "tiny"), (1 << 34, "huge")):
        d = tmp_path / sub
        d.mkdir()
        config = parse_config(_config(d, MIXED_DESTS))
        registry = CollectorRegistry()
        metrics = RelayMetrics(registry)
        cm = CardinalityMetrics(registry)
        stats = [DestinationStats(x.name, window_s=x.limits.window, metrics=cm) for x in config.destinations]
        queues = [DurableQueue(d / "q" / f"{x.name}.db", x.queue.max_disk) for x in config.destinations]
        clock = Clock(T0 / 1000)
        p = Pipeline(config, metrics, stats, queues, cardinality=cm, clock=clock, cache_max_bytes=size)
        h = Harness(p, registry, {x.name: q for x, q in zip(config.destinations, queues, strict=True)},
                    config, clock)
        _mixed_traffic(h)
        assert p.cache_bytes() <= size
        results.append((
            {name: sorted(h.queued(name)) for name in ("amp", "all")},
            _values(h),
            _snapshot(h),
        ))
        for q in queues:
            q.close()
    (q_tiny, v_tiny, s_tiny), (q_huge, v_huge, s_huge) = results
    assert q_tiny == q_huge
    assert v_tiny == v_huge
    assert s_tiny == s_huge
    # and the traffic really exercised every stateful stage
    assert v_huge[("gpu_relay_samples_dropped_total", (("destination", "amp"), ("reason", "collision")))] > 0
    assert v_huge[("gpu_relay_samples_dropped_total", (("destination", "amp"), ("reason", "series_limit")))] > 0
    assert v_huge[("gpu_relay_samples_dropped_total", (("destination", "amp"), ("reason", "aggregated")))] > 0
    assert any(":30s_" in dict(lb)["__name__"] for lb, _ in q_huge["amp"])


def test_decision_cache_is_bounded_and_evicts_incrementally(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: d
    url: http://127.0.0.1:1/api/v1/write
"""))
    h.pipeline.set_cache_max_bytes(50_000)
    for r in range(20):
        h.ingest([(S("m", gpu=str(r * 100 + g)), [(T0, 1.0)]) for g in range(100)])
        assert h.pipeline.cache_bytes() <= 50_000
    assert 0 < h.pipeline.cache_entries() < 2000
    # every one of the 2000 series is still accounted (state does not live in the cache)
    assert h.pipeline.stages[0].stats.snapshot()["active_series"] == {"in": 2000, "out": 2000}


# ---- aggregation of pruned collisions ------------------------------------------------------------


PRUNED_AGG = """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    prune_labels: [pod]
    aggregate:
      - match: '{__name__="gpu_util"}'
        without: [gpu]
        interval: 30s
        outputs: [sum, avg, count_series]
      - match: '{__name__="xid_total"}'
        without: [gpu]
        interval: 30s
        outputs: [total]
    queue: {max_shards: 1}
"""


def _outputs(h: Harness) -> dict[tuple[str, int], float]:
    return {(dict(lb)["__name__"], ts): v for lb, ts, v in h.queued_set("amp")}


def test_aggregation_of_pruned_collisions_counts_each_input_series_as_a_member(
        make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, PRUNED_AGG))
    # pods a and b prune to the same output series gpu_util{gpu="0"}: two members, not one
    h.ingest([(S("gpu_util", gpu="0", pod="a"), [(T0 + 1000, 10.0)]),
              (S("gpu_util", gpu="0", pod="b"), [(T0 + 1000, 30.0)]),
              (S("xid_total", gpu="0", pod="a"), [(T0 + 1000, 100.0)]),
              (S("xid_total", gpu="0", pod="b"), [(T0 + 1000, 5.0)])])
    h.ingest([(S("xid_total", gpu="0", pod="a"), [(T0 + 31_000, 110.0)]),
              (S("xid_total", gpu="0", pod="b"), [(T0 + 31_000, 7.0)])])
    h.pipeline.flush_aggregates((T0 + 60_000 + GRACE) / 1000)
    assert _outputs(h) == {
        ("gpu_util:30s_without_gpu_sum", T0 + 30_000): 40.0,
        ("gpu_util:30s_without_gpu_avg", T0 + 30_000): 20.0,
        ("gpu_util:30s_without_gpu_count_series", T0 + 30_000): 2.0,
        ("xid_total:30s_without_gpu_total", T0 + 30_000): 105.0,
        # +10 and +2: the other member's value is never read as a reset
        ("xid_total:30s_without_gpu_total", T0 + 60_000): 117.0,
    }
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="collision") == 0


def test_prometheus_resend_after_a_503_is_not_aggregated_twice(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, PRUNED_AGG))
    first = [(S("gpu_util", gpu="0", pod="a"), [(T0 + 1000, 10.0), (T0 + 2000, 20.0)]),
             (S("xid_total", gpu="0", pod="a"), [(T0 + 1000, 4.0)])]
    other_shard = [(S("gpu_util", gpu="1", pod="a"), [(T0 + 1000, 30.0)]),
                   (S("xid_total", gpu="1", pod="a"), [(T0 + 1000, 1.0)])]
    h.ingest(first)
    h.ingest(other_shard)
    h.ingest(first)  # the same request again: Prometheus retries after a 503 from another destination
    h.pipeline.flush_aggregates((T0 + 30_000 + GRACE) / 1000)
    assert _outputs(h) == {
        ("gpu_util:30s_without_gpu_sum", T0 + 30_000): 50.0,
        ("gpu_util:30s_without_gpu_avg", T0 + 30_000): 20.0,  # (10 + 20 + 30) / 3, not / 6
        ("gpu_util:30s_without_gpu_count_series", T0 + 30_000): 2.0,
        ("xid_total:30s_without_gpu_total", T0 + 30_000): 5.0,
    }


def test_flush_all_emits_every_open_window_for_a_graceful_stop(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, PRUNED_AGG))
    h.ingest([(S("gpu_util", gpu="0", pod="a"), [(T0 + 1000, 10.0)]),
              (S("gpu_util", gpu="0", pod="a"), [(T0 + 31_000, 12.0)])])
    h.pipeline.flush_all()
    out = _outputs(h)
    assert out[("gpu_util:30s_without_gpu_sum", T0 + 30_000)] == 10.0
    assert out[("gpu_util:30s_without_gpu_sum", T0 + 60_000)] == 12.0
    h.pipeline.flush_all()  # nothing left open: nothing new
    assert len(h.queued_set("amp")) == len(out)


def test_open_windows_of_changed_aggregate_rules_are_emitted_after_a_reload(
        make: MakeHarness, tmp_path: Path) -> None:
    text = _config(tmp_path, PRUNED_AGG)
    h = make(text)
    h.ingest([(S("gpu_util", gpu=str(g), pod="a"), [(T0 + 1000, 1.0 + g)]) for g in range(3)])
    old = h.pipeline
    changed = parse_config(text.replace("outputs: [sum, avg, count_series]", "outputs: [max]"))
    new = Pipeline(changed, old.metrics, [s.stats for s in old.stages], [s.queue for s in old.stages],
                   clock=h.clock, previous=old)
    assert new.stages[0].aggregator is not old.stages[0].aggregator
    new.flush_aggregates()  # the window has not ended yet: emitted early rather than lost
    assert _outputs(h) == {
        ("gpu_util:30s_without_gpu_sum", T0 + 30_000): 6.0,
        ("gpu_util:30s_without_gpu_avg", T0 + 30_000): 2.0,
        ("gpu_util:30s_without_gpu_count_series", T0 + 30_000): 3.0,
    }
    new.flush_aggregates()
    assert len(h.queued_set("amp")) == 3


def test_future_dated_samples_do_not_open_aggregation_windows(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, PRUNED_AGG))
    far = T0 + 10 * 24 * 3600 * 1000  # ten days ahead of the relay's clock
    h.ingest([(S("gpu_util", gpu=str(g), pod="a"), [(far + g * 30_000, 1.0)]) for g in range(50)])
    agg = h.pipeline.stages[0].aggregator
    assert agg is not None
    assert agg.windows() == 0
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="too_far_in_future") == 50


# ---- histograms ---------------------------------------------------------------------------------


def test_histogram_only_series_is_queued(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: d
    url: http://127.0.0.1:1/api/v1/write
    queue: {max_shards: 1}
"""))
    body = _histogram_series(S("rpc_latency", job="x"), T0 + 500)
    result = h.pipeline.ingest(body)
    assert result.histograms == 1
    assert result.kept == [1]
    (payload,) = h.payloads("d")
    req = remote_v1_pb2.WriteRequest.FromString(payload)
    assert [ts.histograms[0].timestamp for ts in req.timeseries] == [T0 + 500]
    q = h.queues["d"]
    assert q is not None
    assert q.depth()[0] == 1
    assert h.value("gpu_relay_samples_kept_total", destination="d") == 1


def test_histograms_of_an_aggregated_series_are_dropped_with_a_counted_reason(
        make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, PRUNED_AGG))
    h.pipeline.ingest(_histogram_series(S("gpu_util", gpu="0"), T0 + 500))
    assert h.payloads("amp") == []
    assert h.value("gpu_relay_samples_dropped_total", destination="amp", reason="aggregate_histogram") == 1


def test_pieces_carry_the_oldest_sample_timestamp(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: d
    url: http://127.0.0.1:1/api/v1/write
    queue: {max_shards: 1}
"""))
    _, per_dest = h.pipeline.route(wire.encode_write_request([
        (S("a"), [(T0 + 5000, 1.0), (T0 + 7000, 1.0)]), (S("b"), [(T0 + 3000, 1.0)])]))
    ((shard, _payload, samples, oldest),) = per_dest[0]
    assert (shard, samples, oldest) == (0, 3, T0 + 3000)


# ---- metadata -----------------------------------------------------------------------------------


def _families(payloads: list[bytes]) -> list[str]:
    out = []
    for p in payloads:
        out.extend(m.metric_family_name for m in remote_v1_pb2.WriteRequest.FromString(p).metadata)
    return out


def _md(*families: str) -> bytes:
    return b"".join(_metadata_entry(f, remote_v1_pb2.MetricMetadata.COUNTER) for f in families)


def test_metadata_goes_only_to_destinations_that_keep_the_family(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, """\
  - name: gpu
    url: http://127.0.0.1:1/api/v1/write
    write_relabel_configs: [{source_labels: [__name__], regex: 'gpu_.*|rpc_seconds_bucket', action: keep}]
    queue: {max_shards: 1}
  - name: all
    url: http://127.0.0.1:1/api/v1/write
    queue: {max_shards: 1}
"""))
    h.ingest([(S("gpu_errors_total"), [(T0, 1.0)]), (S("rpc_seconds_bucket", le="1"), [(T0, 1.0)]),
              (S("rpc_seconds_count"), [(T0, 1.0)]), (S("node_load1"), [(T0, 1.0)])])
    h.pipeline.ingest(_md("gpu_errors", "rpc_seconds", "node_load1", "never_seen"))
    assert _families(h.payloads("gpu")) == ["gpu_errors", "rpc_seconds"]
    assert _families(h.payloads("all")) == ["gpu_errors", "rpc_seconds", "node_load1"]


def test_a_malformed_metadata_entry_is_left_out_and_the_others_kept() -> None:
    # (wire.route may refuse such a request outright; the pipeline's own parsing never forwards it)
    bad = b"\x1a\x03\x08\xff\xff"  # a MetricMetadata whose type varint runs past its end
    good = _md("gpu_errors")
    assert metadata_entries(bad + good) == [("gpu_errors", good, True)]
    assert metadata_entries(b"\x1a\x02\x12\xc3") == []  # a family name that is not UTF-8


def test_no_metadata_for_a_destination_with_send_metadata_false(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, "  - name: d\n    url: http://127.0.0.1:1/api/v1/write\n"))
    # DestinationConfig.send_metadata comes with the config change (interface 4); set it directly
    object.__setattr__(h.pipeline.stages[0].dest, "send_metadata", False)
    h.ingest([(S("gpu_errors_total"), [(T0, 1.0)])], metadata=_md("gpu_errors"))
    assert _families(h.payloads("d")) == []
    assert len(h.payloads("d")) == 1  # the samples still go


# ---- bounded per-name structures ----------------------------------------------------------------


def test_series_limit_metric_label_is_bounded_to_top_names_and_other(make: MakeHarness, tmp_path: Path) -> None:
    from relay.state.cardinality import MAX_LIMIT_METRIC_LABELS

    h = make(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    limits: {max_series: 1}
"""))
    h.ingest([(S("first"), [(T0, 1.0)])])
    names = [f"m{i}" for i in range(MAX_LIMIT_METRIC_LABELS + 40)]
    h.ingest([(S(n), [(T0, 1.0)]) for n in names])
    got = {s.labels["metric"]: s.value for f in h.registry.collect() for s in f.samples
           if s.name == "gpu_relay_series_limit_dropped_total"}
    assert len(got) == MAX_LIMIT_METRIC_LABELS + 1
    assert got["other"] == 40
    assert sum(got.values()) == len(names)


def test_collision_owners_trackers_and_counter_families_expire(tmp_path: Path) -> None:
    config = parse_config(_config(tmp_path, """\
  - name: amp
    url: http://127.0.0.1:1/api/v1/write
    prune_labels: [pod]
    limits: {window: 60s}
"""))
    clock = Clock(T0 / 1000)
    registry = CollectorRegistry()
    stats = [DestinationStats("amp", window_s=60.0, clock=clock)]
    p = Pipeline(config, RelayMetrics(registry), stats, [None], clock=clock)
    p.ingest(wire.encode_write_request([(S("m", gpu=str(g), pod="a"), [(T0, 1.0)]) for g in range(100)],
                                       _md("c1", "c2")))
    assert p.state_sizes() == {"in": 100, "out:amp": 100, "collision_owners:amp": 100,
                               "counter_families": 2, "aggregate_groups:amp": 0}
    clock.t += 59.0
    p.expire()
    assert p.state_sizes()["collision_owners:amp"] == 100  # still inside the window
    clock.t += 62.0
    p.expire()
    assert p.state_sizes() == {"in": 0, "out:amp": 0, "collision_owners:amp": 0,
                               "counter_families": 0, "aggregate_groups:amp": 0}


def test_in_tracker_survives_a_reload_that_adds_a_destination_in_front(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, "  - name: a\n    url: http://127.0.0.1:1/api/v1/write\n"))
    h.ingest([(S("m", gpu=str(g)), [(T0, 1.0)]) for g in range(7)])
    old = h.pipeline
    cfg = parse_config(_config(tmp_path, "  - name: z\n    url: http://127.0.0.1:1/api/v1/write\n"
                                         "  - name: a\n    url: http://127.0.0.1:1/api/v1/write\n"))
    z_stats = DestinationStats("z")
    new = Pipeline(cfg, old.metrics, [z_stats, old.stages[0].stats], [None, old.stages[0].queue],
                   clock=h.clock, previous=old)
    assert z_stats.snapshot()["active_series"]["in"] == 7
    assert new.stages[1].stats.snapshot()["active_series"]["in"] == 7


# ---- concurrency --------------------------------------------------------------------------------


def test_cardinality_snapshot_is_consistent_under_concurrent_ingest(make: MakeHarness, tmp_path: Path) -> None:
    h = make(_config(tmp_path, "  - name: d\n    url: http://127.0.0.1:1/api/v1/write\n    dry_run: true\n"))
    stats = h.pipeline.stages[0].stats
    errors: list[BaseException] = []
    stop = threading.Event()

    def ingest() -> None:
        try:
            for r in range(60):
                h.pipeline.ingest(wire.encode_write_request(
                    [(S(f"m{r % 7}", gpu=str(g), pod=f"p{r}-{g}"), [(T0, 1.0)]) for g in range(200)]))
                stats.record_drop(f"reason{r}", series=0, samples=1)
                h.pipeline.expire()
        except BaseException as e:
            errors.append(e)
        finally:
            stop.set()

    def read() -> None:
        try:
            while not stop.is_set():
                snap = stats.snapshot(limit=1000)
                assert sum(m["series"] for m in snap["top_metrics"]["in"]) == snap["active_series"]["in"]
        except BaseException as e:
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=ingest)] + [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert stats.snapshot()["active_series"]["in"] == 60 * 200


# ---- the fast label decoder of the cold path -------------------------------------------------------


_label_text = st.text(alphabet=st.sampled_from(["a", "b", "_", "0", "\u00e9", "\n"]), max_size=4)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_label_text, _label_text), max_size=5), st.binary(max_size=3), st.booleans())
def test_fast_label_decoder_equals_wire_decode_labels_errors_included(
        pairs: list[tuple[str, str]], junk: bytes, append_junk: bool) -> None:
    raw = _labels_bytes(pairs) + (junk if append_junk else b"")
    try:
        expected: object = wire.decode_labels(raw)
    except wire.WireError as e:
        expected = (e.status, str(e))
    try:
        got: object = pipeline_decode_labels(raw)
    except wire.WireError as e:
        got = (e.status, str(e))
    assert got == expected
    if isinstance(expected, tuple) and expected and isinstance(expected[0], tuple):
        labels, offsets = decode_labels_canonical(raw)
        if offsets is not None:  # claimed canonical: the key is exactly the encoding, entries where said
            assert wire.encode_labels(labels) == raw
            assert offsets == [len(wire.encode_labels(labels[:i])) for i in range(len(labels))]
        elif raw == wire.encode_labels(labels) and all(len(n.encode()) < 100 and len(v.encode()) < 100
                                                        for n, v in labels):
            raise AssertionError("a canonical short key was not recognised")


def test_fast_label_decoder_handles_long_labels_and_invalid_utf8() -> None:
    pairs = [("__name__", "m"), ("long", "x" * 300), ("b", "1")]
    assert pipeline_decode_labels(_labels_bytes(pairs)) == tuple(sorted(pairs))
    bad = wire.encode_label_pair(b"a", b"\xff")
    with pytest.raises(wire.WireError, match="invalid UTF-8"):
        pipeline_decode_labels(bad)
