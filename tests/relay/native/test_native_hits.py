"""relay.native._cstage.route_hits (issue 9): a request whose every series is cached, routed in one C call.

Differential: a Pipeline on the native core (its route takes the fast path whenever every series is a
cache hit) against one on the pure-Python trackers and take (never the fast path), the same random
request sequences, repeated so that hits dominate: identical results (queue pieces byte for byte,
counts, errors), counters, reports and state sizes. Histograms, exemplars and metadata entries in
between; destinations that rewrite labels (labeldrop: claimed outputs, edited label bytes), add
external labels (spliced outputs), prune (colliding outputs), aggregate next to one that does not,
limits reached and not; the cache resized (evictions, generations swapped) between requests; decisions
of other kinds put in the table by hand (a digest found whose entry is not a plain decision). Separate
tests prove the fast path ran (its counters), and fell back where it must.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from relay import native
from relay.common.metrics import RelayMetrics
from relay.common.protowire import encode_len
from relay.config.config import parse_config
from relay.ingest import wire
from relay.proto import remote_v1_pb2 as v1pb
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.pipeline import Pipeline
from relay.state.series_tracker import CSeriesTracker
from relay.state.stage import route_hits
from tests.relay.native.test_native_cstage import Clock, reference
from tests.relay.native.test_native_cwire import histograms, metadata_entries

_c = native.load("cstage")
pytestmark = pytest.mark.skipif(route_hits is None,
                                reason="relay's native core not in use (GPU_RELAY_NATIVE=0 or not built)")

DEST = "    url: http://127.0.0.1:1/api/v1/write\n    dry_run: true\n"
CONFIGS = {
    "keep+labeldrop": "external_labels: {cluster: c}\ndestinations:\n  - name: a\n" + DEST + """\
    send_metadata: true
    write_relabel_configs:
      - {source_labels: [__name__], regex: 'm_a|m_b|x_total', action: keep}
      - {regex: 'pod|note', action: labeldrop}
    queue: {max_shards: 3}
""",
    "pass-through+prune, two destinations": "external_labels: {cluster: c, zone: z}\ndestinations:\n"
    "  - name: a\n" + DEST + "    queue: {max_shards: 2}\n"
    "  - name: b\n" + DEST + "    prune_labels: [uid]\n    limits: {max_series: 1000, window: 60s}\n",
    "aggregate next to plain": "destinations:\n  - name: agg\n" + DEST + """\
    aggregate:
      - match: '{__name__="m_b"}'
        without: [gpu]
        interval: 30s
        outputs: [sum]
""" + "  - name: plain\n" + DEST + "    send_metadata: true\n    queue: {max_shards: 4}\n",
    "limits reached": "destinations:\n  - name: a\n" + DEST
    + "    limits: {max_series: 5, max_series_per_metric: 3, window: 60s}\n",
    # a metric renamed by the rules: the decision cache's table turns wide (the others stay narrow)
    "one metric renamed": "external_labels: {cluster: c}\ndestinations:\n  - name: a\n" + DEST + """\
    write_relabel_configs:
      - {source_labels: [__name__], regex: 'x_total', target_label: __name__, replacement: 'x_renamed_total'}
""",
}
METRICS = ["m_a", "m_b", "x_total", "other"]


T0 = 1_700_000_000.0  # the clocks' start (a real-looking time: limits and windows count from it)


def pipeline(name: str, clock: Clock, ref: bool) -> tuple[Pipeline, CollectorRegistry]:
    config = parse_config("storage: {path: /nonexistent}\n" + CONFIGS[name])
    with reference() if ref else nullcontext():
        registry = CollectorRegistry()
        cm = CardinalityMetrics(registry)
        stats = [DestinationStats(d.name, window_s=d.limits.window, clock=clock, metrics=cm)
                 for d in config.destinations]
        p = Pipeline(config, RelayMetrics(registry), stats, [None] * len(stats), cardinality=cm, clock=clock)
    assert (type(p.tracker_in) is CSeriesTracker) is not ref
    return p, registry


def state(p: Pipeline, registry: CollectorRegistry) -> dict[str, Any]:
    counters = {}
    for family in registry.collect():
        for s in family.samples:
            if not s.name.endswith("_created") and s.name.startswith("gpu_relay_"):
                counters[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return {"counters": counters, "sizes": p.state_sizes(), "snapshots": [s.stats.snapshot(limit=20) for s in p.stages],
            "collisions": dict(p.collisions.collisions), "counter_families": dict(p.counters)}


def outcome(p: Pipeline, body: bytes) -> Any:
    try:
        return p.route(body)
    except Exception as exc:  # the error itself is compared
        return type(exc).__name__, str(exc)


def hits() -> tuple[int, int]:
    assert _c is not None
    r: tuple[int, int] = _c.hit_counts()
    return r


# a series: (metric, gpu, pod, uid, shuffled labels, samples 0-3, histogram?)
_series = st.tuples(st.sampled_from(METRICS), st.integers(0, 2), st.integers(0, 3), st.integers(0, 6),
                    st.booleans(), st.integers(0, 3), st.integers(0, 6).map(lambda x: x == 0))


def series_entry(s: tuple[str, int, int, int, bool, int, bool], ts: int, histogram: bytes = b"") -> bytes:
    metric, gpu, pod, uid, shuffled, n, with_histogram = s
    pairs = [("__name__", metric), ("gpu", str(gpu)), ("pod", f"p{pod}"), ("uid", f"u{uid}")]
    if uid == 6:
        pairs.append(("note", "x" * 3000))  # AMP's value length: a drop with its reason
    if shuffled:
        pairs.reverse()
    lb = b"".join(wire.encode_label_pair(a.encode(), b.encode()) for a, b in pairs)
    rest = b"".join(wire.encode_sample(ts + 1000 * k, float(k + uid)) for k in range(n))
    if with_histogram:
        rest += histogram
    return wire.wrap_series(lb, rest)


def metadata(family: str, kind: int = 1) -> bytes:
    return encode_len(3, v1pb.MetricMetadata(type=kind, metric_family_name=family, help="h").SerializeToString())


@st.composite
def bodies(draw: st.DrawFn) -> list[bytes]:
    """Requests over one pool of series: each request a few of them, in any order, with metadata."""
    pool = draw(st.lists(_series, min_size=1, max_size=12))
    hist = draw(histograms())
    out = []
    for _ in range(draw(st.integers(1, 3))):
        parts = []
        for s in draw(st.lists(st.sampled_from(pool), min_size=1, max_size=20)):
            parts.append(series_entry(s, 1_700_000_000_000, hist))
            kind = draw(st.sampled_from(["", "", "", "", "metadata", "odd metadata"]))
            if kind == "metadata":
                parts.append(metadata(draw(st.sampled_from([*METRICS, "x"])), draw(st.integers(0, 3))))
            elif kind == "odd metadata":
                parts.append(draw(metadata_entries()))
        out.append(b"".join(parts))
    return out


_step = st.one_of(
    st.tuples(st.just("again"), st.integers(0, 10)),
    st.tuples(st.just("again"), st.integers(0, 10)),
    st.tuples(st.just("again"), st.integers(0, 10)),
    st.tuples(st.just("advance"), st.floats(0, 50)),
    st.tuples(st.just("expire")),
    st.tuples(st.just("cache"), st.sampled_from([0, 1, 3000, 1 << 30])),
    st.tuples(st.just("flush")),
)


def run_both(name: str, reqs: list[bytes], steps: list[tuple[Any, ...]]) -> None:
    clock = Clock(T0)
    cp, creg = pipeline(name, clock, False)
    pp, preg = pipeline(name, clock, True)
    sent = 0
    for step in [("again", i) for i in range(len(reqs))] + steps:
        if step[0] == "again":
            body = reqs[step[1] % len(reqs)]
            sent += 1
            assert outcome(cp, body) == outcome(pp, body), step
        elif step[0] == "advance":
            clock.t += step[1]
        elif step[0] == "expire":
            cp.expire()
            pp.expire()
        elif step[0] == "cache":
            cp.set_cache_max_bytes(step[1])
            pp.set_cache_max_bytes(step[1])
        else:
            now_ms = int(clock.t * 1000)
            assert [s.flush_aggregates(now_ms) for s in cp.stages] == [s.flush_aggregates(now_ms) for s in pp.stages]
        assert state(cp, creg) == state(pp, preg), step


@pytest.mark.parametrize("name", sorted(CONFIGS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(reqs=bodies(), steps=st.lists(_step, max_size=25))
def test_repeated_requests_with_the_fast_path_match_the_reference(name: str, reqs: list[bytes],
                                                                   steps: list[tuple[Any, ...]]) -> None:
    run_both(name, reqs, steps)


def _plain_request(uids: range, ts: int = 1_700_000_000_000, metric: str = "m_a") -> bytes:
    return b"".join(series_entry((metric, u % 3, u % 4, u + 10, False, 1, False), ts) for u in uids)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_known_request_takes_the_fast_path_for_every_series(name: str) -> None:
    clock = Clock(T0)
    cp, creg = pipeline(name, clock, False)
    pp, preg = pipeline(name, clock, True)
    body = _plain_request(range(5)) + metadata("m_a") + _plain_request(range(5, 6), metric="x_total")
    assert outcome(cp, body) == outcome(pp, body)
    before = hits()
    for k in range(3):
        clock.t += 15
        assert outcome(cp, body) == outcome(pp, body), k
        assert state(cp, creg) == state(pp, preg)
    # the limits config has 6 series for a limit of 5: one is never admitted, so never a fast path
    expected = (0, 0) if name == "limits reached" else (3, 18)
    assert (hits()[0] - before[0], hits()[1] - before[1]) == expected


def test_a_request_with_one_new_series_takes_the_usual_path() -> None:
    clock = Clock(T0)
    cp, creg = pipeline("keep+labeldrop", clock, False)
    pp, preg = pipeline("keep+labeldrop", clock, True)
    for p in (cp, pp):
        p.route(_plain_request(range(6)))
    before = hits()
    body = _plain_request(range(7))  # 6 hits and a miss
    assert outcome(cp, body) == outcome(pp, body)
    assert hits() == before
    assert outcome(cp, body) == outcome(pp, body)  # now all known
    assert hits()[0] == before[0] + 1
    assert state(cp, creg) == state(pp, preg)


def test_an_owner_that_is_another_series_sends_the_request_the_usual_way() -> None:
    """labeldrop pod: two input series (pods 0 and 1) make one output; the second is a collision,
    decided by the reference's CollisionOwners every time, and the fast path never runs."""
    clock = Clock(T0)
    cp, creg = pipeline("keep+labeldrop", clock, False)
    pp, preg = pipeline("keep+labeldrop", clock, True)
    body = b"".join(series_entry(("m_a", 0, pod, 1, False, 1, False), 1_700_000_000_000) for pod in (0, 1))
    before = hits()
    for _ in range(3):
        assert outcome(cp, body) == outcome(pp, body)
    assert hits() == before
    assert state(cp, creg) == state(pp, preg)
    assert state(cp, creg)["collisions"]


def test_a_tiny_cache_evicts_between_requests_and_results_stay_the_references() -> None:
    clock = Clock(T0)
    cp, creg = pipeline("pass-through+prune, two destinations", clock, False)
    pp, preg = pipeline("pass-through+prune, two destinations", clock, True)
    body = _plain_request(range(12))
    for size in (1 << 30, 1, 0, 2000, 1 << 30, 1 << 30):
        cp.set_cache_max_bytes(size)
        pp.set_cache_max_bytes(size)
        assert outcome(cp, body) == outcome(pp, body), size
        assert state(cp, creg) == state(pp, preg), size


def _split_key(body: bytes) -> bytes:
    """The label bytes of the first series of a request."""
    seen: list[bytes] = []

    def decide(key: bytes) -> wire.Decision:
        seen.append(key)
        return ((key, 1, "m"),)

    wire.route(body, 1, {}, decide)
    return seen[0]


@pytest.mark.parametrize("kind", ["none for a destination", "another key's decision", "a drop of its own",
                                  "an aggregated series"])
def test_a_digest_found_whose_entry_is_not_a_plain_decision(kind: str) -> None:
    """What the table holds for a key is what both pipelines use: an entry the fast path does not
    take (stored whole, None for a destination, a tuple stored as is) sends the request the usual
    way, with the reference's result or error; a shared drop stays on the fast path."""
    clock = Clock(T0)
    cp, creg = pipeline("keep+labeldrop", clock, False)
    pp, preg = pipeline("keep+labeldrop", clock, True)
    body = _plain_request(range(4))
    other = _plain_request(range(4, 5))
    for p in (cp, pp):
        p.route(body)
        p.route(other)
    key, okey = _split_key(body), _split_key(other)
    for p in (cp, pp):
        d = p.cache.young.get(key)
        od = p.cache.young.get(okey)
        assert d is not None and od is not None
        if kind == "none for a destination":
            p.cache.young[key] = (d[0], None)
        elif kind == "another key's decision":
            p.cache.young[key] = od
        elif kind == "a drop of its own":
            p.cache.young[key] = (d[0], (b"", 0, "hand_made"))
        else:
            p.cache.young[key] = (d[0], (b"\x0a\x00", -1, "m_a"))
    before = hits()
    for _ in range(2):
        assert outcome(cp, body) == outcome(pp, body)
        assert state(cp, creg) == state(pp, preg)
    ran = hits()[0] - before[0]
    assert ran == (2 if kind == "a drop of its own" else 0), ran
    if kind == "none for a destination":
        assert outcome(cp, body)[0] == "ValueError"


def test_wrapping_wire_route_or_a_stage_take_turns_the_fast_path_off() -> None:
    """Benches time these calls by wrapping them: then the pipeline calls them as before."""
    clock = Clock(T0)
    cp, _ = pipeline("keep+labeldrop", clock, False)
    body = _plain_request(range(4))
    cp.route(body)
    calls = []
    take = cp.stages[0].take

    def wrapped(*args: Any) -> Any:
        calls.append(1)
        return take(*args)

    cp.stages[0].take = wrapped  # type: ignore[method-assign]
    before = hits()
    cp.route(body)
    assert calls == [1] and hits() == before
    del cp.stages[0].take
    cp.route(body)
    assert hits()[0] == before[0] + 1


def test_non_bytes_bodies_and_malformed_requests_take_the_usual_path() -> None:
    clock = Clock(T0)
    cp, _ = pipeline("keep+labeldrop", clock, False)
    pp, _ = pipeline("keep+labeldrop", clock, True)
    body = _plain_request(range(4))
    for p in (cp, pp):
        p.route(body)
    before = hits()
    for b in (bytearray(body), memoryview(body), body[:-1], body + b"\x0a\x05", body + b"\x08"):
        assert outcome(cp, b) == outcome(pp, b)  # type: ignore[arg-type]
    assert hits() == before


def test_decide_re_entering_route_with_a_known_request_matches_the_reference() -> None:
    """A decide that routes a known request from inside the outer request's route loop: the inner
    route takes the fast path while the outer one runs the usual path, as the reference's would."""
    clock = Clock(T0)
    known = _plain_request(range(5))
    new = _plain_request(range(5, 9))
    results = []
    ran = []
    for ref in (False, True):
        p, reg = pipeline("keep+labeldrop", clock, ref)
        p.route(known)
        decide = p.decide
        inner: list[Any] = []

        def reentrant(key: bytes, p: Pipeline = p, decide: Any = decide, inner: list[Any] = inner) -> Any:
            if not inner:
                inner.append(None)
                before = hits()
                inner.append(p.route(known))
                inner.append(hits()[0] - before[0])
            return decide(key)

        p.decide = reentrant  # type: ignore[method-assign]
        results.append((outcome(p, new), inner[1], state(p, reg)))
        ran.append(inner[2])
    assert results[0] == results[1]
    assert ran == [1, 0]


def _generation(text: str, clock: Clock, ref: bool,
                previous: tuple[Pipeline, CollectorRegistry, CardinalityMetrics] | None = None,
                ) -> tuple[Pipeline, CollectorRegistry, CardinalityMetrics]:
    """A Pipeline for config text; with previous, the reload's next generation (stats of the same
    destinations, the in tracker, the lock and the owners handed over as the relay does)."""
    config = parse_config("storage: {path: /nonexistent}\n" + text)
    with reference() if ref else nullcontext():
        registry = previous[1] if previous else CollectorRegistry()
        cm = previous[2] if previous else CardinalityMetrics(registry)
        old = {s.name: s for s in previous[0].stats} if previous else {}
        stats = [old.get(d.name) or DestinationStats(d.name, window_s=d.limits.window, clock=clock, metrics=cm)
                 for d in config.destinations]
        p = Pipeline(config, previous[0].metrics if previous else RelayMetrics(registry), stats,
                     [None] * len(stats), cardinality=cm, clock=clock, previous=previous[0] if previous else None)
    return p, registry, cm


def test_a_reload_sharing_the_in_tracker_matches_the_reference_on_both_generations() -> None:
    """After a reload (destinations reordered, one rewriting labels now) the old generation still
    routes requests that began before it, next to the new one: both share the in tracker, the lock,
    the out trackers and the owners; the fast path runs on both and every result and state stays
    the reference's."""
    new_text = ("external_labels: {cluster: c}\ndestinations:\n  - name: b\n" + DEST + "    queue: {max_shards: 3}\n"
                "  - name: a\n" + DEST + "    write_relabel_configs:\n      - {regex: 'pod', action: labeldrop}\n")
    clock = Clock(T0)
    c1 = _generation(CONFIGS["pass-through+prune, two destinations"], clock, False)
    p1 = _generation(CONFIGS["pass-through+prune, two destinations"], clock, True)
    body = _plain_request(range(5)) + metadata("m_a") + _plain_request(range(5, 9), metric="x_total")
    for _ in range(2):
        assert outcome(c1[0], body) == outcome(p1[0], body)
    c2, p2 = _generation(new_text, clock, False, c1), _generation(new_text, clock, True, p1)
    assert c2[0].tracker_in is c1[0].tracker_in and c2[0].lock is c1[0].lock
    before = hits()
    for k in range(4):
        clock.t += 7
        for c, p in ((c2, p2), (c1, p1)):
            assert outcome(c[0], body) == outcome(p[0], body), k
            assert state(c[0], c[1]) == state(p[0], p[1]), k
    assert hits()[0] - before[0] >= 6  # both generations took the fast path once their caches knew the series
