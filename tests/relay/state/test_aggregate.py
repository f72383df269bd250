from __future__ import annotations

import pytest

from relay.common.labels import Labels, make
from relay.rules.selector import parse_selector
from relay.state.aggregate import OUTPUTS, AggregateRule, Aggregator, format_interval, output_name

GAUGE = "DCGM_FI_DEV_GPU_UTIL"
COUNTER = "DCGM_FI_DEV_XID_ERRORS_total"


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def series(name: str, pod: str, gpu: str = "0") -> Labels:
    return make([("__name__", name), ("gpu", gpu), ("pod", pod), ("container", "main")])


def rule(outputs: tuple[str, ...] = OUTPUTS, **kw: object) -> AggregateRule:
    args: dict[str, object] = {"without": ("pod", "container")}
    args.update(kw)
    return AggregateRule(parse_selector('{__name__=~"DCGM_FI_DEV_.*"}'), 30.0, outputs, **args)  # type: ignore[arg-type]


def by_name(out: list[tuple[Labels, int, float]]) -> dict[str, tuple[int, float]]:
    result = {}
    for labels, ts, value in out:
        name = dict(labels)["__name__"]
        assert name not in result, f"{name} emitted twice in one flush"
        result[name] = (ts, value)
    return result


@pytest.mark.parametrize(("metric", "kw", "output", "expected"), [
    (GAUGE, {"without": ("pod", "container")}, "avg", "DCGM_FI_DEV_GPU_UTIL:30s_without_container_pod_avg"),
    (GAUGE, {"without": ("container", "pod")}, "max", "DCGM_FI_DEV_GPU_UTIL:30s_without_container_pod_max"),
    (GAUGE, {"without": (), "by": ("gpu", "Hostname")}, "sum",
     "DCGM_FI_DEV_GPU_UTIL:30s_by_Hostname_gpu_sum"),
    (GAUGE, {"without": ()}, "last", "DCGM_FI_DEV_GPU_UTIL:30s_last"),
    (COUNTER, {"without": ("pod",)}, "total", "DCGM_FI_DEV_XID_ERRORS_total:30s_without_pod_total"),
])
def test_output_name_follows_vmagent_naming(metric: str, kw: dict[str, tuple[str, ...]], output: str,
                                            expected: str) -> None:
    assert output_name(metric, rule(**kw), output) == expected


@pytest.mark.parametrize(("seconds", "text"), [(30, "30s"), (60, "1m"), (90, "1m30s"), (3600, "1h"),
                                               (0.5, "500ms"), (7260, "2h1m")])
def test_format_interval_writes_go_durations(seconds: float, text: str) -> None:
    assert format_interval(seconds) == text


@pytest.mark.parametrize(("kw", "message"), [
    ({"without": ("pod",), "by": ("gpu",)}, "both"),
    ({"outputs": ("median",)}, "unknown aggregate outputs"),
    ({"outputs": ()}, "no outputs"),
    ({"interval_s": 0.0}, "positive"),
    ({"without": ("__name__",)}, "__name__"),
])
def test_invalid_rule_is_rejected(kw: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"match": parse_selector("{}"), "interval_s": 30.0, "outputs": ("avg",)}
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        AggregateRule(**args)  # type: ignore[arg-type]


def test_route_drops_without_labels_and_keeps_metric_name() -> None:
    agg = Aggregator([rule()])
    assert agg.route(series(GAUGE, "a")) == (0, make([("__name__", GAUGE), ("gpu", "0")]))
    assert agg.route(make([("__name__", "node_load1"), ("pod", "a")])) is None


def test_route_with_by_keeps_only_by_labels_and_name() -> None:
    agg = Aggregator([rule(without=(), by=("gpu",))])
    assert agg.route(series(GAUGE, "a", gpu="3")) == (0, make([("__name__", GAUGE), ("gpu", "3")]))


def test_route_picks_first_matching_rule() -> None:
    first = AggregateRule(parse_selector(f"{GAUGE}"), 60.0, ("max",), without=("pod",))
    agg = Aggregator([first, rule()])
    assert agg.route(series(GAUGE, "a"))[0] == 0  # type: ignore[index]
    assert agg.route(series("DCGM_FI_DEV_FB_USED", "a"))[0] == 1  # type: ignore[index]


def test_gauge_outputs_over_three_windows_with_late_sample() -> None:
    clock = Clock()
    agg = Aggregator([rule()], clock=clock)
    ga, gb = series(GAUGE, "a"), series(GAUGE, "b")
    r, group = agg.route(ga)  # type: ignore[misc]
    assert agg.route(gb) == (r, group)
    # window [0, 30s): a = 1 then 3, b = 5
    agg.add(r, group, 1, [(10_000, 1.0), (25_000, 3.0)], False)
    agg.add(r, group, 2, [(15_000, 5.0)], False)
    assert agg.flush(29_999) == []  # not closed yet
    w1 = by_name(agg.flush(30_000))
    base = "DCGM_FI_DEV_GPU_UTIL:30s_without_container_pod_"
    assert w1 == {
        base + "sum": (30_000, 8.0),  # latest of a (3) + latest of b (5)
        base + "avg": (30_000, 3.0),  # (1 + 3 + 5) / 3
        base + "min": (30_000, 1.0),
        base + "max": (30_000, 5.0),
        base + "count_series": (30_000, 2.0),
        base + "last": (30_000, 3.0),  # a@25s is the newest sample
    }
    # window [30s, 60s): a = 2, b = 4
    agg.add(r, group, 1, [(40_000, 2.0)], False)
    agg.add(r, group, 2, [(45_000, 4.0)], False)
    w2 = by_name(agg.flush(60_000))
    assert w2[base + "sum"] == (60_000, 6.0)
    assert w2[base + "avg"] == (60_000, 3.0)
    assert w2[base + "last"] == (60_000, 4.0)
    # late: a@50s arrives after [30s, 60s) closed -> counted in [60s, 90s), never emitted at 60s again
    agg.add(r, group, 1, [(50_000, 10.0)], False)
    agg.add(r, group, 2, [(70_000, 6.0)], False)
    w3 = by_name(agg.flush(90_000))
    assert w3 == {
        base + "sum": (90_000, 16.0),
        base + "avg": (90_000, 8.0),
        base + "min": (90_000, 6.0),
        base + "max": (90_000, 10.0),
        base + "count_series": (90_000, 2.0),
        base + "last": (90_000, 6.0),  # b@70s is newer than the late a@50s
    }


def test_output_labels_replace_name_and_keep_group_labels() -> None:
    agg = Aggregator([rule(("avg",))])
    r, group = agg.route(series(GAUGE, "a", gpu="7"))  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, 2.0)], False)
    name = "DCGM_FI_DEV_GPU_UTIL:30s_without_container_pod_avg"
    assert agg.flush(30_000) == [(make([("__name__", name), ("gpu", "7")]), 30_000, 2.0)]


def test_counter_total_is_cumulative_and_handles_reset_and_late_sample() -> None:
    agg = Aggregator([rule(("total", "count_series", "avg"))], clock=Clock())
    r, group = agg.route(series(COUNTER, "a"), is_counter=True)  # type: ignore[misc]
    name = "DCGM_FI_DEV_XID_ERRORS_total:30s_without_container_pod_total"
    count = "DCGM_FI_DEV_XID_ERRORS_total:30s_without_container_pod_count_series"
    agg.add(r, group, 1, [(10_000, 5.0), (20_000, 8.0)], True)
    agg.add(r, group, 2, [(15_000, 100.0)], True)
    w1 = by_name(agg.flush(30_000))
    # first samples count in full: 5 + (8 - 5) + 100; avg is not emitted for counters
    assert w1 == {name: (30_000, 108.0), count: (30_000, 2.0)}
    agg.add(r, group, 1, [(40_000, 2.0)], True)  # reset 8 -> 2: increase is 2
    agg.add(r, group, 2, [(45_000, 110.0)], True)  # +10
    assert by_name(agg.flush(60_000))[name] == (60_000, 120.0)
    agg.add(r, group, 1, [(50_000, 4.0)], True)  # late (window closed), newer than 40s: +2 next window
    agg.add(r, group, 1, [(30_000, 1.0)], True)  # older than what series 1 already gave: ignored
    w3 = by_name(agg.flush(90_000))
    assert w3[name] == (90_000, 122.0)
    assert w3[count] == (90_000, 1.0)


def test_counter_gets_total_even_when_not_listed() -> None:
    agg = Aggregator([rule(("avg", "max"))])
    r, group = agg.route(series(COUNTER, "a"))  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, 3.0)], True)
    assert [dict(lb)["__name__"] for lb, _, _ in agg.flush(30_000)] == [
        "DCGM_FI_DEV_XID_ERRORS_total:30s_without_container_pod_total"]


def test_total_is_not_emitted_for_gauges() -> None:
    agg = Aggregator([rule(("total", "max"))])
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, 3.0)], False)
    assert [dict(lb)["__name__"] for lb, _, _ in agg.flush(30_000)] == [
        "DCGM_FI_DEV_GPU_UTIL:30s_without_container_pod_max"]


def test_outputs_never_go_back_in_time_per_series() -> None:
    agg = Aggregator([rule(("last",))])
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    emitted: list[int] = []
    for step in range(6):
        now = (step + 1) * 30_000
        agg.add(r, group, 1, [(now - 31_000, float(step)), (now - 1_000, float(step))], False)  # 1 late
        emitted += [ts for _, ts, _ in agg.flush(now)]
    assert emitted == sorted(set(emitted))
    assert emitted[-1] == 180_000


def test_samples_ahead_of_flush_wait_for_their_window() -> None:
    agg = Aggregator([rule(("max",))])
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    agg.add(r, group, 1, [(10_000, 1.0), (70_000, 9.0)], False)
    assert [(ts, v) for _, ts, v in agg.flush(30_000)] == [(30_000, 1.0)]
    assert agg.flush(80_000) == []  # [60s, 90s) is still open
    assert [(ts, v) for _, ts, v in agg.flush(90_000)] == [(90_000, 9.0)]


def test_nan_samples_are_ignored() -> None:
    agg = Aggregator([rule(("avg",))])
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, float("nan")), (2_000, 4.0)], False)
    assert [v for _, _, v in agg.flush(30_000)] == [4.0]


def test_idle_group_state_is_dropped_after_staleness() -> None:
    clock = Clock(0.0)
    agg = Aggregator([rule(("avg",))], clock=clock)
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, 4.0)], False)
    clock.t = 30.0
    agg.flush(30_000)
    assert agg.groups() == 1  # within 2 intervals
    clock.t = 61.0
    assert agg.flush(60_000) == []
    assert agg.groups() == 0


def test_a_resent_sample_of_a_member_counts_once_for_gauges_too() -> None:
    agg = Aggregator([rule(("avg", "sum", "count_series"))], clock=Clock(0.0))
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, 10.0), (2_000, 20.0)], False)
    agg.add(r, group, 2, [(1_000, 30.0)], False)
    agg.add(r, group, 1, [(1_000, 10.0), (2_000, 20.0)], False)  # the same request again
    out = by_name(agg.flush(30_000))
    assert out[f"{GAUGE}:30s_without_container_pod_avg"] == (30_000, 20.0)
    assert out[f"{GAUGE}:30s_without_container_pod_sum"] == (30_000, 50.0)
    assert out[f"{GAUGE}:30s_without_container_pod_count_series"] == (30_000, 2.0)


def test_two_members_of_one_group_are_never_read_as_resets_of_each_other() -> None:
    agg = Aggregator([rule(("total",))], clock=Clock(0.0))
    r, group = agg.route(series(COUNTER, "a"), is_counter=True)  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, 100.0)], True)
    agg.add(r, group, 2, [(1_000, 5.0)], True)
    agg.add(r, group, 1, [(31_000, 110.0)], True)
    agg.add(r, group, 2, [(31_000, 7.0)], True)
    assert [v for _, _, v in agg.flush(60_000)] == [105.0, 117.0]


def test_samples_too_far_in_the_future_are_refused_and_open_no_window() -> None:
    clock = Clock(1000.0)
    agg = Aggregator([rule(("max",))], clock=clock, max_future_s=600.0)
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    assert agg.add(r, group, 1, [(1_600_000 + 1, 1.0)], False) == 1
    assert (agg.groups(), agg.windows()) == (0, 0)
    assert agg.add(r, group, 1, [(1_600_000, 2.0), (9_000_000, 3.0)], False) == 1
    assert agg.windows() == 1


def test_flush_without_a_time_emits_every_open_window() -> None:
    agg = Aggregator([rule(("max",))], clock=Clock(0.0))
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    agg.add(r, group, 1, [(1_000, 1.0), (31_000, 2.0), (61_000, 3.0)], False)
    assert [(ts, v) for _, ts, v in agg.flush()] == [(30_000, 1.0), (60_000, 2.0), (90_000, 3.0)]
    assert agg.windows() == 0


def test_members_that_stopped_are_forgotten_after_staleness() -> None:
    clock = Clock(0.0)
    agg = Aggregator([rule(("max",))], clock=clock)
    r, group = agg.route(series(GAUGE, "a"))  # type: ignore[misc]
    for member in range(100):
        agg.add(r, group, member, [(1_000, 1.0)], False)
    agg.add(r, group, 1000, [(91_000, 1.0)], False)
    assert agg.members() == 101
    agg.flush(120_000)  # closed until 120 s; staleness 2 intervals: members last seen before 60 s go
    assert agg.members() == 1
