"""dcgm-exporter's own ``DCGM_EXP_*`` CSV rows, computed from what NVML gives (pure but for the
clock-event sample store).

As dcgm-exporter 4.8.2 (``internal/pkg/collector/{xid,clock_events,p2p_status}_collector.go``):

- ``DCGM_EXP_XID_ERRORS_COUNT``: per GPU, one series per XID code seen in the last ``-x`` ms
  (``xid`` label, the count), or one series valued 0 without ``xid`` when none; labels
  ``window_size_in_ms`` and ``xid`` sort with the CSV label fields. A MIG instance shows its GPU's.
- ``DCGM_EXP_CLOCK_EVENTS_COUNT``: per GPU, for each clock-event reason bit, how many collection
  samples of ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` in the last ``--clock-events-count-window-size``
  ms had it set (``clock_event`` label: gpu_idle, clocks_setting, power_cap, ...), else one 0.
  DCGM samples at the collect interval, so do we: counts scale with ``-c`` as dcgm-exporter's do.
- ``DCGM_EXP_P2P_STATUS``: per GPU, one series per other GPU (``peer_gpu``), valued NVML's
  ``nvmlDeviceGetP2PStatus(NVLINK)`` code with ``link_status`` its name (OK, ChipsetNotSupported,
  GPUNotSupported, TopologyNotSupported, DisabledByRegKey, NotSupported, Unknown); read once a
  minute (the topology does not change while the driver runs).
- ``DCGM_EXP_GPU_HEALTH_STATUS``: per GPU, one series per DCGM health watch NVML can observe
  (``health_watch``, ``health_error_code``; 0 PASS, 10 WARN, 20 FAIL), re-derived from NVML's inputs to
  DCGM's checks by :mod:`exporter.health_status` (which watches map to what, and which are absent).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from exporter.backend import Value
from exporter.health_status import FIELDS as HEALTH_FIELDS
from exporter.health_status import HEALTH_STATUS, HealthStatus
from exporter.render import PodLabels, Row, escape_label_value, with_pod
from exporter.xid import XidState

XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
CLOCK_EVENTS_COUNT = "DCGM_EXP_CLOCK_EVENTS_COUNT"
P2P_STATUS = "DCGM_EXP_P2P_STATUS"
CLOCK_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
IMPLEMENTED = frozenset({XID_COUNT, CLOCK_EVENTS_COUNT, P2P_STATUS, HEALTH_STATUS})
UNAVAILABLE: dict[str, str] = {}  # DCGM_EXP_* rows refused with a reason (none now)
DEFAULT_WINDOW_MS = 300000
P2P_REFRESH_S = 60.0

# dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_* bits and dcgm-exporter's label names for them
CLOCK_EVENTS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"), (0x2, "clocks_setting"), (0x4, "power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"), (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)  # fmt: skip
# nvmlGpuP2PStatus_t -> dcgm-exporter's link_status text
LINK_STATUS = ("OK", "ChipsetNotSupported", "GPUNotSupported", "TopologyNotSupported", "DisabledByRegKey",
               "NotSupported", "Unknown")


def link_status(code: int) -> str:
    return LINK_STATUS[code] if 0 <= code < len(LINK_STATUS) else "Unknown"


class ExpCounters:
    """The enabled ``DCGM_EXP_*`` rows for one collector. ``p2p(gpu)`` returns peer -> status code
    (the backend's optional ``p2p_status``); ``clock`` is seconds (monotonic)."""

    def __init__(
        self,
        names: Sequence[str],
        xids: XidState,
        *,
        xid_window_ms: int = DEFAULT_WINDOW_MS,
        clock_events_window_ms: int = DEFAULT_WINDOW_MS,
        p2p: Callable[[int], Mapping[int, int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.names = frozenset(names) & IMPLEMENTED
        self._xids = xids
        self._xid_ms = xid_window_ms
        self._clock_ms = clock_events_window_ms
        self._p2p_fn = p2p
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[int, deque[tuple[float, int]]] = {}
        self._p2p: dict[int, tuple[float, Mapping[int, int]]] = {}
        self._health = HealthStatus(xids, clock)

    def needs(self) -> frozenset[str]:
        """DCGM fields the collector must read for these rows (dcgm-exporter watches them too)."""
        clock = frozenset({CLOCK_REASONS}) if CLOCK_EVENTS_COUNT in self.names else frozenset()
        return clock | (HEALTH_FIELDS if HEALTH_STATUS in self.names else frozenset())

    def observe(self, gpu: int, values: Mapping[str, Value]) -> None:
        """One collection sample of the GPU's values (clock-event reasons, health inputs)."""
        if HEALTH_STATUS in self.names:
            self._health.observe(gpu, values)
        if CLOCK_EVENTS_COUNT not in self.names or CLOCK_REASONS not in values:
            return
        now = self._clock()
        with self._lock:
            q = self._samples.setdefault(gpu, deque())
            q.append((now, int(values[CLOCK_REASONS])))
            while q and q[0][0] < now - self._clock_ms / 1000.0:
                q.popleft()

    def _clock_counts(self, gpu: int) -> dict[str, int]:
        since = self._clock() - self._clock_ms / 1000.0
        with self._lock:
            masks = [m for t, m in self._samples.get(gpu, ()) if t >= since]
        counts = {name: sum(1 for m in masks if m & bit) for bit, name in CLOCK_EVENTS}
        return {name: n for name, n in counts.items() if n}

    def _peers(self, gpu: int) -> Mapping[int, int]:
        if self._p2p_fn is None:
            return {}
        cached = self._p2p.get(gpu)
        now = self._clock()
        if cached is None or now - cached[0] >= P2P_REFRESH_S:
            cached = self._p2p[gpu] = (now, dict(self._p2p_fn(gpu)))
        return cached[1]

    def rows(
        self, gpu: int, prefixes: Sequence[tuple[str, Sequence[PodLabels | None]]], xid_watched: bool = True
    ) -> list[Row]:
        """The GPU's rows; ``prefixes``: each entity's static label prefix and its holders;
        ``xid_watched``: the GPU's XID events are received (the health row's XID inputs)."""
        out: list[Row] = []

        def emit(name: str, labels: Sequence[tuple[str, str]], value: int) -> None:
            extra = "".join(f',{k}="{escape_label_value(v)}"' for k, v in sorted(labels))
            for prefix, holders in prefixes:
                for pod in holders:
                    out.append(Row(with_pod(prefix + extra, pod), {name: value}))

        if XID_COUNT in self.names:
            window = ("window_size_in_ms", str(self._xid_ms))
            counts = self._xids.window(gpu, self._xid_ms / 1000.0)
            for code, n in sorted(counts.items()):
                emit(XID_COUNT, (window, ("xid", str(code))), n)
            if not counts:
                emit(XID_COUNT, (window,), 0)
        if CLOCK_EVENTS_COUNT in self.names:
            window = ("window_size_in_ms", str(self._clock_ms))
            events = self._clock_counts(gpu)
            for event, n in events.items():
                emit(CLOCK_EVENTS_COUNT, (window, ("clock_event", event)), n)
            if not events:
                emit(CLOCK_EVENTS_COUNT, (window,), 0)
        if P2P_STATUS in self.names:
            for peer, code in sorted(self._peers(gpu).items()):
                if peer != gpu:
                    emit(P2P_STATUS, (("peer_gpu", str(peer)), ("link_status", link_status(code))), code)
        if HEALTH_STATUS in self.names:
            for watch, (health, reason) in self._health.incidents(gpu, xid_watched):
                emit(HEALTH_STATUS, (("health_error_code", reason), ("health_watch", watch)), health)
        return out
