"""deploy/dashboard.json: a valid Grafana dashboard whose queries parse (promtool), use only metrics
the programs define (read from the programs themselves: the exporter's collector set and self-metrics,
the relay's registries), and filter on Hostname only where the series carry it."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from exporter.counters_csv import load_counters
from relay.common.metrics import RelayMetrics
from relay.state.cardinality import CardinalityMetrics
from tests.deploy.render import DEPLOY
from tests.helpers import require_binary


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    with open(DEPLOY / "dashboard.json") as f:
        d: dict[str, Any] = json.load(f)
    return d


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in iter_panels(dashboard["panels"]) for t in p.get("targets", [])]


def exposition_names(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)[{ ]", text, re.M)}


def exporter_self_metric_names() -> set[str]:
    """The families exporter/selfmetrics.py renders (each `out.family("<name>", "<kind>", ...)`)."""
    import exporter.selfmetrics as sm

    source = Path(sm.__file__).read_text()
    families = re.findall(r'family\(\s*"(\w+)",\s*"(\w+)"', source)
    assert families, "exporter/selfmetrics.py renders no family"
    return {sm.PREFIX + name for name, _kind in families}


def relay_metric_names() -> set[str]:
    registry = CollectorRegistry()
    RelayMetrics(registry)
    CardinalityMetrics(registry)
    names = set()
    for family in registry.collect():
        kind = family.type
        base = family.name
        names |= {base + "_total"} if kind == "counter" else {base}
        if kind == "histogram":
            names |= {base + "_bucket", base + "_sum", base + "_count"}
    return names


def known_metrics() -> set[str]:
    dcgm = {c.field for c in load_counters(None)} | {"DCGM_FI_DEV_XID_ERRORS"}
    return dcgm | exporter_self_metric_names() | relay_metric_names()


_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label names
    in grouping clauses or selectors, strings, durations or Grafana variables."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # ranges
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", s)
    s = re.sub(r"\$\w+", "", s)
    names = set()
    for m in re.finditer(r"(?<![\w$])([a-zA-Z_:][\w:]*)(\s*\()?", s):
        if m.group(2) is None and m.group(1) not in _PROMQL_WORDS:
            names.add(m.group(1))
    return names


def test_metric_name_extraction_finds_only_metrics() -> None:
    expr = (
        'sum by (namespace) (rate(DCGM_FI_X{pod!="", a=~"b|c"}[5m]))'
        " / on(gpu) group_left() gpu_relay_y or vector(0)"
    )
    assert metric_names(expr) == {"DCGM_FI_X", "gpu_relay_y"}


def test_known_metrics_come_from_the_programs() -> None:
    known = known_metrics()
    assert {"DCGM_FI_DEV_GPU_UTIL", "gpu_exporter_device_up", "gpu_exporter_xid_errors_total",
            "gpu_relay_samples_sent_total", "gpu_relay_send_duration_seconds_bucket",
            "gpu_relay_series_limit_dropped_total"} <= known
    assert "gpu_relay_samples_sent" not in known  # counters are exposed with _total


def test_dashboard_is_a_grafana_dashboard_with_unique_panel_ids(dashboard: dict[str, Any]) -> None:
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["title"] and dashboard["uid"]
    ids = [p["id"] for p in iter_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)) > 10
    for p in iter_panels(dashboard["panels"]):
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys(), p["title"]


def test_dashboard_queries_use_only_metrics_the_programs_define(dashboard: dict[str, Any]) -> None:
    exprs = dashboard_exprs(dashboard)
    assert exprs
    known = known_metrics()
    unknown = {name: e for e in exprs for name in metric_names(e) if name not in known}
    assert unknown == {}
    assert all(metric_names(e) for e in exprs)


def template_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"}


def test_node_and_gpu_variables_list_gpus_that_are_down_too(dashboard: dict[str, Any]) -> None:
    # A node whose GPUs are all lost has no DCGM series at all; gpu_exporter_device_up is there for
    # every GPU the exporter knows, up or down, so the broken node stays selectable.
    queries = template_queries(dashboard)
    assert queries["Hostname"] == "label_values(gpu_exporter_device_up, Hostname)"
    assert queries["gpu"] == 'label_values(gpu_exporter_device_up{Hostname=~"$Hostname"}, gpu)'


def test_relay_row_groups_by_destination_and_shows_failures(dashboard: dict[str, Any]) -> None:
    (row,) = [p for p in dashboard["panels"] if p["type"] == "row" and "gpu-relay" in p["title"]]
    relay_panels = [p for p in dashboard["panels"] if p["gridPos"]["y"] > row["gridPos"]["y"] and p.get("targets")]
    exprs = [t["expr"] for p in relay_panels for t in p["targets"]]
    assert all("Hostname" not in e for e in exprs)  # relay series carry no Hostname
    names = set().union(*(metric_names(e) for e in exprs))
    assert {"gpu_relay_samples_sent_total", "gpu_relay_samples_failed_total", "gpu_relay_samples_dropped_total",
            "gpu_relay_oldest_queued_sample_age_seconds"} <= names


def test_dashboard_answers_utilisation_idle_jobs_power_temp_memory_and_xid(dashboard: dict[str, Any]) -> None:
    panels = [p for p in iter_panels(dashboard["panels"]) if p.get("targets")]

    def names(p: dict[str, Any]) -> set[str]:
        return set().union(*(metric_names(t["expr"]) for t in p["targets"]))

    # "Why is this GPU at 50%?": utilisation next to SM/tensor/DRAM activity in one panel.
    assert any(
        {
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        }
        <= names(p)
        for p in panels
    )
    # "Which job is idle?": utilisation grouped by pod / namespace.
    grouped = [t["expr"] for p in panels for t in p["targets"] if "DCGM_FI_DEV_GPU_UTIL" in t["expr"]]
    assert any(re.search(r"by \([^)]*\bpod\b", e) for e in grouped)
    assert any(re.search(r"by \([^)]*\bnamespace\b", e) for e in grouped)
    used = set().union(*(names(p) for p in panels))
    assert {
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "gpu_exporter_xid_errors_total",
    } <= used


def hostname_filtered_metrics(dashboard: dict[str, Any]) -> set[str]:
    out = set()
    for expr in dashboard_exprs(dashboard):
        for m in re.finditer(r"([a-zA-Z_:][\w:]*)\{[^}]*Hostname=~", expr):
            out.add(m.group(1))
    return out


def test_every_series_the_dashboard_filters_on_hostname_carries_hostname(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    from tests.e2e.procs import running, start_exporter

    exporter, url = start_exporter(tmp_path, gpus=2, interval="1s")
    with running(exporter), urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    carrying = {m.group(1) for m in re.finditer(r'^([\w:]+)\{[^}]*\bHostname="', text, re.M)}
    self_metrics = {n for n in exposition_names(text) if n.startswith("gpu_exporter_")}
    assert carrying & self_metrics, "exporter self-metrics must carry Hostname (issue 7)"
    wanted = {n for n in hostname_filtered_metrics(dashboard) if n in exposition_names(text)}
    assert wanted and wanted <= carrying, wanted - carrying


def test_dashboard_queries_parse_with_promtool(dashboard: dict[str, Any], tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    grafana_vars = {
        "$__rate_interval": "5m",
        "$__range": "6h",
        "$__interval": "1m",
        "$Hostname": ".*",
        "$gpu": ".*",
    }
    rules = []
    for i, expr in enumerate(dashboard_exprs(dashboard)):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


