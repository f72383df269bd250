"""PROF_* fields from NVML GPM (nvml.h ``nvmlGpm*``): support and permission probe, paced samples.

Per entity (a GPU, or one MIG GPU instance of it) two sample buffers are allocated once and swapped;
``nvmlGpmMetricsGet`` runs between the previous and the new sample for the requested metrics only.
A new sample is taken only when the previous one is at least ``min_age_s`` old (about one collection
interval: DCGM's ``DcgmGpmManagerEntity::MaybeFetchNewSample`` fetches only when the latest sample is
one update interval old, and pairs it with a baseline at least that much older), so a ratio never
comes from two samples milliseconds apart (start-up right after the probe, an XID wake-up); in
between, the last ratios are served again.

Refused sampling (NVML_ERROR_NO_PERMISSION: the driver restricts profiling to admin users) is said
once at WARNING, with the fix, and each PROF field is reported unavailable with that reason.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.backend import Value
from exporter.nvml.devices import DOWN_ERRORS, error_name
from exporter.nvml.fields import GPM_FIELDS, NVLINK_FIELDS, gpm_value

log = logging.getLogger("exporter.nvml_gpm")

REFUSED_HINT = (
    "GPM profiling refused (NO_PERMISSION): the DCGM_FI_PROF_* fields are not published. Give the "
    "exporter CAP_SYS_ADMIN (securityContext.capabilities.add: [SYS_ADMIN]) or load the NVIDIA driver "
    "with NVreg_RestrictProfilingToAdminUsers=0"
)


@dataclass(slots=True)
class _State:
    prev: Any
    cur: Any
    request: Any
    have_prev: bool = False
    taken_at: float = -math.inf
    last: dict[str, Value] = field(default_factory=dict)


class GpmSampler:
    """GPM state for every GPU and MIG GPU instance of one NVML library instance."""

    def __init__(self, nvml: Any, clock: Callable[[], float], min_age_s: float = 1.0) -> None:
        self._nvml = nvml
        self._error: type[BaseException] = nvml.NVMLError
        self._clock = clock
        self.min_age_s = min_age_s
        self._states: dict[tuple[int, int | None], _State] = {}
        self._lock = threading.Lock()  # GPUs are read on parallel threads: guards _states' shape
        self._warned = False

    def probe(
        self, gpu: int, h: Any, instances: Sequence[int] = (), *, has_nvlink: bool = False
    ) -> tuple[set[str], dict[str, str]]:
        """(supported PROF fields, refused field -> reason). Takes the GPU's first sample, which
        also tells whether sampling is permitted. On a MIG GPU (``instances``: its GPU instance
        ids) whose parent sample fails, each GPU instance's first sample decides instead (DCGM
        samples MIG GPUs per GPU instance; nvml.h leaves the parent's errors unspecified). The
        NVLink metrics count only where the GPU has NVLink links (``has_nvlink``, from
        :func:`exporter.nvml.nvlink.present_links`: GPM answers 0 for them on a PCIe board).
        Errors other than NO_PERMISSION propagate."""
        n = self._nvml
        try:
            if not n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                return set(), {}
        except (self._error, AttributeError):
            return set(), {}
        candidates = {
            f
            for f, (metric, _) in GPM_FIELDS.items()
            if hasattr(n, metric) and (has_nvlink or f not in NVLINK_FIELDS)
        }
        try:
            self._first_samples(gpu, h, instances)
        except self._error as exc:
            if error_name(n, exc) != "NO_PERMISSION":
                raise
            if not self._warned:
                log.warning(REFUSED_HINT, extra={"gpu": gpu, "reason": "NO_PERMISSION"})
                self._warned = True
            return set(), dict.fromkeys(candidates, "NO_PERMISSION")
        return candidates, {}

    def _first_samples(self, gpu: int, h: Any, instances: Sequence[int]) -> None:
        """The parent's first sample, else (MIG) every GPU instance's; raises when none answers."""
        try:
            self._first(gpu, h, None)
            return
        except self._error as exc:
            if not instances or error_name(self._nvml, exc) in ("NO_PERMISSION", *DOWN_ERRORS):
                raise
            parent_error = exc
        answered = False
        for gi in instances:
            try:
                self._first(gpu, h, gi)
                answered = True
            except self._error as exc:
                if error_name(self._nvml, exc) in ("NO_PERMISSION", *DOWN_ERRORS):
                    raise
        if not answered:
            raise parent_error

    def _first(self, gpu: int, h: Any, gi: int | None) -> None:
        st = self._sample(gpu, h, gi)
        st.prev, st.cur, st.have_prev, st.taken_at = st.cur, st.prev, True, self._clock()

    def _state(self, gpu: int, gi: int | None) -> _State:
        st = self._states.get((gpu, gi))
        if st is None:
            n = self._nvml
            request = n.c_nvmlGpmMetricsGet_t()
            request.version = n.NVML_GPM_METRICS_GET_VERSION
            st = _State(n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc(), request)
            with self._lock:
                self._states[(gpu, gi)] = st
        return st

    def _sample(self, gpu: int, h: Any, gi: int | None) -> _State:
        n = self._nvml
        st = self._state(gpu, gi)
        if gi is None:
            n.nvmlGpmSampleGet(h, st.cur)
        else:
            n.nvmlGpmMigSampleGet(h, gi, st.cur)
        return st

    def read(self, gpu: int, h: Any, gi: int | None, names: tuple[str, ...]) -> dict[str, Value]:
        """The requested ratios; the last ones again while the previous sample is too young."""
        st = self._states.get((gpu, gi))
        now = self._clock()
        if st is not None and st.have_prev and now - st.taken_at < self.min_age_s:
            return {k: v for k, v in st.last.items() if k in names}
        st = self._sample(gpu, h, gi)
        out: dict[str, Value] = {}
        if st.have_prev:
            out = self._metrics(st, names)
        st.prev, st.cur, st.have_prev, st.taken_at, st.last = st.cur, st.prev, True, now, out
        return out

    def _metrics(self, st: _State, names: tuple[str, ...]) -> dict[str, Value]:
        n = self._nvml
        req = st.request
        req.numMetrics = len(names)
        req.sample1, req.sample2 = st.prev, st.cur
        for i, name in enumerate(names):
            req.metrics[i].metricId = getattr(n, GPM_FIELDS[name][0])
        n.nvmlGpmMetricsGet(req)
        out: dict[str, Value] = {}
        for i, name in enumerate(names):
            m = req.metrics[i]
            if m.nvmlReturn != 0 or math.isnan(m.value):
                continue
            out[name] = gpm_value(name, m.value)
        return out

    def forget(self, gpu: int) -> None:
        """The GPU was re-opened: its next sample starts a new pair."""
        with self._lock:
            mine = [st for (g, _gi), st in self._states.items() if g == gpu]
        for st in mine:
            st.have_prev, st.last = False, {}

    def keep_instances(self, gpu: int, gis: set[int]) -> None:
        """Free the state of MIG GPU instances that no longer exist."""
        with self._lock:
            gone = [k for k in self._states if k[0] == gpu and k[1] is not None and k[1] not in gis]
            states = [self._states.pop(k) for k in gone]
        for st in states:
            self._free(st)

    def _free(self, st: _State) -> None:
        for sample in (st.prev, st.cur):
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._error as exc:
                log.debug("nvmlGpmSampleFree: %s", exc)

    def close(self) -> None:
        with self._lock:
            states = list(self._states.values())
            self._states.clear()
        for st in states:
            self._free(st)
