"""``DCGM_EXP_GPU_HEALTH_STATUS`` from what NVML observes per GPU: DCGM's health watches, re-derived.

dcgm-exporter 4.8.2 (``internal/pkg/collector/gpu_health_collector.go``) runs DCGM 4.5.3's health
engine (``HealthSet(DCGM_HEALTH_WATCH_ALL)``, ``HealthCheck`` every scrape) and exports, per GPU, one
series per health watch: labels ``health_watch`` (PCIE, NVLINK, PMU, MCU, MEM, SM, INFOROM, THERMAL,
POWER, DRIVER, ALL) and ``health_error_code`` (``DCGM_FR_OK`` or the incident's ``DCGM_FR_*`` name,
``DCGM_FR_UNKNOWN(<n>)`` for a code outside its table), valued the incident's health: 0 PASS,
10 WARN, 20 FAIL. When a watch has several incidents the last one DCGM reports wins, so the checks
below run in DCGM's order and the last failing one names the series.

NVML gives the same inputs DCGM's checks read (``DcgmHealthWatch.cpp`` at v4.5.3), through the
backend's ordinary fields (``needs``) and the XID watcher:

- PCIE: XIDs 38, 39 (WARN ``DCGM_FR_XID_ERROR``), 42 (WARN ``DCGM_FR_PCI_REPLAY_RATE``); the PCIe replay
  counter's rise over the last minute above ceil(per-lane rate of the link generation x width)
  (0.15, 0.3, 0.48, 0.96, 1.92, 3.84 a minute a lane for Gen1-6): WARN ``DCGM_FR_PCI_REPLAY_RATE``.
- MEM: XIDs 31, 32, 43 (WARN ``DCGM_FR_XID_ERROR``), 63 (WARN ``DCGM_FR_PENDING_PAGE_RETIREMENTS``), 64
  (WARN ``DCGM_FR_ROW_REMAP_FAILURE``); volatile DBE count > 0: FAIL ``DCGM_FR_VOLATILE_DBE_DETECTED``;
  pages pending retirement: WARN ``DCGM_FR_PENDING_PAGE_RETIREMENTS``; retired pages SBE + DBE >= 63:
  FAIL ``DCGM_FR_RETIRED_PAGES_LIMIT``, DBE > 15: FAIL ``DCGM_FR_RETIRED_PAGES_DBE_LIMIT`` (without
  DCGM's one-week age test); row-remap failure: FAIL ``DCGM_FR_ROW_REMAP_FAILURE``. (Pending row
  remaps are not a DCGM health check: they stay ``DCGM_FI_DEV_ROW_REMAP_PENDING``.)
- INFOROM: XID 93, or ``nvmlDeviceValidateInforom`` answering CORRUPTED_INFOROM: WARN
  ``DCGM_FR_CORRUPT_INFOROM``.
- THERMAL: XIDs 60 (``DCGM_FR_CLOCK_THROTTLE_THERMAL``), 61 (``DCGM_FR_XID_ERROR``), 62
  (``DCGM_FR_THERMAL_VIOLATIONS``), all WARN; thermal violation time rising over the last minute: WARN
  ``DCGM_FR_CLOCK_THROTTLE_THERMAL``.
- POWER: XIDs 54, 56, 58, 78 (``DCGM_FR_XID_ERROR``), 57 (``DCGM_FR_CLOCK_THROTTLE_POWER``), all WARN;
  power reading missing while the violation counter answers: WARN ``DCGM_FR_POWER_UNREADABLE``; power
  violation time rising over the last minute: WARN ``DCGM_FR_CLOCK_THROTTLE_POWER`` (a power-capped
  GPU warns, as under DCGM).
- NVLINK: XIDs 67 (``DCGM_FR_NVLINK_ERROR_THRESHOLD``), 73, 121, 137 (``DCGM_FR_XID_ERROR``), all WARN;
  a rise over the last minute of the replay or recovery error totals: FAIL
  ``DCGM_FR_NVLINK_ERROR_CRITICAL``; of a CRC total: FAIL ``DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD`` at 100/s,
  else WARN ``DCGM_FR_NVLINK_ERROR_THRESHOLD``. (DCGM's link-down check is not re-derived.)
- DRIVER: NVML's GPU recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``): GPU_RESET and
  NODE_REBOOT FAIL (``DCGM_FR_GPU_RECOVERY_RESET``, ``_REBOOT``), DRAIN_P2P and DRAIN_AND_RESET WARN
  (``DCGM_FR_GPU_RECOVERY_DRAIN_P2P``, ``_DRAIN_RESET``).
- ALL: the devastating XIDs 48, 74, 94, 119, 120, 140 (FAIL ``DCGM_FR_XID_ERROR``), 79 (FAIL
  ``DCGM_FR_FALLEN_OFF_BUS``), 95 (FAIL ``DCGM_FR_UNCONTAINED_ERROR``).

XIDs count from the exporter's start (DCGM keeps its XID history for the hostengine's life). A
watch is exported only when one of its NVML inputs answers on this GPU this cycle, or when one of
its XIDs was seen; ALL, whose only input is XIDs, when the GPU's XID events are watched. Otherwise it
is absent, never PASS: NVLINK on a board without NVLink error counters, INFOROM where validation is
not supported, DRIVER before drivers that report a recovery action. PMU, MCU and SM are never exported: DCGM 4.5.3
runs no GPU check for them (dcgm-exporter's series are a constant PASS) and NVML has no input for
them. Not re-derived either: DCGM's NVSwitch, CPU and ConnectX watches (not per-GPU series).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping

from exporter.backend import Value
from exporter.xid import XidState

HEALTH_STATUS = "DCGM_EXP_GPU_HEALTH_STATUS"
PASS, WARN, FAIL = 0, 10, 20  # dcgmHealthWatchResults_t
OK = "DCGM_FR_OK"
WINDOW_S = 60.0  # DCGM's health checks compare the last minute's samples
# dcgm-exporter's health_watch order (gpuHealthChecks)
WATCHES = ("PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL")
NOT_OBSERVED = frozenset({"PMU", "MCU", "SM"})
XE = "DCGM_FR_XID_ERROR"
# DCGM 4.5.3 BuildXidMappings: watch -> {xid: (health, code)}
XIDS: dict[str, dict[int, tuple[int, str]]] = {
    "ALL": {48: (FAIL, XE), 74: (FAIL, XE), 79: (FAIL, "DCGM_FR_FALLEN_OFF_BUS"), 94: (FAIL, XE),
            95: (FAIL, "DCGM_FR_UNCONTAINED_ERROR"), 119: (FAIL, XE), 120: (FAIL, XE), 140: (FAIL, XE)},
    "MEM": {31: (WARN, XE), 32: (WARN, XE), 43: (WARN, XE), 63: (WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS"),
            64: (WARN, "DCGM_FR_ROW_REMAP_FAILURE")},
    "PCIE": {38: (WARN, XE), 39: (WARN, XE), 42: (WARN, "DCGM_FR_PCI_REPLAY_RATE")},
    "THERMAL": {60: (WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL"), 61: (WARN, XE), 62: (WARN, "DCGM_FR_THERMAL_VIOLATIONS")},
    "POWER": {54: (WARN, XE), 56: (WARN, XE), 57: (WARN, "DCGM_FR_CLOCK_THROTTLE_POWER"), 58: (WARN, XE),
              78: (WARN, XE)},
    "NVLINK": {67: (WARN, "DCGM_FR_NVLINK_ERROR_THRESHOLD"), 73: (WARN, XE), 121: (WARN, XE), 137: (WARN, XE)},
    "INFOROM": {93: (WARN, "DCGM_FR_CORRUPT_INFOROM")},
}  # fmt: skip
PCIE_RATE_PER_LANE = (0.15, 0.3, 0.48, 0.96, 1.92, 3.84)  # replays a minute a lane, Gen1..Gen6
F = "DCGM_FI_DEV_"
REPLAY, GEN, WIDTH = F + "PCIE_REPLAY_COUNTER", F + "PCIE_LINK_GEN", F + "PCIE_LINK_WIDTH"
DBE_VOL, RETIRED_PENDING = F + "ECC_DBE_VOL_TOTAL", F + "RETIRED_PENDING"
RETIRED_SBE, RETIRED_DBE, REMAP_FAILURE = F + "RETIRED_SBE", F + "RETIRED_DBE", F + "ROW_REMAP_FAILURE"
INFOROM_VALID, RECOVERY = F + "INFOROM_CONFIG_VALID", F + "GPU_RECOVERY_ACTION"
THERMAL_V, POWER_V, POWER = F + "THERMAL_VIOLATION", F + "POWER_VIOLATION", F + "POWER_USAGE"
NVLINK_CRC = (F + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", F + "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")
NVLINK_CRITICAL = (F + "NVLINK_REPLAY_ERROR_COUNT_TOTAL", F + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL")
# nvmlDeviceGpuRecoveryAction_t -> DCGM 4.5.3 MonitorGpuRecoveryAction
RECOVERY_ACTIONS = {1: (FAIL, "DCGM_FR_GPU_RECOVERY_RESET"), 2: (FAIL, "DCGM_FR_GPU_RECOVERY_REBOOT"),
                    3: (WARN, "DCGM_FR_GPU_RECOVERY_DRAIN_P2P"), 4: (WARN, "DCGM_FR_GPU_RECOVERY_DRAIN_RESET")}
XID_ERRORS = F + "XID_ERRORS"  # asked for so the collector knows whether the GPU's XIDs are watched
FIELDS = frozenset({XID_ERRORS, REPLAY, GEN, WIDTH, DBE_VOL, RETIRED_PENDING, RETIRED_SBE, RETIRED_DBE, REMAP_FAILURE,
                    INFOROM_VALID, RECOVERY, THERMAL_V, POWER_V, POWER, *NVLINK_CRC, *NVLINK_CRITICAL})

Incident = tuple[int, str]  # (health, DCGM_FR_* name)
Sample = Mapping[str, Value]


def _rise(first: Sample, last: Sample, name: str) -> float | None:
    if name not in first or name not in last:
        return None
    return abs(float(last[name]) - float(first[name]))  # DCGM: |end - start|


def pcie_replay(first: Sample, last: Sample, elapsed_s: float) -> Incident | None:
    rise = _rise(first, last, REPLAY)
    if rise is None:
        return None
    gen, width = int(last.get(GEN, 0)), int(last.get(WIDTH, 0))
    if gen < 1 or width < 1:
        return PASS, OK  # DCGM: no expected rate, no incident
    expected = math.ceil(PCIE_RATE_PER_LANE[min(gen, len(PCIE_RATE_PER_LANE)) - 1] * width)
    return (WARN, "DCGM_FR_PCI_REPLAY_RATE") if rise > expected else (PASS, OK)


def _flag(last: Sample, name: str, bad: Callable[[float], bool], incident: Incident) -> Incident | None:
    if name not in last:
        return None
    return incident if bad(float(last[name])) else (PASS, OK)


def memory(first: Sample, last: Sample, elapsed_s: float) -> list[Incident | None]:
    pages = None
    if RETIRED_SBE in last and RETIRED_DBE in last:
        sbe, dbe = float(last[RETIRED_SBE]), float(last[RETIRED_DBE])
        pages = (FAIL, "DCGM_FR_RETIRED_PAGES_LIMIT") if sbe + dbe >= 63 else (
            (FAIL, "DCGM_FR_RETIRED_PAGES_DBE_LIMIT") if dbe > 15 else (PASS, OK))
    return [
        _flag(last, DBE_VOL, lambda v: v > 0, (FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED")),
        _flag(last, RETIRED_PENDING, lambda v: v > 0, (WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS")),
        pages,
        _flag(last, REMAP_FAILURE, lambda v: v > 0, (FAIL, "DCGM_FR_ROW_REMAP_FAILURE")),
    ]


def violation(first: Sample, last: Sample, name: str, code: str) -> Incident | None:
    rise = _rise(first, last, name)
    return None if rise is None else ((WARN, code) if rise > 0 else (PASS, OK))


def nvlink(first: Sample, last: Sample, elapsed_s: float) -> list[Incident | None]:
    out: list[Incident | None] = []
    for name in (*NVLINK_CRC, *NVLINK_CRITICAL):
        rise = _rise(first, last, name)
        if rise is None:
            out.append(None)
        elif rise < 1:
            out.append((PASS, OK))
        elif name in NVLINK_CRITICAL:
            out.append((FAIL, "DCGM_FR_NVLINK_ERROR_CRITICAL"))
        elif rise / max(elapsed_s, 1.0) >= 100.0:
            out.append((FAIL, "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD"))
        else:
            out.append((WARN, "DCGM_FR_NVLINK_ERROR_THRESHOLD"))
    return out


def evaluate(
    first: Sample, last: Sample, elapsed_s: float, xids: Collection[int], xid_watched: bool
) -> dict[str, Incident]:
    """Each observable watch's incident, from the oldest and newest samples of the last minute
    (``elapsed_s`` apart) and the XID codes seen on the GPU; unobservable watches are left out."""
    checks: dict[str, list[Incident | None]] = {
        "PCIE": [pcie_replay(first, last, elapsed_s)],
        "NVLINK": nvlink(first, last, elapsed_s),
        "MEM": memory(first, last, elapsed_s),
        "INFOROM": [_flag(last, INFOROM_VALID, lambda v: v == 0, (WARN, "DCGM_FR_CORRUPT_INFOROM"))],
        "THERMAL": [violation(first, last, THERMAL_V, "DCGM_FR_CLOCK_THROTTLE_THERMAL")],
        "POWER": [None if POWER_V not in last else
                  ((WARN, "DCGM_FR_POWER_UNREADABLE") if POWER not in last else (PASS, OK)),
                  violation(first, last, POWER_V, "DCGM_FR_CLOCK_THROTTLE_POWER")],
        "DRIVER": [None if RECOVERY not in last else RECOVERY_ACTIONS.get(int(last[RECOVERY]), (PASS, OK))],
        "ALL": [],
    }
    out: dict[str, Incident] = {}
    for watch in WATCHES:
        if watch in NOT_OBSERVED:
            continue
        table = XIDS.get(watch, {})
        found: list[Incident | None] = [table[x] for x in sorted(xids) if x in table] if xid_watched else []
        if xid_watched and watch == "ALL":
            found.insert(0, (PASS, OK))  # ALL's only input is XIDs: watched, it is observed
        seen = [i for i in (*found, *checks[watch]) if i is not None]
        if seen:
            bad = [i for i in seen if i[0] != PASS]
            out[watch] = bad[-1] if bad else (PASS, OK)
    return out


class HealthStatus:
    """Per-GPU samples of the health inputs over the last minute and the XID history (thread-safe)."""

    def __init__(self, xids: XidState, clock: Callable[[], float] = time.monotonic) -> None:
        self._xids = xids
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[int, deque[tuple[float, dict[str, Value]]]] = {}

    def observe(self, gpu: int, values: Mapping[str, Value]) -> None:
        now = self._clock()
        with self._lock:
            q = self._samples.setdefault(gpu, deque())
            q.append((now, {k: v for k, v in values.items() if k in FIELDS}))
            while q[0][0] < now - WINDOW_S:
                q.popleft()  # DCGM compares the first and last samples inside the last minute

    def incidents(self, gpu: int, xid_watched: bool) -> list[tuple[str, Incident]]:
        """(health_watch, (value, health_error_code)) in dcgm-exporter's order, observable ones only."""
        with self._lock:
            q = list(self._samples.get(gpu, ()))
        if not q:
            return []
        (t0, first), (t1, last) = q[0], q[-1]
        seen = {x for (g, x) in self._xids.counts() if g == gpu}
        by_watch = evaluate(first, last, t1 - t0, seen, xid_watched)
        return [(w, by_watch[w]) for w in WATCHES if w in by_watch]
