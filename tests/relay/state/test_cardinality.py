from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from relay.common.labels import Labels, make
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.series_tracker import SeriesTracker


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lbl(metric: str, **kw: str) -> Labels:
    return make([("__name__", metric), *kw.items()])


def tracker(clock: Clock, window: float = 60.0, **kw: int) -> SeriesTracker:
    return SeriesTracker(window, clock, **kw)  # 60 slots of 1 s


def test_observe_reports_new_once_and_counts_per_metric() -> None:
    t = tracker(Clock())
    assert t.observe(1, "a") is True
    assert t.observe(1, "a") is False
    assert t.observe(2, "a") is True
    assert t.observe(3, "b") is True
    assert t.active() == 3
    assert [t.active_for_metric(m) for m in "abc"] == [2, 1, 0]
    assert t.contains(2) and not t.contains(9)


def test_top_metrics_sorted_by_series_then_name() -> None:
    t = tracker(Clock())
    for i, m in enumerate(["x", "y", "y", "z", "z", "z", "w"]):
        t.observe(i, m)
    assert t.top_metrics(3) == [("z", 3), ("y", 2), ("w", 1)]
    assert t.top_metrics(0) == []


def test_series_expires_after_window_without_samples() -> None:
    clock = Clock()
    t = tracker(clock)
    t.observe(1, "a")
    t.observe(2, "a")
    clock.t += 30
    t.observe(2, "a")  # refreshed
    clock.t += 31  # series 1 last seen 61 s ago: one slot past the window
    assert t.expire() == 1
    assert (t.active(), t.active_for_metric("a"), t.contains(1), t.contains(2)) == (1, 1, False, True)
    clock.t += 31
    assert t.expire() == 1
    assert (t.active(), t.top_metrics(5)) == (0, [])


def test_series_within_window_is_not_expired() -> None:
    clock = Clock()
    t = tracker(clock)
    t.observe(1, "a")
    clock.t += 59.5
    assert t.expire() == 0
    assert t.contains(1)


def test_series_out_of_window_is_new_again_before_sweep() -> None:
    clock = Clock()
    t = tracker(clock)
    t.observe(1, "a")
    clock.t += 120
    assert t.contains(1) is False
    assert t.observe(1, "a") is True
    assert t.active_for_metric("a") == 1


def test_top_labels_counts_distinct_values_per_label() -> None:
    t = tracker(Clock())
    for i in range(6):
        t.observe(i, "gpu_util", lbl("gpu_util", gpu=str(i % 3), pod=f"p{i}", node="n1"))
    t.observe(10, "fb_used", lbl("fb_used", gpu="7", pod="p0"))
    assert t.top_labels(10, "gpu_util") == [("pod", 6), ("gpu", 3), ("node", 1)]
    assert t.top_labels(2) == [("pod", 6), ("gpu", 4)]  # union across metrics: gpu 0,1,2,7
    assert t.top_labels(5, "missing") == []


def test_label_values_expire_with_the_window_and_refresh_when_supplied() -> None:
    clock = Clock()
    t = tracker(clock)
    t.observe(1, "m", lbl("m", pod="a"))
    t.observe(2, "m", lbl("m", pod="b"))
    clock.t += 40
    t.observe(2, "m", lbl("m", pod="b"))  # labels supplied again
    clock.t += 25
    t.expire()
    assert t.top_labels(5, "m") == [("pod", 1)]


def test_wants_labels_for_unknown_series_and_after_half_window() -> None:
    clock = Clock()
    t = tracker(clock)
    assert t.wants_labels(1)
    t.observe(1, "m")  # no labels yet
    assert t.wants_labels(1)
    t.observe(1, "m", lbl("m", pod="a"))
    assert not t.wants_labels(1)
    clock.t += 29
    t.observe(1, "m")
    assert not t.wants_labels(1)
    clock.t += 2
    assert t.wants_labels(1)


def test_label_values_are_capped_per_label() -> None:
    t = tracker(Clock(), max_values=3)
    for i in range(5):
        t.observe(i, "m", lbl("m", pod=f"p{i}", gpu="0"))
    assert t.top_labels(5, "m") == [("pod", 3), ("gpu", 1)]
    assert t.capped_labels() == [("m", "pod")]


def test_expire_returns_memory_by_rebuilding_a_shrunk_table() -> None:
    clock = Clock()
    t = tracker(clock)
    for i in range(1000):
        t.observe(i, "m")
    clock.t += 30
    for i in range(100):
        t.observe(i, "m")
    clock.t += 31
    assert t.expire() == 900
    assert t.active() == 100
    assert all(t.contains(i) for i in range(100))


def test_invalid_window_is_rejected() -> None:
    with pytest.raises(ValueError, match="positive"):
        SeriesTracker(0.0)


def test_snapshot_reports_series_labels_drops_rates_and_cost() -> None:
    clock = Clock(1000.0)
    stats = DestinationStats("amp", window_s=60.0, clock=clock)
    for i in range(4):
        stats.tracker_in.observe(i, "gpu_util", lbl("gpu_util", gpu=str(i), pod=f"p{i}"))
    out = "gpu_util:30s_without_pod_avg"
    stats.tracker_out.observe(100, out, lbl(out, gpu="0"))
    stats.record_samples(600, 60)
    clock.t += 60
    stats.record_samples(600, 60)  # the first second's bucket is now a minute old
    stats.record_drop("collision", 2)
    stats.record_drop("label_value_too_long", series=1, samples=5)
    snap = stats.snapshot(limit=1)
    json.dumps(snap)
    assert snap["destination"] == "amp"
    assert snap["active_series"] == {"in": 4, "out": 1}
    assert snap["top_metrics"]["in"] == [{"metric": "gpu_util", "series": 4}]
    assert snap["top_labels"]["in"] == [{"label": "gpu", "distinct_values": 4}]  # gpu 4 ties pod 4: by name
    assert snap["dropped"] == {"collision": {"series": 2, "samples": 0},
                               "label_value_too_long": {"series": 1, "samples": 5}}
    assert snap["samples_per_second"] == {"in": 10.0, "out": 1.0}
    assert snap["estimated_cost"]["samples_per_second"] == 1.0
    assert snap["estimated_cost_without_rules"]["samples_per_second"] == 10.0
    assert snap["estimated_cost"]["price_table"]["storage_usd_per_gb_month"] == 0.03


def test_rates_use_elapsed_time_before_a_minute_has_passed() -> None:
    clock = Clock(1000.0)
    stats = DestinationStats("amp", clock=clock)
    stats.record_samples(100, 50)
    clock.t += 10
    assert stats.snapshot()["samples_per_second"] == {"in": 10.0, "out": 5.0}


def test_metrics_expose_active_series_and_drops() -> None:
    registry = CollectorRegistry()
    metrics = CardinalityMetrics(registry)
    stats = DestinationStats("amp", clock=Clock(), metrics=metrics)
    stats.tracker_in.observe(1, "m")
    stats.tracker_in.observe(2, "m")
    stats.tracker_out.observe(1, "m")
    stats.record_drop("collision", 3)
    metrics.on_limit_drop("amp")("m", "max_series")
    text = generate_latest(registry).decode()
    assert 'gpu_relay_active_series{destination="amp",direction="in"} 2.0' in text
    assert 'gpu_relay_active_series{destination="amp",direction="out"} 1.0' in text
    assert 'gpu_relay_series_dropped_total{destination="amp",reason="collision"} 3.0' in text
    assert 'gpu_relay_series_limit_dropped_total{destination="amp",limit="max_series",metric="m"} 1.0' in text
    metrics.untrack("amp")
    assert "gpu_relay_active_series{" not in generate_latest(registry).decode()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from("abc"), st.integers(0, 30), st.booleans()),
                max_size=120))
def test_tracker_matches_a_naive_model_of_last_seen_times(steps: list[tuple[int, str, int, bool]]) -> None:
    clock = Clock(0.0)
    t = tracker(clock)  # 60 s window, 1 s slots
    last: dict[int, tuple[str, int]] = {}  # series -> (metric, slot last seen)
    for sid, metric, advance, sweep in steps:
        clock.t += advance
        gen = int(clock.t)
        was_active = sid in last and gen - last[sid][1] <= 60
        assert t.observe(sid, metric) is (not was_active)
        last[sid] = (last[sid][0] if was_active else metric, gen)
        if sweep:
            t.expire()
            last = {s: v for s, v in last.items() if v[1] >= gen - 60}
            assert t.active() == len(last)
            for m in "abc":
                assert t.active_for_metric(m) == sum(1 for v in last.values() if v[0] == m)


def test_observe_many_matches_observe_one_by_one() -> None:
    now = [0.0]
    a = SeriesTracker(window_s=600, clock=lambda: now[0])
    b = SeriesTracker(window_s=600, clock=lambda: now[0])
    batches = [[(1, "m"), (2, "m"), (3, "n")], [(1, "m"), (4, "n")], [(2, "m")], [(5, "m"), (1, "m")]]
    for step, batch in enumerate(batches):
        now[0] = step * 400.0  # crosses slots and lets series leave the window
        a.observe_many(batch)
        for sid, metric in batch:
            b.observe(sid, metric)
        assert a.active() == b.active()
        assert a.top_metrics(5) == b.top_metrics(5)
        assert all(a.contains(s) == b.contains(s) for s in range(1, 6))
    now[0] = 5000.0
    assert a.expire() == b.expire()
    assert a.active() == b.active() == 0


def test_observe_batch_returns_first_sights_and_asks_labels_only_when_due() -> None:
    clock = Clock(0.0)
    t = tracker(clock)  # 60 slots of 1 s: labels are due again after 30 slots
    asked: list[int] = []

    def labels_of(i: int) -> Labels:
        asked.append(i)
        return lbl("m", pod=f"p{i}")

    assert t.observe_batch([(1, "m"), (2, "m"), (1, "m")], labels_of) == [0, 1]
    assert asked == [0, 1]
    asked.clear()
    for step in range(1, 29):
        clock.t = float(step)
        assert t.observe_batch([(1, "m"), (2, "m")], labels_of) == []
    assert asked == []
    clock.t = 30.0
    t.observe_batch([(1, "m"), (2, "m")], labels_of)
    assert asked == [0, 1]


def test_label_values_of_a_stable_series_stay_counted_past_the_window() -> None:
    clock = Clock(0.0)
    t = tracker(clock)
    for step in range(0, 200, 5):  # seen every 5 s for over three windows, labels never change
        clock.t = float(step)
        t.observe_batch([(1, "m")], lambda i: lbl("m", pod="a", gpu="0"))
        t.expire()
    assert t.top_labels(5, "m") == [("gpu", 1), ("pod", 1)]


def test_series_limit_metric_label_is_bounded() -> None:
    from relay.state.cardinality import MAX_LIMIT_METRIC_LABELS

    registry = CollectorRegistry()
    cm = CardinalityMetrics(registry)
    on_drop = cm.on_limit_drop("amp")
    for i in range(MAX_LIMIT_METRIC_LABELS + 5):
        on_drop(f"m{i}", "max_series")
    on_drop("m0", "max_series")  # a name that has its label keeps it
    values = {s.labels["metric"]: s.value for f in registry.collect() for s in f.samples
              if s.name == "gpu_relay_series_limit_dropped_total"}
    assert len(values) == MAX_LIMIT_METRIC_LABELS + 1
    assert (values["m0"], values["other"]) == (2.0, 5.0)
