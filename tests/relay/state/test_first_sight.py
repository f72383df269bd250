"""The uncached path (``Pipeline.decide``, the first sight of a series) against a frozen copy of the
reference logic it replaced (main at 634c9e5: decode, external labels, global and per-destination
relabeling with no memo, prune, AMP checks, aggregation match, output encoding and id), over random
configs built from the relabel test tables and random valid and malformed label sets. Every memo
(Label entries, rule-list effects, regex answers, AMP name checks, aggregation candidates) must
never change a decision, an error, or what is left in the request's scratch map."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from relay.common.labels import Labels
from relay.common.metrics import RelayMetrics
from relay.common.protowire import WireError
from relay.config.model import AggregateConfig, Config, DestinationConfig
from relay.ingest import wire
from relay.rules import label_codec, relabel_regexp, rule_plan
from relay.rules.relabel import RelabelConfig, parse_relabel_config, process
from relay.rules.rule_plan import RulePlan
from relay.state import aggregate, limits
from relay.state import decide as decide_mod
from relay.state import stage as stage_mod
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.limits import AmpLimits, amp_violation
from relay.state.pipeline import Pipeline
from tests.helpers import TEST_DATA
from tests.relay.state.first_sight_reference import ref_decide, unmemoised

DATA = TEST_DATA
_TABLE = json.loads((DATA / "relabel_cases.json").read_text())["cases"]
_ID_MASK = (1 << 60) - 1

# Rules: every rule of the relabel tables, and the shapes the relay meets (keep/drop by name,
# labeldrop, a replace), parsed once so their regexes' memos carry over from example to example.
_BENCH_RULES: list[dict[str, Any]] = [
    {"source_labels": ["__name__"], "regex": "m1|m2|DCGM_FI_DEV_GPU_UTIL", "action": "keep"},
    {"source_labels": ["__name__"], "regex": "m.*", "action": "drop"},
    {"source_labels": ["__name__"], "regex": "m2|n_x", "action": "drop"},
    {"source_labels": ["__name__"], "regex": "(m|n)_(.+)", "action": "keep"},
    {"regex": "pci_bus_id|a|UUID", "action": "labeldrop"},
    {"regex": "__name__|a|b|job", "action": "labelkeep"},
    {"source_labels": ["job"], "regex": "(.+)", "target_label": "team", "replacement": "t-$1"},
    {"source_labels": ["a", "b"], "separator": "/", "regex": "(.*)/(.*)", "target_label": "c",
     "replacement": "$2"},
    {"target_label": "b", "replacement": "fixed"},
    {"source_labels": ["c"], "target_label": "a", "replacement": ""},
    {"source_labels": ["__name__"], "regex": "(.*)", "target_label": "__name__", "replacement": "x_$1"},
    {"source_labels": ["b"], "target_label": "__name__", "regex": "(v.*)", "replacement": ""},
]
RULE_POOL: list[RelabelConfig] = []
for _raw in [r for c in _TABLE for r in c["rules"]] + _BENCH_RULES:
    with contextlib.suppress(ValueError):  # a table row that is refused (its validation tests check it)
        RULE_POOL.append(parse_relabel_config(_raw))

NAMES = ["__name__", "a", "b", "c", "job", "UUID", "pci_bus_id", "team", "Z", "é", "__tmp"]
VALUES = ["m1", "m2", "n_x", "foo", "bar", "v1", "1", "x" * 130, "ü", "a\nb", "fixed", "DCGM_FI_DEV_GPU_UTIL",
          "t-foo", "0"]
SELECTORS = ['{__name__="m1"}', '{__name__=~"m.*", job!="x"}', '{a="foo"}', '{__name__!~"n_.*"}']


def outcome(fn: Any, *args: Any) -> tuple[str, object]:
    try:
        return "ok", fn(*args)
    except wire.WireError as e:
        return "error", (type(e), e.status, e.message)


def decides_as_the_reference(p: Pipeline, keys: list[bytes], context: object) -> None:
    """``p.decide`` answers each key (in order: memos warm up) as the frozen reference does, errors
    and what it leaves in the request's scratch map included."""
    for key in keys:
        want_scratch: dict[bytes, Labels] = {}
        want = outcome(ref_decide, p, key, want_scratch)
        p._scratch.clear()
        assert outcome(p.decide, key) == want, (key, context)
        if want[0] == "ok":
            assert p._scratch == want_scratch


# ---- random configs and label sets ----------------------------------------------------------------


def pipeline(config: Config, amp: AmpLimits) -> Pipeline:
    registry = CollectorRegistry()
    cm = CardinalityMetrics(registry)
    stats = [DestinationStats(d.name, window_s=d.limits.window, metrics=cm) for d in config.destinations]
    return Pipeline(config, RelayMetrics(registry), stats, [None] * len(config.destinations), cardinality=cm,
                    amp_limits=amp)


rules_st = st.lists(st.sampled_from(RULE_POOL), max_size=4).map(tuple)
external_st = st.dictionaries(
    st.sampled_from(["a", "cluster", "job", "zz", "__name__"]),
    st.sampled_from(["prod", "foo", "m1"]), max_size=2,
).map(lambda d: tuple(sorted(d.items())))
destination_st = st.builds(
    lambda i, rules, prune, agg: DestinationConfig(
        name=f"d{i}", url="http://127.0.0.1:1/w", write_relabel_configs=rules, prune_labels=prune,
        aggregate=tuple(AggregateConfig(match=m, without=("b",)) for m in agg)),
    st.integers(0, 0), rules_st, st.lists(st.sampled_from(["b", "c", "team"]), max_size=2, unique=True).map(tuple),
    st.lists(st.sampled_from(SELECTORS), max_size=2, unique=True))
config_st = st.builds(
    lambda ext, glob, dests: Config(external_labels=ext, global_relabel=glob,
                                    destinations=tuple(dataclasses.replace(d, name=f"d{i}")
                                                       for i, d in enumerate(dests))),
    external_st, rules_st, st.lists(destination_st, min_size=1, max_size=2))
amp_st = st.one_of(st.just(AmpLimits()), st.builds(AmpLimits, st.integers(1, 6), st.integers(1, 8),
                                                    st.integers(1, 200)))


def _entry(name: bytes, value: bytes, framing: str) -> bytes:
    """One Label entry, framed as protobuf does or in one of the other ways a client may frame it."""
    if framing == "explicit empty value" and not value:
        inner = b"\x0a" + bytes([len(name)]) + name + b"\x12\x00"
    elif framing == "value first":
        inner = b"\x12" + bytes([len(value)]) + value + b"\x0a" + bytes([len(name)]) + name
    elif framing == "long length" and len(name) < 0x80:
        inner = b"\x0a" + bytes([0x80 | len(name), 0x00]) + name + b"\x12" + bytes([len(value)]) + value
    elif framing == "extra field":
        inner = wire.encode_label_pair(name, value)[2:] + b"\x18\x01"
    elif framing == "no name":
        inner = b"\x12" + bytes([len(value)]) + value
    else:
        return wire.encode_label_pair(name, value)
    return b"\x0a" + bytes([len(inner)]) + inner if len(inner) < 0x80 else wire.encode_label_pair(name, value)


FRAMINGS = ["canonical"] * 12 + ["explicit empty value", "value first", "long length", "extra field", "no name"]
KINDS = ["canonical"] * 12 + ["shuffled", "duplicate", "truncated", "bad utf-8", "random"]


@st.composite
def key_sets(draw: st.DrawFn) -> list[bytes]:
    """Label keys of one family: a base label set and variants of it (one or two labels changed,
    added or removed), so that memos meet the same names with other values. Usually canonical
    (sorted, protobuf's own framing), else with an entry framed otherwise, reordered, duplicated,
    cut short, with a bad byte, or random bytes."""
    base = draw(st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), min_size=1, max_size=6))
    keys: list[bytes] = []
    for _ in range(draw(st.integers(1, 12))):
        d = dict(base)
        for name, value in draw(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from([*VALUES, "", None])),
                                         max_size=2)):
            if value is None:
                d.pop(name, None)
            else:
                d[name] = value
        pairs = sorted(d.items())
        kind = draw(st.sampled_from(KINDS))
        if kind == "shuffled":
            pairs = draw(st.permutations(pairs))
        elif kind == "duplicate" and pairs:
            pairs = [*pairs, pairs[0]]
        key = b"".join(_entry(n.encode(), v.encode(), draw(st.sampled_from(FRAMINGS))) for n, v in pairs)
        if kind == "truncated" and key:
            key = key[: draw(st.integers(0, len(key) - 1))]
        elif kind == "bad utf-8" and key:
            i = draw(st.integers(0, len(key) - 1))
            key = key[:i] + b"\xff" + key[i + 1:]
        elif kind == "random":
            key = draw(st.binary(max_size=24))
        keys.append(key)
    return keys


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config_st, amp_st, st.lists(key_sets(), min_size=1, max_size=3).map(lambda ks: [k for s in ks for k in s]))
def test_decide_equals_the_frozen_reference_for_random_rules_and_label_sets(
        config: Config, amp: AmpLimits, keys: list[bytes]) -> None:
    p = pipeline(config, amp)
    for key in keys * 2:  # the second pass meets every memo warm
        want_scratch: dict[bytes, Labels] = {}
        want = outcome(ref_decide, p, key, want_scratch)
        p._scratch.clear()
        got = outcome(p.decide, key)
        assert got == want, (key, config)
        if got[0] == "ok":
            assert p._scratch == want_scratch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config_st, amp_st, st.lists(key_sets(), min_size=1, max_size=3).map(lambda ks: [k for s in ks for k in s]))
def test_decide_equals_the_reference_when_every_memo_is_tiny_and_starts_over_often(
        config: Config, amp: AmpLimits, keys: list[bytes]) -> None:
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(label_codec, "MAX_ENTRIES", 3)
        mp.setattr(label_codec, "MAX_NAME_SETS", 2)
        mp.setattr(rule_plan, "MAX_EFFECTS", 2)
        mp.setattr(limits, "MAX_MEMO", 2)
        mp.setattr(relabel_regexp, "MEMO_MAX", 2)
        mp.setattr(aggregate, "MAX_CANDIDATE_NAMES", 1)
        label_codec.clear()
        relabel_regexp.DEFAULT_REGEX._memo.clear()
        p = pipeline(config, amp)
        for key in keys * 2:
            want_scratch: dict[bytes, Labels] = {}
            want = outcome(ref_decide, p, key, want_scratch)
            p._scratch.clear()
            assert outcome(p.decide, key) == want
            assert len(label_codec._PAIR) <= 3 and len(label_codec._SORTED) <= 2
            assert len(relabel_regexp.DEFAULT_REGEX._memo) <= 2
            assert all(r.memo_bytes() <= 2 * rule_plan.EFFECT_BYTES + 2 * rule_plan.PLAN_BYTES
                       for r in (p.rules._global_plan, *p.rules._write_plans))
    finally:
        mp.undo()


# ---- each memo on its own ---------------------------------------------------------------------------


def _one_destination(*rules: dict[str, Any], external: Labels = ()) -> Pipeline:
    cfg = Config(external_labels=external, destinations=(DestinationConfig(
        name="d", url="http://127.0.0.1:1/w", write_relabel_configs=tuple(parse_relabel_config(r) for r in rules)),))
    return pipeline(cfg, AmpLimits())


def _key(**labels: str) -> bytes:
    return wire.encode_labels(tuple(sorted(labels.items())))


def test_entry_with_an_explicit_empty_value_is_left_out_like_the_reference_even_when_memoised() -> None:
    p = _one_destination()
    key = _key(__name__="m1") + b"\x0a\x06\x0a\x02zz\x12\x00"
    for _ in range(2):
        assert p.decide(key) == ref_decide(p, key, {})
        assert p._scratch[key] == (("__name__", "m1"),)


def test_key_cut_inside_a_memoised_entry_raises_the_reference_error() -> None:
    p = _one_destination()
    whole = _key(__name__="m1", job="node")
    p.decide(whole)  # both entries memoised
    boundary = len(_key(__name__="m1"))
    for cut in range(1, len(whole)):
        got, want = outcome(p.decide, whole[:cut]), outcome(ref_decide, p, whole[:cut], {})
        assert got == want, cut
        assert got[0] == ("ok" if cut == boundary else "error"), cut


def test_rule_effect_memo_tells_apart_series_that_differ_in_any_label_the_rules_read() -> None:
    p = _one_destination({"source_labels": ["a", "b"], "separator": "/", "regex": "(.*)/(.*)",
                          "target_label": "c", "replacement": "$2"})
    for b in ("y", "z", "y"):
        key = _key(__name__="m1", a="x", b=b)
        assert p.decide(key) == ref_decide(p, key, {})
        assert wire.decode_labels(p.decide(key)[1][0])[-1] == ("c", b)


def test_replace_of_a_label_it_does_not_read_sets_it_in_every_series_whatever_its_value() -> None:
    p = _one_destination({"source_labels": ["job"], "regex": "(.+)", "target_label": "b", "replacement": "fixed"})
    for b in ("fixed", "other", "third"):  # same names, same read value (job): one memoised effect
        key = _key(__name__="m1", b=b, job="node")
        assert p.decide(key) == ref_decide(p, key, {})
        assert ("b", "fixed") in wire.decode_labels(p.decide(key)[1][0])


def test_labelmap_rules_are_never_memoised_and_still_give_the_reference_result() -> None:
    plan = RulePlan([parse_relabel_config({"regex": "a(.*)", "action": "labelmap", "replacement": "z$1"})])
    assert not plan.memoised
    for labels in ((("__name__", "m"), ("a1", "x")), (("__name__", "m"), ("a1", "y"))):
        with unmemoised():
            want = process(labels, plan.rules)
        assert plan.apply(labels, rule_plan.names_of(labels)) == (want, rule_plan.names_of(want))
    assert plan.memo_bytes() == 0


def test_label_entry_memo_never_holds_more_than_its_bound() -> None:
    label_codec.clear()
    for i in range(label_codec.MAX_ENTRIES + 10):
        label_codec.decode_key(_key(__name__="m", pod=f"p{i}"))
        assert len(label_codec._PAIR) <= label_codec.MAX_ENTRIES
        assert len(label_codec._ENTRY) <= label_codec.MAX_ENTRIES
    assert label_codec.memo_bytes() <= label_codec.MAX_ENTRIES * label_codec.ENTRY_BYTES + \
        label_codec.MAX_NAME_SETS * (label_codec.NAME_SET_BYTES + 128) + \
        label_codec.C_MEMO_SLOTS * (label_codec.C_MEMO_SLOT_BYTES + label_codec.C_MEMO_PAIR_BYTES)


def test_rule_effect_memo_never_holds_more_than_its_bound() -> None:
    plan = RulePlan([parse_relabel_config({"source_labels": ["pod"], "regex": "p(.*)", "target_label": "n"})])
    for i in range(rule_plan.MAX_EFFECTS + 10):
        labels = (("__name__", "m"), ("pod", f"p{i}"))
        assert plan.apply(labels, ("__name__", "pod")) == ((*labels[:1], ("n", str(i)), labels[1]),
                                                            ("__name__", "n", "pod"))
        assert plan._count <= rule_plan.MAX_EFFECTS
    assert plan.memo_bytes() <= rule_plan.MAX_EFFECTS * rule_plan.EFFECT_BYTES + rule_plan.PLAN_BYTES


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(RULE_POOL), st.lists(st.sampled_from([*VALUES, *NAMES, "", "x" * 200]), max_size=30))
def test_regex_memo_answers_as_the_regex_does(rule: RelabelConfig, texts: list[str]) -> None:
    for text in texts * 2:
        assert rule.regex.matches(text) == rule.regex._match(text)
    assert len(rule.regex._memo) <= relabel_regexp.MEMO_MAX


names_st = st.sampled_from(["__name__", "a", "b_1", "9x", "é", "a-b", "x" * 10, "_"])
values_st = st.sampled_from(["m", "m:x", "1m", "", "ü" * 3, "v" * 9, "ok"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(names_st, values_st, max_size=6), st.builds(AmpLimits, st.integers(0, 6), st.integers(1, 12),
                                                                   st.integers(1, 12)))
def test_amp_check_with_known_names_and_size_answers_as_amp_violation(d: dict[str, str], amp: AmpLimits) -> None:
    labels = tuple(sorted(d.items()))
    names = rule_plan.names_of(labels)
    size = len(wire.encode_labels(labels))
    for _ in range(2):
        assert limits.amp_violation_named(labels, names, size, amp) == amp_violation(labels, amp)


@settings(max_examples=300, deadline=None)
@given(rules_st, st.dictionaries(st.sampled_from(NAMES), st.sampled_from([*VALUES, ""]), max_size=6), st.data())
def test_rule_plan_gives_what_process_gives_for_a_family_of_label_sets(
        rules: tuple[RelabelConfig, ...], base: dict[str, str], data: st.DataObject) -> None:
    """Label sets that share names and differ in one value at a time, mostly of a label the rules
    read (empty values included, which only a caller other than the decoder passes): the memoised
    effect of one must not leak into another."""
    plan = RulePlan(rules)
    reads = [n for r in rules for n in (*r.source_labels, r.target_label) if n] or NAMES
    names = st.one_of(st.sampled_from(reads), st.sampled_from(NAMES))
    changes = data.draw(st.lists(st.tuples(names, st.sampled_from([*VALUES, ""])), max_size=8))
    family = [base] + [{**base, name: value} for name, value in changes]
    for d in family * 2:
        labels = tuple(sorted(d.items()))
        with unmemoised():
            want = process(labels, rules)
        got = plan.apply(labels, rule_plan.names_of(labels))
        assert got == (None if want is None else (want, rule_plan.names_of(want)))
        if want is labels:
            assert got is not None and got[0] is labels  # unchanged: the same tuple, as process promises


def test_effects_of_long_read_values_are_decided_but_not_memoised() -> None:
    plan = RulePlan([parse_relabel_config({"source_labels": ["pod"], "regex": "(.*)", "target_label": "n"})])
    labels = (("__name__", "m"), ("pod", "p" * (rule_plan.MAX_KEY_CHARS + 1)))
    with unmemoised():
        want = process(labels, plan.rules)
    assert want is not None
    assert plan.apply(labels, ("__name__", "pod")) == (want, rule_plan.names_of(want))
    assert plan._count == 0 and plan.memo_bytes() <= rule_plan.PLAN_BYTES


def test_label_sets_with_very_many_names_are_decided_without_a_memo_keeping_their_names() -> None:
    many = tuple(sorted({"__name__": "m", **{f"l{i:03d}": "v" for i in range(150)}}.items()))
    key = wire.encode_labels(many)
    p = _one_destination({"source_labels": ["l001"], "regex": "v", "action": "keep"})
    assert p.decide(key) == ref_decide(p, key, {})
    names = rule_plan.names_of(many)
    assert names not in label_codec._SORTED and names not in p.rules._write_plans[0]._plans
    assert all(names not in memo for memo in limits._NAME_SETS.values())


def test_first_sight_bench_measures_both_paths_on_distinct_new_series_and_prints_every_rule_set() -> None:
    from bench import relay_series_bench as bench

    series = [s for n in range(3) for s in bench.ksm_series(n)]
    assert len(series) == 3 * 8 * 21 and len(set(series)) == len(series)
    assert all(dict(s)["__name__"] and list(s) == sorted(s) for s in series)
    rows = [bench.in_process(name, rules, "ksm", nodes=1, repeats=1) for name, rules in bench.RULE_SETS]
    assert [r.rules for r in rows] == ["keep4", "passthrough", "kps", "keep4+ext", "pass+ext"]
    # the "+ext" sets are the same rules under external_labels (added to every series first)
    assert bench._pipeline("", bench.ROOTS["pass+ext"]).rules._external == (("cluster", "prod"),)
    assert bench._pipeline("").rules._external == ()
    assert all(r.series == 8 * 21 and r.before_us > 0 and r.after_us > 0 for r in rows)
    table = bench.in_process_table(rows)
    assert "keep4" in table and "kps" in table and "B per series at 1M" in table


def test_first_sight_bench_compare_keeps_each_rows_best_repeat_and_prints_both_trees() -> None:
    from bench import relay_series_bench as bench

    def run(after: float, route: float, new: float) -> dict[str, object]:
        row = {"rules": "keep4", "shape": "dcgm", "series": 10, "before_us": 20.0, "after_us": after,
               "route_new_us": route}
        return {"in_process": [row], "first_sight": [{"rules": "keep4", "series": 63000, "new_us": new,
                                                      "known_us": 1.0}]}

    base = bench._best([run(9.0, 12.0, 12.0), run(8.0, 11.0, 13.0)])
    this = bench._best([run(4.0, 6.0, 8.0), run(5.0, 5.5, 7.0)])
    assert base["in_process"][0]["route_new_us"] == 11.0 and base["first_sight"][0]["new_us"] == 12.0
    assert this["in_process"][0]["route_new_us"] == 5.5 and this["first_sight"][0]["new_us"] == 7.0
    table = bench.compare_tables({"base": base, "this": this})
    assert "2.00x" in table  # route new-known 11.0 / 5.5
    assert "11.0 us" in table and "6.0 us" in table  # first sight: base 12 - 1, this 7 - 1


def test_labels_of_answers_labels_decided_in_the_request_and_decodes_any_other_without_keeping_them() -> None:
    p = _one_destination()
    decided, other = _key(__name__="m1", pod="a"), _key(__name__="m2", pod="b")
    p.decide(decided)
    assert p._labels_of(decided) is p._scratch[decided]
    assert p._labels_of(other) == wire.decode_labels(other) == (("__name__", "m2"), ("pod", "b"))
    assert other not in p._scratch and p._labels(other) == p._labels_of(other)
    with pytest.raises(WireError) as e:
        p._labels_of(b"\x0a\x02\x0a\x00")  # an empty label name: the reference decoder's error
    assert str(e.value) == str(_wire_error(wire.decode_labels, b"\x0a\x02\x0a\x00"))


def _wire_error(fn: Any, arg: bytes) -> WireError:
    try:
        fn(arg)
    except WireError as e:
        return e
    raise AssertionError("no WireError")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), amp_st,
       st.lists(key_sets(), min_size=1, max_size=3).map(lambda ks: [k for s in ks for k in s]))
def test_decide_for_destinations_that_send_every_series_as_it_is_equals_the_reference(
        n_dest: int, amp: AmpLimits, keys: list[bytes]) -> None:
    config = Config(destinations=tuple(DestinationConfig(name=f"d{i}", url="http://127.0.0.1:1/w")
                                       for i in range(n_dest)))
    p = pipeline(config, amp)
    assert p._as_is  # decide()'s shortest path
    for key in keys * 2:
        want_scratch: dict[bytes, Labels] = {}
        want = outcome(ref_decide, p, key, want_scratch)
        p._scratch.clear()
        assert outcome(p.decide, key) == want, key
        if want[0] == "ok":
            assert p._scratch == want_scratch


def test_the_shortest_decide_path_is_off_where_anything_changes_a_series() -> None:
    prune = Config(destinations=(DestinationConfig(name="d", url="http://127.0.0.1:1/w", prune_labels=("b",)),))
    external = Config(external_labels=(("cluster", "c"),),
                      destinations=(DestinationConfig(name="d", url="http://127.0.0.1:1/w"),))
    aggregated = Config(destinations=(DestinationConfig(name="d", url="http://127.0.0.1:1/w",
                                                        aggregate=(AggregateConfig(match="m", without=("b",)),)),))
    for config in (prune, external, aggregated):
        assert not pipeline(config, AmpLimits())._as_is
    assert not _one_destination({"regex": "b", "action": "labeldrop"})._as_is


# ---- a series every destination's first rule drops by its metric name ----------------------------
_NAME_FILTERS = [r for r in RULE_POOL if rule_plan.name_filter(r) is not None]
gated_destination_st = st.builds(
    lambda first, rest, prune: DestinationConfig(name="d", url="http://127.0.0.1:1/w",
                                                 write_relabel_configs=(first, *rest), prune_labels=prune),
    st.sampled_from(_NAME_FILTERS), rules_st,
    st.lists(st.sampled_from(["b", "c", "team"]), max_size=2, unique=True).map(tuple))
gated_config_st = st.builds(
    lambda ext, dests: Config(external_labels=ext, destinations=tuple(
        dataclasses.replace(d, name=f"d{i}") for i, d in enumerate(dests))),
    external_st, st.lists(gated_destination_st, min_size=1, max_size=3))


def test_the_name_filter_pool_has_keeps_and_drops() -> None:
    kinds = {rule_plan.name_filter(r)[0] for r in _NAME_FILTERS}  # type: ignore[index]
    assert kinds == {True, False}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gated_config_st, amp_st, st.lists(key_sets(), min_size=1, max_size=3).map(lambda ks: [k for s in ks for k in s]))
def test_decide_where_every_destination_begins_with_a_name_filter_equals_the_reference(
        config: Config, amp: AmpLimits, keys: list[bytes]) -> None:
    p = pipeline(config, amp)
    assert p._name_drops is not None  # the drop-by-name answer is in use
    decides_as_the_reference(p, keys * 2, config)


def test_a_series_dropped_by_every_destinations_name_filter_is_answered_without_the_rules() -> None:
    keep = {"source_labels": ["__name__"], "regex": "m1|m2", "action": "keep"}
    p = _one_destination(keep, {"regex": "a", "action": "labeldrop"}, external=(("cluster", "c"),))
    calls: list[str] = []
    real = p.rules.global_named
    p.rules.global_named = lambda *a: calls.append("global") or real(*a)  # type: ignore[method-assign]
    dropped = _key(__name__="other", a="1")
    kept = _key(__name__="m1", a="1")
    assert p.decide(dropped)[1:] == (stage_mod.RULES,) and calls == []
    assert p.decide(kept)[1] != stage_mod.RULES and calls == ["global"]
    assert p._name_drops == {"other": True, "m1": False}
    assert p.decide(_key(a="1"))[1:] == (stage_mod.RULES,)  # no metric name: the rules' path, same answer


@pytest.mark.parametrize("config", [
    pytest.param(Config(global_relabel=(parse_relabel_config({"target_label": "x", "replacement": "y"}),),
                        destinations=(DestinationConfig(name="d", url="http://127.0.0.1:1/w",
                                                        write_relabel_configs=(_NAME_FILTERS[0],)),)),
                 id="global rules run first"),
    pytest.param(Config(destinations=(
        DestinationConfig(name="d0", url="http://127.0.0.1:1/w", write_relabel_configs=(_NAME_FILTERS[0],)),
        DestinationConfig(name="d1", url="http://127.0.0.1:1/w"))), id="a destination without rules"),
    pytest.param(Config(destinations=(DestinationConfig(name="d", url="http://127.0.0.1:1/w", write_relabel_configs=(
        parse_relabel_config({"source_labels": ["__name__"], "regex": "m.*", "action": "keep"}),)),)),
        id="a regex that is not a list of names"),
    pytest.param(Config(destinations=(DestinationConfig(name="d", url="http://127.0.0.1:1/w", write_relabel_configs=(
        parse_relabel_config({"regex": "a", "action": "labeldrop"}), _NAME_FILTERS[0])),)),
        id="the filter is not the first rule"),
])
def test_the_drop_by_name_answer_is_off_where_the_name_alone_does_not_decide(config: Config) -> None:
    assert pipeline(config, AmpLimits())._name_drops is None


def test_the_drop_by_name_memo_never_holds_more_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decide_mod, "_MAX_SHORT_MEMO", 3)
    p = _one_destination({"source_labels": ["__name__"], "regex": "m1", "action": "keep"})
    for i in range(10):
        assert p.decide(_key(__name__=f"n{i}"))[1:] == (stage_mod.RULES,)
        assert p._name_drops is not None and len(p._name_drops) <= 3
    assert p.decide(_key(__name__="m1"))[1] != stage_mod.RULES


# ---- destinations that send every series with the external labels added, nothing else ----------
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), external_st.filter(bool), amp_st,
       st.lists(key_sets(), min_size=1, max_size=3).map(lambda ks: [k for s in ks for k in s]))
def test_decide_where_destinations_only_add_the_external_labels_equals_the_reference(
        n_dest: int, external: Labels, amp: AmpLimits, keys: list[bytes]) -> None:
    config = Config(external_labels=external, destinations=tuple(
        DestinationConfig(name=f"d{i}", url="http://127.0.0.1:1/w") for i in range(n_dest)))
    p = pipeline(config, amp)
    assert p._ext_only and not p._as_is
    decides_as_the_reference(p, keys * 2, external)


@pytest.mark.parametrize(("external", "labels", "short"), [
    ((("cluster", "c"),), {"__name__": "m", "pod": "p"}, True),  # one label, between two
    ((("aa", "1"), ("ab", "2")), {"__name__": "m", "pod": "p"}, True),  # two, together
    ((("zz", "1"),), {"__name__": "m", "pod": "p"}, True),  # at the end
    ((("a", "1"), ("z", "2")), {"__name__": "m", "pod": "p"}, False),  # apart: pod between them
    ((("pod", "mine"),), {"__name__": "m", "pod": "p"}, False),  # the series' own label wins
])
def test_the_external_labels_short_path_takes_only_series_they_all_go_into_at_one_place(
        external: Labels, labels: dict[str, str], short: bool) -> None:
    p = pipeline(Config(external_labels=external, destinations=(DestinationConfig(name="d", url="http://127.0.0.1:1/w"),)),
                 AmpLimits())
    key = _key(**labels)
    got = p.decide(key)
    assert (p._ext_at[tuple(sorted(labels))] is not None) == short
    assert got == ref_decide(p, key, {})


def test_the_external_labels_short_path_leaves_a_series_over_an_amp_limit_to_the_general_path() -> None:
    p = pipeline(Config(external_labels=(("cluster", "c"),), destinations=(
        DestinationConfig(name="d", url="http://127.0.0.1:1/w"),)), AmpLimits(max_labels=2))
    key = _key(__name__="m", pod="p")  # 3 labels with cluster
    got = p.decide(key)
    assert got[1][0] == b"" and got == ref_decide(p, key, {})  # a drop, named as the reference names it


@pytest.mark.parametrize("config", [
    Config(external_labels=(("c", "1"),), global_relabel=(parse_relabel_config(
        {"target_label": "x", "replacement": "y"}),), destinations=(DestinationConfig(name="d", url="http://x/w"),)),
    Config(external_labels=(("c", "1"),), destinations=(DestinationConfig(name="d", url="http://x/w",
                                                                          prune_labels=("b",)),)),
    Config(external_labels=(("c", "1"),), destinations=(DestinationConfig(
        name="d", url="http://x/w", aggregate=(AggregateConfig(match="m", without=("b",)),)),)),
    Config(destinations=(DestinationConfig(name="d", url="http://x/w"),)),  # no external labels: _as_is
], ids=["global rules", "prune", "aggregation", "no external labels"])
def test_the_external_labels_short_path_is_off_where_anything_else_changes_a_series(config: Config) -> None:
    assert not pipeline(config, AmpLimits())._ext_only


def test_the_external_labels_place_memo_never_holds_more_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decide_mod, "_MAX_SHORT_MEMO", 3)
    p = pipeline(Config(external_labels=(("cluster", "c"),), destinations=(
        DestinationConfig(name="d", url="http://127.0.0.1:1/w"),)), AmpLimits())
    for i in range(10):
        key = wire.encode_labels((("__name__", "m"), (f"l{i}", "v")))
        assert p.decide(key) == ref_decide(p, key, {})
        assert len(p._ext_at) <= 3


@pytest.mark.parametrize(("names", "amp", "want"), [
    (("__name__", "a", "cluster"), AmpLimits(), AmpLimits().max_value_len),
    (("__name__", "a", "cluster"), AmpLimits(max_labels=2), -1),  # too many labels
    (("__name__", "a-b"), AmpLimits(), -1),  # not a valid label name
    (("a", "b"), AmpLimits(), -1),  # no metric name
    (("__name__", "abcdefghij"), AmpLimits(max_name_len=4), -1),  # a name too long
    (("__name__", *[f"l{i:03}" for i in range(limits.MAX_MEMO_NAMES)]), AmpLimits(max_labels=1000), -1),
])
def test_fits_named_is_the_size_up_to_which_the_names_alone_never_make_amp_look_closer(
        names: tuple[str, ...], amp: AmpLimits, want: int) -> None:
    assert limits.fits_named(names, amp) == want
    if want > 0:  # and amp_violation_named agrees at that size, once the metric is known valid
        labels = tuple((n, "m" if n == "__name__" else "v") for n in names)
        assert limits.amp_violation_named(labels, names, want, amp) is None and limits.metric_ok("m")
        assert limits.amp_violation_named(labels, names, want + 1, amp) == amp_violation(labels, amp)


def test_metric_ok_is_true_only_for_a_metric_name_memoised_as_valid() -> None:
    limits._METRIC_OK.pop("never_seen_metric", None)
    assert not limits.metric_ok("never_seen_metric")
    labels = (("__name__", "never_seen_metric"),)
    assert limits.amp_violation_named(labels, ("__name__",), 30, AmpLimits()) is None
    assert limits.metric_ok("never_seen_metric")
    assert limits.amp_violation_named((("__name__", "1bad"),), ("__name__",), 30, AmpLimits()) is not None
    assert not limits.metric_ok("1bad")


def test_the_short_path_memos_keep_no_hostile_metric_name_or_label_names() -> None:
    keep = {"source_labels": ["__name__"], "regex": "m1", "action": "keep"}
    p = _one_destination(keep)
    long_name = "x" * (limits.MAX_MEMO_TEXT + 1)
    key = _key(__name__=long_name)
    assert p.decide(key) == ref_decide(p, key, {}) and p._name_drops == {}  # decided, not kept
    q = pipeline(Config(external_labels=(("cluster", "c"),), destinations=(
        DestinationConfig(name="d", url="http://127.0.0.1:1/w"),)), AmpLimits(max_name_len=1 << 20))
    key = wire.encode_labels((("__name__", "m"), ("l" * (decide_mod._MAX_MEMO_NAME_CHARS + 1), "v")))
    assert q.decide(key) == ref_decide(q, key, {}) and q._ext_at == {}
    key = _key(__name__="m", pod="p")
    q.decide(key)
    assert list(q._ext_at) == [("__name__", "pod")]  # an ordinary one is
