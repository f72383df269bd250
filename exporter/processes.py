"""``gpu_exporter_compute_processes``: how many compute processes run on each GPU / MIG instance.

The count comes from the backend's optional ``compute_processes(gpu)`` (NVML:
``nvmlDeviceGetComputeRunningProcesses``, v3 in nvidia-ml-py; a MIG GPU instance is asked through
its MIG device handle), deduplicated by PID; no PID is ever exported. The gauge carries the same
labels as the entity's DCGM series (pod attribution included), so rules join it like
``DCGM_FI_DEV_GPU_UTIL``.

Withheld when NVML cannot see other containers' processes. NVML answers with the processes of the
caller's PID namespace only: in a container without ``hostPID`` a GPU busy with another pod's job
lists none. That is detected, not guessed from configuration: an entity whose framebuffer holds at
least ``BLIND_FB_MIB`` MiB (a CUDA context alone takes ~300-600 MiB; an idle GPU a few MiB) while no
process is visible, for ``BLIND_CYCLES`` consecutive cycles, means the view is blind. Blindness is
a property of the PID namespace, so from then on the whole family is withheld for the life of the
process, with one WARNING naming the GPU and what to change (``hostPID: true``). A count of 0 is
therefore exported only while the exporter can see processes; an absent series means "unknown".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.backend import Entity

log = logging.getLogger("exporter.processes")

COMPUTE_PROCESSES = "gpu_exporter_compute_processes"
HELP = ("Compute processes running on the GPU or MIG GPU instance (NVML's running compute processes; "
        "absent when the exporter cannot see other containers' processes).")
BLIND_FB_MIB = 256
BLIND_CYCLES = 2


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """The gauge's row in the render order (satisfies ``render.SeriesSpec``)."""

    field: str = COMPUTE_PROCESSES
    kind: str = "gauge"
    help: str = HELP


SPEC = ProcessSpec()


@dataclass(frozen=True, slots=True)
class ProcessCount:
    """One entity's answer: visible compute processes and framebuffer used (MiB)."""

    processes: int
    fb_used_mib: int


class Visibility:
    """Decides, cycle by cycle, whether counts may be exported (see the module docstring)."""

    def __init__(self, min_fb_mib: int = BLIND_FB_MIB, cycles: int = BLIND_CYCLES) -> None:
        self.blind = False
        self._min_fb_mib = min_fb_mib
        self._cycles = cycles
        self._suspect: dict[Entity, int] = {}

    def counts(self, answer: Mapping[Entity, ProcessCount]) -> dict[Entity, int]:
        """The counts to export for one GPU's answer ({} once blind)."""
        if self.blind:
            return {}
        for entity, pc in answer.items():
            if pc.processes == 0 and pc.fb_used_mib >= self._min_fb_mib:
                n = self._suspect[entity] = self._suspect.get(entity, 0) + 1
                if n >= self._cycles:
                    self.blind = True
                    where = f"GPU {entity.gpu}" + (
                        "" if entity.gpu_instance_id is None else f" GPU instance {entity.gpu_instance_id}")
                    log.warning(
                        "%s holds %d MiB but NVML shows no compute process: this container cannot see "
                        "other containers' processes (run the exporter with hostPID: true); "
                        "%s is withheld from now on", where, pc.fb_used_mib, COMPUTE_PROCESSES,
                        extra={"gpu": entity.gpu},
                    )
                    return {}
            else:
                self._suspect.pop(entity, None)
        return {entity: pc.processes for entity, pc in answer.items()}
