"""Opening a GPU through NVML: its facts (UUID, bus id, name, minor) and MIG layout, and the nvml.h
error codes that mean the GPU, or the library, no longer answers."""

from __future__ import annotations

import math
from typing import Any

from exporter.backend import DeviceInfo, MigInstance
from exporter.nvml_fields import MIB, as_str, error_name

# nvml.h return codes after which the GPU (or the whole library) no longer answers
DOWN_ERRORS = frozenset(
    {"GPU_IS_LOST", "RESET_REQUIRED", "UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH"}
)
# ... and after which NVML must be initialised again (driver reloaded or upgraded)
REINIT_ERRORS = frozenset({"UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH"})
NO_GI = 0xFFFFFFFF  # nvmlEventData_t.gpuInstanceId when the event is not about one GPU instance


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
