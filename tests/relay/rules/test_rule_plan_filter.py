"""relay.rule_plan's first-rule name filter: a keep/drop on [__name__] whose regex is an alternation of
literal names is answered by a set probe, and RulePlan.apply must still equal relabel.process (the
reference) for every label set, whatever the rules after it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.common.labels import Labels
from relay.rules.relabel import RelabelConfig, parse_relabel_config, process
from relay.rules.rule_plan import RulePlan, name_filter, names_of

METRICS = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "node_load1", "up", "a:b", "x1", "DCGM"]
NAMES = ["__name__", "a", "gpu", "job", "pci_bus_id", "zz"]
VALUES = ["DCGM_FI_DEV_GPU_UTIL", "up", "0", "foo", "x1"]


def rule(**raw: Any) -> RelabelConfig:
    return parse_relabel_config(raw)


@pytest.mark.parametrize(("raw", "want"), [
    ({"source_labels": ["__name__"], "regex": "up|x1", "action": "keep"}, (True, frozenset({"up", "x1"}))),
    ({"source_labels": ["__name__"], "regex": "a:b", "action": "drop"}, (False, frozenset({"a:b"}))),
    ({"source_labels": ["__name__"], "regex": "up|x.*", "action": "keep"}, None),  # a regex, not literals
    ({"source_labels": ["__name__"], "regex": "(up|x1)", "action": "keep"}, None),
    ({"source_labels": ["__name__"], "regex": "up||x1", "action": "keep"}, None),  # matches "" too
    ({"source_labels": ["__name__"], "regex": "UP|x1", "action": "keep"}, (True, frozenset({"UP", "x1"}))),
    ({"source_labels": ["__name__", "job"], "regex": "up", "action": "keep"}, None),
    ({"source_labels": ["job"], "regex": "up", "action": "keep"}, None),
    ({"source_labels": ["__name__"], "regex": "up", "target_label": "t", "action": "replace"}, None),
    ({"regex": "up", "action": "labeldrop"}, None),
])
def test_name_filter_takes_only_keep_or_drop_of_literal_metric_names(raw: dict[str, Any], want: Any) -> None:
    assert name_filter(rule(**raw)) == want


def test_a_keep_filter_drops_other_names_and_a_series_without_a_name_as_the_reference() -> None:
    plan = RulePlan([rule(source_labels=["__name__"], regex="up|x1", action="keep")])
    for labels in ((("__name__", "up"), ("a", "1")), (("__name__", "down"),), (("a", "1"),), ()):
        want = process(labels, plan.rules)
        assert plan.apply(labels, names_of(labels)) == (None if want is None else (want, names_of(want)))
    assert plan.apply((("__name__", "down"),), ("__name__",)) is None
    assert set(plan._plans) == {("__name__", "a")}  # the others dropped by the set probe, without a plan


extra_rules = st.lists(st.sampled_from([
    {"regex": "pci_bus_id|zz", "action": "labeldrop"},
    {"regex": "gpu|job|__name__", "action": "labelkeep"},
    {"source_labels": ["job"], "regex": "f(.*)", "target_label": "a", "replacement": "$1"},
    {"source_labels": ["__name__"], "regex": "up", "action": "drop"},
    {"source_labels": ["gpu"], "regex": "0", "action": "keep"},
]), max_size=3)


@st.composite
def label_sets(draw: st.DrawFn) -> Labels:
    pairs = draw(st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES + METRICS), max_size=5))
    return tuple(sorted(pairs.items()))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["keep", "drop"]), st.lists(st.sampled_from(METRICS), min_size=1, max_size=4, unique=True),
       extra_rules, st.lists(label_sets(), min_size=1, max_size=6))
def test_plan_with_a_leading_name_filter_equals_process(action: str, metrics: list[str], extra: list[dict[str, Any]],
                                                         sets: list[Labels]) -> None:
    rules = [rule(source_labels=["__name__"], regex="|".join(metrics), action=action)] + [rule(**r) for r in extra]
    plan = RulePlan(rules)
    assert plan._filter == (action == "keep", frozenset(metrics))
    for labels in sets * 2:  # the second time from the effect memo where it was not filtered
        want = process(labels, rules)
        assert plan.apply(labels, names_of(labels)) == (None if want is None else (want, names_of(want)))


def test_unsorted_or_duplicated_names_are_the_reference_s_to_decide() -> None:
    plan = RulePlan([rule(source_labels=["__name__"], regex="up", action="keep")])
    dup = (("__name__", "down"), ("__name__", "up"))  # the builder reads the last value
    want = process(dup, plan.rules)
    got = plan.apply(dup, names_of(dup))
    assert got == (None if want is None else (want, names_of(want)))
