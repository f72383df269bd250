"""How each DCGM field is read from NVML, and how NVML's raw values become DCGM's units.

The tables (per-pass getter groups, static values, label strings, ``nvmlDeviceGetFieldValues``
fields, rates from differenced counters, GPM metrics), the :class:`Plan` of what one pass reads for
a requested field set, and the pure conversions of NVML answers (field values, counter rates, GPM
ratios, MIG memory info). The NVML calls, their errors and the per-GPU state live in
:mod:`exporter.nvml`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.backend import DeviceInfo, GpuLostError, Value
from exporter.nvml.brands import brand_name
from exporter.nvml.health import INFOROM_VALID, inforom_valid

MIB = 1048576
UINT_MAX = 0xFFFFFFFF
Getter = Callable[[Any, Any], dict[str, Value]]


def as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def memory_v2(nvml: Any, h: Any) -> dict[str, Value]:
    m = nvml.nvmlDeviceGetMemoryInfo(h, nvml.nvmlMemory_v2)
    usable = m.total - m.reserved
    return {
        "DCGM_FI_DEV_FB_TOTAL": m.total // MIB,
        "DCGM_FI_DEV_FB_FREE": m.free // MIB,
        "DCGM_FI_DEV_FB_USED": m.used // MIB,
        "DCGM_FI_DEV_FB_RESERVED": m.reserved // MIB,
        "DCGM_FI_DEV_FB_USED_PERCENT": m.used / usable if usable > 0 else 0.0,
    }


def memory(nvml: Any, h: Any) -> dict[str, Value]:
    """FB fields: the v2 call, else v1 where the driver predates R510 and lacks the
    ``nvmlDeviceGetMemoryInfo_v2`` symbol (FUNCTION_NOT_FOUND), as DCGM falls back."""
    try:
        return memory_v2(nvml, h)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    return memory_v1(nvml.nvmlDeviceGetMemoryInfo(h))


def _util(nvml: Any, h: Any) -> dict[str, Value]:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return {"DCGM_FI_DEV_GPU_UTIL": int(u.gpu), "DCGM_FI_DEV_MEM_COPY_UTIL": int(u.memory)}


def _one(name: str, call: Callable[[Any, Any], Any], convert: Callable[[Any], Value] = int) -> Getter:
    return lambda nvml, h: {name: convert(call(nvml, h))}


# Per-pass getter groups: one NVML call each.
GETTERS: dict[str, Getter] = {
    "util": _util,
    "memory": memory,
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
    INFOROM_VALID: inforom_valid,  # reads the flash: once, as DCGM reads it hourly
}

# Label strings (CSV ``label`` rows), read once; name, UUID and bus id come from DeviceInfo.
LABELS: dict[str, Callable[[Any, Any], str]] = {
    "DCGM_FI_DEV_SERIAL": lambda n, h: as_str(n.nvmlDeviceGetSerial(h)),
    "DCGM_FI_DEV_VBIOS_VERSION": lambda n, h: as_str(n.nvmlDeviceGetVbiosVersion(h)),
    "DCGM_FI_DEV_INFOROM_IMAGE_VER": lambda n, h: as_str(n.nvmlDeviceGetInforomImageVersion(h)),
    "DCGM_FI_DEV_OEM_INFOROM_VER": lambda n, h: as_str(n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_OEM)),
    "DCGM_FI_DEV_ECC_INFOROM_VER": lambda n, h: as_str(n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_ECC)),
    "DCGM_FI_DEV_POWER_INFOROM_VER": lambda n, h: as_str(n.nvmlDeviceGetInforomVersion(h, n.NVML_INFOROM_POWER)),
    "DCGM_FI_DEV_BRAND": lambda n, h: brand_name(int(n.nvmlDeviceGetBrand(h))),
}




@dataclass(frozen=True, slots=True)
class FieldValue:
    """A DCGM field read through ``nvmlDeviceGetFieldValues``: NVML_FI_* constant name and scale."""

    nvml_name: str
    scale: float = 1.0  # value * scale; 1.0 keeps an integer
    max_valid: float | None = None  # above this the value is a sentinel (memory temp > 200)
    attr: str | None = None  # read this union member whatever valueType the driver claims


FIELD_VALUES: dict[str, FieldValue] = {
    # r545 drivers claim another valueType for memory temperature; DCGM reads it as unsigned int
    "DCGM_FI_DEV_MEMORY_TEMP": FieldValue("NVML_FI_DEV_MEMORY_TEMP", max_valid=200, attr="uiVal"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": FieldValue("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": FieldValue("NVML_FI_DEV_PCIE_REPLAY_COUNTER"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": FieldValue("NVML_FI_DEV_REMAPPED_COR"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": FieldValue("NVML_FI_DEV_REMAPPED_UNC"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": FieldValue("NVML_FI_DEV_REMAPPED_PENDING"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": FieldValue("NVML_FI_DEV_REMAPPED_FAILURE"),
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": FieldValue("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
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
    first_zero: bool = False  # publish 0 on the first pass (no previous reading), as DCGM does
    attr: str | None = None  # read this union member whatever valueType says (DCGM: ullVal)


RATE_FIELDS: dict[str, RateField] = {
    # DCGM (DcgmCacheManager.cpp): NVLink data TX+RX KiB counters (ullVal) over all links,
    # (KiB delta / seconds) / 1000; 0 without a previous reading; a zero timestamp means "now"
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": RateField(
        (
            ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", UINT_MAX),
            ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", UINT_MAX),
        ),
        1,
        1000,
        first_zero=True,
        attr="ullVal",
    ),
    # PROF NVLink rates where GPM does not give them (before Hopper, or profiling refused): the same
    # data-only KiB counters over all links, in bytes/s (make_plan prefers GPM when the GPU has it)
    "DCGM_FI_PROF_NVLINK_TX_BYTES": RateField(
        (("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", UINT_MAX),), 1024, 1, attr="ullVal"
    ),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": RateField(
        (("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", UINT_MAX),), 1024, 1, attr="ullVal"
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
# every DCGM_FI_DEV_FB_* field GROUP_FIELDS["memory"] reads: per instance on MIG (backend.per_instance)
_MIG_FB = frozenset(GROUP_FIELDS["memory"])
# served only while a link is active (exporter.nvml.nvlink); absent on a GPU without NVLink
NVLINK_FIELDS = frozenset(
    {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"}
)
_MIG_GPM = frozenset(f for f, (_, scale) in GPM_FIELDS.items() if scale == 0.01)
_FV_ATTR = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by NVML_VALUE_TYPE_*
NOT_READ = frozenset({"DCGM_FI_DEV_XID_ERRORS"})  # the XID watcher owns it (wait_xid)


@dataclass(frozen=True, slots=True)
class Plan:
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
    nvlink: bool = False  # reads an NVLink field: served only while a link is active


def make_plan(
    n: Any, static: Collection[str], wanted: frozenset[str], gpm_ok: Collection[str] = GPM_FIELDS
) -> Plan:
    """The plan for ``wanted``; ``n`` is the pynvml module, ``static`` the fields read at probe time,
    ``gpm_ok`` the PROF fields this GPU's GPM gives (a field that is also a rate field is read as a
    rate only where GPM does not give it)."""
    gpm = tuple(sorted(f for f in wanted if f in GPM_FIELDS and f in gpm_ok))
    fv_names = tuple(sorted(f for f in wanted if f in FIELD_VALUES))
    rate_names = tuple(sorted(f for f in wanted if f in RATE_FIELDS and f not in gpm))
    request: list[int | tuple[int, int]] = [getattr(n, FIELD_VALUES[f].nvml_name) for f in fv_names]
    for f in rate_names:
        request += [(getattr(n, c), scope) if scope else getattr(n, c) for c, scope in RATE_FIELDS[f].counters]
    return Plan(
        wanted=wanted,
        groups=tuple(sorted({_FIELD_GROUP[f] for f in wanted if f in _FIELD_GROUP})),
        static=tuple(f for f in wanted if f in static),
        fv_names=fv_names,
        rate_names=rate_names,
        request=tuple(request),
        gpm=gpm,
        mig_fb=bool(wanted & _MIG_FB),
        mig_gpm=tuple(f for f in gpm if f in _MIG_GPM),
        nvlink=bool(wanted & NVLINK_FIELDS),
    )


def device_labels(driver: str, nvml_version: str, info: DeviceInfo) -> dict[str, str]:
    """The label fields known without asking the GPU again: versions and the DeviceInfo strings."""
    return {
        "DCGM_FI_DRIVER_VERSION": driver,
        "DCGM_FI_NVML_VERSION": nvml_version,
        "DCGM_FI_DEV_NAME": info.name,
        "DCGM_FI_DEV_UUID": info.uuid,
        "DCGM_FI_DEV_PCI_BUSID": info.pci_bus_id,
    }


def probe_plan(n: Any, static: Collection[str]) -> Plan:
    """A plan reading every field-value and rate field whose NVML_FI_* constants this pynvml knows."""
    simple = [f for f, fv in FIELD_VALUES.items() if hasattr(n, fv.nvml_name)]
    rates = [f for f, r in RATE_FIELDS.items() if all(hasattr(n, c) for c, _ in r.counters)]
    return make_plan(n, static, frozenset(simple + rates), gpm_ok=())


def answered(plan: Plan, results: Sequence[Any]) -> set[str]:
    """The fields of ``plan`` whose values (every counter, for a rate) came back without error."""
    ok = [r.nvmlReturn == 0 for r in results]
    sup = {f for f, good in zip(plan.fv_names, ok, strict=False) if good}
    i = len(plan.fv_names)
    for f in plan.rate_names:
        width = len(RATE_FIELDS[f].counters)
        if all(ok[i : i + width]):
            sup.add(f)
        i += width
    return sup


def convert_field_values(
    gpu: int,
    plan: Plan,
    results: Sequence[Any],
    lost: int,
    rate_prev: dict[str, tuple[float, int]],
    now_us: int = 0,
) -> dict[str, Value]:
    """DCGM values from the answer to ``plan.request``: scaled, sentinels dropped, rates differenced
    against ``rate_prev`` (updated in place; a zero NVML timestamp counts as ``now_us``, as DCGM
    does). A field answering ``lost`` raises GpuLostError."""
    values: dict[str, Value] = {}
    for name, r in zip(plan.fv_names, results, strict=False):
        if r.nvmlReturn == lost:
            raise GpuLostError(gpu, "GPU_IS_LOST (fallen off the bus?)")
        if r.nvmlReturn != 0:
            continue
        fv = FIELD_VALUES[name]
        raw = getattr(r.value, fv.attr or _FV_ATTR[r.valueType])
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
        total = float(sum(getattr(p.value, rate.attr or _FV_ATTR[p.valueType]) for p in parts))
        stamp = max(int(p.timestamp) for p in parts) or now_us
        prev = rate_prev.get(name)
        rate_prev[name] = (total, stamp)
        if prev is None and rate.first_zero:
            values[name] = 0
        elif prev is not None and stamp > prev[1] and total >= prev[0]:
            per_s = (total - prev[0]) * rate.unit_bytes / ((stamp - prev[1]) / 1e6)
            values[name] = int(per_s / rate.per_s_divisor)
    return values


def gpm_value(name: str, value: float) -> Value:
    """A GPM metric in DCGM's unit: percent -> ratio, MiB/s -> bytes/s (an integer)."""
    scale = GPM_FIELDS[name][1]
    return value * scale if scale < 1 else int(value * scale)


def memory_v1(m: Any) -> dict[str, Value]:
    """FB fields from ``nvmlDeviceGetMemoryInfo`` v1 (no reserved memory in v1: 0)."""
    return {
        "DCGM_FI_DEV_FB_TOTAL": m.total // MIB,
        "DCGM_FI_DEV_FB_FREE": m.free // MIB,
        "DCGM_FI_DEV_FB_USED": m.used // MIB,
        "DCGM_FI_DEV_FB_RESERVED": 0,
        "DCGM_FI_DEV_FB_USED_PERCENT": m.used / m.total if m.total > 0 else 0.0,
    }
