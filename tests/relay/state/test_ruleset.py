from __future__ import annotations

import textwrap

import pytest

from relay.common.labels import Labels, make
from relay.config.config import Config, parse_config
from relay.state.ruleset import Rules, UnknownDestinationError, add_external_labels, prune

CONFIG = """\
external_labels: {cluster: gpu-prod, region: eu}
global:
  relabel_configs:
    - source_labels: [gpu]
      regex: "(.+)"
      target_label: device_index
      replacement: gpu$1
    - source_labels: [env]
      regex: scratch
      action: drop
destinations:
  - name: amp
    url: https://aps.example/api/v1/remote_write
    write_relabel_configs:
      - source_labels: [__name__]
        regex: DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED
        action: keep
      - source_labels: [device_index, pci_bus_id]
        separator: "@"
        target_label: where
    prune_labels: [pci_bus_id, DCGM_FI_DRIVER_VERSION, device_index]
  - name: local
    url: http://127.0.0.1:9090/api/v1/write
"""


def series(name: str, **labels: str) -> Labels:
    return make([("__name__", name), *labels.items()])


@pytest.fixture(scope="module")
def rules() -> Rules:
    return Rules(parse_config(CONFIG))


def test_destinations_are_listed_in_config_order(rules: Rules) -> None:
    assert rules.destinations == ("amp", "local")


def test_external_labels_are_added_when_the_series_lacks_them(rules: Rules) -> None:
    out = rules.apply_global(series("up"))
    assert out == series("up", cluster="gpu-prod", region="eu")


def test_external_label_does_not_override_the_series_own_label(rules: Rules) -> None:
    out = rules.apply("local", series("up", cluster="own"))
    assert out == series("up", cluster="own", region="eu")


def test_global_relabel_sees_external_labels() -> None:
    config = parse_config(
        textwrap.dedent("""\
        external_labels: {cluster: gpu-prod}
        global:
          relabel_configs:
            - {source_labels: [cluster], regex: gpu-prod, action: keep}
        destinations: [{name: d, url: "http://127.0.0.1:1/w"}]
        """)
    )
    rules = Rules(config)
    assert rules.apply("d", series("up")) == series("up", cluster="gpu-prod")
    assert rules.apply("d", series("up", cluster="other")) is None


def test_global_relabel_runs_before_write_relabel_then_prune(rules: Rules) -> None:
    raw = series("DCGM_FI_DEV_GPU_UTIL", gpu="3", pci_bus_id="0000:3B:00.0", DCGM_FI_DRIVER_VERSION="550.1")
    out = rules.apply("amp", raw)
    # global set device_index=gpu3; write relabel read it and pci_bus_id; prune then removed both.
    assert out == series(
        "DCGM_FI_DEV_GPU_UTIL", gpu="3", where="gpu3@0000:3B:00.0", cluster="gpu-prod", region="eu"
    )


def test_write_relabel_applies_only_to_its_destination(rules: Rules) -> None:
    raw = series("DCGM_FI_DEV_SM_CLOCK", gpu="0", pci_bus_id="p")
    assert rules.apply("amp", raw) is None
    assert rules.apply("local", raw) == series(
        "DCGM_FI_DEV_SM_CLOCK", gpu="0", pci_bus_id="p", device_index="gpu0", cluster="gpu-prod", region="eu"
    )


def test_global_drop_drops_for_every_destination(rules: Rules) -> None:
    raw = series("DCGM_FI_DEV_GPU_UTIL", env="scratch")
    assert rules.apply_global(raw) is None
    assert rules.apply("amp", raw) is None
    assert rules.apply("local", raw) is None


def test_apply_is_apply_global_then_apply_destination(rules: Rules) -> None:
    raw = series("DCGM_FI_DEV_FB_USED", gpu="1", pci_bus_id="x")
    base = rules.apply_global(raw)
    assert base is not None
    assert rules.apply(0, raw) == rules.apply_destination(0, base) == rules.apply("amp", raw)


def test_destination_by_index_and_name_agree(rules: Rules) -> None:
    raw = series("up", job="x")
    assert rules.apply(1, raw) == rules.apply("local", raw)


@pytest.mark.parametrize("bad", ["nope", 2, -1])
def test_unknown_destination_error_lists_the_valid_names(rules: Rules, bad: str | int) -> None:
    with pytest.raises(UnknownDestinationError) as info:
        rules.apply(bad, series("up"))
    assert info.value.valid == ("amp", "local")
    assert str(info.value) == f'unknown destination "{bad}" (valid: amp, local)'


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ("{regex: __name__, action: labeldrop}", "no metric name"),
        ("{regex: .*, action: labeldrop}", "no labels left"),
        ("{target_label: __name__, replacement: ''}", "metric name set to empty"),
    ],
)
def test_series_without_metric_name_or_labels_is_dropped(rule: str, why: str) -> None:
    config = parse_config(
        f'destinations: [{{name: d, url: "http://h/w", write_relabel_configs: [{rule}]}}]\n'
    )
    assert Rules(config).apply("d", series("up", job="x")) is None, why


def test_input_without_metric_name_is_dropped() -> None:
    rules = Rules(parse_config('destinations: [{name: d, url: "http://h/w"}]\n'))
    assert rules.apply("d", make([("job", "x")])) is None


def test_no_rules_returns_the_same_labels_unchanged() -> None:
    rules = Rules(parse_config('destinations: [{name: d, url: "http://h/w"}]\n'))
    raw = series("up", job="x")
    assert rules.apply("d", raw) is raw


def test_rules_from_a_programmatic_config_with_no_destinations_has_none() -> None:
    assert Rules(Config()).destinations == ()


@pytest.mark.parametrize(
    ("labels", "external", "expected"),
    [
        ((), (("a", "1"),), (("a", "1"),)),
        ((("b", "2"),), (("a", "1"), ("c", "3")), (("a", "1"), ("b", "2"), ("c", "3"))),
        ((("a", "own"),), (("a", "1"),), (("a", "own"),)),
        ((("a", "own"),), (), (("a", "own"),)),
    ],
)
def test_add_external_labels_keeps_labels_sorted_and_own_values(
    labels: Labels, external: Labels, expected: Labels
) -> None:
    assert add_external_labels(labels, external) == expected


def test_prune_removes_only_the_named_labels() -> None:
    labels = series("up", a="1", b="2")
    assert prune(labels, frozenset({"a", "zzz"})) == series("up", b="2")
    assert prune(labels, frozenset({"zzz"})) is labels


TRACE = """\
external_labels: {cluster: c}
global:
  relabel_configs:
    - {source_labels: [ns], regex: sys, action: drop}
    - {source_labels: [job], regex: x, action: drop}
destinations:
  - name: amp
    url: http://127.0.0.1:9/w
    write_relabel_configs:
      - {source_labels: [__name__], regex: up|down, action: keep}
      - {source_labels: [__name__], regex: down, action: drop}
    prune_labels: [ns]
  - name: b
    url: http://127.0.0.1:9/b
"""


@pytest.mark.parametrize(
    ("series", "destination", "expected"),
    [
        ((("__name__", "up"), ("ns", "sys")), "amp", (None, "global.relabel_configs[0] (drop)")),
        ((("__name__", "up"), ("job", "x")), "b", (None, "global.relabel_configs[1] (drop)")),
        ((("__name__", "other"),), "amp", (None, "destinations[amp].write_relabel_configs[0] (keep)")),
        ((("__name__", "down"),), "amp", (None, "destinations[amp].write_relabel_configs[1] (drop)")),
        ((("a", "1"),), "b", (None, "no metric name")),
        ((("__name__", "other"),), "b", ((("__name__", "other"), ("cluster", "c")), None)),
    ],
)
def test_trace_names_the_stage_and_rule_that_dropped_a_series(
    series: Labels, destination: str, expected: tuple[Labels | None, str | None]
) -> None:
    rules = Rules(parse_config(TRACE))
    assert rules.trace(destination, series) == expected
    assert rules.apply(destination, series) == expected[0]


# ---- the cold path's external labels: inserted where they sort, once ----------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from relay.state.ruleset import with_external_named  # noqa: E402

_NAME = st.sampled_from(["__name__", "a", "cluster", "gpu", "instance", "job", "pod", "zone", "zz", "Z", "_x"])
_LABELS = st.dictionaries(_NAME, st.text(max_size=3), max_size=8).map(lambda d: tuple(sorted(d.items())))


@settings(max_examples=400, deadline=None)
@given(_LABELS, _LABELS)
def test_with_external_named_is_add_external_labels_and_names_the_result(labels: Labels, external: Labels) -> None:
    names = tuple(n for n, _ in labels)
    got, got_names = with_external_named(labels, names, external)
    assert got == add_external_labels(labels, external)
    assert got_names == tuple(n for n, _ in got)


@pytest.mark.parametrize(("labels", "external", "want"), [
    ((), (("cluster", "c"),), (("cluster", "c"),)),  # nothing of its own
    ((("a", "1"),), (("cluster", "c"),), (("a", "1"), ("cluster", "c"))),  # after the last
    ((("z", "1"),), (("cluster", "c"),), (("cluster", "c"), ("z", "1"))),  # before the first
    ((("a", "1"), ("z", "2")), (("m", "x"), ("b", "y")), (("a", "1"), ("b", "y"), ("m", "x"), ("z", "2"))),
    ((("cluster", "own"),), (("cluster", "ext"),), (("cluster", "own"),)),  # a series' own label wins
])
def test_with_external_named_inserts_each_missing_label_where_its_name_sorts(
        labels: Labels, external: Labels, want: Labels) -> None:
    got, names = with_external_named(labels, tuple(n for n, _ in labels), external)
    assert got == want and names == tuple(n for n, _ in want)


def test_global_named_gives_the_labels_with_external_and_the_global_result() -> None:
    rules = Rules(parse_config(textwrap.dedent("""
        storage: {path: /nonexistent}
        external_labels: {cluster: prod}
        global:
          relabel_configs:
            - {action: drop, source_labels: [job], regex: drop-me}
        destinations:
          - {name: amp, url: "http://127.0.0.1:1/api/v1/write", dry_run: true}
    """)))
    labels = (("__name__", "up"), ("job", "keep"))
    plain, base = rules.global_named(labels, ("__name__", "job"))
    assert plain == (("__name__", "up"), ("cluster", "prod"), ("job", "keep"))
    assert base == (plain, ("__name__", "cluster", "job")) == rules.apply_global_named(labels, ("__name__", "job"))
    dropped = (("__name__", "up"), ("job", "drop-me"))
    assert rules.global_named(dropped, ("__name__", "job")) == (
        (("__name__", "up"), ("cluster", "prod"), ("job", "drop-me")), None)
