"""Opening a GPU through NVML: its facts (UUID, bus id, name, minor) and MIG layout, and the nvml.h
error codes that mean the GPU, or the library, no longer answers."""

from __future__ import annotations

import math
from typing import Any

from exporter.backend import DeviceInfo, MigInstance
from exporter.nvml.fields import MIB, as_str

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

def dcgm_profile_name(nvml: Any, h: Any, gi: int) -> str | None:
    """GPU_I_PROFILE as DCGM builds it (DcgmCacheManager.cpp: "<sliceCount>g.<ceil(memorySizeMB /
    1024)>gb" of the GPU instance's nvmlGpuInstanceProfileInfo_t): the GI's profile id from
    nvmlGpuInstanceGetInfo, matched against nvmlDeviceGetGpuInstanceProfileInfo over the profile
    indices. None when NVML does not answer that way (the caller falls back)."""
    try:
        profile_id = int(nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(h, gi)).profileId)
    except nvml.NVMLError:
        return None
    for index in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        except nvml.NVMLError:
            continue
        if int(info.id) == profile_id:
            return f"{int(info.sliceCount)}g.{math.ceil(int(info.memorySizeMB) / 1024)}gb"
    return None


def mig_layout(
    nvml: Any, h: Any, previous: tuple[MigInstance, ...] = ()
) -> tuple[tuple[MigInstance, ...], dict[int, Any]]:
    """GPU instances, one per GI id: a GPU instance with several compute instances (several
    MIG devices with the same GI id) is one entity holding every compute instance's UUID. The
    profile name (``dcgm_profile_name``, else from nvmlDeviceAttributes_t of the MIG device) is
    computed once per GPU instance: an instance in ``previous`` with the same id and UUIDs keeps it."""
    n = nvml
    try:
        current, _pending = n.nvmlDeviceGetMigMode(h)
    except nvml.NVMLError as exc:
        if error_name(n, exc) in DOWN_ERRORS:
            raise
        return (), {}
    if current != 1:
        return (), {}
    found: dict[int, list[tuple[int, str, Any]]] = {}
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
        found.setdefault(gi, []).append((ci, as_str(n.nvmlDeviceGetUUID(mh)), mh))
    known = {(m.gpu_instance_id, m.all_uuids()): m.profile for m in previous}
    instances: list[MigInstance] = []
    handles: dict[int, Any] = {}
    for gi in sorted(found):
        cis = sorted(found[gi], key=lambda c: c[0])
        uuids = tuple(c[1] for c in cis)
        profile = known.get((gi, uuids)) or dcgm_profile_name(n, h, gi) or _attributes_profile(n, cis[0][2])
        instances.append(MigInstance(gi, profile, uuids[0], uuids))
        handles[gi] = cis[0][2]
    return tuple(instances), handles


def _attributes_profile(nvml: Any, mh: Any) -> str:
    attrs = nvml.nvmlDeviceGetAttributes(mh)
    mem_mb = getattr(attrs, "memorySizeMB", 0) or nvml.nvmlDeviceGetMemoryInfo(mh).total // MIB
    return f"{int(attrs.gpuInstanceSliceCount)}g.{math.ceil(mem_mb / 1024)}gb"
