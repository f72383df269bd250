"""relay.native._cstage (issue 9): the C per-series state and stage loop against the pure-Python reference.

Differential: the same random sequences (series repeating and new, labels in another order, a fake
clock that expires them, prune collisions, limits hit, aggregation, drops by rules and by AMP checks)
drive a Pipeline built on the C code and one built on the reference; queue pieces, counters, reports
and state sizes must be identical. The C table itself is tested against a dict model. Runs whenever
the extension is built; skipped only when the native core is off (GPU_RELAY_NATIVE=0) or not built.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from relay import native
from relay.common.labels import Labels
from relay.common.metrics import RelayMetrics
from relay.config.config import parse_config
from relay.ingest import wire
from relay.state import series_tracker
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.pipeline import Pipeline
from relay.state.series_tracker import CSeriesTracker

_c = native.load("cstage")
pytestmark = pytest.mark.skipif(_c is None, reason="relay.native._cstage not in use (GPU_RELAY_NATIVE=0 or not built)")

U64 = (1 << 64) - 1


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextmanager
def reference() -> Iterator[None]:
    """SeriesTracker() builds the dict reference while inside."""
    saved = series_tracker._NATIVE
    series_tracker._NATIVE = None
    try:
        yield
    finally:
        series_tracker._NATIVE = saved


# ---- the C table ---------------------------------------------------------------------------------

def test_table_keeps_ids_zero_and_max_like_any_other() -> None:
    assert _c is not None
    t = _c.Table()
    for k, v in ((0, 7), (U64, 8), (1, 9)):
        t.put(k, v)
    assert len(t) == 3 and t.get(0) == 7 and t.get(U64) == 8 and t.get(1) == 9
    assert 0 in t and U64 in t and 2 not in t
    assert sorted(t.items()) == [(0, 7), (1, 9), (U64, 8)]
    assert t.delete(0) and not t.delete(0) and t.get(0) is None and len(t) == 2
    assert t.delete(U64) and t.get(U64) is None and t.get(1) == 9
    t.check()


def test_table_refuses_ids_outside_64_bits_and_finds_none_of_them() -> None:
    assert _c is not None
    t = _c.Table()
    with pytest.raises(OverflowError):
        t.put(1 << 64, 1)
    with pytest.raises(OverflowError):
        t.put(-1, 1)
    with pytest.raises(TypeError):
        t.put("1", 1)
    assert t.get(-1) is None and (1 << 64) not in t and "x" not in t and len(t) == 0


def test_table_grows_past_its_load_limit_and_shrinks_after_removals() -> None:
    assert _c is not None
    t = _c.Table()
    keys = [random.Random(1).getrandbits(64) for _ in range(1)] + list(range(1, 20_000))
    for i, k in enumerate(keys):
        t.put(k, i)
    t.check()
    grown = t.capacity()
    assert len(t) == len(keys) and len(keys) * 20 <= grown * 17 < len(keys) * 25  # load in [0.68, 0.85]
    assert all(t.get(k) == i for i, k in enumerate(keys))
    # remove_below: mostly dead (the survivors are copied into a right-sized table)
    assert t.remove_below(19_900) == 19_900
    t.check()
    assert len(t) == 100 and t.capacity() < grown // 10
    assert all(t.get(k) == i for i, k in enumerate(keys) if i >= 19_900)
    assert all(t.get(k) is None for k in keys[:19_900])


def test_table_load_stays_within_0_68_and_0_85_as_it_grows() -> None:
    """Growth x1.25 past 85 %: at every size from 100 keys on, 0.68 <= load <= 0.85, about 0.76 on
    average (the bytes a series costs: 12 / load)."""
    assert _c is not None
    t = _c.Table()
    rnd = random.Random(3)
    loads = []
    for i in range(1, 60_001):
        t.put(rnd.getrandbits(64) | 1, i)
        if i >= 100 and i % 37 == 0:
            loads.append(i / t.capacity())
    t.check()
    assert min(loads) >= 0.68 and max(loads) <= 0.85
    assert 0.74 <= sum(loads) / len(loads) <= 0.78


def test_table_past_a_mebibyte_grows_shrinks_and_frees_through_its_own_mappings() -> None:
    """Tables of 1 MiB and more are mmap'd: growth into one, removals in place, a shrink back to the
    heap, and a table freed while mapped."""
    assert _c is not None
    rnd = random.Random(7)
    keys = list({rnd.getrandbits(64) | 1 for _ in range(150_000)})
    t = _c.Table()
    for i, k in enumerate(keys):
        t.put(k, i)
    assert t.capacity() * 12 >= 1 << 20
    t.check()
    assert len(t) == len(keys) and all(t.get(k) == i for i, k in enumerate(keys))
    assert t.remove_below(len(keys) // 10) == len(keys) // 10  # few dead: deleted in place
    t.check()
    assert all(t.get(k) == (i if i >= len(keys) // 10 else None) for i, k in enumerate(keys))
    assert t.remove_below(len(keys) - 50) == len(keys) - 50 - len(keys) // 10  # mostly: copied
    t.check()
    assert len(t) == 50 and t.capacity() * 12 < 1 << 20
    assert all(t.get(k) == i for i, k in enumerate(keys) if i >= len(keys) - 50)
    big = _c.Table()
    for k in keys:
        big.put(k, 1)
    del big  # freed while mapped


def test_table_with_many_keys_sharing_a_home_bucket() -> None:
    """Long probe chains: deleting from the middle of a cluster must keep the rest reachable."""
    assert _c is not None
    t = _c.Table()
    # capacity 8: only 8 home buckets, so these 6 keys form clusters that wrap around the end
    keys = [3, 5, 0xFFFF_FFFF_FFFF_FFFE, 1 << 63, 12345, 99]
    for k in keys:
        t.put(k, k & 0xFFFF)
    assert t.capacity() == 8
    left = list(keys)
    for k in (5, 1 << 63, 3, 99):
        assert t.delete(k)
        left.remove(k)
        t.check()
        assert all(t.get(x) == x & 0xFFFF for x in left) and t.get(k) is None
    for k in range(100, 130):  # regrow from there
        t.put(k, 1)
    t.check()
    assert all(t.get(x) == x & 0xFFFF for x in left)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "delete", "get", "remove_below"]),
                          st.one_of(st.integers(0, 40), st.sampled_from([0, U64, U64 - 1, 1 << 63]),
                                    st.integers(0, U64)),
                          st.integers(0, 1000)), max_size=200))
def test_table_matches_a_dict(ops: list[tuple[str, int, int]]) -> None:
    assert _c is not None
    t = _c.Table()
    model: dict[int, int] = {}
    for op, k, v in ops:
        if op == "put":
            t.put(k, v)
            model[k] = v
        elif op == "delete":
            assert t.delete(k) == (model.pop(k, None) is not None)
        elif op == "get":
            assert t.get(k) == model.get(k)
        else:
            dead = [x for x, y in model.items() if y < v]
            assert t.remove_below(v) == len(dead)
            for x in dead:
                del model[x]
        t.check()
        assert len(t) == len(model)
    assert sorted(t.items()) == sorted(model.items())


# ---- the tracker ---------------------------------------------------------------------------------

METRICS = ["m_a", "m_b", "x_total"]


def _labels(i: int, metric: str) -> Labels:
    return tuple(sorted([("__name__", metric), ("gpu", str(i % 3)), ("pod", f"p{i % 5}"), ("uid", f"u{i}")]))


def _report(t: series_tracker.SeriesTracker, ids: list[int]) -> dict[str, Any]:
    has = t.has()
    return {
        "active": t.active(),
        "per_metric": [t.active_for_metric(m) for m in [*METRICS, "nope"]],
        "top_metrics": t.top_metrics(10),
        "top_labels": t.top_labels(10),
        "top_labels_m": [t.top_labels(10, m) for m in METRICS],
        "top_labels_1": t.top_labels(1),
        "capped": t.capped_labels(),
        "contains": [t.contains(i) for i in ids],
        "has": [has(i) for i in ids],
        "wants": [t.wants_labels(i) for i in ids],
    }


_ids = st.one_of(st.integers(0, 30), st.sampled_from([0, U64, 1 << 63]))
_tracker_op = st.one_of(
    st.tuples(st.just("observe"), _ids, st.sampled_from(METRICS), st.booleans()),
    st.tuples(st.just("batch"), st.lists(st.tuples(_ids, st.sampled_from(METRICS)), max_size=12)),
    st.tuples(st.just("inputs"), st.lists(st.tuples(_ids, st.sampled_from(METRICS)), max_size=12)),
    st.tuples(st.just("many"), st.lists(st.tuples(_ids, st.sampled_from(METRICS)), max_size=12)),
    st.tuples(st.just("advance"), st.floats(0, 80)),
    st.tuples(st.just("expire")),
    # 2**16 slots and about: label values keep their slot mod 2**16 (the base sweeps them forward)
    st.tuples(st.just("leap"), st.sampled_from([65_535, 65_536, 65_570, 131_072])),
    # label values whose hashes agree in the 48 bits kept (and key 0, negative hashes)
    st.tuples(st.just("hashed"), _ids, st.sampled_from(METRICS),
              st.sampled_from([0, 1 << 47, 1 << 48, 5, 5 + (1 << 47), 5 + (1 << 48), 5 + (1 << 59), -2,
                               (1 << 48) - 2, (1 << 63) - 1])),
)


class _Hashed:
    """A label value with a chosen hash."""

    def __init__(self, h: int) -> None:
        self.h = h

    def __hash__(self) -> int:
        return self.h


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_tracker_op, max_size=40), st.sampled_from([2, 3, 100]), st.sampled_from([60, 7]))
def test_tracker_matches_the_reference(ops: list[tuple[Any, ...]], max_values: int, slots: int) -> None:
    clock = Clock()
    c = CSeriesTracker(60.0, clock, slots=slots, max_values=max_values)
    with reference():
        p = series_tracker.SeriesTracker(60.0, clock, slots=slots, max_values=max_values)
    assert type(p) is not CSeriesTracker
    ids = sorted({0, 1, 5, 17, U64, 1 << 63})
    for op in ops:
        asked: list[list[Any]] = [[], []]
        for k, t in enumerate((c, p)):
            log = asked[k]
            if op[0] == "observe":
                _, sid, metric, with_labels = op
                log.append(t.observe(sid, metric, _labels(sid, metric) if with_labels else None))
            elif op[0] == "batch":
                log.append(t.observe_batch(op[1], _asking(log, op[1])))
            elif op[0] == "inputs":
                inputs = [((_key(sid, m), sid, m), b"", 1, 0) for sid, m in op[1]]
                log.append(t.observe_inputs(inputs, _asking_key(log)))
            elif op[0] == "many":
                t.observe_many(list(op[1]))
            elif op[0] == "expire":
                log.append(t.expire())
            elif op[0] == "hashed":
                _, sid, metric, h = op
                labels: Any = (("__name__", metric), ("uid", _Hashed(h)))
                log.append(t.observe(sid, metric, labels))
            elif op[0] == "leap":
                if k == 0:
                    clock.t += op[1] * 60.0 / slots
            elif k == 0:
                clock.t += op[1]
        assert asked[0] == asked[1], op
        assert _report(c, ids) == _report(p, ids), op


def _asking(log: list[Any], items: list[tuple[int, str]]) -> Callable[[int], Labels]:
    """labels_of for observe_batch that records which items were asked for."""
    def labels_of(i: int) -> Labels:
        log.append(i)
        return _labels(items[i][0], items[i][1])
    return labels_of


def _asking_key(log: list[Any]) -> Callable[[bytes], Labels]:
    def labels_of(key: bytes) -> Labels:
        log.append(key)
        return _unkey(key)
    return labels_of


def _key(sid: int, metric: str) -> bytes:
    return f"{sid}/{metric}".encode()


def _unkey(key: bytes) -> Labels:
    sid, metric = key.decode().split("/")
    return _labels(int(sid), metric)


def test_tracker_refuses_ids_outside_64_bits() -> None:
    t = CSeriesTracker(60.0, Clock())
    with pytest.raises(OverflowError):
        t.observe(-1, "m")
    with pytest.raises(OverflowError):
        t.observe(1 << 64, "m")
    assert not t.contains(-1) and not t.has()(1 << 64) and t.wants_labels(-1)


def test_tracker_labels_of_failing_leaves_the_same_state_as_the_reference() -> None:
    clock = Clock()
    c = CSeriesTracker(60.0, clock)
    with reference():
        p = series_tracker.SeriesTracker(60.0, clock)

    def boom(i: int) -> Labels:
        if i == 2:
            raise KeyError("labels")
        return _labels(i, "m_a")

    for t in (c, p):
        with pytest.raises(KeyError):
            t.observe_batch([(0, "m_a"), (1, "m_a"), (2, "m_a"), (3, "m_a")], boom)
    assert _report(c, [0, 1, 2, 3]) == _report(p, [0, 1, 2, 3])


def test_tracker_expire_frees_slots_and_metrics_and_keeps_counting_right() -> None:
    clock = Clock()
    t = CSeriesTracker(60.0, clock)
    for i in range(5000):
        t.observe(i, f"m{i % 50}", _labels(i, f"m{i % 50}"))
    before = t.table_bytes()
    clock.t += 30
    t.observe_batch([(i, f"m{i % 50}") for i in range(100)], lambda i: _labels(i, f"m{i % 50}"))
    clock.t += 31
    assert t.expire() == 4900
    assert t.active() == 100 and t.table_bytes() < before / 4
    assert sum(n for _, n in t.top_metrics(100)) == 100
    clock.t += 61
    assert t.expire() == 100 and t.active() == 0 and t.top_metrics(5) == [] and t.top_labels(5) == []
    t.observe(7, "m7")  # metric indexes and slots freed above are reused
    assert t.active_for_metric("m7") == 1 and t.contains(7)


# ---- the pipeline: C and reference side by side ------------------------------------------------

CONFIGS = {
    "pass-through+external labels": """\
external_labels: {cluster: c}
destinations:
  - name: e
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    queue: {max_shards: 3}
""",
    "pass-through+limits": """\
external_labels: {cluster: c}
destinations:
  - name: a
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    queue: {max_shards: 3}
    limits: {max_series: 6, window: 60s}
""",
    "keep+prune+per-metric": """\
destinations:
  - name: b
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    write_relabel_configs:
      - {source_labels: [__name__], regex: 'm_a|x_total', action: keep}
    prune_labels: [pod]
    queue: {max_shards: 2}
    limits: {max_series_per_metric: 3, window: 60s}
""",
    "aggregate+two-destinations": """\
external_labels: {cluster: c, zone: z1}
destinations:
  - name: c
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    prune_labels: [uid]
    limits: {window: 60s}
    aggregate:
      - match: '{__name__="m_b"}'
        without: [gpu]
        interval: 30s
        outputs: [sum, count_series]
      - match: '{__name__="x_total"}'
        without: [gpu, pod]
        interval: 30s
        outputs: [total]
  - name: d
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    write_relabel_configs:
      - {source_labels: [gpu], regex: '2', action: drop}
    queue: {max_shards: 4}
    limits: {max_series: 20, window: 60s}
""",
}


def _pipeline(text: str, clock: Clock) -> tuple[Pipeline, CollectorRegistry]:
    config = parse_config("storage: {path: /nonexistent}\n" + text)
    registry = CollectorRegistry()
    cm = CardinalityMetrics(registry)
    stats = [DestinationStats(d.name, window_s=d.limits.window, clock=clock, metrics=cm)
             for d in config.destinations]
    p = Pipeline(config, RelayMetrics(registry), stats, [None] * len(stats), cardinality=cm, clock=clock)
    return p, registry


def _counters(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith("_created") or not s.name.startswith("gpu_relay_"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _state(p: Pipeline, registry: CollectorRegistry) -> dict[str, Any]:
    return {
        "counters": _counters(registry),
        "sizes": p.state_sizes(),
        "snapshots": [s.stats.snapshot(limit=20) for s in p.stages],
        "collisions": dict(p.collisions.collisions),
    }


# a series: (metric, gpu, pod, uid, label order shuffled?, too long value?)
_series = st.tuples(st.sampled_from(METRICS), st.integers(0, 2), st.integers(0, 3), st.integers(0, 5),
                    st.booleans(), st.integers(0, 30) .map(lambda x: x == 0))
_step = st.one_of(
    st.tuples(st.just("request"), st.lists(st.tuples(_series, st.integers(0, 2)), min_size=1, max_size=15)),
    st.tuples(st.just("again"), st.integers(0, 5)),  # a request sent before: every series a cache hit
    st.tuples(st.just("again"), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.floats(0, 50)),
    st.tuples(st.just("expire")),
    st.tuples(st.just("flush")),
)


def _request(series: list[tuple[tuple[str, int, int, int, bool, bool], int]], ts: int) -> bytes:
    out = []
    for (metric, gpu, pod, uid, shuffled, too_long), n in series:
        pairs = [("__name__", metric), ("gpu", str(gpu)), ("pod", f"p{pod}"), ("uid", f"u{uid}")]
        if too_long:
            pairs.append(("note", "x" * 3000))  # AMP's value length: a drop with its reason
        if shuffled:
            pairs.reverse()
        lb = b"".join(wire.encode_label_pair(a.encode(), b.encode()) for a, b in pairs)
        samples = b"".join(wire.encode_sample(ts + 1000 * k, float(k + uid)) for k in range(n))
        out.append(wire.wrap_series(lb, samples))
    return b"".join(out)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_step, min_size=1, max_size=25))
def test_pipeline_with_c_matches_the_reference(name: str, steps: list[tuple[Any, ...]]) -> None:
    clock = Clock(1_700_000_000.0)
    cp, creg = _pipeline(CONFIGS[name], clock)
    with reference():
        pp, preg = _pipeline(CONFIGS[name], clock)
    assert type(cp.tracker_in) is CSeriesTracker and type(pp.tracker_in) is series_tracker.SeriesTracker
    assert all(type(s.stats.tracker_out) is CSeriesTracker for s in cp.stages)
    sent: list[bytes] = []
    for step in steps:
        if step[0] == "again" and sent:
            body = sent[-1 - step[1] % len(sent)]
            assert cp.route(body) == pp.route(body), step
        elif step[0] == "request":
            body = _request(step[1], int(clock.t * 1000))
            sent.append(body)
            assert cp.route(body) == pp.route(body), step
        elif step[0] == "advance":
            clock.t += step[1]
        elif step[0] == "expire":
            cp.expire()
            pp.expire()
        else:
            now_ms = int(clock.t * 1000)
            assert ([s.flush_aggregates(now_ms) for s in cp.stages]
                    == [s.flush_aggregates(now_ms) for s in pp.stages])
        assert _state(cp, creg) == _state(pp, preg), step


def test_take_hands_an_unusual_input_to_the_reference() -> None:
    """Entries that are not the tuples wire.route makes: C answers NotImplemented, the reference runs."""
    clock = Clock(1_700_000_000.0)
    p, _ = _pipeline(CONFIGS["pass-through+limits"], clock)
    stage = p.stages[0]
    tracker = stage.stats.tracker_out
    assert _c is not None and isinstance(tracker, CSeriesTracker)
    key = wire.encode_labels((("__name__", "m_a"), ("gpu", "0")))
    decision = (key, wire.series_id(key), "m_a")
    entries: list[Any] = [[decision, b"", 1, 5]]  # a list, not a tuple
    inputs: list[Any] = [((key, 1, "m_a"), b"", 1, 5)]
    assert _c.take(stage, entries, inputs, set(), p.tracker_in.has(), wire.decode_labels,
                   tracker._t, tracker._gen()) is NotImplemented
    assert tracker.active() == 0  # no effect before answering
    pieces, kept, routed = stage.take(entries, inputs, set(), p.tracker_in.has())
    assert kept == routed == 1 and len(pieces) == 1 and tracker.active() == 1
    # inputs shorter than entries: the reference's own error
    with pytest.raises(IndexError):
        stage.take([((key, (1 << 64) | wire.series_id(key), "m_a"), b"", 1, 5)], [], set(), p.tracker_in.has())


def test_take_pieces_are_the_references_bytes_for_spliced_outputs() -> None:
    """External labels inserted into the input key (the decision's position bits) and sharding."""
    clock = Clock(1_700_000_000.0)
    results = []
    for ref in (False, True):
        with reference() if ref else _nothing():
            p, _ = _pipeline(CONFIGS["aggregate+two-destinations"], clock)
        series = [(("m_a", g, u % 4, u, False, False), 2) for g in range(3) for u in range(40)]
        results.append([p.route(_request(series, 1_700_000_000_000 + k * 15_000)) for k in range(3)])
    assert results[0] == results[1]
    assert len(results[0][0][1][1]) == 4  # every shard of d got some


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _random_steps(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    steps: list[tuple[Any, ...]] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.7:
            steps.append(("request", [((rng.choice(METRICS), rng.randrange(3), rng.randrange(4), rng.randrange(8),
                                        rng.random() < 0.3, rng.random() < 0.03), rng.randrange(3))
                                      for _ in range(rng.randrange(1, 30))]))
        elif r < 0.85:
            steps.append(("advance", rng.uniform(0, 40)))
        elif r < 0.95:
            steps.append(("expire",))
        else:
            steps.append(("flush",))
    return steps


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_long_random_run_hits_every_branch_and_matches(name: str) -> None:
    clock = Clock(1_700_000_000.0)
    cp, creg = _pipeline(CONFIGS[name], clock)
    with reference():
        pp, preg = _pipeline(CONFIGS[name], clock)
    sent: list[bytes] = []
    hits = _c.hit_counts()[0] if _c is not None else 0
    for step in _random_steps(random.Random(name), 400):
        if step[0] == "request":
            body = _request(step[1], int(clock.t * 1000))
            sent.append(body)
            assert cp.route(body) == pp.route(body)
            again = sent[len(sent) // 2]  # and one sent before: its series are cache hits
            assert cp.route(again) == pp.route(again)
        elif step[0] == "advance":
            clock.t += step[1]
        elif step[0] == "expire":
            cp.expire()
            pp.expire()
        else:
            now_ms = int(clock.t * 1000)
            assert [s.flush_aggregates(now_ms) for s in cp.stages] == [s.flush_aggregates(now_ms) for s in pp.stages]
    state = _state(cp, creg)
    assert state == _state(pp, preg)
    reasons = {dict(k[1]).get("reason") for k, v in state["counters"].items()
               if k[0] == "gpu_relay_samples_dropped_total" and v}
    if name == "pass-through+external labels":  # (the others' limits and collisions: few requests all hits)
        assert _c is not None and _c.hit_counts()[0] > hits  # the fast path (relay.native._cstage.route_hits) ran
    expected = {
        "pass-through+external labels": {"label_value_too_long"},
        "pass-through+limits": {"series_limit", "label_value_too_long"},
        "keep+prune+per-metric": {"rules", "collision", "series_limit"},
        "aggregate+two-destinations": {"aggregated", "rules", "collision"},
    }[name]
    assert expected <= reasons, reasons


def test_tracker_tables_cost_at_most_48_bytes_a_series_with_their_label_values() -> None:
    """Issue 9's memory goal: the C tables of one tracker, series and label statistics together
    (one value unique per series, two shared), stay within 48 bytes a series; the dict reference
    costs several times that."""
    n = 50_000
    t = CSeriesTracker(3600.0, Clock())
    t.observe_batch([(i * 0x9E3779B97F4A7C15 & U64, "m") for i in range(n)],
                    lambda i: (("__name__", "m"), ("gpu", str(i % 8)), ("node", f"n{i // 8}"), ("uid", f"u{i}")))
    assert t.active() == n and t.top_labels(3, "m") == [("uid", n), ("node", n // 8), ("gpu", 8)]
    assert t.table_bytes() / n <= 48, t.table_bytes() / n
