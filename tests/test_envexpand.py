from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.config import ConfigError, load_config, parse_config
from relay.envexpand import ExpansionIssue, expand

ENV = {"POD_NAME": "prometheus-1", "EMPTY": "", "REGION": "eu-west-1"}


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("a: ${POD_NAME}\n", "a: prometheus-1\n"),
        ("a: x-${POD_NAME}-y ${REGION}\n", "a: x-prometheus-1-y eu-west-1\n"),
        ("a: ${UNSET:-fallback}\n", "a: fallback\n"),
        ("a: ${EMPTY:-fallback}\n", "a: fallback\n"),  # the shell's ":-": unset or empty
        ("a: ${POD_NAME:-fallback}\n", "a: prometheus-1\n"),
        ("a: ${UNSET:-}\n", "a: \n"),
        ("a: '${EMPTY}'\n", "a: ''\n"),  # set but empty: used as is
        ("a: $$\n", "a: $\n"),
        ("a: $${POD_NAME}\n", "a: ${POD_NAME}\n"),
        ("a: $$$$\n", "a: $$\n"),
        ("replacement: $1 ${1} $name $\n", "replacement: $1 ${1} $name $\n"),  # relabel templates stay
        ("a: ${not closed\n", "a: ${not closed\n"),
        ("  # comment with ${UNSET}\n", "  # comment with ${UNSET}\n"),
        ("no dollars\n", "no dollars\n"),
    ],
)
def test_expand_replaces_variables_and_keeps_the_rest(text: str, expanded: str) -> None:
    assert expand(text, ENV) == (expanded, [])


def test_expand_reports_each_unset_variable_with_its_line() -> None:
    text, issues = expand("a: 1\nb: ${NOPE}\nc: ${ALSO_NOPE} ${POD_NAME}\n", ENV)
    assert text == "a: 1\nb: \nc:  prometheus-1\n"
    assert [(i.line, i.variable) for i in issues] == [(2, "NOPE"), (3, "ALSO_NOPE")]


def test_expand_refuses_a_value_with_a_line_break_that_would_move_later_lines() -> None:
    text, issues = expand("a: ${MULTI}\nb: 2\n", {"MULTI": "x\ny"})
    assert text.count("\n") == 2
    assert issues == [ExpansionIssue(1, "MULTI", "environment variable MULTI contains a line break")]


def test_expand_keeps_the_number_of_lines() -> None:
    text = "a: ${POD_NAME}\r\nb: ${UNSET:-x}\n\nc: $$\n"
    out, _ = expand(text, ENV)
    assert out.splitlines() == ["a: prometheus-1", "b: x", "", "c: $"]


D = "destinations:\n  - name: a\n    url: http://127.0.0.1:9/w\n"


def test_config_values_come_from_the_environment() -> None:
    text = (
        "external_labels: {cluster: '${CLUSTER:-gpu-prod}', __replica__: '${POD_NAME}'}\n"
        "storage: {path: '${QUEUE_DIR:-/var/lib/gpu-relay}'}\n" + D
    )
    config = parse_config(text, env=ENV)
    assert config.external_labels == (("__replica__", "prometheus-1"), ("cluster", "gpu-prod"))
    assert config.storage_path == Path("/var/lib/gpu-relay")


def test_unset_variable_without_default_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text("external_labels:\n  __replica__: ${POD_NAME}\n" + D)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == (
        f"{path}:2: environment variable POD_NAME is not set (give a default: ${{POD_NAME:-value}}; "
        "$$ is a literal $)"
    )


def test_errors_after_an_expansion_keep_the_file_s_line_numbers() -> None:
    text = "server:\n  listen: ${LISTEN:-127.0.0.1:9201}\n" + D + "    queue: {max_backoff: ${BACKOFF}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={"BACKOFF": "5q"})
    assert str(info.value) == 'relay.yaml:6: destinations[0].queue.max_backoff: invalid duration "5q"'


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_RELAY_TEST_CLUSTER", "from-env")
    config = parse_config("external_labels: {cluster: '${GPU_RELAY_TEST_CLUSTER}'}\n" + D)
    assert config.external_labels == (("cluster", "from-env"),)


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="ab$:{}-_#\n \r", max_size=80),
    st.dictionaries(st.sampled_from(["a", "b", "ab"]), st.text(alphabet="xy$ {}", max_size=5), max_size=3),
)
def test_expansion_never_moves_a_line(text: str, env: dict[str, str]) -> None:
    out, issues = expand(text, env)
    assert len(out.splitlines()) == len(text.splitlines())
    assert all(1 <= i.line <= len(text.splitlines()) for i in issues)
