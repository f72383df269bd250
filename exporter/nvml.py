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

The field tables, the pass plan and the value conversions are in :mod:`exporter.nvml_fields`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.backend import BackendError, DeviceInfo, Entity, GpuLostError, MigInstance, Value
from exporter.nvml_fields import (
    FIELD_VALUES,
    GETTERS,
    GPM_FIELDS,
    GPM_NEEDS_NVLINK,
    GROUP_FIELDS,
    LABELS,
    MIB,
    NOT_READ,
    RATE_FIELDS,
    STATIC,
    UINT_MAX,
    FieldValue,
    Getter,
    Plan,
    RateField,
    answered,
    as_str,
    convert_field_values,
    device_labels,
    gpm_value,
    init_message,
    make_plan,
    memory_v1,
    memory_v2,
    probe_plan,
)

__all__ = [
    "FIELD_VALUES", "GETTERS", "GPM_FIELDS", "GROUP_FIELDS", "LABELS", "MIB", "RATE_FIELDS", "STATIC", "UINT_MAX",
    "FieldValue", "Getter", "NvmlBackend", "RateField",
]  # fmt: skip

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Gpm:
    """Two GPM sample buffers allocated once, swapped every pass, and a reusable metrics request."""

    prev: Any
    cur: Any
    request: Any
    have_prev: bool = False


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
    plans: dict[frozenset[str], Plan] = field(default_factory=dict)


@dataclass(slots=True)
class _PassStats:
    ok: int = 0
    unknown: int = 0


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
            raise BackendError(init_message(nvml, exc)) from exc
        self.last_pass_us: dict[int, float] = {}
        self._stop = threading.Event()
        self._closed = False
        try:
            self._driver = as_str(nvml.nvmlSystemGetDriverVersion())
            self._nvml_version = as_str(nvml.nvmlSystemGetNVMLVersion())
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
            uuid=as_str(n.nvmlDeviceGetUUID(h)),
            pci_bus_id=as_str(n.nvmlDeviceGetPciInfo(h).busId),
            name=as_str(n.nvmlDeviceGetName(h)),
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
            instances.append(MigInstance(gi, f"{slices}g.{mem_gb}gb", as_str(n.nvmlDeviceGetUUID(mh))))
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
        g.labels.update(device_labels(self._driver, self._nvml_version, g.info))
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
        plan = probe_plan(n, g.static)
        try:
            results = n.nvmlDeviceGetFieldValues(g.handle, list(plan.request))
            stats.ok += 1
        except self._error as exc:
            self._failed(gpu, exc, stats)
            return set()
        return answered(plan, results)

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
            if hasattr(n, metric) and (has_nvlink or f not in GPM_NEEDS_NVLINK)
        }

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
            plan = g.plans[fields] = make_plan(self._nvml, g.static, (fields & supported) - NOT_READ - g.labels.keys())
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
        self, gpu: int, g: _Gpu, plan: Plan, values: dict[str, Value], stats: _PassStats
    ) -> None:
        try:
            results = self._nvml.nvmlDeviceGetFieldValues(g.handle, list(plan.request))
            stats.ok += 1
        except self._error as exc:
            self._failed(gpu, exc, stats)
            return
        lost = self._nvml.NVML_ERROR_GPU_IS_LOST
        values.update(convert_field_values(gpu, plan, results, lost, g.rate_prev))

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
                out[name] = gpm_value(name, m.value)
        st.prev, st.cur, st.have_prev = st.cur, st.prev, True
        return out

    def _read_instance(
        self, gpu: int, g: _Gpu, gi: int, mh: Any, plan: Plan, stats: _PassStats
    ) -> dict[str, Value]:
        values: dict[str, Value] = {}
        if plan.mig_fb:
            try:
                values.update(memory_v2(self._nvml, mh))
                stats.ok += 1
            except self._error:
                try:
                    values.update(memory_v1(self._nvml.nvmlDeviceGetMemoryInfo(mh)))
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
