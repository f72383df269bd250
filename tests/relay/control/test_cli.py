from __future__ import annotations

import io
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from relay import __version__
from relay.common.labels import Labels
from relay.control.cli import SeriesSyntaxError, main, parse_json_series, parse_series
from tests.helpers import TEST_DATA, free_port

CONFIGS = TEST_DATA / "configs"
GOOD = str(CONFIGS / "two-destinations.yaml")
BAD = str(CONFIGS / "many-errors.yaml")


def run_with_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], stdin: str
) -> tuple[int, list[str], list[str]]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


@pytest.mark.parametrize(
    ("text", "labels"),
    [
        ("up", (("__name__", "up"),)),
        ("up{}", (("__name__", "up"),)),
        ('up{job="a",instance="b"}', (("__name__", "up"), ("instance", "b"), ("job", "a"))),
        ('up{ job = "a" , }', (("__name__", "up"), ("job", "a"))),
        ('{__name__="up",job="a"}', (("__name__", "up"), ("job", "a"))),
        ('{"gpu.util",job="a"}', (("__name__", "gpu.util"), ("job", "a"))),
        ('{"gpu.util","a.b"="c"}', (("__name__", "gpu.util"), ("a.b", "c"))),
        ('up{a="q\\"x\\\\y\\nz"}', (("__name__", "up"), ("a", 'q"x\\y\nz'))),
        ('up{a="",b="1"}', (("__name__", "up"), ("b", "1"))),
        ('up{a="1"} 12.5 1700000000000', (("__name__", "up"), ("a", "1"))),
        ("up NaN", (("__name__", "up"),)),
        ('ns:metric:rate5m{a="é"}', (("__name__", "ns:metric:rate5m"), ("a", "é"))),
        ('{job="a"}', (("job", "a"),)),
    ],
)
def test_parse_series_accepts_prometheus_text(text: str, labels: Labels) -> None:
    assert parse_series(text) == labels


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('up{a="1"', "expected '}', got end of line (column 9)"),
        ("up{a=1}", "expected '\"', got '1' (column 6)"),
        ('up{a="1}', "unterminated string (column 9)"),
        ('up{a="\\t"}', 'unknown escape (use \\\\, \\" or \\n) (column 7)'),
        ('up{1a="x"}', "expected a label name (column 4)"),
        ('up{a="1",a="2"}', 'label "a" given twice (column 10)'),
        ('up{__name__="x"}', 'label "__name__" given twice (column 4)'),
        ('up{"x"}', "metric name given twice (column 4)"),
        ('up{a="1"} one', "unexpected text after the series (column 10)"),
        ("up 1 2 3", "unexpected text after the series (column 4)"),
        ("=x", "expected a metric name or '{' (column 1)"),
    ],
)
def test_parse_series_rejects_malformed_text_with_a_column(text: str, message: str) -> None:
    with pytest.raises(SeriesSyntaxError) as info:
        parse_series(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "expected a JSON object of string label values (column 1)"),
        ('{"a": 1}', "expected a JSON object of string label values (column 1)"),
        ('{"a": ', "invalid JSON: Expecting value (column 7)"),
    ],
)
def test_parse_json_series_rejects_non_label_objects(text: str, message: str) -> None:
    with pytest.raises(SeriesSyntaxError) as info:
        parse_json_series(text)
    assert str(info.value) == message


def test_check_config_prints_a_one_line_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", GOOD]) == 0
    out, err = capsys.readouterr()
    assert out == (
        f"{GOOD}: OK: 2 destinations (amp, local); 1 global relabel rule, 1 write_relabel rule, "
        "0 aggregate rules; 0 scrape jobs\n"
    )
    assert err == ""


def test_check_config_accepts_the_design_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(CONFIGS / "design-example.yaml")]) == 0
    assert (
        "1 destination (amp); 0 global relabel rules, 1 write_relabel rule, 1 aggregate rule; 1 scrape job"
        in (capsys.readouterr().out)
    )


def test_check_config_prints_every_error_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", BAD]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith(f"{BAD}:4: server.max_request_bytes: invalid size")
    assert f'{BAD}:12: destinations[0].queue.max_backoff: invalid duration "5q"' in lines
    assert f'{BAD}:14: destinations[1].name: duplicate name "amp" (first at line 7)' in lines


def test_check_config_of_a_missing_file_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "relay.yaml"
    assert main(["check-config", str(missing)]) == 1
    assert capsys.readouterr().err == f"{missing}: cannot read the config: No such file or directory\n"


SERIES_TEXT = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
DCGM_FI_DEV_GPU_UTIL{gpu="0",pci_bus_id="0000:3B:00.0",DCGM_FI_DRIVER_VERSION="550.54",Hostname="n1"} 37

DCGM_FI_DEV_SM_CLOCK{gpu="0"}
DCGM_FI_DEV_FB_USED{gpu="1",cluster="own",namespace="ml"}
DCGM_FI_DEV_FB_USED{namespace="kube-system"}
"""


def test_test_rules_text_uses_the_first_destination_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_with_stdin(monkeypatch, capsys, ["test-rules", "--config", GOOD], SERIES_TEXT)
    assert (code, err) == (0, [])
    assert out == [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        'DCGM_FI_DEV_GPU_UTIL{DCGM_FI_DRIVER_VERSION="550.54",Hostname="n1",gpu="0",pci_bus_id="0000:3B:00.0"} '
        '-> DCGM_FI_DEV_GPU_UTIL{Hostname="n1",cluster="gpu-prod",gpu="0"}',
        "",
        'DCGM_FI_DEV_SM_CLOCK{gpu="0"} -> DROPPED by destinations[amp].write_relabel_configs[0] (keep)',
        'DCGM_FI_DEV_FB_USED{cluster="own",gpu="1",namespace="ml"} '
        '-> DCGM_FI_DEV_FB_USED{cluster="own",gpu="1",namespace="ml"}',
        'DCGM_FI_DEV_FB_USED{namespace="kube-system"} -> DROPPED by global.relabel_configs[0] (drop)',
    ]


def test_test_rules_text_for_a_named_destination(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["test-rules", "--config", GOOD, "--destination", "local"]
    code, out, _ = run_with_stdin(monkeypatch, capsys, argv, SERIES_TEXT)
    assert code == 0
    assert out[1] == (
        'DCGM_FI_DEV_GPU_UTIL{DCGM_FI_DRIVER_VERSION="550.54",Hostname="n1",gpu="0",pci_bus_id="0000:3B:00.0"} '
        '-> DCGM_FI_DEV_GPU_UTIL{DCGM_FI_DRIVER_VERSION="550.54",Hostname="n1",cluster="gpu-prod",gpu="0",'
        'pci_bus_id="0000:3B:00.0"}'
    )
    dropped = 'DCGM_FI_DEV_FB_USED{namespace="kube-system"} -> DROPPED by global.relabel_configs[0] (drop)'
    assert out[3:] == ['DCGM_FI_DEV_SM_CLOCK{gpu="0"} -> DCGM_FI_DEV_SM_CLOCK{cluster="gpu-prod",gpu="0"}', out[4],
                       dropped]


def test_test_rules_json_prints_one_object_a_series_with_its_input_and_result(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = "\n".join(
        [
            json.dumps({"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "pci_bus_id": "x"}),
            json.dumps({"__name__": "DCGM_FI_DEV_SM_CLOCK"}),
            "",
            json.dumps({"__name__": "DCGM_FI_DEV_FB_USED", "pod": "p\u00e9"}),
        ]
    )
    argv = ["test-rules", "--config", GOOD, "--format", "json"]
    code, out, err = run_with_stdin(monkeypatch, capsys, argv, stdin)
    assert (code, err) == (0, [])
    assert [json.loads(line) for line in out] == [  # the blank line is no series: no object
        {"line": 1, "input": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "pci_bus_id": "x"},
         "result": "kept", "output": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "cluster": "gpu-prod", "gpu": "0"}},
        {"line": 2, "input": {"__name__": "DCGM_FI_DEV_SM_CLOCK"},
         "result": "dropped", "by": "destinations[amp].write_relabel_configs[0] (keep)"},
        {"line": 4, "input": {"__name__": "DCGM_FI_DEV_FB_USED", "pod": "p\u00e9"},
         "result": "kept", "output": {"__name__": "DCGM_FI_DEV_FB_USED", "cluster": "gpu-prod", "pod": "p\u00e9"}},
    ]
    assert list(json.loads(out[0])["output"]) == ["__name__", "cluster", "gpu"]  # sorted keys
    assert "null" not in "".join(out)


def test_test_rules_reports_malformed_lines_and_processes_the_rest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}\nbad{a=1}\nDCGM_FI_DEV_FB_USED\n{"x"\n'
    code, out, err = run_with_stdin(monkeypatch, capsys, ["test-rules", "--config", GOOD], stdin)
    assert code == 1
    assert out == [  # line-aligned with the input: a bad line prints ERROR in its place
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} -> DCGM_FI_DEV_GPU_UTIL{cluster="gpu-prod",gpu="0"}',
        "bad{a=1} -> ERROR: expected '\"', got '1' (column 7)",
        'DCGM_FI_DEV_FB_USED{} -> DCGM_FI_DEV_FB_USED{cluster="gpu-prod"}',
        '{"x" -> ERROR: expected \'=\', got end of line (column 5)',
    ]
    assert err == [
        "<stdin>:2: expected '\"', got '1' (column 7)",
        "<stdin>:4: expected '=', got end of line (column 5)",
    ]


def test_test_rules_json_reports_malformed_lines_as_objects_with_the_column(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["test-rules", "--config", GOOD, "--format", "json"]
    code, out, err = run_with_stdin(
        monkeypatch, capsys, argv, 'up{a="1"}\n{"__name__": "DCGM_FI_DEV_FB_USED"}\n'
    )
    assert code == 1
    assert [json.loads(line) for line in out] == [  # no plain ERROR: line among the JSON
        {"line": 1, "input": 'up{a="1"}', "result": "error", "error": "invalid JSON: Expecting value", "column": 1},
        {"line": 2, "input": {"__name__": "DCGM_FI_DEV_FB_USED"}, "result": "kept",
         "output": {"__name__": "DCGM_FI_DEV_FB_USED", "cluster": "gpu-prod"}},
    ]
    assert err == ["<stdin>:1: invalid JSON: Expecting value (column 1)"]


def test_test_rules_unknown_destination_lists_the_valid_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["test-rules", "--config", GOOD, "--destination", "nope"]
    code, out, err = run_with_stdin(monkeypatch, capsys, argv, "up\n")
    assert (code, out) == (2, [])
    assert err == ['gpu-relay test-rules: unknown destination "nope" (valid: amp, local)']


def test_test_rules_with_a_bad_config_prints_its_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_with_stdin(monkeypatch, capsys, ["test-rules", "--config", BAD], "up\n")
    assert (code, out, len(err)) == (1, [], 8)


EXPLAIN_CONFIG = """\
external_labels: {cluster: c1}
global:
  relabel_configs:
    - {source_labels: [namespace], regex: kube-system, action: drop}
    - {source_labels: [job], regex: noisy, action: drop}
    - {regex: tmp, action: labeldrop}
destinations:
  - name: amp
    url: http://127.0.0.1:9/w
    write_relabel_configs:
      - {source_labels: [__name__], regex: 'DCGM_.*|up|x_total', action: keep}
      - {source_labels: [gone], regex: x, target_label: __name__, replacement: '', action: replace}
    prune_labels: [pci_bus_id]
    aggregate:
      - {match: '{__name__=~"DCGM_FI_DEV_.*"}', without: [pod], interval: 30s, outputs: [avg, max]}
      - {match: x_total, by: [gpu], interval: 1m, outputs: [total, sum]}
"""


def test_test_rules_explains_each_drop_and_aggregation_on_the_input_s_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(EXPLAIN_CONFIG)
    stdin = (
        'up{namespace="kube-system"}\n'
        'up{job="noisy"}\n'
        'other{a="1"}\n'
        '{a="1"}\n'
        'up{gone="x",tmp="y",pci_bus_id="p"}\n'
        'up{a="1",tmp="y",pci_bus_id="p"}\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="p1",pci_bus_id="b"}\n'
        'x_total{gpu="1",pod="p"}\n'
    )
    code, out, err = run_with_stdin(monkeypatch, capsys, ["test-rules", "--config", str(path)], stdin)
    assert (code, err) == (0, [])
    assert out == [  # each series read, then what becomes of it
        'up{namespace="kube-system"} -> DROPPED by global.relabel_configs[0] (drop)',
        'up{job="noisy"} -> DROPPED by global.relabel_configs[1] (drop)',
        'other{a="1"} -> DROPPED by destinations[amp].write_relabel_configs[0] (keep)',
        '{a="1"} -> DROPPED: no metric name',
        'up{gone="x",pci_bus_id="p",tmp="y"} -> DROPPED: no metric name',  # the replace rule emptied __name__
        'up{a="1",pci_bus_id="p",tmp="y"} -> up{a="1",cluster="c1"}',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",pci_bus_id="b",pod="p1"} -> '
        "AGGREGATED by destinations[amp].aggregate[0] into: "
        'DCGM_FI_DEV_GPU_UTIL:30s_without_pod_avg{cluster="c1",gpu="0"}, '
        'DCGM_FI_DEV_GPU_UTIL:30s_without_pod_max{cluster="c1",gpu="0"}',
        'x_total{gpu="1",pod="p"} -> '
        'AGGREGATED by destinations[amp].aggregate[1] into: x_total:1m_by_gpu_total{gpu="1"}',
    ]


def test_test_rules_input_and_output_formats_are_separate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(EXPLAIN_CONFIG)
    argv = ["test-rules", "--config", str(path), "--input-format", "text", "--output-format", "json"]
    stdin = 'up{a="1"}\nother\nDCGM_FI_DEV_FB_USED{pod="p"}\n'
    code, out, _ = run_with_stdin(monkeypatch, capsys, argv, stdin)
    assert code == 0
    assert [json.loads(line) for line in out] == [
        {"line": 1, "input": {"__name__": "up", "a": "1"}, "result": "kept",
         "output": {"__name__": "up", "a": "1", "cluster": "c1"}},
        {"line": 2, "input": {"__name__": "other"}, "result": "dropped",
         "by": "destinations[amp].write_relabel_configs[0] (keep)"},
        {"line": 3, "input": {"__name__": "DCGM_FI_DEV_FB_USED", "pod": "p"}, "result": "aggregated",
         "by": "destinations[amp].aggregate[0]", "into": [
             {"__name__": "DCGM_FI_DEV_FB_USED:30s_without_pod_avg", "cluster": "c1"},
             {"__name__": "DCGM_FI_DEV_FB_USED:30s_without_pod_max", "cluster": "c1"}]},
    ]
    argv = ["test-rules", "--config", str(path), "--input-format", "json"]
    code, out, _ = run_with_stdin(monkeypatch, capsys, argv, '{"__name__": "up"}\n')
    assert (code, out) == (0, ['up{} -> up{cluster="c1"}'])


def test_check_config_prints_warnings_and_still_succeeds(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(
        f"storage: {{path: '{tmp_path}'}}\nremote_write:\n  - url: http://127.0.0.1:9/w\n    name: local\n"
        "    queue_config: {capacity: 10}\n"
    )
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{path}: OK: 1 destination (local)")
    assert err.splitlines() == [
        f"warning: {path}:5: remote_write[0].queue_config.capacity: not honoured: the relay's queue is on disk, "
        "bounded by max_disk (1GiB; to change it, move the entry to destinations: and set queue.max_disk, "
        "see docs/relay-config.md)"
    ]


def test_check_config_warns_about_a_storage_path_it_cannot_create(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "relay.yaml"
    path.write_text(f"storage:\n  path: {tmp_path / 'file' / 'q'}\ndestinations: [{{name: a, url: 'http://h:1/w'}}]\n")
    assert main(["check-config", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {path}:2: storage.path: cannot create {tmp_path / 'file' / 'q'}: " in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "relay.yaml"]


def test_run_calls_the_service_with_the_config_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[str, dict[str, object]]] = []

    def fake_run(config_path: str, **options: object) -> int:
        calls.append((config_path, options))
        return 3

    monkeypatch.setitem(sys.modules, "relay.control.daemon", types.SimpleNamespace(run=fake_run))
    assert main(["run", "--config", GOOD, "--log-level", "debug"]) == 3
    assert calls == [(GOOD, {"enable_lifecycle": False, "watch_interval_s": 3.0})]
    assert main(["run", "--web.enable-lifecycle", "--config.watch-interval", "0", "--config", GOOD]) == 3
    assert calls[-1] == (GOOD, {"enable_lifecycle": True, "watch_interval_s": 0.0})


def test_report_prints_what_the_report_module_renders(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[str, str | None, int]] = []

    def fake(url: str, destination: str | None, limit: int) -> str:
        calls.append((url, destination, limit))
        return "REPORT"

    monkeypatch.setitem(sys.modules, "relay.control.report", types.SimpleNamespace(fetch_and_render=fake))
    assert main(["report"]) == 0
    assert main(["report", "--url", "http://127.0.0.1:1", "--destination", "amp", "--limit", "3"]) == 0
    assert calls == [("http://127.0.0.1:9201", None, 10), ("http://127.0.0.1:1", "amp", 3)]
    assert capsys.readouterr().out == "REPORT\nREPORT\n"


def test_report_from_an_unreachable_relay_fails_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["report", "--url", url]) == 1
    assert capsys.readouterr().err.startswith(f"gpu-relay report: cannot get the report from {url}: ")


def test_report_rejects_a_non_positive_limit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["report", "--limit", "0"])
    assert info.value.code == 2
    assert "must be a positive integer, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--version"], ["check-config", "--version"], ["test-rules", "--version"]])
def test_version_everywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert capsys.readouterr().out == f"gpu-relay {__version__}\n"


@pytest.mark.parametrize("command", ["run", "check-config", "test-rules", "report", "import-prometheus"])
def test_help_for_every_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "-h"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gpu-relay {command}")
    assert "--log-level" in out


def test_log_level_is_accepted_before_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-level", "warning", "check-config", GOOD]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "required: COMMAND" in capsys.readouterr().err


def test_installed_entry_point_runs_test_rules_and_check_config() -> None:
    exe = Path(sys.executable).parent / "gpu-relay"
    assert exe.exists(), f"{exe} missing: install the project (scripts/setup.sh)"
    proc = subprocess.run(
        [str(exe), "test-rules", "--config", GOOD, "--destination", "local"],
        input='DCGM_FI_DEV_SM_CLOCK{gpu="0"}\nup{namespace="kube-system"}\n',
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == [
        'DCGM_FI_DEV_SM_CLOCK{gpu="0"} -> DCGM_FI_DEV_SM_CLOCK{cluster="gpu-prod",gpu="0"}',
        'up{namespace="kube-system"} -> DROPPED by global.relabel_configs[0] (drop)',
    ]
    bad = subprocess.run(
        [str(exe), "check-config", BAD], capture_output=True, text=True, timeout=30, check=False
    )
    assert bad.returncode == 1
    assert len(bad.stderr.splitlines()) == 8
