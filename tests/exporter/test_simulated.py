"""SimulatedBackend: a replayed H200 training job, driven by an injected clock."""

from __future__ import annotations

import time

import pytest

from exporter.backend import Entity, GpuBackend, GpuLostError
from exporter.fields import DEFAULT_FIELDS, FIELDS
from exporter.simulated import SUPPORTED, SimulatedBackend, parse_profile

ALL = frozenset(FIELDS)
DEFAULTS = frozenset(DEFAULT_FIELDS)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


def values(b: SimulatedBackend, gpu: int, fields: frozenset[str] = ALL) -> dict[str, int | float]:
    return dict(b.read(gpu, fields)[Entity(gpu)])


def test_implements_the_backend_protocol(clock: Clock) -> None:
    backend: GpuBackend = SimulatedBackend(2, clock=clock)
    assert backend.driver_version() == "580.159.04"
    backend.close()


def test_devices_have_distinct_deterministic_uuids_and_bus_ids(clock: Clock) -> None:
    a = SimulatedBackend(8, clock=clock, seed=1).devices()
    b = SimulatedBackend(8, clock=clock, seed=1).devices()
    c = SimulatedBackend(8, clock=clock, seed=2).devices()
    other_host = SimulatedBackend(8, clock=clock, seed=1, hostname_seed="node-b").devices()
    assert a == b
    assert len({d.uuid for d in a}) == 8 and len({d.pci_bus_id for d in a}) == 8
    assert {d.uuid for d in a}.isdisjoint({d.uuid for d in c})
    assert {d.uuid for d in a}.isdisjoint({d.uuid for d in other_host})
    for d in a:
        assert d.uuid.startswith("GPU-") and len(d.uuid) == len("GPU-5e7a1c2b-0d4f-4a8e-9b1c-3f2d6e8a7b90")
        assert d.name == "NVIDIA H200"
        assert d.pci_bus_id.startswith("00000000:") and d.pci_bus_id.endswith(":00.0")
    assert [d.index for d in a] == list(range(8)) == [d.minor for d in a]


def test_values_are_deterministic_for_seed_and_clock_whatever_the_read_schedule() -> None:
    c1, c2 = Clock(), Clock()
    b1, b2 = SimulatedBackend(4, clock=c1, seed=5), SimulatedBackend(4, clock=c2, seed=5)
    for t in (0.0, 10.0, 33.0, 90.0, 400.0):  # b1 read often, b2 only at the end
        c1.t = 1000.0 + t
        values(b1, 0)
    c2.t = 1400.0
    assert values(b1, 0) == values(b2, 0)


def test_energy_counter_strictly_increases_as_the_integral_of_power(clock: Clock) -> None:
    b = SimulatedBackend(4, clock=clock)
    last = -1
    for _ in range(200):
        clock.t += 3.7
        e = values(b, 0)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
        assert isinstance(e, int) and e > last
        last = e
    # idle GPU: over 100 s at ~78-100 W the counter grows by 7.8-10 kJ (mJ units)
    b2 = SimulatedBackend(4, clock=clock)
    e0 = values(b2, 3)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    clock.t += 100.0
    e1 = values(b2, 3)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert 7_000_000 < e1 - e0 < 10_500_000


def test_training_gpu_moves_from_idle_to_load_like_the_recording(clock: Clock) -> None:
    b = SimulatedBackend(8, clock=clock)
    start = values(b, 0)
    assert start["DCGM_FI_DEV_GPU_UTIL"] == 0
    assert start["DCGM_FI_DEV_SM_CLOCK"] == 345
    assert start["DCGM_FI_DEV_GPU_TEMP"] == 31
    assert 75 < start["DCGM_FI_DEV_POWER_USAGE"] < 80
    samples = []
    for _ in range(600):  # ten minutes, one read every second
        clock.t += 1.0
        samples.append(values(b, 0))
    utils = [s["DCGM_FI_DEV_GPU_UTIL"] for s in samples[200:]]
    assert sorted(utils)[len(utils) // 2] >= 98  # near 99 most of the time
    assert min(utils) < 30  # with dips (checkpoints)
    late = samples[-1]
    assert 19_000 < late["DCGM_FI_DEV_FB_USED"] < 20_500  # ~20 GB
    assert max(s["DCGM_FI_DEV_POWER_USAGE"] for s in samples) > 680
    assert max(s["DCGM_FI_DEV_GPU_TEMP"] for s in samples) in range(54, 58)
    assert {s["DCGM_FI_DEV_SM_CLOCK"] for s in samples} >= {1440, 1980}
    temps = [s["DCGM_FI_DEV_GPU_TEMP"] for s in samples[:120]]
    assert temps[10] < temps[119]  # heats up with lag, not instantly


def test_ranges_are_sane_for_every_gpu_and_field_over_time(clock: Clock) -> None:
    b = SimulatedBackend(8, clock=clock, seed=3)
    for _ in range(60):
        clock.t += 17.0
        for gpu in range(8):
            v = values(b, gpu)
            assert set(v) <= SUPPORTED
            assert 0 <= v["DCGM_FI_DEV_GPU_UTIL"] <= 100
            assert 0 <= v["DCGM_FI_DEV_MEM_COPY_UTIL"] <= 100
            assert 30 <= v["DCGM_FI_DEV_GPU_TEMP"] <= 60
            assert 70 < v["DCGM_FI_DEV_POWER_USAGE"] < 700
            total = v["DCGM_FI_DEV_FB_FREE"] + v["DCGM_FI_DEV_FB_USED"] + v["DCGM_FI_DEV_FB_RESERVED"]
            assert total == v["DCGM_FI_DEV_FB_TOTAL"] == 143771
            for name in (
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "DCGM_FI_PROF_DRAM_ACTIVE",
                "DCGM_FI_PROF_SM_ACTIVE",
            ):
                assert 0.0 <= v[name] <= 1.0
            assert isinstance(v["DCGM_FI_PROF_PCIE_TX_BYTES"], int)
            for name, value in v.items():
                assert isinstance(value, int) is FIELDS[name].integer or isinstance(value, bool), name


def test_some_gpus_are_stuck_idle_for_contrast(clock: Clock) -> None:
    b = SimulatedBackend(8, clock=clock)
    clock.t += 600.0
    utils = [values(b, g)["DCGM_FI_DEV_GPU_UTIL"] for g in range(8)]
    assert utils.count(0) == 2
    stuck = utils.index(0)
    assert values(b, stuck)["DCGM_FI_DEV_FB_USED"] > 19_000  # holds memory, does nothing


@pytest.mark.parametrize("nvlink", [False, True], ids=["pcie-board", "sxm-board"])
def test_read_returns_only_requested_supported_fields_and_never_xid(clock: Clock, nvlink: bool) -> None:
    b = SimulatedBackend(2, clock=clock, nvlink=nvlink)
    got = values(b, 0, DEFAULTS)
    assert "DCGM_FI_DEV_XID_ERRORS" not in got
    assert ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in got) is nvlink  # an SXM board has NVLink, PCIe none
    assert "DCGM_FI_DRIVER_VERSION" not in got
    assert set(got) == DEFAULTS - {
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DRIVER_VERSION",
        *(() if nvlink else ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",)),
    }
    assert values(b, 0, frozenset({"DCGM_FI_DEV_GPU_TEMP"})).keys() == {"DCGM_FI_DEV_GPU_TEMP"}
    supported = b.supported_fields(0, DEFAULTS)
    assert "DCGM_FI_DEV_XID_ERRORS" in supported
    assert ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in supported) is nvlink
    assert b.labels(1)["DCGM_FI_DEV_UUID"] == b.devices()[1].uuid


def test_lose_gpu_raises_only_for_that_gpu_until_restored(clock: Clock) -> None:
    b = SimulatedBackend(4, clock=clock)
    b.lose_gpu(2)
    with pytest.raises(GpuLostError) as info:
        b.read(2, DEFAULTS)
    assert info.value.gpu == 2
    for gpu in (0, 1, 3):
        assert b.read(gpu, DEFAULTS)
    assert b.wait_xid(0) == [(2, 79)]
    b.restore_gpu(2)
    assert b.read(2, DEFAULTS)


def test_inject_xid_is_returned_by_the_next_wait_and_wait_times_out_empty(clock: Clock) -> None:
    b = SimulatedBackend(4, clock=clock)
    b.inject_xid(1, 48)
    b.inject_xid(3, 94)
    assert b.wait_xid(5.0) == [(1, 48), (3, 94)]
    started = time.monotonic()
    assert b.wait_xid(0.05) == []
    assert time.monotonic() - started < 1.0
    b.close()
    assert b.wait_xid(5.0) == []  # closed: returns at once


def test_mig_gpu_reads_per_instance_entities_and_keeps_gpu_wide_values_on_parent(clock: Clock) -> None:
    b = SimulatedBackend(2, clock=clock, mig={0: ["3g.71gb", "2g.35gb", "1g.18gb"]})
    dev = b.devices()[0]
    assert [m.profile for m in dev.mig] == ["3g.71gb", "2g.35gb", "1g.18gb"]
    assert len({m.gpu_instance_id for m in dev.mig}) == 3
    assert all(m.uuid.startswith("MIG-") for m in dev.mig)
    assert b.devices()[1].mig == ()
    clock.t += 200.0
    out = b.read(0, DEFAULTS)
    assert set(out) == {Entity(0)} | {Entity(0, m.gpu_instance_id) for m in dev.mig}
    parent = out[Entity(0)]
    assert "DCGM_FI_DEV_POWER_USAGE" in parent and "DCGM_FI_DEV_GPU_UTIL" not in parent
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in parent
    for m in dev.mig:
        inst = out[Entity(0, m.gpu_instance_id)]
        _slices, gb = parse_profile(m.profile)
        assert inst["DCGM_FI_DEV_FB_USED"] + inst["DCGM_FI_DEV_FB_FREE"] <= gb * 1024
        assert 0.0 < inst["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] <= 1.0
        assert "DCGM_FI_DEV_POWER_USAGE" not in inst


@pytest.mark.parametrize("bad", [{5: ["1g.18gb"]}, {0: ["9g.1gb"]}, {0: ["big"]}])
def test_bad_mig_layouts_are_rejected(clock: Clock, bad: dict[int, list[str]]) -> None:
    with pytest.raises(ValueError):
        SimulatedBackend(2, clock=clock, mig=bad)


def test_per_gpu_pass_time_is_well_under_a_millisecond(clock: Clock) -> None:
    b = SimulatedBackend(8, clock=clock)
    n = 2000
    started = time.perf_counter()
    for i in range(n):
        clock.t += 0.005
        b.read(i % 8, DEFAULTS)
    per_pass_us = (time.perf_counter() - started) / n * 1e6
    print(f"SimulatedBackend.read per GPU pass: {per_pass_us:.1f} us")
    assert per_pass_us < 2000
