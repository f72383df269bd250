"""The NVML backend: DCGM fields read through nvidia-ml-py (``pynvml``), in DCGM's units.

Cost model (measured on an H200, see ``exporter/data/h200.json``): most getters cost 1-10 us, a
naive pass of 14 getters 46 ms, a well-chosen pass 0.18 ms. So this backend:

- reads static facts once (name, UUID, PCI bus id, minor, MIG layout, driver version, max clocks,
  temperature thresholds, label strings);
- probes once per GPU which fields answer (``supported_fields``) and never asks again for the rest;
- per pass calls one getter per group of requested fields (utilization rates give two fields, the
  v2 memory info four), and ONE batched ``nvmlDeviceGetFieldValues`` for every requested field-value
  field (memory temperature, total energy, PCIe replays, remapped rows, ECC, violations, ...);
- computes PROF_* from NVML GPM: one new ``nvmlGpmSampleGet`` per pass into a sample allocated once,
  ``nvmlGpmMetricsGet`` between the previous and the new sample for the requested metrics only;
- never calls ``nvmlDeviceGetPcieThroughput`` (it samples for 20 ms); PCIe bytes come from GPM and
  DCGM_FI_DEV_PCIE_{TX,RX}_THROUGHPUT from the PCIe byte counters, differenced.

Entities: a GPU without MIG returns one ``Entity(gpu)``. With MIG on, ``Entity(gpu)`` keeps what NVML
reports GPU-wide (clocks, temperatures, power, energy, PCIe, remapping, the GPU-level FB and GPM
when the driver answers) and each ``Entity(gpu, gi_id)`` gets its FB (memory info of the MIG
handle) and GPM ratios (``nvmlGpmMigSampleGet``). The renderer decides what to publish where.

Errors: NVML_ERROR_GPU_IS_LOST, or NVML_ERROR_UNKNOWN from every call of a pass, raise
``GpuLostError`` for that GPU; any other error leaves that field absent for the pass.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.backend import BackendError, DeviceInfo, Entity, GpuLostError, MigInstance, Value

log = logging.getLogger(__name__)

MIB = 1048576
UINT_MAX = 0xFFFFFFFF
Getter = Callable[[Any, Any], dict[str, Value]]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _memory(nvml: Any, h: Any) -> dict[str, Value]:
    m = nvml.nvmlDeviceGetMemoryInfo(h, nvml.nvmlMemory_v2)
    usable = m.total - m.reserved
    return {
        "DCGM_FI_DEV_FB_TOTAL": m.total // MIB,
        "DCGM_FI_DEV_FB_FREE": m.free // MIB,
        "DCGM_FI_DEV_FB_USED": m.used // MIB,
        "DCGM_FI_DEV_FB_RESERVED": m.reserved // MIB,
        "DCGM_FI_DEV_FB_USED_PERCENT": m.used / usable if usable > 0 else 0.0,
    }


def _util(nvml: Any, h: Any) -> dict[str, Value]:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return {"DCGM_FI_DEV_GPU_UTIL": int(u.gpu), "DCGM_FI_DEV_MEM_COPY_UTIL": int(u.memory)}


def _one(name: str, call: Callable[[Any, Any], Any], convert: Callable[[Any], Value] = int) -> Getter:
    return lambda nvml, h: {name: convert(call(nvml, h))}


# Per-pass getter groups: one NVML call each.
GETTERS: dict[str, Getter] = {
    "util": _util,
    "memory": _memory,
    "power": _one("DCGM_FI_DEV_POWER_USAGE", lambda n, h: n.nvmlDeviceGetPowerUsage(h), lambda v: v / 1000.0),
    "temp": _one("DCGM_FI_DEV_GPU_TEMP", lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
    "sm_clock": _one("DCGM_FI_DEV_SM_CLOCK", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
    "mem_clock": _one("DCGM_FI_DEV_MEM_CLOCK", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
    "video_clock": _one(
        "DCGM_FI_DEV_VIDEO_CLOCK", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_VIDEO)
    ),
    "enc": _one("DCGM_FI_DEV_ENC_UTIL", lambda n, h: n.nvmlDeviceGetEncoderUtilization(h)[0]),
    "dec": _one("DCGM_FI_DEV_DEC_UTIL", lambda n, h: n.nvmlDeviceGetDecoderUtilization(h)[0]),
    "pstate": _one("DCGM_FI_DEV_PSTATE", lambda n, h: n.nvmlDeviceGetPerformanceState(h)),
    "fan": _one("DCGM_FI_DEV_FAN_SPEED", lambda n, h: n.nvmlDeviceGetFanSpeed(h)),
    "events": _one(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", lambda n, h: n.nvmlDeviceGetCurrentClocksEventReasons(h)
    ),
    "link_gen": _one("DCGM_FI_DEV_PCIE_LINK_GEN", lambda n, h: n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
    "link_width": _one("DCGM_FI_DEV_PCIE_LINK_WIDTH", lambda n, h: n.nvmlDeviceGetCurrPcieLinkWidth(h)),
    "enforced_limit": _one(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h),
        lambda v: v / 1000.0,
    ),
}
GROUP_FIELDS: dict[str, tuple[str, ...]] = {
    "util": ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"),
    "memory": (
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_FB_USED_PERCENT",
    ),
    "power": ("DCGM_FI_DEV_POWER_USAGE",),
    "temp": ("DCGM_FI_DEV_GPU_TEMP",),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK",),
    "mem_clock": ("DCGM_FI_DEV_MEM_CLOCK",),
    "video_clock": ("DCGM_FI_DEV_VIDEO_CLOCK",),
    "enc": ("DCGM_FI_DEV_ENC_UTIL",),
    "dec": ("DCGM_FI_DEV_DEC_UTIL",),
    "pstate": ("DCGM_FI_DEV_PSTATE",),
    "fan": ("DCGM_FI_DEV_FAN_SPEED",),
    "events": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",),
    "link_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN",),
    "link_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH",),
    "enforced_limit": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT",),
}
_FIELD_GROUP = {f: g for g, fs in GROUP_FIELDS.items() for f in fs}

# Static values, read once at probe time (several cost 150-1500 us each).
STATIC: dict[str, Callable[[Any, Any], Value]] = {
    "DCGM_FI_DEV_MAX_SM_CLOCK": lambda n, h: int(n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)),
    "DCGM_FI_DEV_MAX_MEM_CLOCK": lambda n, h: int(n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": lambda n, h: int(
        n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    ),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": lambda n, h: int(
        n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    ),
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": lambda n, h: int(n.nvmlDeviceGetMaxPcieLinkGeneration(h)),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": lambda n, h: int(n.nvmlDeviceGetMaxPcieLinkWidth(h)),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": lambda n, h: n.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
}

# Label strings (CSV ``label`` rows), read once; name, UUID and bus id come from DeviceInfo.
LABELS: dict[str, Callable[[Any, Any], str]] = {
    "DCGM_FI_DEV_SERIAL": lambda n, h: _s(n.nvmlDeviceGetSerial(h)),
    "DCGM_FI_DEV_VBIOS_VERSION": lambda n, h: _s(n.nvmlDeviceGetVbiosVersion(h)),
    "DCGM_FI_DEV_INFOROM_IMAGE_VER": lambda n, h: _s(n.nvmlDeviceGetInforomImageVersion(h)),
    "DCGM_FI_DEV_OEM_INFOROM_VER": lambda n, h: _s(n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_OEM)),
    "DCGM_FI_DEV_ECC_INFOROM_VER": lambda n, h: _s(n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_ECC)),
    "DCGM_FI_DEV_POWER_INFOROM_VER": lambda n, h: _s(n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_POWER)),
    "DCGM_FI_DEV_BRAND": lambda n, h: str(n.nvmlDeviceGetBrand(h)),
}


@dataclass(frozen=True, slots=True)
class FieldValue:
    """A DCGM field read through ``nvmlDeviceGetFieldValues``: NVML_FI_* constant name and scale."""

    nvml_name: str
    scale: float = 1.0  # value * scale; 1.0 keeps an integer
    max_valid: float | None = None  # above this the value is a sentinel (memory temp > 200)


FIELD_VALUES: dict[str, FieldValue] = {
    "DCGM_FI_DEV_MEMORY_TEMP": FieldValue("NVML_FI_DEV_MEMORY_TEMP", max_valid=200),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": FieldValue("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": FieldValue("NVML_FI_DEV_PCIE_REPLAY_COUNTER"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": FieldValue("NVML_FI_DEV_REMAPPED_COR"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": FieldValue("NVML_FI_DEV_REMAPPED_UNC"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": FieldValue("NVML_FI_DEV_REMAPPED_PENDING"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": FieldValue("NVML_FI_DEV_REMAPPED_FAILURE"),
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": FieldValue("NVML_FI_DEV_POWER_INSTANT", scale=0.001),
    "DCGM_FI_DEV_ECC_CURRENT": FieldValue("NVML_FI_DEV_ECC_CURRENT"),
    "DCGM_FI_DEV_ECC_PENDING": FieldValue("NVML_FI_DEV_ECC_PENDING"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": FieldValue("NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": FieldValue("NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": FieldValue("NVML_FI_DEV_ECC_SBE_AGG_TOTAL"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": FieldValue("NVML_FI_DEV_ECC_DBE_AGG_TOTAL"),
    "DCGM_FI_DEV_RETIRED_SBE": FieldValue("NVML_FI_DEV_RETIRED_SBE"),
    "DCGM_FI_DEV_RETIRED_DBE": FieldValue("NVML_FI_DEV_RETIRED_DBE"),
    "DCGM_FI_DEV_RETIRED_PENDING": FieldValue("NVML_FI_DEV_RETIRED_PENDING"),
    "DCGM_FI_DEV_POWER_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_POWER"),
    "DCGM_FI_DEV_THERMAL_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_THERMAL"),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT"),
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION"),
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_RELIABILITY"),
    "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS"),
    "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION": FieldValue("NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": FieldValue(
        "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    ),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": FieldValue(
        "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
    ),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": FieldValue("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": FieldValue(
        "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
    ),
}


@dataclass(frozen=True, slots=True)
class RateField:
    """A DCGM rate computed from NVML byte/KiB counters read in the same batch, differenced."""

    counters: tuple[tuple[str, int], ...]  # (NVML_FI_* name, scopeId), summed
    unit_bytes: int  # bytes per counter unit
    per_s_divisor: int  # bytes/s -> DCGM unit


RATE_FIELDS: dict[str, RateField] = {
    # DCGM: NVLink data TX+RX KiB counters over all links, published as MB/s
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": RateField(
        (
            ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", UINT_MAX),
            ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", UINT_MAX),
        ),
        1024,
        1000 * 1000,
    ),
    # DCGM used the 20 ms nvmlDeviceGetPcieThroughput (KB/s); the byte counters give the same unit free
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": RateField((("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0),), 1, 1024),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": RateField((("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0),), 1, 1024),
}

# PROF_* from GPM: (NVML_GPM_METRIC_* name, multiplier). Percent -> ratio, MiB/s -> bytes/s.
GPM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("NVML_GPM_METRIC_GRAPHICS_UTIL", 0.01),
    "DCGM_FI_PROF_SM_ACTIVE": ("NVML_GPM_METRIC_SM_UTIL", 0.01),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("NVML_GPM_METRIC_SM_OCCUPANCY", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("NVML_GPM_METRIC_FP64_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("NVML_GPM_METRIC_FP32_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("NVML_GPM_METRIC_FP16_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": ("NVML_GPM_METRIC_IMMA_TENSOR_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": ("NVML_GPM_METRIC_HMMA_TENSOR_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": ("NVML_GPM_METRIC_DFMA_TENSOR_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": ("NVML_GPM_METRIC_INTEGER_UTIL", 0.01),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", MIB),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", MIB),
}
_GPM_NEEDS_NVLINK = frozenset({"DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"})
_MIG_FB = frozenset(
    {"DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"}
)
_MIG_GPM = frozenset(f for f, (_, scale) in GPM_FIELDS.items() if scale == 0.01)
_FV_ATTR = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by NVML_VALUE_TYPE_*
_NOT_READ = frozenset({"DCGM_FI_DEV_XID_ERRORS"})  # the XID watcher owns it (wait_xid)


@dataclass(slots=True)
class _Gpm:
    """Two GPM sample buffers allocated once, swapped every pass, and a reusable metrics request."""

    prev: Any
    cur: Any
    request: Any
    have_prev: bool = False


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one pass reads for a given requested field set (computed once per set)."""

    wanted: frozenset[str]
    groups: tuple[str, ...]
    static: tuple[str, ...]
    fv_names: tuple[str, ...]
    rate_names: tuple[str, ...]
    request: tuple[int | tuple[int, int], ...]
    gpm: tuple[str, ...]
    mig_fb: bool
    mig_gpm: tuple[str, ...]


@dataclass(slots=True)
class _Gpu:
    handle: Any
    info: DeviceInfo
    mig_handles: dict[int, Any]
    supported: frozenset[str] | None = None
    static: dict[str, Value] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    gpm: dict[int | None, _Gpm] = field(default_factory=dict)
    rate_prev: dict[str, tuple[float, int]] = field(default_factory=dict)
    plans: dict[frozenset[str], _Plan] = field(default_factory=dict)


@dataclass(slots=True)
class _PassStats:
    ok: int = 0
    unknown: int = 0


def _init_message(nvml: Any, exc: Any) -> str:
    code = getattr(exc, "value", None)
    hints = {
        getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", -1): (
            "NVML library libnvidia-ml.so.1 not found: install the NVIDIA driver on the host; in a "
            "container run with the NVIDIA runtime (runtimeClassName: nvidia, NVIDIA_VISIBLE_DEVICES=all) "
            "so the driver libraries are mounted; or use --backend simulated"
        ),
        getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", -1): (
            "the NVIDIA kernel driver is not loaded: check `nvidia-smi` and `lsmod | grep nvidia` on the node"
        ),
        getattr(nvml, "NVML_ERROR_NO_PERMISSION", -1): (
            "no permission to open /dev/nvidia*: run as root or give the container the GPU devices"
        ),
        getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", -1): (
            "the NVML library and the kernel driver have different versions: reboot or reload the driver"
        ),
    }
    return hints.get(code, f"NVML initialisation failed: {exc}")


class NvmlBackend:
    """GpuBackend over NVML. ``nvml`` is the pynvml module (tests pass a fake)."""

    def __init__(self, nvml: Any | None = None) -> None:
        if nvml is None:
            try:
                import pynvml as nvml_module
            except ImportError as exc:
                raise BackendError(
                    "the NVML backend needs the nvidia-ml-py package (import pynvml failed): "
                    "pip install nvidia-ml-py, or use --backend simulated"
                ) from exc
            nvml = nvml_module
        self._nvml: Any = nvml
        self._error: type[BaseException] = nvml.NVMLError
        try:
            nvml.nvmlInit()
        except self._error as exc:
            raise BackendError(_init_message(nvml, exc)) from exc
        self.last_pass_us: dict[int, float] = {}
        self._stop = threading.Event()
        self._closed = False
        try:
            self._driver = _s(nvml.nvmlSystemGetDriverVersion())
            self._nvml_version = _s(nvml.nvmlSystemGetNVMLVersion())
            self._gpus = [self._open(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        except self._error as exc:
            nvml.nvmlShutdown()
            raise BackendError(f"NVML started but listing the GPUs failed: {exc}") from exc
        self._events = self._open_events()

    # --- start-up ----------------------------------------------------------------------------------

    def _open(self, index: int) -> _Gpu:
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(index)
        mig, handles = self._mig_layout(h)
        info = DeviceInfo(
            index=index,
            uuid=_s(n.nvmlDeviceGetUUID(h)),
            pci_bus_id=_s(n.nvmlDeviceGetPciInfo(h).busId),
            name=_s(n.nvmlDeviceGetName(h)),
            minor=int(n.nvmlDeviceGetMinorNumber(h)),
            mig=mig,
        )
        return _Gpu(h, info, handles)

    def _mig_layout(self, h: Any) -> tuple[tuple[MigInstance, ...], dict[int, Any]]:
        n = self._nvml
        try:
            current, _pending = n.nvmlDeviceGetMigMode(h)
        except self._error:
            return (), {}
        if current != 1:
            return (), {}
        instances: list[MigInstance] = []
        handles: dict[int, Any] = {}
        for slot in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except self._error:
                continue  # empty slot
            gi = int(n.nvmlDeviceGetGpuInstanceId(mh))
            mem_gb = math.ceil(n.nvmlDeviceGetMemoryInfo(mh).total / MIB / 1024)
            slices = int(n.nvmlDeviceGetAttributes(mh).gpuInstanceSliceCount)
            instances.append(MigInstance(gi, f"{slices}g.{mem_gb}gb", _s(n.nvmlDeviceGetUUID(mh))))
            handles[gi] = mh
        instances.sort(key=lambda m: m.gpu_instance_id)
        return tuple(instances), dict(sorted(handles.items()))

    def _open_events(self) -> Any | None:
        n = self._nvml
        try:
            events = n.nvmlEventSetCreate()
        except self._error as exc:
            log.warning("XID events unavailable: nvmlEventSetCreate failed: %s", exc)
            return None
        registered = 0
        for g in self._gpus:
            try:
                if n.nvmlDeviceGetSupportedEventTypes(g.handle) & n.nvmlEventTypeXidCriticalError:
                    n.nvmlDeviceRegisterEvents(g.handle, n.nvmlEventTypeXidCriticalError, events)
                    registered += 1
            except self._error as exc:
                log.warning("GPU %d: cannot watch XID events: %s", g.info.index, exc)
        return events if registered else None

    # --- probing -----------------------------------------------------------------------------------

    def _gpu(self, gpu: int) -> _Gpu:
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu}: NVML lists {len(self._gpus)}")
        return self._gpus[gpu]

    def _lost_check(self, gpu: int, exc: BaseException) -> None:
        if getattr(exc, "value", None) == self._nvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLostError(gpu, "NVML_ERROR_GPU_IS_LOST (fallen off the bus?)") from exc

    def _probe(self, gpu: int) -> frozenset[str]:
        g = self._gpu(gpu)
        if g.supported is not None:
            return g.supported
        n, h, stats = self._nvml, g.handle, _PassStats()
        sup: set[str] = set()
        for getter in GETTERS.values():
            try:
                sup.update(getter(n, h))
                stats.ok += 1
            except self._error as exc:
                self._failed(gpu, exc, stats)
        g.static["DCGM_FI_DEV_MINOR_NUMBER"] = g.info.minor
        sup.add("DCGM_FI_DEV_MINOR_NUMBER")
        for name, read_static in STATIC.items():
            try:
                g.static[name] = read_static(n, h)
                sup.add(name)
                stats.ok += 1
            except self._error as exc:
                self._failed(gpu, exc, stats)
        g.labels.update(
            {
                "DCGM_FI_DRIVER_VERSION": self._driver,
                "DCGM_FI_NVML_VERSION": self._nvml_version,
                "DCGM_FI_DEV_NAME": g.info.name,
                "DCGM_FI_DEV_UUID": g.info.uuid,
                "DCGM_FI_DEV_PCI_BUSID": g.info.pci_bus_id,
            }
        )
        for name, read_label in LABELS.items():
            try:
                g.labels[name] = read_label(n, h)
                stats.ok += 1
            except self._error as exc:
                self._failed(gpu, exc, stats)
        sup.update(g.labels)
        sup.update(self._probe_field_values(gpu, g, stats))
        sup.update(self._probe_gpm(g))
        try:
            if n.nvmlDeviceGetSupportedEventTypes(h) & n.nvmlEventTypeXidCriticalError:
                sup.add("DCGM_FI_DEV_XID_ERRORS")
        except self._error as exc:
            self._failed(gpu, exc, stats)
        if stats.ok == 0 and stats.unknown > 0:
            g.labels.clear()
            g.static.clear()
            raise GpuLostError(gpu, "every NVML call failed with NVML_ERROR_UNKNOWN")
        g.supported = frozenset(sup)
        return g.supported

    def _probe_field_values(self, gpu: int, g: _Gpu, stats: _PassStats) -> set[str]:
        n = self._nvml
        simple = [f for f, fv in FIELD_VALUES.items() if hasattr(n, fv.nvml_name)]
        rates = [f for f, r in RATE_FIELDS.items() if all(hasattr(n, c) for c, _ in r.counters)]
        plan = self._make_plan(g, frozenset(simple + rates), probing=True)
        try:
            results = n.nvmlDeviceGetFieldValues(g.handle, list(plan.request))
            stats.ok += 1
        except self._error as exc:
            self._failed(gpu, exc, stats)
            return set()
        ok = [r.nvmlReturn == 0 for r in results]
        sup = {f for f, good in zip(plan.fv_names, ok, strict=False) if good}
        i = len(plan.fv_names)
        for f in plan.rate_names:
            width = len(RATE_FIELDS[f].counters)
            if all(ok[i : i + width]):
                sup.add(f)
            i += width
        return sup

    def _probe_gpm(self, g: _Gpu) -> set[str]:
        n = self._nvml
        try:
            if not n.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice:
                return set()
        except (self._error, AttributeError):
            return set()
        try:
            has_nvlink = n.nvmlDeviceGetNvLinkState(g.handle, 0) == 1
        except self._error:
            has_nvlink = False
        return {
            f
            for f, (metric, _) in GPM_FIELDS.items()
            if hasattr(n, metric) and (has_nvlink or f not in _GPM_NEEDS_NVLINK)
        }

    def _make_plan(self, g: _Gpu, wanted: frozenset[str], probing: bool = False) -> _Plan:
        n = self._nvml
        fv_names = tuple(sorted(f for f in wanted if f in FIELD_VALUES))
        rate_names = tuple(sorted(f for f in wanted if f in RATE_FIELDS))
        request: list[int | tuple[int, int]] = [getattr(n, FIELD_VALUES[f].nvml_name) for f in fv_names]
        for f in rate_names:
            request += [
                (getattr(n, c), scope) if scope else getattr(n, c) for c, scope in RATE_FIELDS[f].counters
            ]
        gpm = tuple(sorted(f for f in wanted if f in GPM_FIELDS))
        return _Plan(
            wanted=wanted,
            groups=tuple(sorted({_FIELD_GROUP[f] for f in wanted if f in _FIELD_GROUP})),
            static=tuple(f for f in wanted if f in g.static),
            fv_names=fv_names,
            rate_names=rate_names,
            request=tuple(request),
            gpm=gpm,
            mig_fb=bool(wanted & _MIG_FB),
            mig_gpm=tuple(f for f in gpm if f in _MIG_GPM),
        )

    # --- GpuBackend ---------------------------------------------------------------------------------

    def driver_version(self) -> str:
        return self._driver

    def devices(self) -> list[DeviceInfo]:
        return [g.info for g in self._gpus]

    def labels(self, gpu: int) -> dict[str, str]:
        """Static string fields (CSV ``label`` rows) for one GPU, keyed by DCGM field name."""
        self._probe(gpu)
        return dict(self._gpus[gpu].labels)

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        supported = self._probe(gpu)
        return {f for f in fields if f in supported}

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        started = time.perf_counter()
        g = self._gpu(gpu)
        supported = self._probe(gpu)
        plan = g.plans.get(fields)
        if plan is None:
            if len(g.plans) > 32:
                g.plans.clear()
            plan = g.plans[fields] = self._make_plan(g, (fields & supported) - _NOT_READ - g.labels.keys())
        n, h, stats = self._nvml, g.handle, _PassStats()
        values: dict[str, Value] = {}
        for group in plan.groups:
            try:
                values.update(GETTERS[group](n, h))
                stats.ok += 1
            except self._error as exc:
                self._failed(gpu, exc, stats)
        for name in plan.static:
            values[name] = g.static[name]
        if plan.request:
            self._read_field_values(gpu, g, plan, values, stats)
        if plan.gpm:
            values.update(self._gpm_pass(gpu, g, None, plan.gpm, stats))
        out: dict[Entity, Mapping[str, Value]] = {
            Entity(gpu): {k: v for k, v in values.items() if k in plan.wanted}
        }
        for gi, mh in g.mig_handles.items():
            out[Entity(gpu, gi)] = self._read_instance(gpu, g, gi, mh, plan, stats)
        if stats.ok == 0 and stats.unknown > 0:
            raise GpuLostError(gpu, "every NVML call of the pass failed with NVML_ERROR_UNKNOWN")
        self.last_pass_us[gpu] = (time.perf_counter() - started) * 1e6
        return out

    def _failed(self, gpu: int, exc: BaseException, stats: _PassStats) -> None:
        self._lost_check(gpu, exc)
        if getattr(exc, "value", None) == self._nvml.NVML_ERROR_UNKNOWN:
            stats.unknown += 1
        log.debug("GPU %d: NVML call failed: %s", gpu, exc)

    def _read_field_values(
        self, gpu: int, g: _Gpu, plan: _Plan, values: dict[str, Value], stats: _PassStats
    ) -> None:
        try:
            results = self._nvml.nvmlDeviceGetFieldValues(g.handle, list(plan.request))
            stats.ok += 1
        except self._error as exc:
            self._failed(gpu, exc, stats)
            return
        lost = self._nvml.NVML_ERROR_GPU_IS_LOST
        for name, r in zip(plan.fv_names, results, strict=False):
            if r.nvmlReturn == lost:
                raise GpuLostError(gpu, "NVML_ERROR_GPU_IS_LOST (fallen off the bus?)")
            if r.nvmlReturn != 0:
                continue
            fv = FIELD_VALUES[name]
            raw = getattr(r.value, _FV_ATTR[r.valueType])
            if fv.max_valid is not None and raw > fv.max_valid:
                continue
            values[name] = raw * fv.scale if fv.scale != 1.0 else int(raw)
        i = len(plan.fv_names)
        for name in plan.rate_names:
            rate = RATE_FIELDS[name]
            parts = results[i : i + len(rate.counters)]
            i += len(rate.counters)
            if any(p.nvmlReturn != 0 for p in parts):
                continue
            total = float(sum(getattr(p.value, _FV_ATTR[p.valueType]) for p in parts))
            stamp = max(int(p.timestamp) for p in parts)
            prev = g.rate_prev.get(name)
            g.rate_prev[name] = (total, stamp)
            if prev is not None and stamp > prev[1] and total >= prev[0]:
                per_s = (total - prev[0]) * rate.unit_bytes / ((stamp - prev[1]) / 1e6)
                values[name] = int(per_s / rate.per_s_divisor)

    def _gpm_pass(
        self, gpu: int, g: _Gpu, gi: int | None, names: tuple[str, ...], stats: _PassStats
    ) -> dict[str, Value]:
        n = self._nvml
        st = g.gpm.get(gi)
        try:
            if st is None:
                request = n.c_nvmlGpmMetricsGet_t()
                request.version = n.NVML_GPM_METRICS_GET_VERSION
                st = g.gpm[gi] = _Gpm(n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc(), request)
            if gi is None:
                n.nvmlGpmSampleGet(g.handle, st.cur)
            else:
                n.nvmlGpmMigSampleGet(g.handle, gi, st.cur)
            stats.ok += 1
        except self._error as exc:
            self._failed(gpu, exc, stats)
            return {}
        out: dict[str, Value] = {}
        if st.have_prev:
            req = st.request
            req.numMetrics = len(names)
            req.sample1, req.sample2 = st.prev, st.cur
            for i, name in enumerate(names):
                req.metrics[i].metricId = getattr(n, GPM_FIELDS[name][0])
            try:
                n.nvmlGpmMetricsGet(req)
                stats.ok += 1
            except self._error as exc:
                self._failed(gpu, exc, stats)
                names = ()
            for i, name in enumerate(names):
                m = req.metrics[i]
                if m.nvmlReturn != 0 or math.isnan(m.value):
                    continue
                scale = GPM_FIELDS[name][1]
                out[name] = m.value * scale if scale < 1 else int(m.value * scale)
        st.prev, st.cur, st.have_prev = st.cur, st.prev, True
        return out

    def _read_instance(
        self, gpu: int, g: _Gpu, gi: int, mh: Any, plan: _Plan, stats: _PassStats
    ) -> dict[str, Value]:
        values: dict[str, Value] = {}
        if plan.mig_fb:
            try:
                values.update(_memory(self._nvml, mh))
                stats.ok += 1
            except self._error:
                try:
                    m = self._nvml.nvmlDeviceGetMemoryInfo(mh)
                    values.update(
                        {
                            "DCGM_FI_DEV_FB_TOTAL": m.total // MIB,
                            "DCGM_FI_DEV_FB_FREE": m.free // MIB,
                            "DCGM_FI_DEV_FB_USED": m.used // MIB,
                            "DCGM_FI_DEV_FB_RESERVED": 0,
                        }
                    )
                    stats.ok += 1
                except self._error as exc:
                    self._failed(gpu, exc, stats)
        if plan.mig_gpm:
            values.update(self._gpm_pass(gpu, g, gi, plan.mig_gpm, stats))
        return {k: v for k, v in values.items() if k in plan.wanted}

    # --- XID -----------------------------------------------------------------------------------------

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to timeout_s for critical XID events. Keep timeout_s short (about 1 s): NVML's
        wait cannot be interrupted, so ``close`` takes effect after the current wait."""
        n = self._nvml
        if self._events is None or self._closed:
            self._stop.wait(max(timeout_s, 0.0))
            return []
        out: list[tuple[int, int]] = []
        wait_ms = max(int(timeout_s * 1000), 0)
        while len(out) < 64:
            try:
                data = n.nvmlEventSetWait_v2(self._events, wait_ms)
            except self._error as exc:
                if getattr(exc, "value", None) != n.NVML_ERROR_TIMEOUT:
                    log.warning("waiting for XID events failed: %s", exc)
                    self._stop.wait(min(max(timeout_s, 0.0), 1.0))
                break
            if data.eventType & n.nvmlEventTypeXidCriticalError:
                try:
                    out.append((int(n.nvmlDeviceGetIndex(data.device)), int(data.eventData)))
                except self._error as exc:
                    log.warning("XID %d on a device NVML cannot name: %s", data.eventData, exc)
            wait_ms = 0  # drain what else is queued, without blocking
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        n = self._nvml
        for g in self._gpus:
            for st in g.gpm.values():
                for sample in (st.prev, st.cur):
                    try:
                        n.nvmlGpmSampleFree(sample)
                    except self._error as exc:
                        log.debug("nvmlGpmSampleFree: %s", exc)
            g.gpm.clear()
        try:
            if self._events is not None:
                n.nvmlEventSetFree(self._events)
            n.nvmlShutdown()
        except self._error as exc:
            log.debug("NVML shutdown: %s", exc)
