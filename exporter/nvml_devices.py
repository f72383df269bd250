"""Opening a GPU through NVML: its facts (UUID, bus id, name, minor) and MIG layout, and the nvml.h
error codes that mean the GPU, or the library, no longer answers."""

from __future__ import annotations

import math
from typing import Any

from exporter.backend import DeviceInfo, MigInstance
from exporter.nvml_fields import MIB, as_str

# nvml.h return codes after which the GPU (or the whole library) no longer answers
DOWN_ERRORS = frozenset(
    {"GPU_IS_LOST", "RESET_REQUIRED", "UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH"}
)
# ... and after which NVML must be initialised again (driver reloaded or upgraded)
REINIT_ERRORS = frozenset({"UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH"})
NO_GI = 0xFFFFFFFF  # nvmlEventData_t.gpuInstanceId when the event is not about one GPU instance


_ERROR_NAMES: dict[int, dict[int, str]] = {}  # id(pynvml module) -> return code -> short name


def error_name(nvml: Any, exc: BaseException) -> str:
    """The short nvml.h name of an NVML error (``RESET_REQUIRED``), or the text when unknown."""
    names = _ERROR_NAMES.get(id(nvml))
    if names is None:
        names = _ERROR_NAMES[id(nvml)] = {
            getattr(nvml, n): n[len("NVML_ERROR_"):] for n in dir(nvml) if n.startswith("NVML_ERROR_")
        }
    code = getattr(exc, "value", None)
    return names.get(code, str(exc)) if isinstance(code, int) else str(exc)


def init_message(nvml: Any, exc: Any) -> str:
    """The hint for an ``nvmlInit`` failure: what to install or check for the usual error codes."""
    code = getattr(exc, "value", None)
    hints = {
        getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", -1): (
            "NVML library libnvidia-ml.so.1 not found: install the NVIDIA driver on the host; in a "
            "container run with the NVIDIA runtime (runtimeClassName: nvidia, NVIDIA_VISIBLE_DEVICES=all) "
            "so the driver libraries are mounted; or use --backend simulated"
        ),
        getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", -1): (
            "the NVIDIA kernel driver is not loaded: check `nvidia-smi` and `lsmod | grep nvidia` on the node"
        ),
        getattr(nvml, "NVML_ERROR_NO_PERMISSION", -1): (
            "no permission to open /dev/nvidia*: run as root or give the container the GPU devices"
        ),
        getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", -1): (
            "the NVML library and the kernel driver have different versions: reboot or reload the driver"
        ),
    }
    return hints.get(code, f"NVML initialisation failed: {exc}")


def device_info(nvml: Any, index: int, h: Any) -> tuple[DeviceInfo, dict[int, Any]]:
    """A GPU's facts and its MIG GPU-instance handles; GPU-wide errors propagate."""
    n = nvml
    uuid = as_str(n.nvmlDeviceGetUUID(h))
    pci = as_str(n.nvmlDeviceGetPciInfo(h).busId)
    name = as_str(n.nvmlDeviceGetName(h))
    try:
        minor = int(n.nvmlDeviceGetMinorNumber(h))
    except nvml.NVMLError as exc:
        if error_name(n, exc) in DOWN_ERRORS:
            raise
        minor = -1
    mig, handles = mig_layout(nvml, h)
    return DeviceInfo(index, uuid, pci, name, minor, mig), handles

def mig_layout(nvml: Any, h: Any) -> tuple[tuple[MigInstance, ...], dict[int, Any]]:
    """GPU instances, one per GI id: a GPU instance with several compute instances (several
    MIG devices with the same GI id) is one entity holding every compute instance's UUID.
    GPU_I_PROFILE as DCGM builds it: "<gpuInstanceSliceCount>g.<ceil(memorySizeMB / 1024)>gb"
    from nvmlDeviceAttributes_t (nvml.h), the profile's memory, not the rounded memory total."""
    n = nvml
    try:
        current, _pending = n.nvmlDeviceGetMigMode(h)
    except nvml.NVMLError as exc:
        if error_name(n, exc) in DOWN_ERRORS:
            raise
        return (), {}
    if current != 1:
        return (), {}
    found: dict[int, list[tuple[int, str, Any, str]]] = {}
    for slot in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
        try:
            mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except nvml.NVMLError:
            continue  # empty slot
        gi = int(n.nvmlDeviceGetGpuInstanceId(mh))
        try:
            ci = int(n.nvmlDeviceGetComputeInstanceId(mh))
        except nvml.NVMLError:
            ci = 0
        attrs = n.nvmlDeviceGetAttributes(mh)
        mem_mb = getattr(attrs, "memorySizeMB", 0) or n.nvmlDeviceGetMemoryInfo(mh).total // MIB
        profile = f"{int(attrs.gpuInstanceSliceCount)}g.{math.ceil(mem_mb / 1024)}gb"
        found.setdefault(gi, []).append((ci, as_str(n.nvmlDeviceGetUUID(mh)), mh, profile))
    instances: list[MigInstance] = []
    handles: dict[int, Any] = {}
    for gi in sorted(found):
        cis = sorted(found[gi], key=lambda c: c[0])
        uuids = tuple(c[1] for c in cis)
        instances.append(MigInstance(gi, cis[0][3], uuids[0], uuids))
        handles[gi] = cis[0][2]
    return tuple(instances), handles
