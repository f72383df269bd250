"""deploy/monitoring/rules/gpu-waste.rules.yaml under the real promtool: every case of
tests/deploy/data/gpu-waste.test.yaml (built by tests/deploy/waste_cases.py: the weekend stall,
checkpoints, evals, a data-starved job, an OOM restart, a crash loop, NCCL hangs, a healthy 24 h run,
FP32, a finished job holding its GPUs, time-sliced notebooks, a CPU-only Deployment, p5 dollars,
RHOAI) passes, each alert has a case where it fires and cases where it stays silent, and the
detection times the issue names are asserted at the minute they bound."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import waste_cases
from tests.helpers import require_binary

TESTS = waste_cases.TEST_FILE
WASTE_ALERTS = set(waste_cases.ALERTS) - {"GPUIdleWhileHeldByPod"}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(TESTS.read_text())
    return loaded


def run(path: Path) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    # the weekend case evaluates 58 hours of minutes; generous for a busy 2-core machine
    return subprocess.run([promtool, "test", "rules", path.name], cwd=path.parent, capture_output=True, text=True,
                          timeout=900)


def test_the_yaml_is_what_the_cases_build() -> None:
    assert TESTS.read_text() == waste_cases.build(), "run: python -m tests.deploy.waste_cases"


def test_promtool_test_rules_passes_every_case() -> None:
    out = run(TESTS)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "SUCCESS" in out.stdout


def test_rule_files_are_loaded_as_they_are(spec: dict[str, Any]) -> None:
    assert spec["rule_files"] == ["../../../deploy/monitoring/rules/gpu-waste.rules.yaml",
                                  "../../../deploy/monitoring/rules/gpu-telemetry.rules.yaml"]
    assert spec["evaluation_interval"] == "1m"
    rules = yaml.safe_load((TESTS.parent / spec["rule_files"][0]).read_text())
    assert [g["interval"] for g in rules["groups"]] == ["1m"]
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == WASTE_ALERTS


def checks(spec: dict[str, Any]) -> list[tuple[str, int, str, list[dict[str, Any]]]]:
    return [(t["name"], int(c["eval_time"].removesuffix("m")), c["alertname"], c["exp_alerts"])
            for t in spec["tests"] for c in t["alert_rule_test"]]


def test_each_alert_fires_somewhere_and_is_silent_elsewhere(spec: dict[str, Any]) -> None:
    for alert in WASTE_ALERTS:
        firing = {case for case, _, a, exp in checks(spec) if a == alert and exp}
        silent_cases = {case for case, _, a, exp in checks(spec) if a == alert and not exp} - firing
        assert firing, f"{alert} never fires"
        assert len(silent_cases) >= 3, f"{alert} is silent in too few cases: {silent_cases}"


def test_every_issue_scenario_is_a_case(spec: dict[str, Any]) -> None:
    names = " | ".join(t["name"] for t in spec["tests"])
    for words in ["weekend stall", "9-minute checkpoint every 1,000 steps", "25-minute eval with low GPU use",
                  "data-starved job", "OOM restart resuming from a checkpoint", "crash loop", "all-rank NCCL hang",
                  "one hung rank of 16", "healthy GEMM run for 24 h", "FP32 non-tensor job",
                  "finished job sleeping on its GPUs", "four notebooks sharing a time-sliced GPU",
                  "CPU-only Deployment holding a GPU", "p5.48xlarge at $55.04/hour/8 GPUs",
                  "RHOAI job whose lastUpdatedTime moves while its step does not"]:
        assert words in names, words


def first_fire(spec: dict[str, Any], case: str, alert: str) -> tuple[int, int]:
    """(last minute checked silent before it fires, first minute checked firing) in a case."""
    rows = sorted((t, bool(exp)) for c, t, a, exp in checks(spec) if c.startswith(case) and a == alert)
    fired = min(t for t, f in rows if f)
    before = max(t for t, f in rows if not f and t < fired)
    return before, fired


@pytest.mark.parametrize(("case", "alert", "fault", "earliest", "latest"), [
    # fault = the minute the fault begins; the alert must not fire before fault+earliest, and must by fault+latest
    ("a CPU-only Deployment", "GPUHeldIdle", 0, 15, 18),
    ("four notebooks", "GPUHeldIdle", 0, 15, 18),
    ("weekend stall", "GPUJobBusyHang", 61, 0, 13),
    ("an all-rank NCCL hang", "GPUJobBusyHang", 31, 0, 13),
    ("one hung rank of 16", "GPUJobRankHang", 31, 0, 13),
    ("a finished job", "GPUJobFinishedHoldingGPUs", 31, 0, 13),
    # stalled: within 3 minutes of the threshold passing (last advance + threshold)
    ("weekend stall", "GPUJobStalled", 60 + 15, 0, 3),
    ("an RHOAI job", "GPUJobStalled", 30 + 20, 0, 3),
    ("stall past the 2-hour ceiling", "GPUJobStalled", 60 + 120, 0, 3),
])
def test_detection_times(spec: dict[str, Any], case: str, alert: str, fault: int, earliest: int,
                         latest: int) -> None:
    before, fired = first_fire(spec, case, alert)
    assert fired <= fault + latest, f"{alert} fires at minute {fired}, after fault + {latest}"
    assert before >= fault + earliest - 1, f"silence is asserted only up to minute {before}"


def test_promtool_catches_a_wrong_expectation(tmp_path: Path, spec: dict[str, Any]) -> None:
    """The harness can fail: GPUHeldIdle expected a minute early in the CPU-only case."""
    (case,) = [t for t in spec["tests"] if t["name"].startswith("a CPU-only Deployment")]
    fire = next(c for c in case["alert_rule_test"] if c["alertname"] == "GPUHeldIdle" and c["exp_alerts"])
    early = {k: v for k, v in case.items() if k != "promql_expr_test"}
    early["alert_rule_test"] = [{**fire, "eval_time": "14m"}]
    rules = [str(TESTS.parent / f) for f in spec["rule_files"]]
    path = tmp_path / "early.test.yaml"
    path.write_text(yaml.safe_dump({**spec, "rule_files": rules, "tests": [early]}, sort_keys=False))
    out = run(path)
    assert out.returncode != 0, out.stdout
    assert "alertname: GPUHeldIdle, time: 14m" in out.stdout + out.stderr, out.stdout + out.stderr
