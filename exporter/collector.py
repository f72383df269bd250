"""Background collection: read every GPU once per interval, render once, swap the cached bytes.

Scrapes never touch the backend: they read ``Collector.exposition`` (an immutable snapshot replaced
by one attribute assignment). A GPU that raises is marked down (``gpu_exporter_device_up 0``), its
series disappear, the others go on, and it is retried every cycle. Pod attribution is fetched here,
off the scrape path.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from exporter.backend import DeviceInfo, Entity, GpuBackend, GpuLostError, MigInstance
from exporter.render import PodLabels, Row, SeriesSpec, entity_labels, render_series, with_pod
from exporter.selfmetrics import BuildInfo, DeviceStat, SelfState, render_self_metrics
from exporter.xid import XidState

log = logging.getLogger(__name__)

DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
STALE_INTERVALS = 3

# CSV ``label`` rows this exporter can fill: field -> value from (device, driver version)
LABEL_SOURCES: dict[str, Callable[[DeviceInfo, str], str]] = {
    DRIVER_VERSION: lambda d, driver: driver,
    "DCGM_FI_DEV_NAME": lambda d, driver: d.name,
    "DCGM_FI_DEV_UUID": lambda d, driver: d.uuid,
    "DCGM_FI_DEV_PCI_BUSID": lambda d, driver: d.pci_bus_id,
}


def label_values(backend: object, d: DeviceInfo, driver: str, names: Sequence[str]) -> dict[str, str]:
    """Values for CSV ``label`` rows: the backend's optional ``labels(gpu)`` (static strings such as
    serial and VBIOS), else what ``DeviceInfo`` and the driver version give."""
    own: Mapping[str, str] = {}
    labels_fn = getattr(backend, "labels", None)
    if callable(labels_fn):
        own = labels_fn(d.index)
    out: dict[str, str] = {}
    for name in names:
        if name in own:
            out[name] = str(own[name])
        elif name in LABEL_SOURCES:
            out[name] = LABEL_SOURCES[name](d, driver)
    return out


@dataclass(frozen=True, slots=True)
class Exposition:
    """What every scrape serves until the next cycle replaces it."""

    text: bytes
    openmetrics: bytes
    collected_at: float | None  # clock() when the cycle finished; None before the first
    devices_up: int
    devices_total: int
    problem: str  # "" when every GPU answered


EMPTY = Exposition(b"", b"# EOF\n", None, 0, 0, "no collection yet")


def health_of(exp: Exposition, now: float, interval_s: float) -> tuple[bool, str]:
    """(healthy, reason): the backend answered and the last collection is younger than 3 intervals."""
    if exp.collected_at is None:
        return False, "no collection has finished yet"
    age = now - exp.collected_at
    if age >= STALE_INTERVALS * interval_s:
        return False, (
            f"last collection finished {age:.1f}s ago, "
            f"more than {STALE_INTERVALS} intervals of {interval_s:g}s"
        )
    if exp.devices_total > 0 and exp.devices_up == 0:
        return False, f"no GPU answered in the last collection: {exp.problem}"
    return True, "OK"


def package_version() -> str:
    try:
        return metadata.version("gpu-telemetry")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


@dataclass(slots=True)
class _Gpu:
    """Per-GPU state; the label prefixes are built once at start."""

    device: DeviceInfo
    fields: frozenset[str]
    entities: tuple[tuple[Entity, str, str], ...]  # (entity, static label prefix, pod key: GPU or MIG UUID)
    up: bool = True
    errors: int = 0
    duration_s: float | None = None
    problem: str = ""


class Collector:
    def __init__(
        self,
        backend: GpuBackend,
        counters: Sequence[SeriesSpec],
        hostname: str | None,
        interval_s: float,
        pods: Callable[[], Mapping[str, PodLabels]] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        xids: XidState | None = None,
        integer_fields: frozenset[str] | None = None,
        kubelet_errors: Callable[[], int] | None = None,
        backend_name: str = "unknown",
        supported: Mapping[int, set[str]] | None = None,
    ) -> None:
        """``supported``: per-GPU supported fields when the caller already probed them."""
        self._backend = backend
        self._interval_s = interval_s
        self._pods = pods
        self._clock = clock
        self._wall_clock = wall_clock
        self.xids = xids if xids is not None else XidState()
        self._integer_fields = integer_fields
        self._kubelet_errors_fn = kubelet_errors
        self._kubelet_errors = 0
        self._build = BuildInfo(package_version(), platform.python_version(), backend_name)
        self._specs = [s for s in counters if s.kind != "label"]
        label_specs = [s for s in counters if s.kind == "label"]
        driver = backend.driver_version()
        label_names = [s.field for s in label_specs]
        wanted = {s.field for s in self._specs} - {XID_ERRORS}
        self._gpus = []
        missing: set[str] = set()
        for d in backend.devices():
            probed = supported.get(d.index) if supported is not None else None
            if probed is None:
                probed = backend.supported_fields(d.index, sorted(wanted))
            labels = label_values(backend, d, driver, label_names)
            missing.update(set(label_names) - set(labels))
            self._gpus.append(self._static(d, frozenset(probed) & wanted, hostname, labels))
        for name in sorted(missing):
            log.warning("label field %s has no value on some GPUs; the label is omitted there", name)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.exposition = EMPTY

    @staticmethod
    def _static(d: DeviceInfo, fields: frozenset[str], hostname: str | None, lf: Mapping[str, str]) -> _Gpu:
        units: list[tuple[Entity, str, str]] = []
        by_id: list[MigInstance] = sorted(d.mig, key=lambda m: m.gpu_instance_id)
        migs: list[MigInstance | None] = list(by_id) if by_id else [None]
        for mig in migs:
            entity = Entity(d.index, None if mig is None else mig.gpu_instance_id)
            units.append((entity, entity_labels(d, mig, hostname, lf), d.uuid if mig is None else mig.uuid))
        return _Gpu(d, fields, tuple(units))

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def health(self) -> tuple[bool, str]:
        return health_of(self.exposition, self._clock(), self._interval_s)

    # -- one cycle -------------------------------------------------------------------------------

    def collect_once(self) -> Exposition:
        """Read every GPU, render both formats, swap the cached snapshot; returns it."""
        with self._lock:
            pods = self._fetch_pods()
            rows: list[Row] = []
            for g in self._gpus:
                rows.extend(self._read_gpu(g, pods))
            exp = self._render(rows)
            self.exposition = exp
            return exp

    def _fetch_pods(self) -> Mapping[str, PodLabels]:
        if self._pods is None:
            return {}
        try:
            return self._pods()
        except Exception as exc:
            self._kubelet_errors += 1
            log.warning("pod attribution failed, serving without pod labels: %s", exc)
            return {}

    def _read_gpu(self, g: _Gpu, pods: Mapping[str, PodLabels]) -> list[Row]:
        gpu = g.device.index
        t0 = time.perf_counter()
        try:
            data = self._backend.read(gpu, g.fields)
        except Exception as exc:
            g.duration_s = time.perf_counter() - t0
            g.errors += 1
            g.problem = exc.reason if isinstance(exc, GpuLostError) else f"{type(exc).__name__}: {exc}"
            if g.up:
                log.warning("GPU %d (%s) stopped answering, dropping its series: %s", gpu, g.device.uuid,
                            g.problem)
            g.up = False
            return []
        g.duration_s = time.perf_counter() - t0
        if not g.up:
            log.warning("GPU %d (%s) answers again", gpu, g.device.uuid)
        g.up, g.problem = True, ""
        xid = self.xids.last(gpu)
        rows = []
        for entity, prefix, pod_key in g.entities:
            values = data.get(entity)
            if values is None:
                continue
            values = {**values, XID_ERRORS: xid}
            rows.append(Row(with_pod(prefix, pods.get(pod_key)), values))
        return rows

    def _self_state(self) -> SelfState:
        xid_counts = {}
        uuid = {g.device.index: g.device.uuid for g in self._gpus}
        for (gpu, code), n in self.xids.counts().items():
            xid_counts[(gpu, uuid.get(gpu, ""), code)] = n
        kubelet: int | None = None
        if self._pods is not None:
            kubelet = self._kubelet_errors + (self._kubelet_errors_fn() if self._kubelet_errors_fn else 0)
        return SelfState(
            devices=[
                DeviceStat(g.device.index, g.device.uuid, g.up, g.duration_s, g.errors) for g in self._gpus
            ],
            build=self._build,
            last_collection_ts=self._wall_clock(),
            kubelet_errors=kubelet,
            xid_counts=xid_counts,
        )

    def _render(self, rows: Sequence[Row]) -> Exposition:
        state = self._self_state()
        text = render_series(self._specs, rows, self._integer_fields) + render_self_metrics(state)
        om = (
            render_series(self._specs, rows, self._integer_fields, openmetrics=True)
            + render_self_metrics(state, openmetrics=True)
            + "# EOF\n"
        )
        down = [f"GPU {g.device.index}: {g.problem}" for g in self._gpus if not g.up]
        return Exposition(
            text=text.encode(),
            openmetrics=om.encode(),
            collected_at=self._clock(),
            devices_up=len(self._gpus) - len(down),
            devices_total=len(self._gpus),
            problem="; ".join(down),
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
