"""NvmlBackend's NVLink fields against the fake pynvml: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (DCGM's
MB/s arithmetic over the data counters of all links) and DCGM_FI_PROF_NVLINK_TX/RX_BYTES (bytes/s:
GPM on Hopper, else the same counters differenced), absent without NVLink or with every link down."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from exporter.backend import Entity, GpuLostError
from exporter.nvml.backend import NvmlBackend
from tests.exporter.fake_pynvml import FakeNvml

BW = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
TX = "DCGM_FI_PROF_NVLINK_TX_BYTES"
RX = "DCGM_FI_PROF_NVLINK_RX_BYTES"
NVLINK = frozenset({BW, TX, RX})
# the fake's SXM board moves 3,000 KiB/s TX and 1,000 KiB/s RX over all links
TX_BPS, RX_BPS = 3000 * 1024, 1000 * 1024
BW_MBPS = (3000 + 1000) // 1000  # DCGM: KiB delta / seconds / 1000


def backend_for(fake: FakeNvml) -> NvmlBackend:
    return NvmlBackend(fake, clock=fake.clock, wall_clock=fake.clock)


@pytest.fixture
def sxm() -> Iterator[tuple[FakeNvml, NvmlBackend]]:
    fake = FakeNvml(n_gpus=1, nvlink=True)
    b = backend_for(fake)
    yield fake, b
    b.close()


def read(fake: FakeNvml, b: NvmlBackend, fields: frozenset[str] = NVLINK, n: int = 2) -> dict[str, object]:
    out: dict[str, object] = {}
    for _ in range(n):
        fake.now += 5.0
        out = dict(b.read(0, fields)[Entity(0)])
    return out


@pytest.mark.parametrize(
    ("setup", "source"),
    [
        pytest.param({}, "gpm", id="hopper-gpm"),
        pytest.param({"gpm_refused": True}, "counters", id="profiling-refused-counters"),
        pytest.param({"gpm_supported": False}, "counters", id="no-gpm-counters"),
    ],
)
def test_sxm_board_serves_all_three_nvlink_fields_in_dcgm_units(setup: dict[str, bool], source: str) -> None:
    fake = FakeNvml(n_gpus=1, nvlink=True, gpm_supported=setup.get("gpm_supported", True))
    fake.gpm_refused = setup.get("gpm_refused", False)
    b = backend_for(fake)
    try:
        assert b.supported_fields(0, NVLINK) == NVLINK
        assert not set(b.unavailable(0)) & NVLINK  # the counters stand in for refused GPM
        before = fake.calls["nvmlGpmMetricsGet"]
        v = read(fake, b)
        assert v == {BW: BW_MBPS, TX: TX_BPS, RX: RX_BPS}
        assert all(isinstance(x, int) for x in v.values())  # int64 fields, rendered %d
        asked_gpm = fake.calls["nvmlGpmMetricsGet"] > before
        assert asked_gpm is (source == "gpm")
    finally:
        b.close()


def test_gpm_is_preferred_and_the_counters_are_not_requested_for_prof_fields(
    sxm: tuple[FakeNvml, NvmlBackend],
) -> None:
    fake, b = sxm
    b.supported_fields(0, {TX, RX, BW})
    probed = len(fake.field_requests)
    fake.gpm_values[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = 7.0  # GPM now says 7 MiB/s
    v = read(fake, b, frozenset({TX, RX, BW}))
    assert v[TX] == 7 * 1048576 and v[BW] == BW_MBPS
    requests = fake.field_requests[probed:]
    assert len(requests) == 2  # one batch a pass, for BANDWIDTH_TOTAL's two counters only
    for req in requests:
        assert sorted(req) == sorted([(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
                                      (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF)])


def test_pcie_board_has_no_nvlink_series_though_gpm_answers_zero() -> None:
    """The recorded PCIe H200: NVLink state NOT_SUPPORTED, the counters NOT_SUPPORTED, GPM's NVLink
    metrics 0. Absent, not 0."""
    fake = FakeNvml(n_gpus=1)
    assert fake.gpm_values[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] == 0.0
    b = backend_for(fake)
    try:
        assert b.supported_fields(0, NVLINK) == set()
        assert not set(b.unavailable(0)) & NVLINK
        assert not set(read(fake, b)) & NVLINK
        assert fake.calls["nvmlDeviceGetNvLinkState"] == 1  # link 0: NOT_SUPPORTED ends the walk
    finally:
        b.close()


def test_links_all_down_serve_nothing_until_one_comes_up_without_restart(sxm: tuple[FakeNvml, NvmlBackend]) -> None:
    fake, b = sxm
    fake.links_down = set(range(18))
    assert b.supported_fields(0, NVLINK) == NVLINK  # the rows stay: the board has NVLink
    assert read(fake, b, n=3) == {}
    fake.links_down = set(range(18)) - {11}  # the fabric manager brought one link up
    v = read(fake, b)
    assert v[TX] == TX_BPS and v[RX] == RX_BPS and v[BW] == BW_MBPS
    fake.links_down = set(range(18))
    assert read(fake, b, n=1) == {}


def test_link_zero_down_with_other_links_up_still_serves_gpm_fields() -> None:
    fake = FakeNvml(n_gpus=1, nvlink=True)
    fake.links_down = {0}
    b = backend_for(fake)
    try:
        assert b.supported_fields(0, NVLINK) == NVLINK
        assert read(fake, b) == {BW: BW_MBPS, TX: TX_BPS, RX: RX_BPS}
    finally:
        b.close()


def test_a_healthy_board_costs_one_link_state_call_a_pass(sxm: tuple[FakeNvml, NvmlBackend]) -> None:
    fake, b = sxm
    b.supported_fields(0, NVLINK)
    probed = fake.calls["nvmlDeviceGetNvLinkState"]
    assert probed == pynvml.NVML_NVLINK_MAX_LINKS  # probe: every index once (18 answer, 18 INVALID_ARGUMENT)
    read(fake, b, n=4)
    assert fake.calls["nvmlDeviceGetNvLinkState"] == probed + 4


def test_nvlink_fields_not_asked_for_cost_no_link_state_call(sxm: tuple[FakeNvml, NvmlBackend]) -> None:
    fake, b = sxm
    fields = frozenset({"DCGM_FI_DEV_GPU_UTIL"})
    b.supported_fields(0, fields)
    probed = fake.calls["nvmlDeviceGetNvLinkState"]
    read(fake, b, fields, n=3)
    assert fake.calls["nvmlDeviceGetNvLinkState"] == probed


def test_a_gpu_lost_while_reading_link_state_is_lost_not_linkless(sxm: tuple[FakeNvml, NvmlBackend]) -> None:
    fake, b = sxm
    read(fake, b)
    fake.fail["nvmlDeviceGetNvLinkState"] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuLostError, match="GPU_IS_LOST"):
        read(fake, b, n=1)


def test_an_unknown_error_on_link_state_reads_as_links_down(sxm: tuple[FakeNvml, NvmlBackend]) -> None:
    fake, b = sxm
    read(fake, b)
    fake.fail["nvmlDeviceGetNvLinkState"] = pynvml.NVML_ERROR_UNKNOWN
    v = dict(b.read(0, NVLINK | {"DCGM_FI_DEV_GPU_UTIL"})[Entity(0)])
    assert "DCGM_FI_DEV_GPU_UTIL" in v and not set(v) & NVLINK


# --- the fake answers as nvml.h documents -----------------------------------------------------------


@pytest.mark.parametrize(
    ("nvlink", "link", "down", "answer"),
    [
        (False, 0, set(), pynvml.NVML_ERROR_NOT_SUPPORTED),
        (True, 0, set(), pynvml.NVML_FEATURE_ENABLED),
        (True, 17, set(), pynvml.NVML_FEATURE_ENABLED),
        (True, 17, {17}, pynvml.NVML_FEATURE_DISABLED),
        (True, 18, set(), pynvml.NVML_ERROR_INVALID_ARGUMENT),
    ],
)
def test_fake_link_state(nvlink: bool, link: int, down: set[int], answer: int) -> None:
    fake = FakeNvml(n_gpus=1, nvlink=nvlink)
    fake.links_down = down
    h = fake.nvmlDeviceGetHandleByIndex(0)
    if answer in (pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_DISABLED):
        assert fake.nvmlDeviceGetNvLinkState(h, link) == answer
    else:
        with pytest.raises(pynvml.NVMLError) as err:
            fake.nvmlDeviceGetNvLinkState(h, link)
        assert err.value.value == answer


def test_fake_field_values_answer_not_supported_per_entry_for_unknown_ids() -> None:
    fake = FakeNvml(n_gpus=1)
    h = fake.nvmlDeviceGetHandleByIndex(0)
    tx, energy = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    got = fake.nvmlDeviceGetFieldValues(h, [(tx, 0xFFFFFFFF), energy, 9999])
    assert [r.nvmlReturn for r in got] == [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_SUCCESS,
                                           pynvml.NVML_ERROR_NOT_SUPPORTED]
