"""The plain rule files in deploy/monitoring/rules/ and the PrometheusRules generated from them
agree (scripts/gen-prometheus-rules.py), both pass `promtool check rules` as they are, the rules
ConfigMap kustomization renders, and the exporter alerts are keyed so that swapping NVIDIA's
dcgm-exporter chart for gpu-exporter (issue 21, point 11) raises none of them."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.render import DEPLOY, crd_errors, find, load_yaml_file, render
from tests.helpers import require_binary

ROOT = DEPLOY.parent
RULES = DEPLOY / "monitoring" / "rules"


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_prometheus_rules", ROOT / "scripts" / "gen-prometheus-rules.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rules_name", ["gpu-telemetry.rules.yaml", "gpu-waste.rules.yaml"])
def test_prometheusrule_is_generated_from_the_plain_rule_file(rules_name: str) -> None:
    gen = generator()
    target, name = gen.PAIRS[rules_name]
    text = (DEPLOY / "monitoring" / target).read_text()
    assert text == gen.render(rules_name), f"run: python scripts/gen-prometheus-rules.py ({target} is stale)"
    (doc,) = [d for d in yaml.safe_load_all(text) if d]
    assert doc["kind"] == "PrometheusRule" and doc["metadata"]["name"] == name
    assert doc["spec"] == yaml.safe_load((RULES / rules_name).read_text())
    assert crd_errors(doc) == []


def test_generator_check_mode_passes_on_the_committed_files() -> None:
    assert generator().main(["--check"]) == 0


def squeeze(node: Any) -> Any:
    """The same rules with runs of whitespace in strings made one space: kustomize re-folds `>-`
    blocks with more-indented lines (an extra blank line), which PromQL ignores."""
    if isinstance(node, dict):
        return {k: squeeze(v) for k, v in node.items()}
    if isinstance(node, list):
        return [squeeze(v) for v in node]
    return " ".join(node.split()) if isinstance(node, str) else node


def test_monitoring_kustomization_ships_both_prometheusrules() -> None:
    docs = render("monitoring")
    for name in ("gpu-telemetry", "gpu-waste"):
        rule = find(docs, "PrometheusRule", name)
        assert crd_errors(rule) == []
        source = find(load_yaml_file(f"monitoring/{generator().PAIRS_BY_NAME[name]}"), "PrometheusRule")
        assert squeeze(rule["spec"]) == squeeze(source["spec"])


def test_rules_configmap_kustomization_carries_the_plain_files_verbatim() -> None:
    (cm,) = render("monitoring/rules")
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "gpu-telemetry"
    assert cm["data"] == {p.name: p.read_text() for p in RULES.glob("*.rules.yaml")}


@pytest.mark.parametrize("path", sorted(str(p.relative_to(DEPLOY)) for p in RULES.glob("*.rules.yaml")))
def test_promtool_check_rules_loads_the_plain_file_as_it_is(path: str) -> None:
    promtool = require_binary("promtool")
    out = subprocess.run([promtool, "check", "rules", str(DEPLOY / path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


# -- a swap of NVIDIA's dcgm-exporter chart raises nothing (issue 21, point 11) ------------------------

DCGM = ('gpu="{i}",UUID="GPU-{i}",pci_bus_id="00000000:1{i}:00.0",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",'
        'Hostname="ip-10-0-1-5",DCGM_FI_DRIVER_VERSION="570.124.06",job="{job}",instance="10.0.1.5:9400"')
# what dcgm-exporter 4.8.2's default-counters.csv emits, which gpu-exporter also emits
SHARED = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
          "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"]


def swap_series(job: str, up: str) -> list[dict[str, str]]:
    series = [{"series": f'up{{job="{job}",instance="10.0.1.5:9400"}}', "values": up}]
    if not up.startswith("0"):
        series += [{"series": f"{name}{{{DCGM.format(i=i, job=job)}}}", "values": "50x60"}
                   for name in SHARED for i in range(2)]
    return series


def run_promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    spec = {"rule_files": [str(RULES / "gpu-telemetry.rules.yaml")], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "swap.test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", "swap.test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def alert_names() -> list[str]:
    groups = yaml.safe_load((RULES / "gpu-telemetry.rules.yaml").read_text())["groups"]
    return sorted(r["alert"] for g in groups for r in g["rules"] if "alert" in r)


@pytest.mark.parametrize("job", ["dcgm-exporter", "gpu-operator-dcgm-exporter", "nvidia-dcgm-exporter"])
def test_nvidia_chart_job_names_raise_no_alert(tmp_path: Path, job: str) -> None:
    checks = [{"eval_time": f"{t}m", "alertname": a, "exp_alerts": []} for a in alert_names() for t in (15, 45)]
    out = run_promtool(tmp_path, [{"interval": "1m", "input_series": swap_series(job, "1x60"),
                                   "alert_rule_test": checks}])
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_swapped_exporter_that_is_down_is_reported_down(tmp_path: Path) -> None:
    down = {"exp_labels": {"severity": "warning", "job": "dcgm-exporter", "instance": "10.0.1.5:9400"},
            "exp_annotations": {"summary": "gpu-exporter at 10.0.1.5:9400 cannot be scraped",
                                "description": "The GPUs on that node have no metrics and no GPU alerts."}}
    out = run_promtool(tmp_path, [{"interval": "1m", "input_series": swap_series("dcgm-exporter", "0x30"),
                                   "alert_rule_test": [
                                       {"eval_time": "4m", "alertname": "GPUExporterDown", "exp_alerts": []},
                                       {"eval_time": "6m", "alertname": "GPUExporterDown", "exp_alerts": [down]},
                                   ]}])
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_exporter_of_either_kind_is_absent(tmp_path: Path) -> None:
    absent = {"exp_labels": {"severity": "critical", "job": "gpu-exporter"},
              "exp_annotations": {"summary": "No gpu-exporter target is scraped",
                                  "description": "Prometheus has no gpu-exporter or dcgm-exporter serving GPU "
                                                 "series; GPU metrics and GPU alerts are blind."}}
    series = [{"series": 'up{job="prometheus",instance="127.0.0.1:9090"}', "values": "1x30"}]
    out = run_promtool(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": "9m", "alertname": "GPUExporterAbsent", "exp_alerts": []},
        {"eval_time": "11m", "alertname": "GPUExporterAbsent", "exp_alerts": [absent]},
    ]}])
    assert out.returncode == 0, out.stdout + out.stderr
