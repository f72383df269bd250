"""relay.relabel: Prometheus relabel_config semantics, checked against relabel_test.go's tables."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.common import labels as lbl
from relay.rules.relabel import (
    DEFAULT_REGEX,
    Regexp,
    RelabelConfig,
    RelabelConfigError,
    compile_template,
    expand,
    is_valid_legacy_target,
    parse_relabel_config,
    parse_relabel_configs,
    process,
    process_traced,
    rules_to_yaml_dict,
    validate,
)
from tests.helpers import TEST_DATA

DATA = TEST_DATA
RELABEL_CASES: list[dict[str, Any]] = json.loads((DATA / "relabel_cases.json").read_text())["cases"]
VALIDATE_CASES: list[dict[str, Any]] = json.loads((DATA / "relabel_validate_cases.json").read_text())["cases"]


def labelset(mapping: dict[str, str]) -> lbl.Labels:
    return lbl.make(mapping.items())


# --- TestRelabel --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", RELABEL_CASES, ids=[c["name"] for c in RELABEL_CASES])
def test_relabel_table(case: dict[str, Any]) -> None:
    rules = parse_relabel_configs(case["rules"])
    result = process(labelset(case["input"]), rules)
    if case.get("drop"):
        assert result is None
    else:
        assert result == labelset(case["output"])


@pytest.mark.parametrize("case", RELABEL_CASES, ids=[c["name"] for c in RELABEL_CASES])
def test_process_traced_agrees_with_process_and_names_the_dropping_rule(case: dict[str, Any]) -> None:
    rules = parse_relabel_configs(case["rules"])
    labels = labelset(case["input"])
    result, index = process_traced(labels, rules)
    assert result == process(labels, rules)
    if result is None:
        assert process(labels, rules[: index + 1]) is None and process(labels, rules[:index]) is not None
    else:
        assert index == -1


def test_relabel_table_ports_every_upstream_row() -> None:
    upstream = [c for c in RELABEL_CASES if c["origin"].endswith("TestRelabel")]
    assert len(upstream) == 34


def test_process_result_is_sorted_and_has_no_empty_values() -> None:
    rules = parse_relabel_configs(
        [{"target_label": "zz", "replacement": "1"}, {"target_label": "aa", "replacement": "2"}]
    )
    result = process(labelset({"m": "x", "b": "y"}), rules)
    assert result == (("aa", "2"), ("b", "y"), ("m", "x"), ("zz", "1"))


def test_process_without_changes_returns_the_same_tuple() -> None:
    labels = labelset({"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0"})
    rules = parse_relabel_configs([{"source_labels": ["__name__"], "regex": "DCGM_.*", "action": "keep"}])
    assert process(labels, rules) is labels
    assert process(labels, ()) is labels


def test_process_set_then_delete_in_one_pass_leaves_no_label() -> None:
    rules = parse_relabel_configs(
        [{"target_label": "tmp", "replacement": "x"}, {"regex": "tmp", "action": "labeldrop"}]
    )
    assert process(labelset({"a": "1"}), rules) == (("a", "1"),)


def test_process_deleted_label_reads_as_empty_until_set_again() -> None:
    rules = parse_relabel_configs(
        [
            {"regex": "a", "action": "labeldrop"},
            {"source_labels": ["a"], "target_label": "copy", "replacement": "was:$1"},
            {"target_label": "a", "replacement": "back"},
            {"source_labels": ["a"], "target_label": "copy2"},
        ]
    )
    assert process(labelset({"a": "1"}), rules) == (("a", "back"), ("copy", "was:"), ("copy2", "back"))


# --- TestRelabelValidate ------------------------------------------------------------------------


@pytest.mark.parametrize("case", VALIDATE_CASES, ids=[c["name"] for c in VALIDATE_CASES])
def test_validate_table(case: dict[str, Any]) -> None:
    def load() -> None:
        cfg = parse_relabel_config(case["config"])
        validate(cfg, name_validation=case["name_validation"])

    if case["error"] is None:
        load()
        return
    with pytest.raises(RelabelConfigError) as info:
        load()
    assert case["error"] in info.value.message
    assert info.value.field == case["field"]


def test_config_error_is_a_value_error_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^modulus: relabel configuration for hashmod requires non-zero"):
        parse_relabel_config({"source_labels": ["a"], "target_label": "b", "action": "hashmod"})


def test_parse_relabel_configs_prefixes_the_field_with_the_index() -> None:
    raw = [{"target_label": "a"}, {"target_label": "b"}, {"regex": "(", "action": "keep"}]
    with pytest.raises(RelabelConfigError) as info:
        parse_relabel_configs(raw)
    assert info.value.field == "[2].regex"
    assert "error parsing regexp" in info.value.message


def test_parse_relabel_configs_index_alone_when_no_field() -> None:
    with pytest.raises(RelabelConfigError) as info:
        parse_relabel_configs([{"target_label": "a"}, "not a mapping"])
    assert info.value.field == "[1]"


def test_parse_relabel_configs_rejects_a_mapping() -> None:
    with pytest.raises(RelabelConfigError, match="must be a list"):
        parse_relabel_configs({"target_label": "a"})  # type: ignore[arg-type]


def test_parse_applies_prometheus_defaults() -> None:
    cfg = parse_relabel_config({"target_label": "x"})
    assert cfg == RelabelConfig(target_label="x")
    assert (cfg.action, cfg.separator, cfg.regex.pattern, cfg.replacement) == ("replace", ";", "(.*)", "$1")
    assert cfg.regex is DEFAULT_REGEX


def test_explicit_empty_values_differ_from_absent_ones() -> None:
    cfg = parse_relabel_config({"target_label": "x", "separator": "", "regex": "", "replacement": ""})
    assert (cfg.separator, cfg.regex.pattern, cfg.replacement) == ("", "", "")
    assert cfg.regex is not DEFAULT_REGEX


def test_yaml_null_values_are_go_zero_values() -> None:
    cfg = parse_relabel_config(yaml.safe_load("target_label: x\nseparator:\nregex:\nreplacement:\n"))
    assert (cfg.separator, cfg.regex.pattern, cfg.replacement) == ("", "", "")


def test_constructing_a_config_with_an_unknown_action_fails() -> None:
    with pytest.raises(RelabelConfigError) as info:
        RelabelConfig(target_label="x", action="rename")
    assert info.value.field == "action"


@pytest.mark.parametrize(
    ("template", "valid"),
    [
        ("-label", False),
        ("label", True),
        ("label${1}", True),
        ("${1}label", True),
        ("${1}", True),
        ("${", False),
        ("$", False),
        ("${}", False),
        ("foo${", False),
        ("$1", True),
        ("asd$2asd", True),
        ("-foo${1}bar-", False),
        ("bar.foo${1}bar", False),
        ("_${1}_", True),
        ("foo${bar}foo", True),
    ],
)
def test_legacy_target_validity(template: str, valid: bool) -> None:
    """TestTargetLabelLegacyValidity."""
    assert is_valid_legacy_target(template) is valid


def test_legacy_target_check_is_linear_on_long_invalid_input() -> None:
    assert is_valid_legacy_target("a" * 5000 + "-") is False  # a backtracking engine would hang here


# --- round trip ---------------------------------------------------------------------------------

UNMARSHAL_THEN_MARSHAL = [  # TestConfig_UnmarshalThenMarshal
    """source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port]
separator: ;
regex: \\d+
target_label: __meta_kubernetes_pod_container_port_number
replacement: $1
action: replace
""",
    """source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port]
separator: ;
target_label: __meta_kubernetes_pod_container_port_number
replacement: $1
action: keepequal
""",
    """source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port]
separator: ;
regex: (.*)
target_label: __meta_kubernetes_pod_container_port_number
replacement: $1
action: replace
""",
]


@pytest.mark.parametrize("text", UNMARSHAL_THEN_MARSHAL, ids=["values", "no regex", "default regex"])
def test_unmarshal_then_marshal_gives_the_same_mapping_in_prometheus_key_order(text: str) -> None:
    loaded = yaml.safe_load(text)
    out = rules_to_yaml_dict(parse_relabel_config(loaded))
    assert list(out.items()) == list(loaded.items())


ALL_RULES = [rule for case in RELABEL_CASES for rule in case["rules"]]


@pytest.mark.parametrize("raw", ALL_RULES)
def test_parse_to_dict_parse_round_trips(raw: dict[str, Any]) -> None:
    cfg = parse_relabel_config(raw)
    again = parse_relabel_config(yaml.safe_load(yaml.safe_dump(rules_to_yaml_dict(cfg))))
    assert again == cfg
    assert (again.regex is DEFAULT_REGEX) == (cfg.regex is DEFAULT_REGEX)
    assert rules_to_yaml_dict(again) == rules_to_yaml_dict(cfg)


def test_round_trip_keeps_explicit_empty_separator_and_replacement() -> None:
    """prometheus#18652: an explicit "" must not come back as the default."""
    cfg = parse_relabel_config(
        {"source_labels": ["a", "b"], "separator": "", "target_label": "t", "replacement": ""}
    )
    out = rules_to_yaml_dict(cfg)
    assert out["separator"] == "" and out["replacement"] == ""
    assert parse_relabel_config(out) == cfg


def test_to_dict_strips_regex_anchors_and_omits_the_default_regex() -> None:
    assert rules_to_yaml_dict(parse_relabel_config({"regex": "a|b", "action": "keep"}))["regex"] == "a|b"
    assert "regex" not in rules_to_yaml_dict(parse_relabel_config({"target_label": "t"}))
    assert rules_to_yaml_dict(parse_relabel_config({"target_label": "t", "regex": ""}))["regex"] == ""


# --- Regexp -------------------------------------------------------------------------------------


def test_regexp_pattern_is_the_original_text() -> None:
    assert Regexp("f(.*)").pattern == "f(.*)"
    assert Regexp("a") == Regexp("a") and hash(Regexp("a")) == hash(Regexp("a"))
    assert Regexp("a") != Regexp("b")


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        ("f|o", "foo", False),
        ("line1.*line2", "line1\nline2", True),
        (".*", "a\nb\n", True),
        ("a", "a\n", False),
        ("(?i)gpu", "GPU", True),
        ("é.", "éü", True),
        ("\\d+", "\u0661\u0662", False),
    ],
)
def test_regexp_is_anchored_dotall_re2(pattern: str, text: str, matches: bool) -> None:
    assert Regexp(pattern).matches(text) is matches


@settings(max_examples=150, deadline=None)
@given(
    pattern=st.sampled_from(["a.*b", "(a|b)+", "[^x]*", "gpu_[0-9]+", ".*", "x?y?z?", "a\\nb|", "(?i)GPU.*"]),
    text=st.text(alphabet="abxyz\n_0123gpuGPU", max_size=12),
    pad=st.integers(min_value=0, max_value=1),
)
def test_regexp_matches_agrees_with_a_full_match_on_short_and_long_texts(
    pattern: str, text: str, pad: int
) -> None:
    text = text + "z" * (2000 * pad)  # long texts take the plain-search path
    assert Regexp(pattern).matches(text) is (re.fullmatch(pattern, text, re.DOTALL) is not None)
    assert (Regexp(pattern).submatch_index(text) is not None) is Regexp(pattern).matches(text)


def test_regexp_submatch_index_uses_character_offsets() -> None:
    assert Regexp("é(ü)(x)?").submatch_index("éü") == [0, 2, 1, 2, -1, -1]
    assert Regexp("x").submatch_index("y") is None


# --- Go Regexp.Expand ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("regex", "template", "src", "want"),
    [
        ("(f)(o+)", "$1", "foo", "f"),
        ("(f)(o+)", "${2}", "foo", "oo"),
        ("(f)(o+)", "$1_x", "foo", ""),  # the group named "1_x"
        ("(f)(o+)", "${1}_x", "foo", "f_x"),
        ("(f)(o+)", "$2$1", "foo", "oof"),
        ("(f)(o+)", "$$1", "foo", "$1"),
        ("(f)(o+)", "$", "foo", "$"),
        ("(f)(o+)", "a$", "foo", "a$"),
        ("(f)(o+)", "${1", "foo", "${1"),
        ("(f)(o+)", "${}", "foo", "${}"),
        ("(f)(o+)", "$-", "foo", "$-"),
        ("(f)(o+)", "$3", "foo", ""),
        ("(f)(o+)", "$0", "foo", "foo"),
        ("(f)(o+)", "$00", "foo", ""),  # leading zero: a name, not a number
        ("(f)(o+)", "$1é", "foo", ""),  # letters are Unicode letters in Go's extract
        ("(f)(o+)", "${1}é", "foo", "fé"),
        ("(?P<g>f)(o+)", "$g-${g}", "foo", "f-f"),
        ("(?P<1_x>f)(o+)", "$1_x", "foo", "f"),
        ("(a)|(b)", "[$1][$2]", "b", "[][b]"),  # a group that did not take part is ""
        ("(f)(o+)", "no vars", "foo", "no vars"),
    ],
)
def test_expand_follows_go_regexp_expand(regex: str, template: str, src: str, want: str) -> None:
    rx = Regexp(regex)
    index = rx.submatch_index(src)
    assert index is not None
    assert expand(compile_template(template, rx), src, index) == want


# --- hashmod ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "modulus", "want"), [("baz", 1000, "976"), ("foo\nbar", 1000, "734")])
def test_hashmod_matches_prometheus(value: str, modulus: int, want: str) -> None:
    rules = parse_relabel_configs(
        [{"source_labels": ["v"], "target_label": "h", "modulus": modulus, "action": "hashmod"}]
    )
    assert lbl.get(process(labelset({"v": value}), rules) or (), "h") == want


@settings(max_examples=60, deadline=None)
@given(value=st.text(max_size=20), modulus=st.integers(min_value=1, max_value=(1 << 64) - 1))
def test_hashmod_is_below_the_modulus(value: str, modulus: int) -> None:
    rules = (RelabelConfig(source_labels=("v",), target_label="h", modulus=modulus, action="hashmod"),)
    result = process(labelset({"v": value}), rules)
    assert result is not None
    assert 0 <= int(lbl.get(result, "h")) < modulus


# --- properties ---------------------------------------------------------------------------------

NAMES = st.sampled_from(["__name__", "a", "b", "gpu", "pod", "x_1", "utf-8.label"])
LABELSETS = st.dictionaries(NAMES, st.text(min_size=1, max_size=6), max_size=6).map(labelset)


@settings(max_examples=80, deadline=None)
@given(labels=LABELSETS, pattern=st.sampled_from(["a|b", "gpu", ".*", "_.*", "x_(.*)", "z"]))
def test_labeldrop_and_labelkeep_partition_the_names(labels: lbl.Labels, pattern: str) -> None:
    dropped = process(labels, parse_relabel_configs([{"regex": pattern, "action": "labeldrop"}]))
    kept = process(labels, parse_relabel_configs([{"regex": pattern, "action": "labelkeep"}]))
    assert dropped is not None and kept is not None
    assert sorted(dropped + kept) == list(labels)
    assert set(dropped).isdisjoint(kept)


@settings(max_examples=80, deadline=None)
@given(labels=LABELSETS, value=st.text(max_size=4), target=NAMES)
def test_results_stay_sorted_without_empty_values(labels: lbl.Labels, value: str, target: str) -> None:
    rules = (
        RelabelConfig(target_label=target, replacement=value),
        RelabelConfig(source_labels=("a", "b"), target_label="joined"),
        RelabelConfig(regex=Regexp("(x)_(.*)"), replacement="y_$2", action="labelmap"),
    )
    result = process(labels, rules)
    assert result is not None
    assert list(result) == sorted(result)
    assert all(v != "" for _, v in result)
    assert len({n for n, _ in result}) == len(result)


# --- realistic config (BenchmarkRelabel "kubernetes") -------------------------------------------

KUBERNETES_RULES = """
- {source_labels: [__meta_kubernetes_pod_container_port_name], regex: .*-metrics, action: keep}
- {source_labels: [__meta_kubernetes_pod_label_name], action: drop, regex: ""}
- {source_labels: [__meta_kubernetes_pod_phase], regex: Succeeded|Failed, action: drop}
- {source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape], regex: "false", action: drop}
- {source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scheme], target_label: __scheme__,
   regex: '(https?)', replacement: $1, action: replace}
- {source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path], target_label: __metrics_path__,
   regex: '(.+)', replacement: $1, action: replace}
- {source_labels: [__address__, __meta_kubernetes_pod_annotation_prometheus_io_port],
   target_label: __address__, regex: '(.+?)(\\:\\d+)?;(\\d+)', replacement: '$1:$3', action: replace}
- {regex: __meta_kubernetes_pod_annotation_prometheus_io_param_(.+), replacement: __param_$1,
   action: labelmap}
- {regex: __meta_kubernetes_pod_label_prometheus_io_label_(.+), action: labelmap}
- {regex: __meta_kubernetes_pod_annotation_prometheus_io_label_(.+), action: labelmap}
- {source_labels: [__meta_kubernetes_namespace, __meta_kubernetes_pod_label_name], separator: /,
   target_label: job, replacement: $1, action: replace}
- {source_labels: [__meta_kubernetes_namespace], target_label: namespace, action: replace}
- {source_labels: [__meta_kubernetes_pod_name], target_label: pod, action: replace}
- {source_labels: [__meta_kubernetes_pod_container_name], target_label: container, action: replace}
- {source_labels: [__meta_kubernetes_pod_name, __meta_kubernetes_pod_container_name,
   __meta_kubernetes_pod_container_port_name], separator: ':', target_label: instance, action: replace}
- {target_label: cluster, replacement: dev-us-central-0}
- {source_labels: [__meta_kubernetes_namespace], regex: hosted-grafana, action: drop}
- {source_labels: [__address__], target_label: __tmp_hash, modulus: 3, action: hashmod}
- {source_labels: [__tmp_hash], regex: ^0$, action: keep}
- {regex: __tmp_hash, action: labeldrop}
"""

KUBERNETES_TARGET = {
    "__address__": "10.132.183.40:80",
    "__meta_kubernetes_namespace": "loki-boltdb-shipper",
    "__meta_kubernetes_pod_container_name": "promtail",
    "__meta_kubernetes_pod_container_port_name": "http-metrics",
    "__meta_kubernetes_pod_label_name": "promtail-loki-boltdb-shipper",
    "__meta_kubernetes_pod_name": "promtail-loki-boltdb-shipper-jgtr7",
    "__meta_kubernetes_pod_phase": "Running",
    "__metrics_path__": "/metrics",
    "__scheme__": "http",
    "job": "kubernetes-pods",
}


def test_kubernetes_config_shards_by_address_hash() -> None:
    rules = parse_relabel_configs(yaml.safe_load(KUBERNETES_RULES))
    assert process(labelset(KUBERNETES_TARGET), rules) is None  # md5 of the address % 3 == 1
    without_shard = rules[:-3]
    result = process(labelset(KUBERNETES_TARGET), without_shard)
    assert result is not None
    got = dict(result)
    assert got["job"] == "loki-boltdb-shipper/promtail-loki-boltdb-shipper"
    assert got["instance"] == "promtail-loki-boltdb-shipper-jgtr7:promtail:http-metrics"
    assert got["cluster"] == "dev-us-central-0"
    assert (got["namespace"], got["pod"], got["container"]) == (
        "loki-boltdb-shipper",
        "promtail-loki-boltdb-shipper-jgtr7",
        "promtail",
    )
