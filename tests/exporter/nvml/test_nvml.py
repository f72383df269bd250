"""NvmlBackend against a fake pynvml replaying the recorded H200."""

from __future__ import annotations

import builtins
import sys
from typing import Any

import pynvml
import pytest

from exporter.backend import BackendError, Entity, GpuBackend, GpuLostError
from exporter.fields import DEFAULT_FIELDS, FIELDS
from exporter.nvml.backend import NvmlBackend
from tests.exporter.fake_pynvml import MIB, REC, FakeNvml

DEFAULTS = frozenset(DEFAULT_FIELDS)
ALL = frozenset(FIELDS)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(n_gpus=2)


@pytest.fixture
def backend(fake: FakeNvml) -> Any:
    b = NvmlBackend(fake, clock=fake.clock)
    yield b
    b.close()


def passes(b: NvmlBackend, fake: FakeNvml, gpu: int, fields: frozenset[str], n: int = 2) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(n):
        fake.now += 5.0
        out = dict(b.read(gpu, fields)[Entity(gpu)])
    return out


def test_implements_protocol_and_reads_static_devices(backend: NvmlBackend) -> None:
    typed: GpuBackend = backend
    assert typed.driver_version() == "580.159.04"
    devs = backend.devices()
    assert [d.index for d in devs] == [0, 1]
    assert devs[0].name == "NVIDIA H200"
    assert devs[0].pci_bus_id == "00000000:18:00.0"  # bytes decoded
    assert devs[0].uuid != devs[1].uuid and devs[0].uuid.startswith("GPU-")
    assert devs[0].mig == ()


def test_static_values_are_read_once_not_per_pass(fake: FakeNvml, backend: NvmlBackend) -> None:
    passes(backend, fake, 0, ALL, n=5)
    assert fake.calls["nvmlDeviceGetName"] == 2  # once per GPU at start
    assert fake.calls["nvmlDeviceGetUUID"] == 2
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 2  # SM and MEM, probe of GPU 0 only
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == 2
    assert fake.calls["nvmlSystemGetDriverVersion"] == 1
    # issue 7: the MIG mode is checked every pass (one cheap call) so a reconfigured GPU is seen
    assert fake.calls["nvmlDeviceGetMigMode"] == 2 + 5
    assert fake.calls["nvmlDeviceGetMinorNumber"] == 2


def test_one_field_values_batch_per_pass_and_never_pcie_throughput(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    backend.supported_fields(0, ALL)
    before = fake.calls["nvmlDeviceGetFieldValues"]
    for _ in range(4):
        fake.now += 5.0
        backend.read(0, DEFAULTS)
    assert fake.calls["nvmlDeviceGetFieldValues"] - before == 4
    last = fake.field_requests[-1]
    assert set(last) == {
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        pynvml.NVML_FI_DEV_REMAPPED_COR,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
    }  # only what the default set needs
    passes(backend, fake, 0, ALL, n=3)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0


def test_default_fields_in_dcgm_units(fake: FakeNvml, backend: NvmlBackend) -> None:
    v = passes(backend, fake, 0, DEFAULTS)
    load = REC["load"]
    assert v["DCGM_FI_DEV_GPU_UTIL"] == 99 and v["DCGM_FI_DEV_MEM_COPY_UTIL"] == 23
    assert v["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(686.982)
    assert isinstance(v["DCGM_FI_DEV_POWER_USAGE"], float)
    assert v["DCGM_FI_DEV_GPU_TEMP"] == 56 and v["DCGM_FI_DEV_MEMORY_TEMP"] == 43
    assert v["DCGM_FI_DEV_SM_CLOCK"] == 1440 and v["DCGM_FI_DEV_MEM_CLOCK"] == 3201
    assert v["DCGM_FI_DEV_FB_USED"] == load["memory_v2"]["used"] // MIB == 19956
    assert v["DCGM_FI_DEV_FB_FREE"] == load["memory_v2"]["free"] // MIB
    assert v["DCGM_FI_DEV_FB_RESERVED"] == 615
    assert v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == load["energy_mj"] + int(10.0 * load["power_mw"])
    assert v["DCGM_FI_DEV_ENC_UTIL"] == 0 and v["DCGM_FI_DEV_DEC_UTIL"] == 0
    assert v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 0
    assert v["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 0 and v["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0
    for name, value in v.items():
        assert isinstance(value, int) is FIELDS[name].integer, name


def test_gpm_ratios_and_bytes_are_converted_from_the_probe_sample_and_the_next(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    backend.supported_fields(0, ALL)  # issue 7: the probe takes the first sample (permission check)
    assert fake.calls["nvmlGpmSampleGet"] == 1 and fake.calls["nvmlGpmMetricsGet"] == 0
    fake.now += 5.0
    v = backend.read(0, DEFAULTS)[Entity(0)]
    gpm = REC["gpm"]["training"]
    assert v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(gpm["GRAPHICS_UTIL"] / 100)
    assert v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == pytest.approx(gpm["ANY_TENSOR_UTIL"] / 100)
    assert v["DCGM_FI_PROF_DRAM_ACTIVE"] == pytest.approx(gpm["DRAM_BW_UTIL"] / 100)
    assert v["DCGM_FI_PROF_PCIE_TX_BYTES"] == int(gpm["PCIE_TX_PER_SEC"] * MIB)
    assert isinstance(v["DCGM_FI_PROF_PCIE_RX_BYTES"], int)
    assert fake.calls["nvmlGpmSampleAlloc"] == 2  # two buffers, allocated once
    assert fake.calls["nvmlGpmSampleGet"] == 2  # one new sample per pass
    assert fake.calls["nvmlGpmMetricsGet"] == 1
    fake.now += 5.0
    backend.read(0, DEFAULTS)
    assert fake.calls["nvmlGpmSampleAlloc"] == 2 and fake.calls["nvmlGpmSampleGet"] == 3


def test_unsupported_fields_are_absent_and_not_listed(fake: FakeNvml, backend: NvmlBackend) -> None:
    supported = backend.supported_fields(0, ALL)
    for absent in (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_FAN_SPEED",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_DEV_OEM_INFOROM_VER",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    ):
        assert absent not in supported
    assert "DCGM_FI_DEV_XID_ERRORS" in supported and "DCGM_FI_DRIVER_VERSION" in supported
    v = passes(backend, fake, 0, ALL, n=3)
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in v and "DCGM_FI_DEV_FAN_SPEED" not in v
    assert "DCGM_FI_DEV_XID_ERRORS" not in v  # owned by the XID watcher
    assert "DCGM_FI_DRIVER_VERSION" not in v  # labels come from labels()
    assert set(v) <= supported
    assert backend.labels(0)["DCGM_FI_DRIVER_VERSION"] == "580.159.04"
    assert backend.labels(0)["DCGM_FI_DEV_VBIOS_VERSION"] == "96.00.A5.00.1A"


def test_pcie_throughput_comes_from_byte_counters_as_kb_per_s(fake: FakeNvml, backend: NvmlBackend) -> None:
    fields = frozenset({"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"})
    v = passes(backend, fake, 0, fields, n=2)
    assert v["DCGM_FI_DEV_PCIE_TX_THROUGHPUT"] == 5 * 1024  # 5 MiB/s in KB/s
    assert v["DCGM_FI_DEV_PCIE_RX_THROUGHPUT"] == 13 * 1024
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


@pytest.mark.parametrize("mode", ["lost", "unknown"])
def test_lost_gpu_raises_gpu_lost_only_for_that_gpu(fake: FakeNvml, backend: NvmlBackend, mode: str) -> None:
    passes(backend, fake, 0, DEFAULTS)
    getattr(fake, mode).add(1)
    with pytest.raises(GpuLostError) as info:
        backend.read(1, DEFAULTS)
    assert info.value.gpu == 1
    assert backend.read(0, DEFAULTS)[Entity(0)]["DCGM_FI_DEV_GPU_UTIL"] == 99


def test_one_failing_getter_leaves_only_its_fields_absent(fake: FakeNvml, backend: NvmlBackend) -> None:
    passes(backend, fake, 0, DEFAULTS)
    fake.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    v = passes(backend, fake, 0, DEFAULTS, n=1)
    assert "DCGM_FI_DEV_POWER_USAGE" not in v and v["DCGM_FI_DEV_GPU_TEMP"] == 56


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "permission"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "different versions"),
    ],
)
def test_no_library_or_driver_is_a_backend_error_with_a_hint(code: int, needle: str) -> None:
    fake = FakeNvml()
    fake.init_error = code
    with pytest.raises(BackendError, match=needle):
        NvmlBackend(fake, clock=fake.clock)


def test_missing_pynvml_module_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(BackendError, match="nvidia-ml-py"):
        NvmlBackend()


def test_real_pynvml_without_a_driver_is_a_backend_error() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        with pytest.raises(BackendError, match=r"NVML|driver"):
            NvmlBackend()
    else:  # a machine with a GPU: the real backend starts
        pynvml.nvmlShutdown()
        b = NvmlBackend()
        assert b.driver_version()
        b.close()


def test_xid_events_map_device_to_index_and_timeout_is_empty(fake: FakeNvml, backend: NvmlBackend) -> None:
    assert fake.registered == [0, 1]
    assert backend.wait_xid(0.01) == []
    fake.xids += [(1, 79), (0, 48)]
    assert backend.wait_xid(1.0) == [(1, 79), (0, 48)]
    assert backend.wait_xid(0.0) == []


def test_mig_instances_are_enumerated_with_dcgm_profiles_and_read_per_instance() -> None:
    fake = FakeNvml(n_gpus=1, mig={0: [(2, 3, 71), (3, 2, 35), (9, 1, 18)]})
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        mig = b.devices()[0].mig
        assert [(m.gpu_instance_id, m.profile) for m in mig] == [
            (2, "3g.71gb"),
            (3, "2g.35gb"),
            (9, "1g.18gb"),
        ]
        assert all(m.uuid.startswith("MIG-") for m in mig)
        out: Any = {}
        for _ in range(2):
            fake.now += 5.0
            out = b.read(0, DEFAULTS)
        assert set(out) == {Entity(0), Entity(0, 2), Entity(0, 3), Entity(0, 9)}
        parent = out[Entity(0)]
        assert "DCGM_FI_DEV_GPU_UTIL" not in parent  # NVML: not supported in MIG mode
        assert parent["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(686.982)
        inst = out[Entity(0, 3)]
        assert inst["DCGM_FI_DEV_FB_USED"] + inst["DCGM_FI_DEV_FB_FREE"] == 35 * 1024 - 300
        gr = REC["gpm"]["training"]["GRAPHICS_UTIL"]
        assert inst["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(gr / 200)
        assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in inst  # PCIe stays GPU-wide
        assert fake.calls["nvmlGpmMigSampleGet"] == 6
    finally:
        b.close()


def test_close_frees_gpm_samples_and_shuts_nvml_down(fake: FakeNvml) -> None:
    b = NvmlBackend(fake, clock=fake.clock)
    passes(b, fake, 0, DEFAULTS)
    b.close()
    b.close()
    assert fake.calls["nvmlGpmSampleFree"] == 2
    assert fake.calls["nvmlShutdown"] == 1
    assert b.wait_xid(0.0) == []


def test_last_pass_cost_is_recorded_per_gpu(fake: FakeNvml, backend: NvmlBackend) -> None:
    passes(backend, fake, 1, DEFAULTS)
    assert set(backend.last_pass_us) == {1}
    assert 0 < backend.last_pass_us[1] < 50_000


# --- issue 7: GPM permission and pacing, parity with DCGM ------------------------------------------


def test_gpm_refused_is_warned_once_with_the_fix_and_listed_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(n_gpus=2)
    fake.gpm_refused = True  # NVreg_RestrictProfilingToAdminUsers=1 and no CAP_SYS_ADMIN
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        with caplog.at_level("WARNING"):
            sup0 = b.supported_fields(0, ALL)
            b.supported_fields(1, ALL)
        assert not any(f.startswith("DCGM_FI_PROF_") for f in sup0)
        warned = [r.getMessage() for r in caplog.records if "NO_PERMISSION" in r.getMessage()]
        assert len(warned) == 1
        assert "CAP_SYS_ADMIN" in warned[0] and "NVreg_RestrictProfilingToAdminUsers=0" in warned[0]
        assert b.unavailable(0)["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == "NO_PERMISSION"
        assert b.unavailable(1)["DCGM_FI_PROF_PCIE_TX_BYTES"] == "NO_PERMISSION"
        assert "DCGM_FI_DEV_GPU_UTIL" not in b.unavailable(0)
    finally:
        b.close()


def test_gpm_new_sample_only_when_the_previous_is_one_interval_old(fake: FakeNvml) -> None:
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        b.set_interval(5.0)
        b.supported_fields(0, ALL)  # the probe's sample is the first one
        taken = fake.calls["nvmlGpmSampleGet"]
        fake.now += 0.01  # cli's first cycle right after the probe
        first = b.read(0, DEFAULTS)[Entity(0)]
        assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in first  # no ratio from samples 10 ms apart
        assert fake.calls["nvmlGpmSampleGet"] == taken
        fake.now += 5.0
        v = b.read(0, DEFAULTS)[Entity(0)]
        assert v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(REC["gpm"]["training"]["GRAPHICS_UTIL"] / 100)
        fake.now += 0.2  # an XID wake-up: the last ratio is served again, no new sample
        again = b.read(0, DEFAULTS)[Entity(0)]
        assert again["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
        assert fake.calls["nvmlGpmSampleGet"] == taken + 1
    finally:
        b.close()


def test_nvlink_bandwidth_uses_dcgm_arithmetic_and_is_zero_in_the_first_cycle() -> None:
    fake = FakeNvml(n_gpus=1, nvlink=True)
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        f = frozenset({"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"})
        assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in b.supported_fields(0, f)
        fake.now += 5.0
        assert b.read(0, f)[Entity(0)]["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 0
        fake.now += 5.0
        # DCGM: (KiB delta / seconds) / 1000 = (4000 KiB/s) / 1000
        assert b.read(0, f)[Entity(0)]["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 4
    finally:
        b.close()


def test_nvlink_zero_nvml_timestamp_is_replaced_by_now() -> None:
    fake = FakeNvml(n_gpus=1, nvlink=True)
    fake.zero_timestamps = True
    b = NvmlBackend(fake, clock=fake.clock, wall_clock=fake.clock)
    try:
        f = frozenset({"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"})
        fake.now += 5.0
        b.read(0, f)
        fake.now += 5.0
        assert b.read(0, f)[Entity(0)]["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 4
    finally:
        b.close()


def test_memory_temp_is_read_as_unsigned_int_whatever_type_r545_claims() -> None:
    fake = FakeNvml(n_gpus=1)
    fake.memory_temp_type = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        assert passes(b, fake, 0, DEFAULTS)["DCGM_FI_DEV_MEMORY_TEMP"] == 43
    finally:
        b.close()


def test_brand_label_is_dcgms_string_not_the_nvml_enum_number(backend: NvmlBackend) -> None:
    assert backend.labels(0)["DCGM_FI_DEV_BRAND"] == "NVIDIA"  # NVML_BRAND_NVIDIA = 14


@pytest.mark.parametrize(
    ("brand", "text"),
    [(pynvml.NVML_BRAND_GRID, "Grid"), (pynvml.NVML_BRAND_TESLA, "Tesla"),
     (pynvml.NVML_BRAND_NVIDIA_VGAMING, "NVIDIA vGaming"),
     (pynvml.NVML_BRAND_NVIDIA_VCS, "NVIDIA Virtual Compute Server"),
     (99, "Unknown")],
)
def test_brand_strings_follow_dcgm_cache_manager(brand: int, text: str) -> None:
    from exporter.nvml.fields import brand_name

    assert brand_name(brand) == text


def test_pre_r510_driver_without_memory_info_v2_falls_back_to_v1_for_whole_gpus() -> None:
    fake = FakeNvml(n_gpus=1)
    fake.pre_r510 = True  # nvmlDeviceGetMemoryInfo_v2 missing: FUNCTION_NOT_FOUND
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        assert {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"} <= b.supported_fields(0, DEFAULTS)
        v = passes(b, fake, 0, DEFAULTS)
        m = REC["load"]["memory_v2"]
        assert v["DCGM_FI_DEV_FB_FREE"] == m["free"] // MIB
        assert v["DCGM_FI_DEV_FB_USED"] == (m["total"] - m["free"]) // MIB
        assert v["DCGM_FI_DEV_FB_RESERVED"] == 0
    finally:
        b.close()


def test_xid_events_unavailable_are_said_and_the_field_is_not_supported(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(n_gpus=1)
    fake.fail["nvmlEventSetCreate"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    with caplog.at_level("WARNING"):
        b = NvmlBackend(fake, clock=fake.clock)
    try:
        assert "DCGM_FI_DEV_XID_ERRORS" not in b.supported_fields(0, ALL)
        assert any("XID" in r.getMessage() and "not published" in r.getMessage() for r in caplog.records)
    finally:
        b.close()
