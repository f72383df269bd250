"""``${VAR}`` is expanded only where Prometheus gives ``$`` no meaning (issue 20 point 1).

Every case of tests/data/relabel_cases.json (Prometheus's TestRelabel rows and the issue's two,
checked against Prometheus) written into a relay config file gives Prometheus's answer, in each place
a relabel list can sit; the relay's own keys still expand; check-config warns about a rule value
that reads like an environment variable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from relay.common import labels as lbl
from relay.config.config import ConfigError, load_config, parse_config
from relay.config.promimport import import_prometheus, variables
from relay.control.cli import main
from relay.rules.relabel import process
from tests.helpers import TEST_DATA

CASES: list[dict[str, Any]] = json.loads((TEST_DATA / "relabel_cases.json").read_text())["cases"]
ENV = {"URL": "http://receiver:9090/api/v1/write", "second": "from-the-environment", "HOME": "/root"}


def _config(rules: list[dict[str, Any]], where: str) -> str:
    dest: dict[str, Any] = {"name": "d", "url": "${URL}"}
    doc: dict[str, Any] = {}
    if where == "global":
        doc["global"] = {"relabel_configs": rules}
    else:
        dest["write_relabel_configs"] = rules
    doc["remote_write" if where == "remote_write" else "destinations"] = [dest]
    return yaml.safe_dump(doc, sort_keys=False)


def _rules(config_text: str, where: str) -> Any:
    config = parse_config(config_text, env=ENV)
    assert config.destinations[0].url == ENV["URL"]  # the relay's own key: expanded
    return config.global_relabel if where == "global" else config.destinations[0].write_relabel_configs


@pytest.mark.parametrize("where", ["destinations", "remote_write", "global"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_relabel_case_in_a_config_file_gives_prometheus_s_answer(case: dict[str, Any], where: str) -> None:
    rules = _rules(_config(case["rules"], where), where)
    result = process(lbl.make(case["input"].items()), rules)
    if case.get("drop"):
        assert result is None
    else:
        assert result == lbl.make(case["output"].items())


@pytest.mark.parametrize(
    ("yaml_value", "kept"),
    [
        ('"${second}"', "${second}"),  # a named group, although $second is set in the environment
        ("$$$1", "$$$1"),
        ("'$${1}'", "$${1}"),
        ('"${UNSET_ANYWHERE}"', "${UNSET_ANYWHERE}"),  # not an error: never looked up
        ('"${HOME:-x}"', "${HOME:-x}"),
        ('"${A:-\\"q\\"}"', '${A:-"q"}'),  # the scalar's escapes as YAML reads them
        ("|\n          ${1}-$$\n", "${1}-$$\n"),
    ],
)
def test_rule_values_are_the_file_s_bytes(yaml_value: str, kept: str) -> None:
    text = (
        "destinations:\n  - name: d\n    url: ${URL}\n    write_relabel_configs:\n"
        "      - source_labels: [a]\n        regex: '(?P<second>.*)'\n        target_label: b\n"
        f"        replacement: {yaml_value}\n"
    )
    (rule,) = parse_config(text, env=ENV).destinations[0].write_relabel_configs
    assert rule.replacement == kept


def test_aggregate_rules_are_not_expanded() -> None:
    text = (
        "destinations:\n  - name: d\n    url: http://h:1/w\n    aggregate:\n"
        "      - match: '{__name__=\"DCGM_FI_DEV_GPU_UTIL\", job=\"${UNSET_JOB}\"}'\n"
        "        without: [gpu]\n        interval: 60s\n        outputs: [avg]\n"
    )
    (agg,) = parse_config(text, env={}).destinations[0].aggregate
    assert agg.match == "{__name__=\"DCGM_FI_DEV_GPU_UTIL\", job=\"${UNSET_JOB}\"}"


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ("external_labels:\n  cluster: ${CLUSTER}\n", lambda c: dict(c.external_labels)["cluster"] == "prod"),
        ("", lambda c: c.destinations[0].headers["X-Team"] == "prod"),
        ("", lambda c: c.destinations[0].queue.max_shards == 7),
    ],
    ids=["external_labels", "headers", "queue"],
)
def test_the_relay_s_own_keys_still_expand(text: str, check: Any) -> None:
    config = parse_config(
        text + "destinations:\n  - name: d\n    url: http://h:1/w\n    headers: {X-Team: '${CLUSTER}'}\n"
        "    queue: {max_shards: ${SHARDS}}\n",
        env={"CLUSTER": "prod", "SHARDS": "7"},
    )
    assert check(config)


def test_an_unset_variable_outside_the_rules_is_still_an_error() -> None:
    with pytest.raises(ConfigError, match="environment variable URL is not set"):
        parse_config("destinations:\n  - name: d\n    url: ${URL}\n    write_relabel_configs: []\n", env={})


def test_check_config_warns_about_an_environment_lookalike_with_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(
        "destinations:\n  - name: d\n    url: http://h:1/w\n    write_relabel_configs:\n"
        "      - target_label: cluster\n        replacement: ${CLUSTER}\n"
        "      - source_labels: [instance]\n        regex: '(?P<HOST>[^:]+):.*'\n        target_label: host\n"
        "        replacement: ${HOST}\n"
        "      - target_label: literal\n        replacement: $${CLUSTER}\n"
    )
    assert main(["check-config", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if "looks like an environment variable" in line]
    assert len(warnings) == 1, err  # ${HOST} is a group of its regex; $${CLUSTER} is a $ and text
    field = "destinations[0].write_relabel_configs[0].replacement"
    assert warnings[0].startswith(f"warning: {path}:6: {field}: ${{CLUSTER}} looks like"), warnings


def test_import_copies_rules_verbatim_and_lists_only_real_variables(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(
        "global:\n  external_labels: {cluster: '${CLUSTER}'}\nremote_write:\n  - url: http://h:1/w\n"
        "    write_relabel_configs:\n      - source_labels: [instance]\n"
        "        regex: '(?P<first>[^:]+):(?P<second>.*)'\n        target_label: port\n"
        "        replacement: '${second}'\n"
    )
    imported = import_prometheus(path)
    assert variables(imported.relay_config) == ["CLUSTER"]
    (tmp_path / "relay.yaml").write_text(imported.relay_config)
    (d,) = load_config(tmp_path / "relay.yaml", env={"CLUSTER": "c"}).destinations
    assert d.write_relabel_configs[0].replacement == "${second}"
