"""Compute processes and NVLink P2P status through NVML, for ``gpu_exporter_compute_processes`` and
``DCGM_EXP_P2P_STATUS``.

``compute_processes``: per entity (the GPU, or each MIG GPU instance through its MIG device handle,
as nvml.h says per-instance information needs the MIG handle) the number of distinct PIDs
``nvmlDeviceGetComputeRunningProcesses`` (v3) lists and the framebuffer used (MiB,
``nvmlDeviceGetMemoryInfo_v2``; 0 when unknown) that
:class:`exporter.processes.Visibility` compares it with. An entity whose calls fail is left out.
``p2p_status``: ``nvmlDeviceGetP2PStatus(NVLINK)`` to every other GPU; an NVML error there reads as
NOT_SUPPORTED (5), as DCGM reports a pair it cannot query.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.backend import Entity
from exporter.nvml.fields import memory_v2
from exporter.processes import ProcessCount

__all__ = ["NOT_SUPPORTED", "ProcessCount", "compute_processes", "p2p_status"]

NOT_SUPPORTED = 5  # nvmlGpuP2PStatus_t NVML_P2P_STATUS_NOT_SUPPORTED


def compute_processes(nvml: Any, gpu: int, handle: Any, mig_handles: Mapping[int, Any]) -> dict[Entity, ProcessCount]:
    if handle is None:
        return {}
    targets = [(Entity(gpu, gi), mh) for gi, mh in sorted(mig_handles.items())] or [(Entity(gpu), handle)]
    out: dict[Entity, ProcessCount] = {}
    for entity, h in targets:
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        except nvml.NVMLError:
            continue
        try:  # v2: used without the driver's reserved memory (v1 counts it, ~0.5 GiB on an idle H100)
            used = int(memory_v2(nvml, h)["DCGM_FI_DEV_FB_USED"])
        except (nvml.NVMLError, KeyError):
            used = 0  # unknown: never suspected blind
        out[entity] = ProcessCount(len({int(p.pid) for p in procs}), used)
    return out


def p2p_status(nvml: Any, gpu: int, handles: Mapping[int, Any]) -> dict[int, int]:
    mine = handles.get(gpu)
    if mine is None:
        return {}
    out: dict[int, int] = {}
    for peer, h in sorted(handles.items()):
        if peer == gpu or h is None:
            continue
        try:
            out[peer] = int(nvml.nvmlDeviceGetP2PStatus(mine, h, nvml.NVML_P2P_CAPS_INDEX_NVLINK))
        except nvml.NVMLError:
            out[peer] = NOT_SUPPORTED
    return out
