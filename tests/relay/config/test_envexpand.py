from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from relay.config.config import ConfigError, load_config, parse_config
from relay.config.envexpand import expand

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
        ("no dollars\n", "no dollars\n"),
    ],
)
def test_expand_replaces_variables_and_keeps_the_rest(text: str, expanded: str) -> None:
    assert expand(text, ENV) == (expanded, [])


def test_expand_reports_each_unset_variable_with_its_line() -> None:
    text, issues = expand("a: 1\nb: ${NOPE}\nc: ${ALSO_NOPE} ${POD_NAME}\n", ENV)
    assert text == "a: 1\nb: \nc:  prometheus-1\n"
    assert [(i.line, i.variable) for i in issues] == [(2, "NOPE"), (3, "ALSO_NOPE")]


def test_expand_puts_a_multi_line_value_in_as_it_is_and_counts_lines_of_the_original() -> None:
    # In a config the value goes into its scalar after the YAML is read, so it moves no line there
    # (test_a_multi_line_value_is_one_value_and_later_lines_keep_their_numbers).
    text, issues = expand("a: ${MULTI}\nb: ${NOPE}\n", {"MULTI": "x\ny"})
    assert text == "a: x\ny\nb: \n"
    assert [(i.line, i.variable) for i in issues] == [(2, "NOPE")]


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


def _breaks(text: str) -> int:
    return text.count("\r\n") + text.replace("\r\n", "").count("\n") + text.replace("\r\n", "").count("\r")


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="ab$:{}-_#\n \r", max_size=80),
    st.dictionaries(st.sampled_from(["a", "b", "ab"]), st.text(alphabet="xy$ {}", max_size=5), max_size=3),
)
@example("${_}", {})  # a whole file that expands to nothing (found by hypothesis)
@example("a\r\n${ab}\rb", {"ab": ""})
def test_expansion_never_moves_a_line(text: str, env: dict[str, str]) -> None:
    out, issues = expand(text, env)
    # Line breaks, counted as YAML counts them (\n, \r\n, \r): a line that expands to nothing is
    # still a line (str.splitlines would count "${_}" -> "" as one line gone).
    assert _breaks(out) == _breaks(text)
    assert all(1 <= i.line <= len(text.splitlines()) for i in issues)


# A value is one YAML value whatever it contains: it is put in after the YAML is read, so YAML
# syntax in a secret (": ", " #", quotes, flow brackets) can neither truncate it nor break the file.
@pytest.mark.parametrize(
    "value",
    ["p#ss #word", "a: b", "it's \"quoted\"", "{x: [1, 2]}", "- item", "*alias", "&anchor", "%", "!tag", " padded ",
     "back\\slash", "multi\nline"],
)  # fmt: skip
@pytest.mark.parametrize("quote", ["", "'", '"'])
def test_a_value_with_yaml_syntax_reaches_the_config_exactly(value: str, quote: str) -> None:
    text = (
        "remote_write:\n  - url: http://127.0.0.1:9/w\n"
        f"    basic_auth: {{username: u, password: {quote}${{PASSWORD}}{quote}}}\n"
    )
    (d,) = parse_config(text, env={"PASSWORD": value}).destinations
    expected = base64.b64encode(f"u:{value}".encode()).decode()
    assert d.headers["Authorization"] == f"Basic {expected}"


def test_a_variable_in_a_flow_mapping_keeps_working_unquoted() -> None:
    text = D + "    queue: {max_shards: ${SHARDS}, max_backoff: ${BACKOFF:-10s}}\n    dry_run: ${DRY:-true}\n"
    (d,) = parse_config(text, env={"SHARDS": "3"}).destinations
    assert (d.queue.max_shards, d.queue.max_backoff, d.dry_run) == (3, 10.0, True)


def test_an_unquoted_empty_value_means_the_default_and_a_quoted_one_an_empty_string() -> None:
    text = "external_labels: {cluster: '${EMPTY}'}\n" + D + "    dry_run: ${EMPTY}\n"
    with pytest.raises(ConfigError, match=r"relay.yaml:1: external_labels.cluster: empty value"):
        parse_config(text, env=ENV)
    (d,) = parse_config(D + "    dry_run: ${EMPTY}\n", env=ENV).destinations
    assert d.dry_run is False


def test_a_variable_in_a_trailing_comment_is_not_expanded_or_required() -> None:
    config = parse_config(D + "    dry_run: true  # set ${UNSET} to ...\n# ${ALSO_UNSET}\n", env={})
    assert config.destinations[0].dry_run is True


def test_a_multi_line_value_is_one_value_and_later_lines_keep_their_numbers() -> None:
    text = "external_labels: {note: '${MULTI}'}\n" + D + "    queue: {max_backoff: 5q}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={"MULTI": "x\ny"})
    assert str(info.value) == 'relay.yaml:5: destinations[0].queue.max_backoff: invalid duration "5q"'


def test_a_multi_line_header_value_is_still_refused() -> None:
    text = D + "    headers: {X-A: '${MULTI}'}\n"
    with pytest.raises(ConfigError, match=r"relay.yaml:4: destinations\[0\].headers.X-A: header values may not"):
        parse_config(text, env={"MULTI": "x\ny"})


@pytest.mark.parametrize(
    ("text", "env", "expanded"),
    [
        ("${A:-${B}}", {"B": "b"}, "b"),
        ("${A:-${B}}", {"A": "a"}, "a"),  # was "a}": the default ended at the first "}"
        ("${A:-x${B:-y}z}", {}, "xyz"),
        ("${A:-$${1}}", {}, "${1}"),
        ("${A:-http://h:1/w}", {}, "http://h:1/w"),
    ],
)
def test_a_default_may_itself_hold_variables(text: str, env: dict[str, str], expanded: str) -> None:
    assert expand(text, env) == (expanded, [])


def test_a_variable_in_an_unused_default_need_not_be_set() -> None:
    assert expand("${A:-${UNSET}}", {"A": "a"}) == ("a", [])
    _, issues = expand("${A:-${UNSET}}", {})
    assert [i.variable for i in issues] == ["UNSET"]


@pytest.mark.parametrize("form", ["${A-x}", "${A:=x}", "${A:?x}", "${A:+x}", "${A=x}", "${A x}"])
def test_shell_forms_the_relay_does_not_implement_are_errors_not_literal_text(form: str) -> None:
    with pytest.raises(ConfigError, match=r"relay.yaml:1: .*use \$\{A\} or \$\{A:-default\}"):
        parse_config(f"external_labels: {{cluster: '{form}'}}\n" + D, env={"A": "a"})
