"""Scripted per-GPU workloads for the simulated backend (``--simulate-workloads 0:training,1:nccl_hang``).

Each workload is a repeating schedule of phases; each phase is what an H200 (700 W enforced limit,
141 GB) shows in that state, as dcgm-exporter would report it: GPU_UTIL (%), the PROF ratios, power
(W), PCIe bytes/s (GPM, as ``DCGM_FI_PROF_PCIE_*_BYTES``), NVLink bytes/s
(``DCGM_FI_PROF_NVLINK_*_BYTES`` and ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL``: tens of GB/s while NCCL
trains, ~0 in a hang, a checkpoint or once stalled), framebuffer used (MiB), SM clock and the number
of compute processes. Values move with a small deterministic jitter (``±2 %`` of the phase's
value), so a time ``t`` gives the same values whatever the read schedule.

| workload | schedule (t = seconds since the exporter started) |
|---|---|
| ``training`` | train (util ~99 %, tensor ~0.52, DRAM ~0.38, ~640 W, NVLink ~40 GB/s each way) |
| ``idle`` | allocated, nothing runs: util 0, no process, no memory, ~78 W |
| ``checkpoint`` | train 20 min, then a 9-minute checkpoint (util ~3 %, PCIe TX ~9 GiB/s, ~135 W), repeating |
| ``eval`` | train 35 min, then a 25-minute eval (util ~70 %, tensor ~0.22, ~380 W), repeating |
| ``data_starved`` | input-bound: util ~30 %, tensor ~0.12, PCIe RX ~2.5 GiB/s, ~260 W |
| ``nccl_hang`` | train 2 min, then a collective hang: util 100 %, tensor 0, DRAM ~0.01, ~175 W, NVLink ~0 |
| ``finished_holding`` | train 2 min, then finished: the process exits, the pod keeps the GPU (util 0, no process) |
| ``stalled`` | train 2 min, then stuck off the GPU (a dead data loader): process and memory stay, util 0, ~90 W |
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.backend import Value

MIB = 1048576
LIMIT_W = 700.0  # the recorded H200's enforced power limit


@dataclass(frozen=True, slots=True)
class Phase:
    util: float  # DCGM_FI_DEV_GPU_UTIL, %
    gr: float  # PROF_GR_ENGINE_ACTIVE
    sm: float  # PROF_SM_ACTIVE
    occupancy: float
    tensor: float
    dram: float
    power_w: float
    pcie_tx_mib: float  # MiB/s
    pcie_rx_mib: float
    fb_mib: int
    sm_clock: int
    processes: int
    nvlink_mib: float = 0.0  # NVLink MiB/s each way (NCCL's collectives; an H200 SXM has 450 GB/s)


TRAIN = Phase(99, 0.97, 0.86, 0.35, 0.52, 0.38, 640, 400, 1200, 71000, 1755, 1, 38000)
IDLE = Phase(0, 0.0, 0.0, 0.0, 0.0, 0.0004, 78, 0.5, 0.2, 0, 345, 0)
CHECKPOINT = Phase(3, 0.03, 0.02, 0.01, 0.0, 0.02, 135, 9000, 50, 71000, 1980, 1, 2)
EVAL = Phase(70, 0.68, 0.55, 0.25, 0.22, 0.30, 380, 150, 800, 71000, 1980, 1, 1500)
STARVED = Phase(30, 0.30, 0.25, 0.10, 0.12, 0.10, 260, 300, 2500, 60000, 1980, 1, 11000)
HANG = Phase(100, 0.99, 0.08, 0.02, 0.0, 0.01, 175, 0.5, 0.5, 71000, 1980, 1, 0.01)
STALLED = Phase(0, 0.0, 0.0, 0.0, 0.0, 0.0004, 90, 0.5, 0.2, 71000, 1980, 1)
FINISHED = Phase(0, 0.0, 0.0, 0.0, 0.0, 0.0004, 80, 0.5, 0.2, 0, 345, 0)
FOREVER = float("inf")

# workload -> phases (duration s, phase); the schedule repeats unless it ends with FOREVER
WORKLOADS: dict[str, tuple[tuple[float, Phase], ...]] = {
    "training": ((FOREVER, TRAIN),),
    "idle": ((FOREVER, IDLE),),
    "checkpoint": ((1200.0, TRAIN), (540.0, CHECKPOINT)),
    "eval": ((2100.0, TRAIN), (1500.0, EVAL)),
    "data_starved": ((FOREVER, STARVED),),
    "nccl_hang": ((120.0, TRAIN), (FOREVER, HANG)),
    "finished_holding": ((120.0, TRAIN), (FOREVER, FINISHED)),
    "stalled": ((120.0, TRAIN), (FOREVER, STALLED)),
}


def parse_workloads(text: str, n_gpus: int) -> dict[int, str]:
    """``"0:training,1:nccl_hang"`` -> {0: "training", 1: "nccl_hang"}. ValueError names the bad item."""
    out: dict[int, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        gpu_text, sep, name = item.partition(":")
        name = name.strip().replace("-", "_")
        if not sep or not gpu_text.strip().isdigit():
            raise ValueError(f"{item!r}: expected <gpu>:<workload>, e.g. 0:training")
        gpu = int(gpu_text)
        if gpu >= n_gpus:
            raise ValueError(f"{item!r}: GPU {gpu} does not exist ({n_gpus} simulated)")
        if name not in WORKLOADS:
            raise ValueError(f"{item!r}: unknown workload {name!r} (one of {', '.join(WORKLOADS)})")
        if gpu in out:
            raise ValueError(f"{item!r}: GPU {gpu} is given twice")
        out[gpu] = name
    return out


def phase_at(workload: str, t: float) -> Phase:
    """The phase of ``workload`` at ``t`` seconds since start."""
    schedule = WORKLOADS[workload]
    total = sum(d for d, _ in schedule)
    at = t % total if total != FOREVER else t
    for duration, phase in schedule:
        if at < duration:
            return phase
        at -= duration
    return schedule[-1][1]


def _jitter(*parts: object) -> float:
    """Deterministic in [-1, 1) from the parts."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return 2.0 * int.from_bytes(digest, "big") / 2**64 - 1.0


def values(workload: str, gpu: int, t: float, fb_total_mib: int) -> dict[str, Value]:
    """The DCGM values this workload shows at ``t`` (overriding the simulator's training model)."""
    p = phase_at(workload, t)
    step = int(t)

    def j(x: float, key: str) -> float:
        return x * (1.0 + 0.02 * _jitter(gpu, step, key))

    def ratio(x: float, key: str) -> float:
        return round(min(max(j(x, key), 0.0), 1.0), 6)

    util = min(100, round(j(p.util, "util"))) if p.util > 0 else 0
    fb = min(p.fb_mib, fb_total_mib)
    return {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ratio(p.gr, "gr"),
        "DCGM_FI_PROF_SM_ACTIVE": ratio(p.sm, "sm"),
        "DCGM_FI_PROF_SM_OCCUPANCY": ratio(p.occupancy, "occ"),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ratio(p.tensor, "tensor"),
        "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": ratio(p.tensor, "tensor"),
        "DCGM_FI_PROF_DRAM_ACTIVE": ratio(p.dram, "dram"),
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ratio(p.tensor * 0.1, "fp16"),
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ratio(p.sm * 0.05, "fp32"),
        "DCGM_FI_PROF_PCIE_TX_BYTES": int(j(p.pcie_tx_mib, "tx") * MIB),
        "DCGM_FI_PROF_PCIE_RX_BYTES": int(j(p.pcie_rx_mib, "rx") * MIB),
        "DCGM_FI_DEV_POWER_USAGE": round(j(p.power_w, "power"), 3),
        "DCGM_FI_DEV_POWER_USAGE_INSTANT": round(j(p.power_w, "power_i"), 3),
        "DCGM_FI_DEV_SM_CLOCK": p.sm_clock,
        # DCGM_CLOCKS_EVENT_REASON_*: GPU_IDLE without work, SW_POWER_CAP near the 700 W limit
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x1 if p.util == 0 else (0x4 if p.power_w >= 0.9 * LIMIT_W else 0),
        "DCGM_FI_DEV_FB_USED": fb,
        **nvlink_values(j(p.nvlink_mib, "nvl_tx"), j(p.nvlink_mib, "nvl_rx")),
    }


def nvlink_values(tx_mib: float, rx_mib: float) -> dict[str, Value]:
    """The NVLink fields for TX / RX MiB/s over all links, as the NVML backend computes them:
    PROF_NVLINK_*_BYTES in bytes/s, BANDWIDTH_TOTAL DCGM's (TX + RX KiB/s) / 1000."""
    return {
        "DCGM_FI_PROF_NVLINK_TX_BYTES": int(tx_mib * MIB),
        "DCGM_FI_PROF_NVLINK_RX_BYTES": int(rx_mib * MIB),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": int((tx_mib + rx_mib) * 1024 / 1000),
    }


def power_w(workload: str, t: float) -> float:
    """The phase's mean power at ``t`` (what the energy counter integrates)."""
    return phase_at(workload, t).power_w


def processes(workload: str, t: float) -> int:
    return phase_at(workload, t).processes


def fb_free(values_: Mapping[str, Value], fb_total: int, fb_reserved: int) -> int:
    return int(fb_total - fb_reserved - int(values_["DCGM_FI_DEV_FB_USED"]))
