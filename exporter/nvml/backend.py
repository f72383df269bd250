"""The NVML backend: DCGM fields read through nvidia-ml-py (``pynvml``), in DCGM's units.

Cost model (measured on an H200, see ``exporter/data/h200.json``): most getters cost 1-10 us, a
naive pass of 14 getters 46 ms, a well-chosen pass 0.18 ms. So this backend:

- reads static facts once (name, UUID, PCI bus id, minor, driver version, max clocks, temperature
  thresholds, label strings); the MIG layout is re-read every pass (one ``nvmlDeviceGetMigMode``,
  plus the MIG device enumeration on a GPU in MIG mode: a few us), so a reconfigured GPU needs no
  restart;
- probes once per GPU which fields answer (``supported_fields``) and never asks again for the rest;
- per pass calls one getter per group of requested fields and ONE batched
  ``nvmlDeviceGetFieldValues`` for every requested field-value field;
- computes PROF_* from NVML GPM (:mod:`exporter.nvml_gpm`), a new sample only when the previous is
  about one collection interval old, as DCGM does;
- never calls ``nvmlDeviceGetPcieThroughput`` (it samples for 20 ms);
- serves the NVLink fields only while one of the GPU's links is active (:mod:`exporter.nvml.nvlink`).

Entities: a GPU without MIG returns one ``Entity(gpu)``. With MIG on, ``Entity(gpu)`` keeps what NVML
reports GPU-wide and each ``Entity(gpu, gi_id)`` (one per GPU instance, whatever its number of
compute instances) its FB and GPM ratios; the collector puts the GPU-wide fields on every instance.

Faults stay on their GPU: a GPU whose handle or first calls fail at start is listed with
``DeviceInfo.problem`` (down) and re-opened by UUID (else index) on later reads. Mid-run,
RESET_REQUIRED, GPU_IS_LOST, UNINITIALIZED, DRIVER_NOT_LOADED and LIB_RM_VERSION_MISMATCH, or
UNKNOWN from every call of a pass, raise ``GpuLostError`` for that GPU and drop its handle; the last
three also re-initialise NVML once (shutdown + init) on the next read, after which every GPU
re-acquires its handle: a driver reload needs no restart. Only "NVML cannot start or list GPUs" is
a ``BackendError``. Any other error leaves that field absent for the pass.

Field tables, pass plan, conversions: :mod:`exporter.nvml.fields`; state and probe: :mod:`exporter.nvml.probe`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from exporter.backend import BackendError, DeviceInfo, Entity, GpuLostError, MigInstance, Value, XidEvent
from exporter.nvml import processes as nvml_processes
from exporter.nvml.devices import DOWN_ERRORS, REINIT_ERRORS, device_info, error_name, init_message, mig_layout
from exporter.nvml.fields import (
    GETTERS,
    NOT_READ,
    NVLINK_FIELDS,
    Plan,
    as_str,
    convert_field_values,
    make_plan,
    memory_v1,
    memory_v2,
)
from exporter.nvml.gpm import GpmSampler
from exporter.nvml.nvlink import links_up
from exporter.nvml.probe import GpuState, PassStats, probe_gpu
from exporter.nvml.xid import XidEvents

__all__ = ["NvmlBackend"]

log = logging.getLogger("exporter.nvml")


class NvmlBackend:
    """GpuBackend over NVML. ``nvml`` is the pynvml module (tests pass a fake); ``clock`` (seconds)
    paces GPM samples; ``wall_clock`` (unix seconds) stands in for a zero NVML field timestamp."""

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
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
        self._gen = 0
        self._need_reinit = False
        self._reinit_lock = threading.Lock()
        self._gpm = GpmSampler(nvml, clock)
        self._wall_clock = wall_clock
        try:
            self._driver = as_str(nvml.nvmlSystemGetDriverVersion())
            self._nvml_version = as_str(nvml.nvmlSystemGetNVMLVersion())
            count = int(nvml.nvmlDeviceGetCount())
        except self._error as exc:
            nvml.nvmlShutdown()
            raise BackendError(f"NVML started but listing the GPUs failed: {exc}") from exc
        self._gpus = [self._open(i) for i in range(count)]
        self._xid = XidEvents(nvml, self._stop)
        for g in self._gpus:
            self._watch_xid(g)

    # --- start-up and recovery -----------------------------------------------------------------

    def _why(self, exc: BaseException) -> str:
        name = error_name(self._nvml, exc)
        return "GPU_IS_LOST (fallen off the bus?)" if name == "GPU_IS_LOST" else name

    def _open(self, index: int) -> GpuState:
        """A GPU's handle and facts; a GPU NVML cannot open is kept, down, with the reason."""
        n = self._nvml
        try:
            h = n.nvmlDeviceGetHandleByIndex(index)
        except self._error as exc:
            reason = self._why(exc)
            log.warning("GPU %d cannot be opened, reporting it down: %s", index, reason,
                        extra={"gpu": index, "reason": reason})
            return GpuState(None, DeviceInfo(index, "", "", "", -1, problem=reason), {})
        try:
            info, handles = self._info(index, h)
        except self._error as exc:
            reason = self._why(exc)
            uuid = self._uuid_or_empty(h)
            log.warning("GPU %d (%s) fails at start, reporting it down: %s", index, uuid or "no UUID", reason,
                        extra={"gpu": index, "uuid": uuid, "reason": reason})
            return GpuState(None, DeviceInfo(index, uuid, "", "", -1, problem=reason), {})
        return GpuState(h, info, handles, gen=self._gen)

    def _uuid_or_empty(self, h: Any) -> str:
        try:
            return as_str(self._nvml.nvmlDeviceGetUUID(h))
        except self._error:
            return ""

    def _info(self, index: int, h: Any) -> tuple[DeviceInfo, dict[int, Any]]:
        return device_info(self._nvml, index, h)

    def _mig_layout(self, h: Any, previous: tuple[MigInstance, ...]) -> tuple[tuple[MigInstance, ...], dict[int, Any]]:
        return mig_layout(self._nvml, h, previous)

    def _watch_xid(self, g: GpuState) -> None:
        if g.handle is not None and not g.xid_watched:
            g.xid_watched = self._xid.watch(g.info.index, g.handle)

    def _reinit(self, gpu: int) -> None:
        """NVML again after the driver went away (reload, upgrade): shutdown + init, once for all
        GPUs; every handle is re-acquired on its GPU's next read."""
        n = self._nvml
        with self._reinit_lock:
            if not self._need_reinit:
                return
            try:
                n.nvmlShutdown()
            except self._error as exc:
                log.debug("nvmlShutdown before re-initialising: %s", exc)
            try:
                n.nvmlInit()
            except self._error as exc:
                raise GpuLostError(gpu, f"{self._why(exc)} (NVML re-initialisation failed)") from exc
            self._gen += 1
            self._need_reinit = False
            self._xid.renew()
            for g in self._gpus:
                g.xid_watched = False
            log.warning("NVML re-initialised after a driver error; GPUs are re-acquired by UUID")

    def _recover(self, gpu: int, g: GpuState) -> None:
        """Re-open a GPU that is not open (or whose handle predates a re-initialisation)."""
        if self._need_reinit:
            self._reinit(gpu)
        if g.handle is not None and g.gen == self._gen:
            return
        n = self._nvml
        try:
            h = n.nvmlDeviceGetHandleByUUID(g.info.uuid) if g.info.uuid else n.nvmlDeviceGetHandleByIndex(gpu)
            info, handles = self._info(gpu, h)
        except self._error as exc:
            self._note(exc)
            raise GpuLostError(gpu, self._why(exc)) from exc
        if g.info.problem:  # never probed: probe now
            g.supported = None
            log.warning("GPU %d (%s) answers now", gpu, info.uuid, extra={"gpu": gpu, "uuid": info.uuid})
        g.handle, g.info, g.mig_handles, g.gen = h, info, handles, self._gen
        g.rate_prev.clear()
        self._gpm.forget(gpu)
        self._watch_xid(g)

    def _note(self, exc: BaseException) -> None:
        if error_name(self._nvml, exc) in REINIT_ERRORS:
            self._need_reinit = True

    # --- probing -------------------------------------------------------------------------------

    def _gpu(self, gpu: int) -> GpuState:
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu}: NVML lists {len(self._gpus)}")
        return self._gpus[gpu]

    def _probe(self, gpu: int) -> frozenset[str]:
        g = self._gpu(gpu)
        if g.supported is not None:
            return g.supported
        if g.handle is None:
            raise GpuLostError(gpu, g.info.problem or "not open")
        try:
            return self._probe_open(gpu, g)
        except GpuLostError:
            g.labels.clear()
            g.static.clear()
            raise

    def _probe_open(self, gpu: int, g: GpuState) -> frozenset[str]:
        return probe_gpu(self._nvml, gpu, g, self._gpm, (self._driver, self._nvml_version),
                         lambda exc, stats: self._failed(gpu, exc, stats))

    # --- GpuBackend ----------------------------------------------------------------------------

    def driver_version(self) -> str:
        return self._driver

    def devices(self) -> list[DeviceInfo]:
        return [g.info for g in self._gpus]

    def labels(self, gpu: int) -> dict[str, str]:
        """Static string fields (CSV ``label`` rows) for one GPU, keyed by DCGM field name."""
        try:
            self._probe(gpu)
        except GpuLostError:
            return {}
        return dict(self._gpus[gpu].labels)

    def unavailable(self, gpu: int) -> dict[str, str]:
        """Fields asked about (``supported_fields``) that this GPU could report but NVML refuses,
        with why (``NO_PERMISSION`` for GPM)."""
        g = self._gpu(gpu)
        return {f: r for f, r in g.unavailable.items() if f in g.asked}

    def set_interval(self, interval_s: float) -> None:
        """The collection interval: GPM samples are taken about one interval apart."""
        self._gpm.min_age_s = 0.9 * interval_s  # 10% slack for the tick's jitter

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        """What this GPU answers; a GPU down at start supports nothing yet (probed when it answers)."""
        fields = list(fields)
        self._gpu(gpu).asked.update(fields)
        try:
            supported = self._probe(gpu)
        except GpuLostError as exc:
            g = self._gpus[gpu]
            if not g.info.problem:
                g.info = replace(g.info, problem=exc.reason)
            g.handle = None
            return set()
        return {f for f in fields if f in supported}

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        started = time.perf_counter()
        g = self._gpu(gpu)
        self._recover(gpu, g)
        supported = self._probe(gpu)
        if g.info.problem:
            g.info = replace(g.info, problem="")
        n, h, stats = self._nvml, g.handle, PassStats()
        try:
            mig, g.mig_handles = self._mig_layout(h, g.info.mig)
        except self._error as exc:
            self._failed(gpu, exc, stats)
            mig = g.info.mig
        if mig != g.info.mig:
            log.info("GPU %d: MIG layout changed: %s", gpu, ", ".join(m.profile for m in mig) or "MIG off")
            g.info = replace(g.info, mig=mig)
            self._gpm.keep_instances(gpu, set(g.mig_handles))
        plan = g.plans.get(fields)
        if plan is None:
            if len(g.plans) > 32:
                g.plans.clear()
            plan = g.plans[fields] = make_plan(
                n, g.static, (fields & supported) - NOT_READ - g.labels.keys(), g.gpm_fields
            )
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
        if plan.nvlink and not links_up(n, h, g.nvlinks, lambda exc: self._failed(gpu, exc, stats)):
            for name in NVLINK_FIELDS:
                values.pop(name, None)
        out: dict[Entity, Mapping[str, Value]] = {
            Entity(gpu): {k: v for k, v in values.items() if k in plan.wanted}
        }
        for gi, mh in g.mig_handles.items():
            out[Entity(gpu, gi)] = self._read_instance(gpu, g, gi, mh, plan, stats)
        if stats.ok == 0 and stats.unknown > 0:
            g.handle = None
            raise GpuLostError(gpu, "UNKNOWN (every NVML call of the pass failed)")
        self.last_pass_us[gpu] = (time.perf_counter() - started) * 1e6
        return out

    def _failed(self, gpu: int, exc: BaseException, stats: PassStats) -> None:
        name = error_name(self._nvml, exc)
        if name in DOWN_ERRORS:
            self._note(exc)
            self._gpus[gpu].handle = None  # re-acquired (by UUID) on the next read
            raise GpuLostError(gpu, self._why(exc)) from exc
        if name == "UNKNOWN":
            stats.unknown += 1
        log.debug("GPU %d: NVML call failed: %s", gpu, exc)

    def _read_field_values(
        self, gpu: int, g: GpuState, plan: Plan, values: dict[str, Value], stats: PassStats
    ) -> None:
        try:
            results = self._nvml.nvmlDeviceGetFieldValues(g.handle, list(plan.request))
            stats.ok += 1
        except self._error as exc:
            self._failed(gpu, exc, stats)
            return
        lost = self._nvml.NVML_ERROR_GPU_IS_LOST
        now_us = int(self._wall_clock() * 1e6)
        values.update(convert_field_values(gpu, plan, results, lost, g.rate_prev, now_us))

    def _gpm_pass(
        self, gpu: int, g: GpuState, gi: int | None, names: tuple[str, ...], stats: PassStats
    ) -> dict[str, Value]:
        try:
            out = self._gpm.read(gpu, g.handle, gi, names)
            stats.ok += 1
            return out
        except self._error as exc:
            self._failed(gpu, exc, stats)
            return {}

    def _read_instance(
        self, gpu: int, g: GpuState, gi: int, mh: Any, plan: Plan, stats: PassStats
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

    def compute_processes(self, gpu: int) -> dict[Entity, nvml_processes.ProcessCount]:
        return nvml_processes.compute_processes(self._nvml, gpu, self._gpu(gpu).handle, self._gpu(gpu).mig_handles)

    def p2p_status(self, gpu: int) -> dict[int, int]:
        return nvml_processes.p2p_status(self._nvml, gpu, {g.info.index: g.handle for g in self._gpus})

    # --- XID -----------------------------------------------------------------------------------

    def wait_xid(self, timeout_s: float) -> list[XidEvent]:
        """Block up to timeout_s for critical XID events: (gpu, xid), or (gpu, xid, GPU instance id)
        when NVML names a MIG GPU instance. Keep timeout_s short (about 1 s): NVML's wait cannot be
        interrupted, so ``close`` takes effect after the current wait."""
        if self._closed:
            return []
        return self._xid.wait(timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        n = self._nvml
        self._gpm.close()
        try:
            self._xid.close()
            n.nvmlShutdown()
        except self._error as exc:
            log.debug("NVML shutdown: %s", exc)
