"""deploy/examples/relay.yaml's AMP destination (issue 22 section 4): it keeps the per-GPU DCGM set with
GPU_UTIL beside the PROF fields, the waste namespace aggregates (not the per-pod series) and
gpu-jobwatch's live-job gauges; every kept name is one something really produces; and the README's
series count and monthly cost are what relay/state/cost.py estimates for its reference cluster."""

from __future__ import annotations

import re

import pytest
import yaml

from relay.config.config import load_config
from relay.rules.relabel import process
from relay.state.cost import estimate_monthly, prices_for_region
from tests.helpers import REPO_ROOT

EXAMPLE = REPO_ROOT / "deploy" / "examples" / "relay.yaml"
WASTE_RULES = REPO_ROOT / "deploy" / "monitoring" / "rules" / "gpu-waste.rules.yaml"
DCGM = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"]
WASTE = ["namespace:gpu_wasted:count", "namespace:gpu_held:count", "namespace:gpu_wasted_usd_per_hour:sum"]
LIVE = ["gpu_job_progress_ratio", "gpu_job_progress_last_advance_timestamp_seconds",
        "gpu_job_stall_threshold_seconds", "gpu_pod_job_info"]
DROPPED = ["pod:gpu_wasted:count", "DCGM_FI_DEV_SM_CLOCK", "gpu_job_progress_step", "gpu_job_metric",
           "namespace:gpu_wasted:count_by_hour", "gpu_pod_job_info_total", "gpu_jobwatch_watch_up"]


def _kept(name: str) -> bool:
    (amp,) = load_config(EXAMPLE, env={}).destinations
    return process((("__name__", name), ("namespace", "ml")), amp.write_relabel_configs) is not None


@pytest.mark.parametrize("name", DCGM + WASTE + LIVE)
def test_amp_keeps(name: str) -> None:
    assert _kept(name)


@pytest.mark.parametrize("name", DROPPED)
def test_amp_drops(name: str) -> None:
    assert not _kept(name)


def test_kept_waste_series_are_recorded_by_the_waste_rules() -> None:
    groups = yaml.safe_load(WASTE_RULES.read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    assert set(WASTE) <= recorded


def test_kept_live_job_gauges_are_served_by_gpu_jobwatch() -> None:
    source = "\n".join(p.read_text() for p in (REPO_ROOT / "jobwatch").rglob("*.py"))
    for name in LIVE:
        assert re.search(rf"\b{name}\b", source), name


# The README's reference cluster: 64 p5.48xlarge (512 GPUs) scraped every 15 s, 20 namespaces, 100 jobs,
# 400 GPU pods; the waste rules evaluate every minute.
GPUS, NAMESPACES, JOBS, PODS = 512, 20, 100, 400


def test_readme_states_the_series_count_and_monthly_cost_the_estimator_gives() -> None:
    dcgm, waste = len(DCGM) * GPUS, NAMESPACES * (4 + 1 + 1)  # wasted{reason} x 4, held, usd
    live = JOBS * 3 + PODS
    samples_per_s = dcgm / 15 + waste / 60 + live / 15
    est = estimate_monthly(samples_per_s, dcgm + waste + live, prices_for_region("us-east-1"))
    readme = (REPO_ROOT / "README.md").read_text()
    stated = f"{dcgm + waste + live:,} series ({dcgm:,} DCGM, {waste} waste, {live} live-job)"
    assert stated in readme
    assert f"{samples_per_s:.0f} samples/s" in readme
    assert f"about ${est['total_usd']:.0f} a month" in readme
