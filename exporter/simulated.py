"""A ``GpuBackend`` that replays the recorded H200 as N GPUs running a training job.

Values come from ``exporter/data/h200.json`` (what a real H200 answered idle and under load) and
move with the injected clock: a training GPU ramps its memory to ~20 GB, runs at ~99 % with short
data-loading dips and a checkpoint pause every 5 minutes, draws ~690 W power-capped at ~1440 MHz
(1980 MHz boost when the cap lets go), and heats from 31 to 56 C with a one-minute lag. Every
fourth GPU holds its memory but does no work (a stuck job) so dashboards show contrast.
``workloads={0: "nccl_hang", ...}`` scripts a GPU instead (:mod:`exporter.workloads`: training, idle,
checkpoint, eval, data_starved, nccl_hang, finished_holding, stalled), its compute process count included.

State advances in fixed one-second steps, so the values at a time ``t`` are a pure function of
``(seed, t)`` whatever the read schedule. The energy counter is the exact integral of power.

MIG: ``mig={0: ["3g.71gb", "2g.35gb", "1g.18gb"]}`` turns GPU 0 into MIG mode. Its instances are
read as ``Entity(gpu, gi_id)`` with FB and GPM (PROF_*) values; the parent ``Entity(gpu)`` keeps the
GPU-wide values (clocks, temperatures, power, energy, PCIe, row remapping) and, as NVML does in MIG
mode, has no GPU_UTIL / MEM_COPY_UTIL / ENC / DEC / PROF values; neither has NVLink values.

NVLink: the board is an HGX H200 SXM (``nvlink=False``: a PCIe board, no NVLink series and no P2P),
moving ~40 GB/s each way while training, none while idle or stuck.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from exporter import workloads as wl
from exporter.backend import DeviceInfo, Entity, GpuLostError, MigInstance, Value, XidEvent
from exporter.processes import ProcessCount
from exporter.simulated_fields import (
    GPM_BYTES,
    GPM_FIELDS,
    HEALTHY,
    MIG_INSTANCE_FIELDS,
    MIG_PARENT_ABSENT,
    NVLINK,
    NVLINK_TRAIN_MIB,
    SUPPORTED,
)

__all__ = ["SUPPORTED", "SimulatedBackend", "load_recording", "parse_profile"]

MIB = 1048576
STEP_S = 1.0
MAX_CATCH_UP_STEPS = 3600  # a longer clock jump restarts from the steady state
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)  # an HGX 8-GPU board
_GI_IDS = {7: (0,), 4: (1,), 3: (1, 2), 2: (3, 4, 5), 1: (7, 8, 9, 10, 11, 12, 13)}
_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb$")

def load_recording() -> dict[str, Any]:
    """The compact H200 recording shipped with the package."""
    text = resources.files("exporter").joinpath("data", "h200.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _unit(*parts: object) -> float:
    """A deterministic pseudo-random number in [0, 1) from the parts."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _uuid(*parts: object) -> str:
    h = hashlib.sha256(repr(parts).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def parse_profile(profile: str) -> tuple[int, int]:
    """``"3g.71gb"`` -> (3 slices, 71 GB). ValueError for anything else."""
    m = _PROFILE.match(profile)
    if not m:
        raise ValueError(f"bad MIG profile {profile!r}: want '<slices>g.<GB>gb', e.g. '3g.71gb'")
    return int(m.group(1)), int(m.group(2))


@dataclass(slots=True)
class _GpuState:
    """Integrated state of one simulated GPU at step ``step`` (seconds since start)."""

    step: int
    temp: float
    energy_mj: float


class SimulatedBackend:
    """N simulated H200s; see the module docstring."""

    def __init__(
        self,
        n_gpus: int = 8,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
        mig: Mapping[int, Sequence[str]] | None = None,
        hostname_seed: str = "sim",
        workloads: Mapping[int, str] | None = None,
        nvlink: bool = True,
    ) -> None:
        if n_gpus < 0:
            raise ValueError(f"n_gpus must be >= 0, got {n_gpus}")
        self._rec = load_recording()
        self._clock = clock
        self._seed = seed
        self._t0 = clock()
        static = self._rec["static"]
        self._fb_total = int(static["memory_total_bytes"]) // MIB
        self._fb_reserved = int(static["memory_reserved_bytes"]) // MIB
        self._fb_job = int(self._rec["load"]["memory_v2"]["used"]) // MIB
        self._idle_w = float(self._rec["idle"]["power_mw"]) / 1000.0
        self._load_w = float(self._rec["load"]["power_mw"]) / 1000.0
        self._workloads = dict(workloads or {})
        self._supported = SUPPORTED if nvlink else SUPPORTED - NVLINK
        self._lost: set[int] = set()
        self._xids: list[tuple[int, int]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._devices = [self._device(i, (mig or {}).get(i, ()), hostname_seed) for i in range(n_gpus)]
        for gpu in (mig or {}):
            if not 0 <= gpu < n_gpus:
                raise ValueError(f"mig names GPU {gpu}, but there are {n_gpus} GPUs")
        e0 = self._rec["idle"]["energy_mj"]
        self._state = [
            _GpuState(0, float(self._rec["idle"]["temp"]), e0 + 1e6 * _unit(seed, i, "energy"))
            for i in range(n_gpus)
        ]

    # --- static ---------------------------------------------------------------------------------

    def _device(self, index: int, profiles: Sequence[str], hostname_seed: str) -> DeviceInfo:
        bus = _PCI_BUSES[index] if index < len(_PCI_BUSES) else 0x18 + index
        uuid = "GPU-" + _uuid(hostname_seed, self._seed, index)
        used: set[int] = set()
        instances = []
        for n, profile in enumerate(profiles):
            slices, _gb = parse_profile(profile)
            gi = next((g for g in _GI_IDS.get(slices, ()) if g not in used), None)
            if gi is None:
                gi = max(used, default=13) + 1
            used.add(gi)
            instances.append(MigInstance(gi, profile, "MIG-" + _uuid(hostname_seed, self._seed, index, n)))
        return DeviceInfo(
            index=index,
            uuid=uuid,
            pci_bus_id=f"00000000:{bus:02X}:00.0",
            name=self._rec["static"]["name"],
            minor=index,
            mig=tuple(sorted(instances, key=lambda m: m.gpu_instance_id)),
        )

    def driver_version(self) -> str:
        return str(self._rec["static"]["driver_version"])

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def labels(self, gpu: int) -> dict[str, str]:
        """Static string fields (CSV ``label`` rows) for one GPU, keyed by DCGM field name."""
        s, d = self._rec["static"], self._devices[gpu]
        return {
            "DCGM_FI_DRIVER_VERSION": s["driver_version"],
            "DCGM_FI_NVML_VERSION": s["nvml_version"],
            "DCGM_FI_DEV_SERIAL": str(int(s["serial"]) + gpu),
            "DCGM_FI_DEV_VBIOS_VERSION": s["vbios"],
            "DCGM_FI_DEV_INFOROM_IMAGE_VER": s["inforom_image"],
            "DCGM_FI_DEV_NAME": d.name,
            "DCGM_FI_DEV_UUID": d.uuid,
            "DCGM_FI_DEV_PCI_BUSID": d.pci_bus_id,
        }

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        self._check_index(gpu)
        return {f for f in fields if f in self._supported}

    # --- the workload model ------------------------------------------------------------------------

    def _stuck(self, gpu: int) -> bool:
        return (gpu + self._seed) % 4 == 3

    def _activity(self, gpu: int, t: float) -> float:
        """0 (idle) .. 1 (full training load) at time t seconds since start."""
        if self._stuck(gpu):
            return 0.0
        start = 20.0 + 40.0 * _unit(self._seed, gpu, "start")  # jobs start staggered
        if t < start:
            return 0.0
        since = t - start
        if since < 30.0:  # model load and warm-up
            return since / 30.0
        phase = (since + 37.0 * gpu) % 300.0
        if phase < 15.0:  # checkpoint: the GPU waits on storage
            return 0.05
        if (since % 30.0) < 2.0:  # data-loader stall
            return 0.6
        return 0.97 + 0.03 * _unit(self._seed, gpu, int(since))

    def _fb_used(self, gpu: int, t: float) -> int:
        start = 20.0 + 40.0 * _unit(self._seed, gpu, "start")
        ramp = min(max((t - start) / 30.0, 0.0), 1.0)
        return int(self._fb_job * ramp)

    def _power(self, activity: float, held: bool) -> float:
        base = self._idle_w + (22.0 if held else 0.0)
        return base + (self._load_w - base) * activity

    def _advance(self, gpu: int, t: float) -> _GpuState:
        st = self._state[gpu]
        target = int(t // STEP_S)
        if target - st.step > MAX_CATCH_UP_STEPS:
            skipped = target - MAX_CATCH_UP_STEPS - st.step
            st.energy_mj += self._power(0.9, True) * skipped * STEP_S * 1000.0
            st.step += skipped
        alpha = 1.0 - math.exp(-STEP_S / 60.0)
        while st.step < target:
            ts = st.step * STEP_S
            act = self._activity(gpu, ts)
            power = self._power_at(gpu, ts, act)
            st.energy_mj += power * STEP_S * 1000.0
            goal = 31.0 + 25.0 * (power - self._idle_w) / (self._load_w - self._idle_w)
            st.temp += (goal - st.temp) * alpha
            st.step += 1
        return st

    def _power_at(self, gpu: int, ts: float, act: float) -> float:
        name = self._workloads.get(gpu)
        return wl.power_w(name, ts) if name else self._power(act, self._fb_used(gpu, ts) > 0)

    def compute_processes(self, gpu: int) -> dict[Entity, ProcessCount]:
        """Scripted GPUs: the workload's processes; others: one while the job holds memory. A MIG
        GPU answers per GPU instance (as NVML through MIG device handles): one process while the
        instance holds memory."""
        t, name = self._clock() - self._t0, self._workloads.get(gpu)
        device = self._devices[gpu]
        if device.mig:
            act = self._activity(gpu, t)
            out: dict[Entity, ProcessCount] = {}
            for n_, inst in enumerate(device.mig):
                used = int(self._mig_values(gpu, n_, inst, act)["DCGM_FI_DEV_FB_USED"])
                out[Entity(gpu, inst.gpu_instance_id)] = ProcessCount(int(used > 0), used)
            return out
        n = wl.processes(name, t) if name else int(self._fb_used(gpu, t) > 0)
        return {Entity(gpu): ProcessCount(n, self._fb_job if n else 0)}

    def p2p_status(self, gpu: int) -> dict[int, int]:
        """An HGX board: NVLink P2P OK to every other GPU (nvmlGpuP2PStatus_t 0); NOT_SUPPORTED (5)
        on a board without NVLink."""
        ok = 0 if self._supported >= NVLINK else 5
        return {peer: ok for peer in range(len(self._devices)) if peer != gpu}

    def _values(self, gpu: int, t: float) -> dict[str, Value]:
        st = self._advance(gpu, t)
        ts = st.step * STEP_S
        act = self._activity(gpu, ts)
        used = self._fb_used(gpu, ts)
        power = self._power_at(gpu, ts, act)
        energy = st.energy_mj + power * (t - ts) * 1000.0
        capped = act > 0.9
        sm_clock = 1440 if capped else (1980 if used > 0 else 345)
        jitter = _unit(self._seed, gpu, st.step, "p") - 0.5
        rec_load = self._rec["load"]
        gpm = self._gpm(act)
        temp = round(st.temp)
        values: dict[str, Value] = {
            "DCGM_FI_DEV_SM_CLOCK": sm_clock,
            "DCGM_FI_DEV_MEM_CLOCK": self._rec["idle"]["clock_mem"],
            "DCGM_FI_DEV_VIDEO_CLOCK": 765 if used == 0 else 1755,
            "DCGM_FI_DEV_GPU_TEMP": temp,
            "DCGM_FI_DEV_MEMORY_TEMP": round(33 + (st.temp - 31.0) * 0.4),
            "DCGM_FI_DEV_POWER_USAGE": round(power + 4.0 * jitter * (act > 0), 3),
            "DCGM_FI_DEV_POWER_USAGE_INSTANT": round(power + 12.0 * jitter * (act > 0), 3),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(energy),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": min(100, round(100 * act)) if act < 0.97 else 99 + (jitter > 0.3),
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(rec_load["utilization"]["memory"] * act),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_FB_TOTAL": self._fb_total,
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_RESERVED": self._fb_reserved,
            "DCGM_FI_DEV_FB_FREE": self._fb_total - self._fb_reserved - used,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
            "DCGM_FI_DEV_ROW_REMAP_PENDING": 0,
            **HEALTHY,  # the health row's other inputs: InfoROM valid, no recovery action, no NVLink errors
            "DCGM_FI_DEV_MAX_SM_CLOCK": self._rec["static"]["max_clock_sm"],
            "DCGM_FI_DEV_MAX_MEM_CLOCK": self._rec["static"]["max_clock_mem"],
            "DCGM_FI_DEV_SLOWDOWN_TEMP": self._rec["static"]["temperature_slowdown"],
            "DCGM_FI_DEV_SHUTDOWN_TEMP": self._rec["static"]["temperature_shutdown"],
            "DCGM_FI_DEV_POWER_MGMT_LIMIT": self._rec["static"]["power_limit_mw"] / 1000.0,
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": self._rec["static"]["power_limit_mw"] / 1000.0,
            "DCGM_FI_DEV_PSTATE": 0,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 4 if capped else (0 if used else 1),
            "DCGM_FI_DEV_PCIE_LINK_GEN": self._rec["static"]["pcie_link_gen"],
            "DCGM_FI_DEV_PCIE_LINK_WIDTH": self._rec["static"]["pcie_link_width"],
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 0,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 0,
            "DCGM_FI_DEV_POWER_VIOLATION": int(3.68e9 + 0.3e9 * max(t - 60.0, 0.0) * (act > 0.9)),
            "DCGM_FI_DEV_THERMAL_VIOLATION": 0,
            "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": 0,
            "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": 0,
            "DCGM_FI_DEV_LOW_UTIL_VIOLATION": int(2.88e10 + 1e9 * t * (act == 0)),
            "DCGM_FI_DEV_RELIABILITY_VIOLATION": 0,
        }
        values.update(gpm)
        values.update(wl.nvlink_values(NVLINK_TRAIN_MIB * act, NVLINK_TRAIN_MIB * act))
        if gpu in self._workloads:
            values.update(wl.values(self._workloads[gpu], gpu, t, self._fb_total))
            values["DCGM_FI_DEV_FB_FREE"] = wl.fb_free(values, self._fb_total, self._fb_reserved)
        return values

    def _gpm(self, act: float, share: float = 1.0) -> dict[str, Value]:
        """PROF_* values: the training recording scaled by activity (idle recording below)."""
        idle, train = self._rec["gpm"]["idle"], self._rec["gpm"]["training"]
        out: dict[str, Value] = {}
        for name, metric in GPM_FIELDS.items():
            pct = idle.get(metric, 0.0) + (train.get(metric, 0.0) - idle.get(metric, 0.0)) * act
            out[name] = round(min(pct * share, 100.0) / 100.0, 6)
        for name, metric in GPM_BYTES.items():
            mib_s = idle[metric] + (train[metric] - idle[metric]) * act
            out[name] = int(mib_s * MIB)
        return out

    # --- GpuBackend ---------------------------------------------------------------------------

    def _check_index(self, gpu: int) -> None:
        if not 0 <= gpu < len(self._devices):
            raise ValueError(f"no GPU {gpu}: {len(self._devices)} simulated")

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        self._check_index(gpu)
        if gpu in self._lost:
            raise GpuLostError(gpu, "GPU has fallen off the bus (simulated XID 79)")
        t = self._clock() - self._t0
        values = self._values(gpu, t)
        device = self._devices[gpu]
        wanted = fields & self._supported
        if not device.mig:
            return {Entity(gpu): {f: values[f] for f in wanted if f in values}}
        out: dict[Entity, Mapping[str, Value]] = {
            Entity(gpu): {f: values[f] for f in wanted - MIG_PARENT_ABSENT if f in values}
        }
        act = self._activity(gpu, t)
        for n, inst in enumerate(device.mig):
            out[Entity(gpu, inst.gpu_instance_id)] = {
                f: v for f, v in self._mig_values(gpu, n, inst, act).items() if f in wanted
            }
        return out

    def _mig_values(self, gpu: int, n: int, inst: MigInstance, act: float) -> dict[str, Value]:
        slices, gb = parse_profile(inst.profile)
        total = gb * 1024 - 256 * slices  # MIG FB is a bit under the profile's nominal size
        busy = act * (0.55 + 0.45 * _unit(self._seed, gpu, n, "mig"))
        used = int(total * 0.6 * busy) if busy > 0 else 0
        values: dict[str, Value] = {
            "DCGM_FI_DEV_FB_TOTAL": total,
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_RESERVED": 0,
            "DCGM_FI_DEV_FB_FREE": total - used,
        }
        values.update({k: v for k, v in self._gpm(busy).items() if k in MIG_INSTANCE_FIELDS})
        return values

    def lose_gpu(self, gpu: int) -> None:
        """Make ``read(gpu)`` raise GpuLostError, as after XID 79; the XID is reported too."""
        self._check_index(gpu)
        self._lost.add(gpu)
        self.inject_xid(gpu, 79)

    def restore_gpu(self, gpu: int) -> None:
        self._check_index(gpu)
        self._lost.discard(gpu)

    def inject_xid(self, gpu: int, xid: int) -> None:
        """Queue an XID event; the next ``wait_xid`` returns it."""
        self._check_index(gpu)
        with self._cond:
            self._xids.append((gpu, xid))
            self._cond.notify_all()

    def wait_xid(self, timeout_s: float) -> Sequence[XidEvent]:
        with self._cond:
            if not self._xids and not self._closed:
                self._cond.wait(max(timeout_s, 0.0))
            events, self._xids = self._xids, []
            return events

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
