"""NvmlBackend fault handling: a failure stays local to the GPU that has it (issue 7).

Error codes are nvml.h's: RESET_REQUIRED (16), GPU_IS_LOST (15), UNINITIALIZED (1),
DRIVER_NOT_LOADED (9), LIB_RM_VERSION_MISMATCH (18), NO_PERMISSION (4), FUNCTION_NOT_FOUND (13).
"""

from __future__ import annotations

import threading
from typing import Any

import pynvml
import pytest

from exporter.backend import BackendError, Entity, GpuLostError
from exporter.fields import DEFAULT_FIELDS
from exporter.nvml.backend import NvmlBackend
from tests.exporter.fake_pynvml import FakeNvml

DEFAULTS = frozenset(DEFAULT_FIELDS)


def backend(fake: FakeNvml) -> NvmlBackend:
    return NvmlBackend(fake, clock=fake.clock)


def test_fake_answers_not_supported_for_any_nvml_call_it_does_not_implement() -> None:
    fake = FakeNvml()
    with pytest.raises(pynvml.NVMLError) as info:
        fake.nvmlDeviceGetPowerManagementDefaultLimit(object())
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(AttributeError):
        _ = fake.not_an_nvml_name


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST"),
        (pynvml.NVML_ERROR_UNKNOWN, "UNKNOWN"),
        (pynvml.NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NO_PERMISSION"),
        (pynvml.NVML_ERROR_INSUFFICIENT_POWER, "INSUFFICIENT_POWER"),
    ],
)
def test_gpu_whose_handle_fails_at_start_is_listed_down_and_others_served(code: int, reason: str) -> None:
    fake = FakeNvml(n_gpus=3)
    fake.handle_error[1] = code
    b = backend(fake)
    try:
        devs = b.devices()
        assert [d.index for d in devs] == [0, 1, 2]
        assert devs[1].problem.startswith(reason) and devs[0].problem == "" == devs[2].problem
        assert b.supported_fields(1, DEFAULTS) == set()  # cli probes every GPU: never raises
        with pytest.raises(GpuLostError, match=reason):
            b.read(1, DEFAULTS)
        fake.now += 5.0
        assert b.read(0, DEFAULTS)[Entity(0)]["DCGM_FI_DEV_GPU_TEMP"] == 56
    finally:
        b.close()


def test_gpu_failing_while_probed_at_start_is_down_not_fatal() -> None:
    fake = FakeNvml(n_gpus=2)
    fake.broken[0] = pynvml.NVML_ERROR_RESET_REQUIRED  # handle fine, every call on it fails
    b = backend(fake)
    try:
        assert b.devices()[0].problem.startswith("RESET_REQUIRED")
        assert b.supported_fields(0, DEFAULTS) == set()
        assert "DCGM_FI_DEV_GPU_TEMP" in b.supported_fields(1, DEFAULTS)
    finally:
        b.close()


def test_gpu_lost_at_start_comes_back_by_index_with_full_device_info_and_is_probed() -> None:
    fake = FakeNvml(n_gpus=2)
    fake.broken[1] = pynvml.NVML_ERROR_GPU_IS_LOST
    b = backend(fake)
    try:
        with pytest.raises(GpuLostError, match="GPU_IS_LOST"):
            b.read(1, DEFAULTS)
        del fake.broken[1]
        fake.now += 5.0
        out = b.read(1, DEFAULTS)
        assert out[Entity(1)]["DCGM_FI_DEV_GPU_TEMP"] == 56
        d = b.devices()[1]
        assert d.problem == "" and d.name == "NVIDIA H200" and d.uuid.startswith("GPU-")
        assert "DCGM_FI_DEV_GPU_TEMP" in b.supported_fields(1, DEFAULTS)
    finally:
        b.close()


def test_nvml_that_cannot_list_gpus_is_the_only_fatal_case() -> None:
    fake = FakeNvml(n_gpus=2)
    fake.fail["nvmlDeviceGetCount"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(BackendError, match="listing the GPUs"):
        backend(fake)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST"),
        (pynvml.NVML_ERROR_UNINITIALIZED, "UNINITIALIZED"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LIB_RM_VERSION_MISMATCH"),
    ],
)
def test_mid_run_gpu_wide_error_marks_only_that_gpu_down_not_up_and_empty(code: int, reason: str) -> None:
    fake = FakeNvml(n_gpus=2)
    b = backend(fake)
    try:
        fake.now += 5.0
        b.read(1, DEFAULTS)
        fake.broken[1] = code
        fake.now += 5.0
        with pytest.raises(GpuLostError, match=reason) as info:
            b.read(1, DEFAULTS)
        assert info.value.gpu == 1 and info.value.reason.startswith(reason)
        assert b.read(0, DEFAULTS)[Entity(0)]["DCGM_FI_DEV_GPU_TEMP"] == 56
    finally:
        b.close()


def test_reset_required_mid_run_then_recovers_with_a_handle_reacquired_by_uuid() -> None:
    fake = FakeNvml(n_gpus=2)
    b = backend(fake)
    try:
        fake.now += 5.0
        b.read(1, DEFAULTS)
        fake.broken[1] = pynvml.NVML_ERROR_RESET_REQUIRED
        for _ in range(2):
            fake.now += 5.0
            with pytest.raises(GpuLostError, match="RESET_REQUIRED"):
                b.read(1, DEFAULTS)
        del fake.broken[1]
        before = fake.calls["nvmlDeviceGetHandleByUUID"]
        fake.now += 5.0
        v = b.read(1, DEFAULTS)[Entity(1)]
        assert v["DCGM_FI_DEV_GPU_TEMP"] == 56 and v["DCGM_FI_DEV_FB_USED"] > 0
        assert fake.calls["nvmlDeviceGetHandleByUUID"] == before + 1
    finally:
        b.close()


def test_driver_reload_reinitialises_nvml_and_every_gpu_recovers_without_restart() -> None:
    fake = FakeNvml(n_gpus=2)
    b = backend(fake)
    try:
        fake.now += 5.0
        b.read(0, DEFAULTS)
        fake.driver_reload()
        fake.now += 5.0
        with pytest.raises(GpuLostError, match="UNINITIALIZED"):
            b.read(0, DEFAULTS)
        inits = fake.calls["nvmlInit"]
        fake.now += 5.0
        assert b.read(0, DEFAULTS)[Entity(0)]["DCGM_FI_DEV_GPU_TEMP"] == 56
        assert b.read(1, DEFAULTS)[Entity(1)]["DCGM_FI_DEV_GPU_TEMP"] == 56  # new handles, no old ones
        assert fake.calls["nvmlInit"] == inits + 1  # once for the node, not once per GPU
    finally:
        b.close()


def test_a_hung_call_blocks_only_its_own_gpu_read() -> None:
    fake = FakeNvml(n_gpus=2)
    b = backend(fake)
    gate = threading.Event()
    try:
        b.supported_fields(0, DEFAULTS)
        b.supported_fields(1, DEFAULTS)
        fake.hang[0] = gate
        done: list[Any] = []
        t = threading.Thread(target=lambda: done.append(b.read(0, DEFAULTS)), daemon=True)
        t.start()
        fake.now += 5.0
        assert b.read(1, DEFAULTS)[Entity(1)]["DCGM_FI_DEV_GPU_TEMP"] == 56
        assert not done
        gate.set()
        t.join(5)
        assert done
    finally:
        gate.set()
        b.close()


def test_parallel_reads_of_different_gpus_with_mig_relayouts_are_safe() -> None:
    """The collector reads GPUs on parallel threads: shared backend state must not break."""
    fake = FakeNvml(n_gpus=4, mig={0: [(1, 3, 40192, 0)], 2: [(1, 3, 40192, 0), (2, 4, 40192, 0)]})
    b = backend(fake)
    errors: list[BaseException] = []

    def worker(gpu: int) -> None:
        try:
            for i in range(40):
                fake.now += 0.5
                if gpu == 2:
                    fake.mig[2] = [(1, 3, 40192, 0)] if i % 2 else [(1, 3, 40192, 0), (2, 4, 40192, 0)]
                b.read(gpu, DEFAULTS)
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(g,)) for g in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
    finally:
        b.close()
