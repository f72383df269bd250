"""The GPU source seam: what every backend (NVML, simulated) provides to the collector.

The collector never imports pynvml; it talks to a ``GpuBackend``. Values are keyed by DCGM field
name (``DCGM_FI_DEV_GPU_UTIL``) in DCGM's units, so the renderer needs no per-backend knowledge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

Value = int | float
# An XID event: (gpu index, xid code) for the whole GPU, (gpu index, xid code, GPU instance id) when
# NVML names the MIG GPU instance it happened on (nvmlEventData_t.gpuInstanceId).
XidEvent = tuple[int, int] | tuple[int, int, int]
# Fields a MIG GPU instance reports for itself; every other field is the parent GPU's and is
# published on each GPU-instance series, as dcgm-exporter does (its issues #317, #713).
PER_INSTANCE_PREFIXES = ("DCGM_FI_DEV_FB_", "DCGM_FI_PROF_")


def per_instance(field: str) -> bool:
    return field.startswith(PER_INSTANCE_PREFIXES)


class BackendError(RuntimeError):
    """The backend cannot start (no driver, no NVML library). Carries a message fit for users."""


class GpuLostError(RuntimeError):
    """One GPU stopped answering (fallen off the bus, XID 79, reset). The others go on.

    ``reason`` starts with the short NVML error name (``RESET_REQUIRED``, ``GPU_IS_LOST``, ...) or
    ``timeout``; it is what ``/health`` and ``/ready`` print for the GPU."""

    def __init__(self, gpu: int, reason: str) -> None:
        super().__init__(f"GPU {gpu}: {reason}")
        self.gpu = gpu
        self.reason = reason


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance on a parent GPU (DCGM reports MIG GPUs only per instance)."""

    gpu_instance_id: int  # GPU_I_ID label
    profile: str  # GPU_I_PROFILE label, DCGM's "<slices>g.<ceil(profile memorySizeMB/1024)>gb"
    uuid: str  # MIG-<uuid> of its first compute instance, what the device plugin hands to pods
    # every compute instance's MIG UUID (a GPU instance with several compute instances is still one
    # entity: one label set; pods holding any of them are attributed to it)
    uuids: tuple[str, ...] = ()

    def all_uuids(self) -> tuple[str, ...]:
        return self.uuids or (self.uuid,)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Static facts about one GPU, read at start (and again when its MIG layout changes or it comes
    back after failing at start)."""

    index: int  # NVML index: the gpu label, and device="nvidia<index>" as dcgm-exporter prints it
    uuid: str  # GPU-... ("" when the GPU failed before NVML gave it)
    pci_bus_id: str  # 00000000:8D:00.0
    name: str  # modelName
    minor: int
    mig: tuple[MigInstance, ...] = ()  # non-empty when MIG mode is on
    problem: str = ""  # non-empty: the GPU could not be opened or probed at start (it is down)


@dataclass(frozen=True, slots=True)
class Entity:
    """What a row of values belongs to: a whole GPU, or one MIG instance of it."""

    gpu: int
    gpu_instance_id: int | None = None


class GpuBackend(Protocol):
    """A source of GPU values. Implementations: ``exporter.nvml.NvmlBackend``,
    ``exporter.simulated.SimulatedBackend``; tests inject their own."""

    def driver_version(self) -> str: ...

    def devices(self) -> list[DeviceInfo]: ...

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        """Which of these DCGM field names this GPU can report (probed once at start)."""
        ...

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        """One collection pass for one GPU: values by entity (the GPU, or each MIG instance),
        keyed by DCGM field name, in DCGM units. A field without a value this pass is absent.
        Raises ``GpuLostError`` when the GPU is gone."""
        ...

    def wait_xid(self, timeout_s: float) -> Sequence[XidEvent]:
        """Block up to timeout_s for XID events; return (gpu index, xid code[, GPU instance id])."""
        ...

    def close(self) -> None: ...
