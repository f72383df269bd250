"""Background collection: read every GPU once per interval, render once, swap the cached bytes.

Scrapes never touch the backend: they read ``Collector.exposition`` (an immutable snapshot replaced
by one attribute assignment). Each GPU is read on its own short-lived daemon thread, all joined
against one deadline (``read_timeout_s``): a GPU whose read is past it is down with reason
"timeout", and its still-running read is not started again until it returns, so one hung NVML call
never stalls the other GPUs. A GPU that raises, or that the backend lists with a ``problem`` at
start, is down (``gpu_exporter_device_up 0``), its series disappear, the others go on, and it is
retried every cycle (probed for its fields once it answers). Pod attribution is read here, off the
scrape path.

MIG: the layout is re-read from the backend every cycle; how a GPU's answer becomes rows (GPU-wide
fields on every GPU instance, pods, XID labels) is :mod:`exporter.collector_rows`.

CSV names: a row listing an alias or a dcgm-exporter 1.x name is read as its field
(``CounterSpec.read_as``) and rendered under the listed name. Extras, each optional: the
``DCGM_EXP_*`` rows (:mod:`exporter.exp_counters`), the HPC job mapping (:mod:`exporter.hpc`),
``gpu_exporter_compute_processes`` when the backend counts processes (:mod:`exporter.processes`),
and ``--replace-blanks-in-model-name`` (``NVIDIA H100`` -> ``NVIDIA-H100`` in ``modelName``).

Health: ``health()`` is liveness (False only when no cycle completed for 3 intervals); ``readiness()``
is False also when no GPU is up. Both name each down GPU and why.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata

from exporter.backend import BackendError, DeviceInfo, Entity, GpuBackend, GpuLostError, MigInstance, Value
from exporter.collector_rows import DRIVER_VERSION, XID_ERRORS, PodMap, RowBuilder, label_values, xid_labels
from exporter.exp_counters import ExpCounters
from exporter.exposition import EMPTY, STALE_INTERVALS, DownGpu, Exposition, liveness_of, readiness_of
from exporter.gpu_reader import GpuReader
from exporter.hpc import HpcJobMap
from exporter.processes import SPEC, ProcessCount
from exporter.render import HOSTNAME_LABEL, Row, SeriesSpec, entity_labels, render_series
from exporter.selfmetrics import BuildInfo, DeviceStat, SelfState, Unavailable, render_self_metrics
from exporter.xid import XidState

__all__ = [
    "DRIVER_VERSION", "EMPTY", "STALE_INTERVALS", "XID_ERRORS", "Collector", "DownGpu", "Exposition",
    "label_values", "liveness_of", "readiness_of", "xid_labels",
]  # fmt: skip

log = logging.getLogger(__name__)

def package_version() -> str:
    try:
        return metadata.version("gpu-telemetry")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


@dataclass(slots=True)
class _Result:
    data: Mapping[Entity, Mapping[str, Value]] | None = None
    error: BaseException | None = None
    fields: frozenset[str] | None = None  # newly probed fields (a GPU that was down at start)
    duration_s: float = 0.0
    processes: Mapping[Entity, ProcessCount] | None = None


@dataclass(slots=True)
class _Gpu:
    """Per-GPU state; the label prefixes are built once (again when the device info changes)."""

    index: int
    device: DeviceInfo
    fields: frozenset[str]
    # (entity, static label prefix, pod keys: the GPU UUID or the GPU instance's MIG UUIDs)
    entities: tuple[tuple[Entity, str, tuple[str, ...]], ...]
    probed: bool = True
    up: bool = True
    errors: int = 0
    duration_s: float | None = None
    problem: str = ""
    reader: GpuReader | None = None
    result: _Result = field(default_factory=_Result)
    unavailable: dict[str, str] = field(default_factory=dict)
    relabel: bool = False  # rebuild the label prefixes from the backend's device info


class Collector:
    def __init__(
        self,
        backend: GpuBackend,
        counters: Sequence[SeriesSpec],
        hostname: str | None,
        interval_s: float,
        pods: Callable[[], PodMap] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        xids: XidState | None = None,
        integer_fields: frozenset[str] | None = None,
        kubelet_errors: Callable[[], int] | None = None,
        backend_name: str = "unknown",
        supported: Mapping[int, set[str]] | None = None,
        read_timeout_s: float | None = None,
        exp: ExpCounters | None = None,
        hpc: HpcJobMap | None = None,
        replace_blanks: bool = False,
        hostname_label: str = HOSTNAME_LABEL,
    ) -> None:
        """``supported``: per-GPU supported fields when the caller already probed them.
        ``read_timeout_s``: how long one cycle waits for a GPU's read (default: the interval, at
        least 1 s). ``hostname_label``: the node label's name on every series (``--hostname-label``)."""
        self._backend = backend
        self._interval_s = interval_s
        self._read_timeout_s = read_timeout_s if read_timeout_s is not None else max(interval_s, 1.0)
        self._pods = pods
        self._clock = clock
        self._wall_clock = wall_clock
        self._hostname, self._hostname_label = hostname, hostname_label
        self.xids = xids if xids is not None else XidState()
        read_as = {s.field: getattr(s, "read_as", s.field) for s in counters}
        self._builder = RowBuilder(self.xids, {n: src for n, src in read_as.items() if n != src}, exp)
        if integer_fields is not None:
            integer_fields |= {n for n, src in self._builder.renames.items() if src in integer_fields} | {SPEC.field}
        self._integer_fields = integer_fields
        self._hpc, self._replace_blanks = hpc, replace_blanks
        self._procs_fn = getattr(backend, "compute_processes", None)
        self._kubelet_errors_fn = kubelet_errors
        self._kubelet_errors = 0
        self._build = BuildInfo(package_version(), platform.python_version(), backend_name)
        self._specs = [s for s in counters if s.kind != "label"]
        self._label_names = [s.field for s in counters if s.kind == "label"]
        self._driver = backend.driver_version()
        exp_needs = exp.needs() if exp else frozenset()  # the DCGM_EXP_* rows' inputs
        self._wanted = frozenset(read_as[s.field] for s in self._specs) | exp_needs
        if callable(self._procs_fn):
            self._specs.append(SPEC)
        set_interval = getattr(backend, "set_interval", None)
        if callable(set_interval):
            set_interval(interval_s)
        self._gpus: list[_Gpu] = []
        missing: set[str] = set()
        for d in backend.devices():
            probed = supported.get(d.index) if supported is not None and not d.problem else None
            if (probed is None or not exp_needs <= probed) and not d.problem:  # the caller probed the CSV only
                try:
                    probed = backend.supported_fields(d.index, sorted(self._wanted))
                except BackendError:
                    raise
                except Exception as exc:  # this GPU is down at start; it is probed again when it answers
                    why = exc.reason if isinstance(exc, GpuLostError) else f"{type(exc).__name__}: {exc}"
                    d = replace(d, problem=why)
            if d.problem:
                g = _Gpu(d.index, d, frozenset(), (), probed=False, up=False, problem=d.problem)
                g.entities = self._entities(d, {})
                log.warning("GPU %d (%s) is down at start: %s", d.index, d.uuid or "no UUID", d.problem,
                            extra={"gpu": d.index, "uuid": d.uuid, "reason": d.problem})
            else:
                assert probed is not None
                labels = label_values(backend, d, self._driver, self._label_names)
                missing.update(set(self._label_names) - set(labels))
                g = _Gpu(d.index, d, frozenset(probed) & self._wanted, self._entities(d, labels))
                g.unavailable = self._unavailable(d.index)
            self._gpus.append(g)
        for name in sorted(missing):
            log.warning("label field %s has no value on some GPUs; the label is omitted there", name)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at = clock()
        self._jobs: dict[str, list[str]] | None = None
        self.exposition = EMPTY

    def _entities(
        self, d: DeviceInfo, lf: Mapping[str, str]
    ) -> tuple[tuple[Entity, str, tuple[str, ...]], ...]:
        units: list[tuple[Entity, str, tuple[str, ...]]] = []
        if self._replace_blanks:  # dcgm-exporter: strings.Fields, joined by "-"
            d = replace(d, name="-".join(d.name.split()))
        by_id: list[MigInstance] = sorted(d.mig, key=lambda m: m.gpu_instance_id)
        migs: list[MigInstance | None] = list(by_id) if by_id else [None]
        for mig in migs:
            entity = Entity(d.index, None if mig is None else mig.gpu_instance_id)
            keys = (d.uuid,) if mig is None else mig.all_uuids()
            units.append((entity, entity_labels(d, mig, self._hostname, lf, self._hostname_label), keys))
        return tuple(units)

    def _unavailable(self, gpu: int) -> dict[str, str]:
        """The backend's refused fields (among those it was asked about: rows the caller may have
        dropped with "Skipping line" before building this collector are still listed)."""
        fn = getattr(self._backend, "unavailable", None)
        return dict(fn(gpu)) if callable(fn) else {}

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def health(self) -> tuple[bool, str]:
        """Liveness: (False, why) only when the collection loop is stale; down GPUs are named."""
        return liveness_of(self.exposition, self._clock(), self._interval_s, self._started_at)

    def readiness(self) -> tuple[bool, str]:
        """Readiness: also False when no selected GPU is up; down GPUs are named."""
        return readiness_of(self.exposition, self._clock(), self._interval_s)

    # -- one cycle -------------------------------------------------------------------------------

    def collect_once(self) -> Exposition:
        """Read every GPU (in parallel, bounded by the read deadline), render both formats, swap
        the cached snapshot; returns it."""
        with self._lock:
            pods = self._fetch_pods()
            self._jobs = self._hpc.read() if self._hpc is not None else None
            self._read_all()
            self._refresh_devices()
            rows: list[Row] = []
            for g in self._gpus:
                rows.extend(self._rows(g, pods))
            exp = self._render(rows)
            self.exposition = exp
            return exp

    def _fetch_pods(self) -> PodMap:
        if self._pods is None:
            return {}
        try:
            return self._pods()
        except Exception as exc:
            self._kubelet_errors += 1
            log.warning("pod attribution failed, serving without pod labels: %s", exc)
            return {}

    def _work(self, g: _Gpu) -> None:
        """One GPU's read, on its own thread; a GPU seen for the first time is probed first."""
        box = g.result
        t0 = time.perf_counter()
        gpu = g.device.index
        try:
            fields = g.fields
            data = self._backend.read(gpu, fields)
            if not g.probed:
                box.fields = frozenset(self._backend.supported_fields(gpu, sorted(self._wanted)))
                data = self._backend.read(gpu, box.fields & self._wanted)
            box.data = data
            if callable(self._procs_fn):
                box.processes = self._procs_fn(gpu)
        except Exception as exc:
            box.error = exc
        box.duration_s = time.perf_counter() - t0

    def _read_all(self) -> None:
        deadline = time.perf_counter() + self._read_timeout_s
        for g in self._gpus:
            if g.reader is None:
                g.reader = GpuReader(f"read-gpu{g.index}", lambda g=g: self._work(g))  # type: ignore[misc]
            if g.reader.busy():
                continue  # a hung read: not started again until it returns
            g.result = _Result()
            g.reader.submit()
        for g in self._gpus:
            assert g.reader is not None
            if not g.reader.wait(deadline - time.perf_counter()):
                self._mark_down(g, f"timeout (read still running after {self._read_timeout_s:g}s)")
                continue
            res = g.result
            g.duration_s = res.duration_s
            if res.error is not None:
                exc = res.error
                self._mark_down(g, exc.reason if isinstance(exc, GpuLostError) else f"{type(exc).__name__}: {exc}")
                continue
            if res.fields is not None:
                g.fields, g.probed = res.fields & self._wanted, True
                g.unavailable = self._unavailable(g.index)
                g.relabel = True
            if not g.up:
                log.warning("GPU %d (%s) answers again", g.device.index, g.device.uuid,
                            extra={"gpu": g.device.index, "uuid": g.device.uuid})
            g.up, g.problem = True, ""

    def _mark_down(self, g: _Gpu, reason: str) -> None:
        g.errors += 1
        if g.up or reason != g.problem:
            log.warning("GPU %d (%s) is down, dropping its series: %s", g.device.index,
                        g.device.uuid or "no UUID", reason,
                        extra={"gpu": g.device.index, "uuid": g.device.uuid, "reason": reason})
        g.up, g.problem = False, reason

    def _refresh_devices(self) -> None:
        """Rebuild label prefixes of GPUs whose device info changed (MIG layout, a GPU that came
        back after failing at start)."""
        if not any(g.up for g in self._gpus):
            return
        by_index = {d.index: d for d in self._backend.devices()}
        for g in self._gpus:
            d = by_index.get(g.index)
            if d is None or not g.up or d.problem or (d == g.device and not g.relabel):
                continue
            if d.mig != g.device.mig:
                log.info("GPU %d: MIG layout now %s", g.index, ", ".join(m.profile for m in d.mig) or "off")
            labels = label_values(self._backend, d, self._driver, self._label_names)
            g.device, g.entities, g.relabel = d, self._entities(d, labels), False

    def _rows(self, g: _Gpu, pods: PodMap) -> list[Row]:
        if not g.up:
            return []
        return self._builder.rows(g.device, g.entities, g.result.data or {}, g.result.processes, pods,
                                  XID_ERRORS in g.fields, self._jobs)

    def _self_state(self) -> SelfState:
        xid_counts = {}
        known = {g.device.index: g.device for g in self._gpus}
        for (gpu, code), n in self.xids.counts().items():
            d = known.get(gpu)
            xid_counts[(gpu, d.uuid if d else "", d.pci_bus_id if d else "", code)] = n
        kubelet: int | None = None
        if self._pods is not None:
            kubelet = self._kubelet_errors + (self._kubelet_errors_fn() if self._kubelet_errors_fn else 0)
        return SelfState(
            devices=[
                DeviceStat(g.device.index, g.device.uuid, g.up, g.duration_s, g.errors, g.device.pci_bus_id)
                for g in self._gpus
            ],
            build=self._build,
            last_collection_ts=self._wall_clock(),
            kubelet_errors=kubelet,
            xid_counts=xid_counts,
            hostname=self._hostname, hostname_label=self._hostname_label,
            unavailable=[
                Unavailable(g.device.index, g.device.uuid, g.device.pci_bus_id, f, r)
                for g in self._gpus
                for f, r in sorted(g.unavailable.items())
            ],
        )

    def _render(self, rows: Sequence[Row]) -> Exposition:
        state = self._self_state()
        text = render_series(self._specs, rows, self._integer_fields) + render_self_metrics(state)
        om = (
            render_series(self._specs, rows, self._integer_fields, openmetrics=True)
            + render_self_metrics(state, openmetrics=True)
            + "# EOF\n"
        )
        down = tuple(DownGpu(g.device.index, g.device.uuid, g.problem) for g in self._gpus if not g.up)
        return Exposition(
            text=text.encode(),
            openmetrics=om.encode(),
            collected_at=self._clock(),
            devices_up=len(self._gpus) - len(down),
            devices_total=len(self._gpus),
            problem="; ".join(d.describe() for d in down),
            down=down,
        )

    # -- background thread -----------------------------------------------------------------------

    def wake(self, *_: object) -> None:
        """Run a cycle now (e.g. after an XID) instead of at the next tick."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="collector", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None
        with self._lock:
            for g in self._gpus:
                if g.reader is not None:
                    g.reader.close()
                    g.reader = None

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.collect_once()
            except Exception:  # never let one bad cycle end collection; /health will show staleness
                log.exception("collection cycle failed")
            now = time.monotonic()
            if next_t <= now:  # the tick this cycle served has passed: schedule the next one
                next_t += self._interval_s
                if next_t <= now:  # overran a whole interval: restart the schedule from now
                    next_t = now + self._interval_s
            self._wake.wait(max(0.0, next_t - now))  # an early wake keeps the tick schedule
            self._wake.clear()

