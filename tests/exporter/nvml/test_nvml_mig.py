"""NvmlBackend on an A100-like MIG layout: GPU instance 1 (3g, two compute instances) and GPU
instance 2 (4g, one), profile memory from nvmlDeviceAttributes_t.memorySizeMB (nvml.h), as DCGM
names profiles: "<slices>g.<ceil(memorySizeMB / 1024)>gb" (DcgmCacheManager.cpp)."""

from __future__ import annotations

import pytest

from exporter.backend import Entity
from exporter.fields import DEFAULT_FIELDS
from exporter.nvml.backend import NvmlBackend
from tests.exporter.fake_pynvml import FakeNvml

DEFAULTS = frozenset(DEFAULT_FIELDS)
# (gi, slices, profile memorySizeMB, ci): the driver reports ~1 GiB less memory than the profile
A100 = {0: [(1, 3, 40192, 0), (1, 3, 40192, 1), (2, 4, 40192, 0)]}


def make() -> tuple[FakeNvml, NvmlBackend]:
    fake = FakeNvml(n_gpus=2, mig=A100)
    return fake, NvmlBackend(fake, clock=fake.clock)


def test_gpu_instance_with_two_compute_instances_is_one_entity_with_both_mig_uuids() -> None:
    _fake, b = make()
    try:
        mig = b.devices()[0].mig
        assert [m.gpu_instance_id for m in mig] == [1, 2]
        assert len(mig[0].uuids) == 2 and mig[0].uuid == mig[0].uuids[0]
        assert len(set(mig[0].uuids + mig[1].uuids)) == 3
    finally:
        b.close()


def test_profile_is_named_from_the_profile_memory_not_the_rounded_memory_total() -> None:
    _fake, b = make()
    try:
        # memory total is 39168 MiB (38.25 GiB -> "39gb"); DCGM's name uses 40192 MiB -> 40
        assert [m.profile for m in b.devices()[0].mig] == ["3g.40gb", "4g.40gb"]
    finally:
        b.close()


def test_profile_name_falls_back_to_mig_device_attributes_without_profile_calls() -> None:
    fake = FakeNvml(n_gpus=1, mig={0: [(7, 1, 11008, 0)]})
    fake.profiles = False  # nvmlGpuInstanceGetInfo / ...ProfileInfo answer NOT_SUPPORTED
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        assert b.devices()[0].mig[0].profile == "1g.10gb"  # the device's 9984 MiB: the best NVML gives
    finally:
        b.close()


def test_profile_names_are_computed_once_per_gpu_instance_not_every_pass() -> None:
    fake, b = make()
    try:
        before = fake.calls["nvmlDeviceGetGpuInstanceProfileInfo"]
        for _ in range(3):
            fake.now += 5.0
            b.read(0, DEFAULTS)
        assert fake.calls["nvmlDeviceGetGpuInstanceProfileInfo"] == before
    finally:
        b.close()


def test_h100_nvl_small_profile_is_named_like_dcgm_1g_11gb() -> None:
    fake = FakeNvml(n_gpus=1, mig={0: [(7, 1, 11008, 0)]})  # dcgm-exporter #544: "1g.11gb"
    b = NvmlBackend(fake, clock=fake.clock)
    try:
        assert b.devices()[0].mig[0].profile == "1g.11gb"
    finally:
        b.close()


def test_mig_read_returns_gpu_wide_values_and_per_instance_fb_once_per_gpu_instance() -> None:
    fake, b = make()
    try:
        out = {}
        for _ in range(2):
            fake.now += 5.0
            out = b.read(0, DEFAULTS)
        assert set(out) == {Entity(0), Entity(0, 1), Entity(0, 2)}
        assert out[Entity(0)]["DCGM_FI_DEV_SM_CLOCK"] == 1440
        assert out[Entity(0, 1)]["DCGM_FI_DEV_FB_USED"] + out[Entity(0, 1)]["DCGM_FI_DEV_FB_FREE"] == 39168
    finally:
        b.close()


def test_mig_layout_change_is_seen_on_the_next_pass_without_restart() -> None:
    fake, b = make()
    try:
        fake.now += 5.0
        b.read(0, DEFAULTS)
        fake.mig[0] = [(5, 7, 80896, 0)]  # reconfigured to one 7g instance
        fake.now += 5.0
        out = b.read(0, DEFAULTS)
        assert set(out) == {Entity(0), Entity(0, 5)}
        assert [m.profile for m in b.devices()[0].mig] == ["7g.79gb"]
        fake.mig.pop(0)  # MIG mode off
        fake.now += 5.0
        assert set(b.read(0, DEFAULTS)) == {Entity(0)}
        assert b.devices()[0].mig == ()
    finally:
        b.close()


def test_mig_xid_names_the_gpu_instance_and_a_gpu_wide_xid_does_not() -> None:
    fake, b = make()
    try:
        fake.xids += [(0, 31, 2), (1, 79)]
        assert b.wait_xid(1.0) == [(0, 31, 2), (1, 79)]
    finally:
        b.close()


@pytest.mark.parametrize("gi", [1, 2])
def test_gpm_per_instance_is_sampled_per_gpu_instance(gi: int) -> None:
    fake, b = make()
    try:
        b.supported_fields(0, DEFAULTS)
        for _ in range(2):
            fake.now += 5.0
            out = b.read(0, DEFAULTS)
        assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in out[Entity(0, gi)]
    finally:
        b.close()


def test_fb_used_percent_alone_is_read_per_gpu_instance_from_its_mig_device() -> None:
    # FB_USED_PERCENT is per instance (the collector drops the parent's aggregate on MIG), so a
    # counters file asking for it alone must still get each instance's own value.
    fake, b = make()
    try:
        wanted = frozenset({"DCGM_FI_DEV_FB_USED_PERCENT"})
        b.supported_fields(0, wanted)
        out = b.read(0, wanted)
        for gi in (1, 2):
            assert out[Entity(0, gi)]["DCGM_FI_DEV_FB_USED_PERCENT"] == pytest.approx(0.25)
        assert fake.calls["nvmlDeviceGetMemoryInfo"] >= 2
    finally:
        b.close()


def test_gpm_probe_on_a_mig_gpu_whose_parent_sample_fails_uses_a_gpu_instance_sample() -> None:
    # nvml.h documents nvmlGpmSampleGet's errors only as "Nonzero NVML_ERROR_?"; DCGM samples MIG
    # GPUs per GPU instance (nvmlGpmMigSampleGet). A parent sample that fails must not take the
    # PROF fields away from every instance of the GPU.
    fake, b = make()
    fake.fail["nvmlGpmSampleGet"] = 3  # NVML_ERROR_NOT_SUPPORTED on the MIG-enabled parent
    try:
        assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in b.supported_fields(0, DEFAULTS)
        fake.now += 5.0
        out = b.read(0, DEFAULTS)
        for gi in (1, 2):
            assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in out[Entity(0, gi)]
    finally:
        b.close()


def test_gpm_refused_on_a_mig_gpu_instance_is_reported_unavailable_not_supported() -> None:
    fake, b = make()
    fake.fail["nvmlGpmSampleGet"] = 3
    fake.gpm_refused = True
    try:
        assert not {f for f in b.supported_fields(0, DEFAULTS) if f.startswith("DCGM_FI_PROF_")}
        assert set(b.unavailable(0).values()) == {"NO_PERMISSION"}
    finally:
        b.close()


def test_unprivileged_mig_gpu_whose_parent_refuses_memory_info_keeps_each_instances_fb() -> None:
    # nvml.h (nvmlDeviceGetMemoryInfo): in MIG mode the parent handle answers only to privileged
    # callers; per-instance information comes from the MIG device handles.
    fake, b = make()
    fake.unprivileged = True
    try:
        assert "DCGM_FI_DEV_FB_USED" in b.supported_fields(0, DEFAULTS)
        out = b.read(0, DEFAULTS)
        assert [out[Entity(0, gi)]["DCGM_FI_DEV_FB_USED"] for gi in (1, 2)] == [39168 // 4, 39168 // 4]
        assert "DCGM_FI_DEV_FB_USED" not in out[Entity(0)]
    finally:
        b.close()
