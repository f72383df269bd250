"""DCGM_EXP_GPU_HEALTH_STATUS from NVML's inputs to DCGM's health checks (issue 21 point 5): per
signal healthy, warning, failure and not supported (absent), through the NVML backend on the fake
NVML, on the simulator, and as dcgm-exporter 4.8.2 labels and encodes it."""

from __future__ import annotations

import pynvml
import pytest

from exporter.backend import Value
from exporter.collector import Collector
from exporter.counters_csv import parse_counters
from exporter.exp_counters import ExpCounters
from exporter.health_status import FAIL, OK, PASS, WARN, WATCHES, HealthStatus, evaluate
from exporter.nvml.backend import NvmlBackend
from exporter.simulated import SimulatedBackend
from exporter.xid import XidState
from tests.exporter.fake_pynvml import FakeNvml

F = "DCGM_FI_DEV_"
CSV = "DCGM_FI_DEV_GPU_UTIL, gauge, util\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, Health status of the GPU\n"
Sample = dict[str, Value]
# Healthy readings of every input (an H100 on PCIe Gen5 x16), the base each case changes
BASE: Sample = {
    F + "PCIE_REPLAY_COUNTER": 100, F + "PCIE_LINK_GEN": 5, F + "PCIE_LINK_WIDTH": 16,
    F + "ECC_DBE_VOL_TOTAL": 0, F + "RETIRED_PENDING": 0, F + "RETIRED_SBE": 0, F + "RETIRED_DBE": 0,
    F + "ROW_REMAP_FAILURE": 0, F + "INFOROM_CONFIG_VALID": 1, F + "GPU_RECOVERY_ACTION": 0,
    F + "THERMAL_VIOLATION": 5000, F + "POWER_VIOLATION": 7000, F + "POWER_USAGE": 350.0,
    F + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 3, F + "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 4,
    F + "NVLINK_REPLAY_ERROR_COUNT_TOTAL": 1, F + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 2,
}  # fmt: skip
ABSENT = object()


def changed(sample: Sample, **delta: object) -> Sample:
    out = dict(sample)
    for short, value in delta.items():
        if value is ABSENT:
            out.pop(F + short, None)
        else:
            out[F + short] = value  # type: ignore[assignment]
    return out


# (watch, first-sample change, last-sample change, expected incident or None: the watch is absent)
CASES: list[tuple[str, dict[str, object], dict[str, object], tuple[int, str] | None]] = [
    # PCIe Gen5 x16: ceil(1.92 * 16) = 31 replays a minute are expected
    ("PCIE", {}, {"PCIE_REPLAY_COUNTER": 131}, (PASS, OK)),
    ("PCIE", {}, {"PCIE_REPLAY_COUNTER": 132}, (WARN, "DCGM_FR_PCI_REPLAY_RATE")),
    ("PCIE", {"PCIE_REPLAY_COUNTER": ABSENT}, {"PCIE_REPLAY_COUNTER": ABSENT}, None),
    ("MEM", {}, {}, (PASS, OK)),
    ("MEM", {}, {"RETIRED_PENDING": 1}, (WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS")),
    ("MEM", {}, {"ECC_DBE_VOL_TOTAL": 2}, (FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED")),
    ("MEM", {}, {"ROW_REMAP_FAILURE": 1}, (FAIL, "DCGM_FR_ROW_REMAP_FAILURE")),
    ("MEM", {}, {"RETIRED_SBE": 50, "RETIRED_DBE": 13}, (FAIL, "DCGM_FR_RETIRED_PAGES_LIMIT")),
    ("MEM", {}, {"RETIRED_DBE": 16}, (FAIL, "DCGM_FR_RETIRED_PAGES_DBE_LIMIT")),
    # several incidents: the last DCGM reports wins (row remap failure is checked after DBE)
    ("MEM", {}, {"RETIRED_PENDING": 1, "ROW_REMAP_FAILURE": 1}, (FAIL, "DCGM_FR_ROW_REMAP_FAILURE")),
    ("MEM", {}, {k: ABSENT for k in ("ECC_DBE_VOL_TOTAL", "RETIRED_PENDING", "RETIRED_SBE", "ROW_REMAP_FAILURE")},
     None),
    ("INFOROM", {}, {}, (PASS, OK)),
    ("INFOROM", {}, {"INFOROM_CONFIG_VALID": 0}, (WARN, "DCGM_FR_CORRUPT_INFOROM")),
    ("INFOROM", {}, {"INFOROM_CONFIG_VALID": ABSENT}, None),
    ("THERMAL", {}, {}, (PASS, OK)),
    ("THERMAL", {}, {"THERMAL_VIOLATION": 5001}, (WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL")),
    ("THERMAL", {"THERMAL_VIOLATION": ABSENT}, {}, None),
    ("POWER", {}, {}, (PASS, OK)),
    ("POWER", {}, {"POWER_VIOLATION": 9000}, (WARN, "DCGM_FR_CLOCK_THROTTLE_POWER")),
    ("POWER", {}, {"POWER_USAGE": ABSENT}, (WARN, "DCGM_FR_POWER_UNREADABLE")),
    ("POWER", {"POWER_VIOLATION": ABSENT}, {"POWER_VIOLATION": ABSENT}, None),
    ("NVLINK", {}, {}, (PASS, OK)),
    ("NVLINK", {}, {"NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 50}, (WARN, "DCGM_FR_NVLINK_ERROR_THRESHOLD")),
    ("NVLINK", {}, {"NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 6003}, (FAIL, "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD")),
    ("NVLINK", {}, {"NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 3}, (FAIL, "DCGM_FR_NVLINK_ERROR_CRITICAL")),
    ("NVLINK", {}, {k: ABSENT for k in ("NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                                        "NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLINK_RECOVERY_ERROR_COUNT_TOTAL")},
     None),
    ("DRIVER", {}, {}, (PASS, OK)),
    ("DRIVER", {}, {"GPU_RECOVERY_ACTION": 3}, (WARN, "DCGM_FR_GPU_RECOVERY_DRAIN_P2P")),
    ("DRIVER", {}, {"GPU_RECOVERY_ACTION": 2}, (FAIL, "DCGM_FR_GPU_RECOVERY_REBOOT")),
    ("DRIVER", {}, {"GPU_RECOVERY_ACTION": ABSENT}, None),
]  # fmt: skip


@pytest.mark.parametrize(("watch", "first", "last", "expected"), CASES)
def test_each_signal_maps_to_dcgms_incident_or_leaves_the_watch_absent(
    watch: str, first: dict[str, object], last: dict[str, object], expected: tuple[int, str] | None
) -> None:
    got = evaluate(changed(BASE, **first), changed(BASE, **last), 60.0, (), xid_watched=False)
    assert got.get(watch) == expected


# (xid, watch, expected incident): DCGM 4.5.3's XID tables
XID_CASES = [
    (79, "ALL", (FAIL, "DCGM_FR_FALLEN_OFF_BUS")), (95, "ALL", (FAIL, "DCGM_FR_UNCONTAINED_ERROR")),
    (48, "ALL", (FAIL, "DCGM_FR_XID_ERROR")), (63, "MEM", (WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS")),
    (38, "PCIE", (WARN, "DCGM_FR_XID_ERROR")), (62, "THERMAL", (WARN, "DCGM_FR_THERMAL_VIOLATIONS")),
    (57, "POWER", (WARN, "DCGM_FR_CLOCK_THROTTLE_POWER")), (67, "NVLINK", (WARN, "DCGM_FR_NVLINK_ERROR_THRESHOLD")),
    (93, "INFOROM", (WARN, "DCGM_FR_CORRUPT_INFOROM")), (13, "ALL", (PASS, OK)),  # 13: no health watch
]  # fmt: skip


@pytest.mark.parametrize(("xid", "watch", "expected"), XID_CASES)
def test_xids_seen_mark_their_watch_and_leave_the_others_passing(
    xid: int, watch: str, expected: tuple[int, str]
) -> None:
    got = evaluate(BASE, BASE, 60.0, {xid}, xid_watched=True)
    assert got[watch] == expected
    assert all(inc == (PASS, OK) for w, inc in got.items() if w != watch)


def test_an_xid_exports_its_watch_even_without_the_watchs_nvml_inputs() -> None:
    assert evaluate({}, {}, 0.0, {67}, xid_watched=True) == {"NVLINK": (WARN, "DCGM_FR_NVLINK_ERROR_THRESHOLD"),
                                                             "ALL": (PASS, OK)}


def test_without_xid_events_or_inputs_nothing_is_reported_healthy() -> None:
    assert evaluate({}, {}, 0.0, {79}, xid_watched=False) == {}


def test_pmu_mcu_and_sm_are_never_exported() -> None:
    assert not {"PMU", "MCU", "SM"} & set(evaluate(BASE, BASE, 60.0, (), xid_watched=True))


def test_rises_are_measured_over_the_last_minute_only() -> None:
    t = [0.0]
    health = HealthStatus(XidState(), clock=lambda: t[0])
    health.observe(0, BASE)
    t[0] = 30.0
    health.observe(0, changed(BASE, THERMAL_VIOLATION=6000))
    assert dict(health.incidents(0, False))["THERMAL"] == (WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL")
    t[0] = 95.0  # the sample before the rise is out of the minute
    health.observe(0, changed(BASE, THERMAL_VIOLATION=6000))
    assert dict(health.incidents(0, False))["THERMAL"] == (PASS, OK)
    assert [w for w, _ in health.incidents(0, False)] == [w for w in WATCHES if w in dict(health.incidents(0, False))]


def series(text: str) -> dict[tuple[str, str], str]:
    """(gpu, health_watch) -> 'health_error_code value' of each DCGM_EXP_GPU_HEALTH_STATUS line."""
    out = {}
    for line in text.splitlines():
        if line.startswith("DCGM_EXP_GPU_HEALTH_STATUS{"):
            gpu = line.split('gpu="')[1].split('"')[0]
            watch = line.split('health_watch="')[1].split('"')[0]
            out[(gpu, watch)] = line.split('health_error_code="')[1].split('"')[0] + " " + line.rsplit(" ", 1)[1]
    return out


def collector(backend: object, xids: XidState) -> Collector:
    specs = parse_counters(CSV)
    exp = ExpCounters([s.field for s in specs], xids)
    return Collector(backend, specs, "node-a", 5.0, xids=xids, exp=exp)  # type: ignore[arg-type]


def test_nvml_backend_reports_corrupt_inforom_remap_failure_and_recovery_action_from_nvml() -> None:
    fake = FakeNvml(n_gpus=3)
    fake.inforom = {0: pynvml.NVML_ERROR_CORRUPTED_INFOROM, 2: pynvml.NVML_ERROR_NOT_SUPPORTED}
    fake.fields[pynvml.NVML_FI_DEV_REMAPPED_FAILURE] = (3, 1)
    xids = XidState()
    got = series(collector(NvmlBackend(fake), xids).collect_once().text.decode())
    assert got[("0", "INFOROM")] == "DCGM_FR_CORRUPT_INFOROM 10"
    assert got[("1", "INFOROM")] == "DCGM_FR_OK 0"
    assert ("2", "INFOROM") not in got  # NOT_SUPPORTED: absent, not healthy
    assert got[("1", "MEM")] == "DCGM_FR_ROW_REMAP_FAILURE 20"
    assert got[("1", "DRIVER")] == "DCGM_FR_OK 0" and got[("1", "ALL")] == "DCGM_FR_OK 0"
    assert ("1", "NVLINK") not in got  # the recorded PCIe H200 has no NVLink error counters
    assert fake.calls["nvmlDeviceValidateInforom"] == 3  # once per GPU, at probe time


def test_nvml_backend_follows_the_recovery_action_and_xids() -> None:
    fake = FakeNvml(n_gpus=1)
    fake.fields[pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION] = (1, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    xids = XidState()
    c = collector(NvmlBackend(fake), xids)
    xids.record(0, 79)
    got = series(c.collect_once().text.decode())
    assert got[("0", "DRIVER")] == "DCGM_FR_GPU_RECOVERY_RESET 20"
    assert got[("0", "ALL")] == "DCGM_FR_FALLEN_OFF_BUS 20"


def test_simulated_board_serves_every_observable_watch_healthy() -> None:
    text = collector(SimulatedBackend(n_gpus=2, workloads={0: "idle", 1: "idle"}), XidState()).collect_once().text
    got = series(text.decode())
    expected = ["PCIE", "NVLINK", "MEM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL"]
    for gpu in ("0", "1"):
        assert [w for (g, w) in got if g == gpu] == expected
    assert set(got.values()) == {"DCGM_FR_OK 0"}
    assert 'health_error_code="DCGM_FR_OK",health_watch="PCIE"} 0' in text.decode()  # dcgm-exporter's label order
