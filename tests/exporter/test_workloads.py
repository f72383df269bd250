"""Scripted simulated workloads (issue 22 section 2): each case shows its signature in the series the
waste rules read (activity, tensor, DRAM, power against the enforced limit, PCIe, processes)."""

from __future__ import annotations

import pytest

from exporter.settings import SettingsError, load_settings
from exporter.simulated import SimulatedBackend
from exporter.workloads import WORKLOADS, parse_workloads

FIELDS = frozenset({
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
})  # fmt: skip


def at(workload: str, t: float) -> dict[str, float]:
    now = [0.0]
    b = SimulatedBackend(n_gpus=1, clock=lambda: now[0], workloads={0: workload})
    now[0] = t
    (values,) = b.read(0, FIELDS).values()
    out = {k: float(v) for k, v in values.items()}
    out["procs"] = b.compute_processes(0)[next(iter(b.compute_processes(0)))].processes
    return out


def busy_hang(v: dict[str, float]) -> bool:  # the GPUJobBusyHang signature
    return (v["DCGM_FI_DEV_GPU_UTIL"] >= 90 and v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] < 0.02
            and v["DCGM_FI_PROF_DRAM_ACTIVE"] < 0.05
            and v["DCGM_FI_DEV_POWER_USAGE"] < 0.35 * v["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"])


def held_idle(v: dict[str, float]) -> bool:  # GPUHeldIdle's: activity < 1 %, util 0, PCIe < 100 MB/s
    pcie = v["DCGM_FI_PROF_PCIE_TX_BYTES"] + v["DCGM_FI_PROF_PCIE_RX_BYTES"]
    return v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] < 0.01 and v["DCGM_FI_DEV_GPU_UTIL"] == 0 and pcie < 100e6


@pytest.mark.parametrize(
    ("workload", "t", "hang", "idle", "procs"),
    [
        ("training", 600, False, False, 1),
        ("idle", 600, False, True, 0),
        ("checkpoint", 600, False, False, 1),  # training phase
        ("checkpoint", 1500, False, False, 1),  # in the 9-minute checkpoint: PCIe busy, not idle
        ("eval", 2400, False, False, 1),
        ("data_starved", 600, False, False, 1),
        ("nccl_hang", 60, False, False, 1),  # still training
        ("nccl_hang", 600, True, False, 1),
        ("finished_holding", 600, False, True, 0),
        ("stalled", 60, False, False, 1),  # still training
        ("stalled", 600, False, True, 1),  # quiet, but its process and memory stay
    ],
)
def test_each_workload_shows_its_signature(workload: str, t: float, hang: bool, idle: bool, procs: int) -> None:
    v = at(workload, t)
    assert (busy_hang(v), held_idle(v), v["procs"]) == (hang, idle, procs)


def test_checkpoint_is_low_activity_with_heavy_pcie_and_training_is_tensor_bound() -> None:
    ckpt, train = at("checkpoint", 1500), at("training", 600)
    assert ckpt["DCGM_FI_DEV_GPU_UTIL"] < 10 and ckpt["DCGM_FI_PROF_PCIE_TX_BYTES"] > 5e9
    assert train["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] > 0.4 and train["DCGM_FI_DEV_POWER_USAGE"] > 600


def test_energy_integrates_the_workloads_power() -> None:
    a, b = at("idle", 1000), at("idle", 2000)
    joules = (b["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] - a["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]) / 1000
    assert joules == pytest.approx(78 * 1000, rel=0.01)


def test_values_are_a_pure_function_of_time() -> None:
    assert at("data_starved", 777) == at("data_starved", 777)


def test_flag_parses_every_workload_and_names_bad_items() -> None:
    text = ",".join(f"{i}:{name}" for i, name in enumerate(WORKLOADS))
    s = load_settings(["--backend", "simulated", "--simulate-workloads", text], {})
    assert dict(s.simulate_workloads) == dict(enumerate(WORKLOADS))
    assert parse_workloads("1:nccl-hang", 2) == {1: "nccl_hang"}


@pytest.mark.parametrize(("text", "needle"), [
    ("0:sleeping", "unknown workload 'sleeping'"), ("9:idle", "GPU 9 does not exist"),
    ("idle", "expected <gpu>:<workload>"), ("0:idle,0:eval", "given twice")])
def test_bad_workload_flag_is_a_settings_error(text: str, needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(["--simulate-workloads", text], {})
    assert needle in str(info.value) and "--simulate-workloads" in str(info.value)
