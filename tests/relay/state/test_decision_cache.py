"""relay.decision_cache.DecisionCache with each implementation of its generations: native
DecisionTables and the reference dicts (GPU_RELAY_NATIVE=0). The pipeline's decision-cache tests
(tests/relay/state/test_pipeline_state.py) run here again under both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from relay.ingest import wire
from relay.state import decision_cache
from relay.state.decision_cache import DecisionCache, entry_bytes
from relay.state.stage import POS_SHIFT, RULES
from tests.relay.state.test_pipeline_state import (  # noqa: F401  (collected here again, under both implementations)
    make_fixture,
    test_decision_cache_is_bounded_and_evicts_incrementally,
    test_external_labels_spliced_into_cached_series_give_exact_sorted_output,
    test_tiny_and_huge_decision_cache_give_identical_stats_limits_and_aggregates,
)

EXT = b"\n\x0c\n\x07cluster\x12\x01c"


@pytest.fixture(autouse=True, params=["native", "dict"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every DecisionCache made in a test (the pipeline's too) uses this implementation."""
    if request.param == "native":
        if not decision_cache.native_table():
            pytest.skip("relay.native._cdcache is off (GPU_RELAY_NATIVE=0) or not built")
    else:
        monkeypatch.setattr(decision_cache, "_c", None)
    yield request.param


def _key(i: int) -> bytes:
    return wire.encode_labels((("__name__", "m"), ("gpu", str(i)), ("pod", f"pod-{i:05d}")))


def _decide(key: bytes) -> wire.Decision:
    return ((key, len(key), "m"), (EXT, 7 | 1 << POS_SHIFT, "m"), RULES)


def _fill(cache: DecisionCache, keys: list[bytes], calls: list[bytes] | None = None) -> None:
    """What wire.route does for each key: get from young, else miss, then store in young."""
    def decide(k: bytes) -> wire.Decision:
        if calls is not None:
            calls.append(k)
        return _decide(k)

    for k in keys:
        if cache.young.get(k) is None:
            cache.young[k] = cache.miss(k, decide)
    cache.evict()


def test_the_implementation_follows_the_native_switch(impl: str) -> None:
    cache = DecisionCache(1 << 20)
    assert cache.native is (impl == "native")
    assert isinstance(cache.young, dict) is (impl == "dict")


def test_a_miss_found_in_the_old_generation_moves_to_the_young_one_without_deciding(impl: str) -> None:
    cache = DecisionCache(1 << 30)
    keys = [_key(i) for i in range(50)]
    _fill(cache, keys)
    cache._old, cache.young = cache.young, cache._new()  # as eviction's swap does
    calls: list[bytes] = []
    _fill(cache, keys[:10], calls)
    assert calls == []
    assert len(cache.young) == 10 and len(cache._old) == 40 and len(cache) == 50
    probe = bytes(bytearray(keys[3]))
    assert cache.young.get(probe) == _decide(keys[3])


def test_the_budget_bounds_the_cache_and_eviction_is_incremental(impl: str) -> None:
    probe = DecisionCache(1 << 30)
    _fill(probe, [_key(i) for i in range(1000)])
    per_entry = probe.size() / 1000
    # a generation holds half the budget: the old one costs what it did until it empties
    cache = DecisionCache(int(per_entry * 2000))
    calls: list[bytes] = []
    _fill(cache, [_key(i) for i in range(1000)], calls)
    assert len(calls) == 1000 and len(cache) >= 900  # the whole set fits (about)
    _fill(cache, [_key(i) for i in range(1000, 1020)], calls)
    assert cache.size() <= cache.max_bytes
    assert len(cache) >= 900  # 20 more: a few dozen evicted, never the whole cache
    assert len(cache._old) > 0  # the swap happened: the old generation is being popped one by one


def test_a_zero_budget_keeps_nothing_and_counts_nothing(impl: str) -> None:
    cache = DecisionCache(0)
    calls: list[bytes] = []
    for _ in range(2):
        _fill(cache, [_key(i) for i in range(30)], calls)
        assert len(cache) == 0 and cache.size() == 0
    assert len(calls) == 60


def test_the_cache_still_answers_after_many_generations(impl: str) -> None:
    cache = DecisionCache(20_000)
    for r in range(30):
        _fill(cache, [_key(r * 40 + i) for i in range(40)])
        assert cache.size() <= 20_000
    cached = 0
    for i in range(30 * 40):  # what is still cached is right, in either generation
        k = bytes(bytearray(_key(i)))
        got = cache.young.get(k) or cache._old.get(k)
        assert got in (None, _decide(k))
        cached += got is not None
    assert cached == len(cache) > 0


def test_native_tables_take_a_small_fraction_of_the_dict_estimate(impl: str) -> None:
    if impl != "native":
        pytest.skip("compares the native table with the dict estimate")
    cache = DecisionCache(1 << 30)
    keys = [_key(i) for i in range(2000)]
    _fill(cache, keys)
    estimate = sum(entry_bytes(k, _decide(k)) for k in keys)
    assert cache.size() * 4 < estimate


def test_asking_for_the_native_table_where_it_is_off_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decision_cache, "_c", None)
    with pytest.raises(RuntimeError, match="_cdcache"):
        DecisionCache(1, table=True)
    assert not DecisionCache(1).native


def test_the_swapped_in_young_table_keeps_the_width(impl: str) -> None:
    cache = DecisionCache(1)
    _fill(cache, [_key(1)])
    young: Any = cache.young
    if impl == "native":
        assert young.width == 3
    assert len(cache) == 0


def test_wire_route_with_a_decision_table_routes_exactly_as_with_a_dict(impl: str) -> None:
    """The route loop reads the cache with get() and stores misses with cache[key] = decision."""
    if impl != "native":
        pytest.skip("routes through a DecisionTable")
    labels = [(("__name__", "m"), ("gpu", str(i)), ("pod", "p" * (i * 40))) for i in range(6)]
    request = wire.encode_write_request(
        [(labels[i % 6], [(1_700_000_000_000 + i // 6, float(i))]) for i in range(30)]  # keys seen again
        + [(labels[0], [(5, 1.0), (6, 2.0)])])  # and one that is not the one-sample shape
    results = []
    for cache in ({}, DecisionCache(1 << 30).young):
        calls: list[bytes] = []

        def decide(key: bytes, calls: list[bytes] = calls) -> wire.Decision:
            calls.append(key)
            return _decide(key)

        for _ in range(2):  # a cold round, then everything cached
            routed = wire.route(request, 3, cache, decide)
            results.append((routed.per_dest, routed.new_keys, routed.series_in, routed.samples_in))
        assert len(calls) == 6 and len(cache) == 6
    assert results[0] == results[2] and results[1] == results[3]
    assert results[1][1] == 0  # no new keys on the second round
