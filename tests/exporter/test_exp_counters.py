"""DCGM_EXP_* rows as dcgm-exporter 4.8.2 exports them (issue 21 point 5): XID and clock-event
counts over their -x / --clock-events-count-window-size windows, P2P status, health (test_health_status)."""

from __future__ import annotations

import pytest

from exporter.collector import Collector
from exporter.counters_csv import parse_counters
from exporter.exp_counters import IMPLEMENTED, UNAVAILABLE, ExpCounters, link_status
from exporter.settings import SettingsError, load_settings
from exporter.simulated import SimulatedBackend
from exporter.xid import XidState

CSV = """\
DCGM_FI_DEV_GPU_UTIL, gauge, util
DCGM_FI_DRIVER_VERSION, label, Driver Version
DCGM_EXP_XID_ERRORS_COUNT, counter, reported XIDs during last window
DCGM_EXP_CLOCK_EVENTS_COUNT, counter, reported clock events
DCGM_EXP_P2P_STATUS, counter, P2P NvLink status
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def lines(text: str, name: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(name + "{")]


def make(clock: Clock, xid_ms: int = 60000, clock_ms: int = 60000) -> tuple[Collector, XidState, SimulatedBackend]:
    backend = SimulatedBackend(n_gpus=2, clock=clock, workloads={0: "training", 1: "idle"})
    xids = XidState(clock=clock)
    specs = parse_counters(CSV)
    exp = ExpCounters([s.field for s in specs], xids, xid_window_ms=xid_ms, clock_events_window_ms=clock_ms,
                      p2p=lambda gpu: {0: 0, 1: 0}, clock=clock)
    return Collector(backend, specs, "node-a", 5.0, xids=xids, exp=exp), xids, backend


def test_xid_count_is_per_code_within_the_window_and_zero_without_events() -> None:
    clock = Clock()
    c, xids, _ = make(clock)
    text = c.collect_once().text.decode()
    assert [ln.rsplit(" ", 1)[1] for ln in lines(text, "DCGM_EXP_XID_ERRORS_COUNT")] == ["0", "0"]
    assert ',DCGM_FI_DRIVER_VERSION="580.159.04",window_size_in_ms="60000"} 0' in text  # sorted with label fields
    xids.record(0, 79)
    xids.record(0, 79)
    xids.record(0, 31)
    text = c.collect_once().text.decode()
    gpu0 = [ln for ln in lines(text, "DCGM_EXP_XID_ERRORS_COUNT") if 'gpu="0"' in ln]
    assert [ln.split('window_size_in_ms="60000",')[1] for ln in gpu0] == ['xid="31"} 1', 'xid="79"} 2']
    clock.t += 61.0  # past the window
    text = c.collect_once().text.decode()
    assert [ln.rsplit(" ", 1)[1] for ln in lines(text, "DCGM_EXP_XID_ERRORS_COUNT")] == ["0", "0"]


def test_clock_events_count_samples_with_each_reason_bit_in_the_window() -> None:
    clock = Clock()
    c, _, _ = make(clock, clock_ms=12000)
    for _ in range(3):
        text = c.collect_once().text.decode()
        clock.t += 5.0
    gpu0 = [ln for ln in lines(text, "DCGM_EXP_CLOCK_EVENTS_COUNT") if '{gpu="0"' in ln]
    # the training GPU is power-capped (reason bit 0x4): 3 samples inside 12 s
    assert len(gpu0) == 1 and 'clock_event="power_cap",window_size_in_ms="12000"} 3' in gpu0[0]
    clock.t += 4.0  # now 1019: samples at 1000 and 1005 are out of the 12 s window, 1010 and 1019 in
    text = c.collect_once().text.decode()
    assert 'clock_event="power_cap",window_size_in_ms="12000"} 2' in text
    assert 'clock_event="gpu_idle",window_size_in_ms="12000"} 2' in text  # the idle GPU


def test_p2p_status_names_each_peer_and_its_link_status() -> None:
    c, _, _ = make(Clock())
    text = c.collect_once().text.decode()
    (line,) = [ln for ln in lines(text, "DCGM_EXP_P2P_STATUS") if ln.startswith('DCGM_EXP_P2P_STATUS{gpu="0"')]
    assert line.endswith(',link_status="OK",peer_gpu="1"} 0')


@pytest.mark.parametrize(("code", "text"), [(0, "OK"), (4, "DisabledByRegKey"), (5, "NotSupported"), (9, "Unknown")])
def test_link_status_text_is_dcgm_exporters(code: int, text: str) -> None:
    assert link_status(code) == text


def test_health_status_is_implemented_and_no_exp_row_is_refused() -> None:
    assert "DCGM_EXP_GPU_HEALTH_STATUS" in IMPLEMENTED and UNAVAILABLE == {}


@pytest.mark.parametrize(
    ("argv", "xid", "clock"),
    [([], 300000, 300000), (["-x", "60000"], 60000, 300000),
     (["--clock-events-count-window-size=1000"], 300000, 1000)],
)
def test_window_flags_are_parsed_in_milliseconds(argv: list[str], xid: int, clock: int) -> None:
    s = load_settings(argv, {})
    assert (s.xid_window_ms, s.clock_events_window_ms) == (xid, clock)
    assert not any("xid" in w.lower() for w in s.warnings)  # -x no longer warns "no effect"


@pytest.mark.parametrize("value", ["0", "-5", "5s", ""])
def test_bad_window_is_an_error_naming_the_flag(value: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(["-x", value], {})
    assert "xid-count-window-size" in str(info.value)


def test_nvml_p2p_status_asks_nvlink_for_every_peer() -> None:
    from exporter.nvml.backend import NvmlBackend
    from tests.exporter.fake_pynvml import FakeNvml

    fake = FakeNvml(n_gpus=3)
    fake.p2p = {(0, 1): 0, (0, 2): 4}
    assert NvmlBackend(fake).p2p_status(0) == {1: 0, 2: 4}


def test_simulated_board_reports_nvlink_p2p_ok_to_every_peer() -> None:
    assert SimulatedBackend(n_gpus=3).p2p_status(1) == {0: 0, 2: 0}
