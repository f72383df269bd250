"""``-d/--devices``: which GPUs and MIG GPU instances are exported (dcgm-exporter's syntax).

dcgm-exporter 4.8.2 ``pkg/cmd/app.go`` (``parseDeviceOptions``, ``deviceUsageTemplate``):

* ``f`` (default): every GPU, or every GPU instance of a GPU in MIG mode;
* ``g`` / ``g:0,2-3``: whole GPUs (all, or those NVML indices); a MIG GPU keeps its instances;
* ``i`` / ``i:0,2-4``: GPU instances only (all, or those ids); GPUs without MIG are left out.

Listed ids must exist ("If an id list is used, then devices with match IDs must exist on the
system"). DCGM numbers GPU instances as entities across the node; NVML has per-GPU instance ids,
so ``i:<ids>`` numbers the node's GPU instances in (GPU index, GPU instance id) order from 0, which
is DCGM's enumeration order.

``FilteredBackend`` applies a selection by wrapping the backend: ``devices()``, ``read()`` and
``wait_xid()`` only show what was selected; everything else passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from exporter.backend import DeviceInfo, Entity, GpuBackend, MigInstance, Value

Kind = Literal["f", "g", "i"]


class DeviceSelectionError(ValueError):
    """A ``-d`` value that does not parse, or names a GPU or GPU instance that does not exist."""


@dataclass(frozen=True, slots=True)
class DeviceSelection:
    kind: Kind
    ids: frozenset[int] | None = None  # None: all of that kind

    @property
    def everything(self) -> bool:
        return self.kind == "f"


ALL = DeviceSelection("f")


def _number(token: str, text: str) -> int:
    if not token.strip().isdigit():
        raise DeviceSelectionError(f"{text!r}: {token!r} is not a non-negative integer")
    return int(token)


def parse_devices(text: str) -> DeviceSelection:
    """``f``, ``g[:ids]``, ``i[:ids]`` with ids like ``0,2-4``. Raises ``DeviceSelectionError``."""
    parts = text.strip().split(":")
    if len(parts) > 2:
        raise DeviceSelectionError(f"{text!r}: there can only be one specified range")
    letter = parts[0]
    if letter == "f":
        if len(parts) > 1:
            raise DeviceSelectionError(f"{text!r}: no range can be specified with the flex option 'f'")
        return ALL
    if letter not in ("g", "i"):
        raise DeviceSelectionError(f"{text!r}: expected f, g[:ids] or i[:ids] (ids like 0,2-4)")
    kind: Kind = "g" if letter == "g" else "i"
    if len(parts) == 1:
        return DeviceSelection(kind)
    ids: set[int] = set()
    for item in parts[1].split(","):
        bounds = item.split("-")
        if len(bounds) == 1:
            ids.add(_number(bounds[0], text))
        elif len(bounds) == 2:
            start, end = _number(bounds[0], text), _number(bounds[1], text)
            if end < start:
                raise DeviceSelectionError(f"{text!r}: range {item!r} ends before it starts")
            ids.update(range(start, end + 1))
        else:
            raise DeviceSelectionError(f"{text!r}: a range is <number>-<number>, got {item!r}")
    return DeviceSelection(kind, frozenset(ids))


def instance_numbers(devices: Iterable[DeviceInfo]) -> dict[tuple[int, int], int]:
    """(GPU index, GPU instance id) -> node-wide GPU instance number, in DCGM's order."""
    keys = sorted((d.index, m.gpu_instance_id) for d in devices for m in d.mig)
    return {key: n for n, key in enumerate(keys)}


def select(devices: Iterable[DeviceInfo], selection: DeviceSelection) -> list[DeviceInfo]:
    """The devices (and MIG instances) a selection keeps. Pure; unknown ids are not checked here."""
    devices = list(devices)
    if selection.kind == "f":
        return devices
    if selection.kind == "g":
        return [d for d in devices if selection.ids is None or d.index in selection.ids]
    numbers = instance_numbers(devices)
    out: list[DeviceInfo] = []
    for d in devices:
        kept: tuple[MigInstance, ...] = tuple(
            m for m in d.mig if selection.ids is None or numbers[(d.index, m.gpu_instance_id)] in selection.ids
        )
        if kept:
            out.append(replace(d, mig=kept))
    return out


def check(devices: Iterable[DeviceInfo], selection: DeviceSelection, flag: str = "--devices") -> None:
    """Raise ``DeviceSelectionError`` when the selection names ids the node does not have."""
    devices = list(devices)
    if selection.kind == "i" and not any(d.mig for d in devices):
        raise DeviceSelectionError(f"{flag} i: no GPU is in MIG mode (i cannot be used unless MIG is enabled)")
    if selection.ids is None:
        return
    have = set(instance_numbers(devices).values()) if selection.kind == "i" else {d.index for d in devices}
    missing = sorted(selection.ids - have)
    if missing:
        what = "GPU instance" if selection.kind == "i" else "GPU"
        known = ", ".join(str(n) for n in sorted(have)) or "none"
        raise DeviceSelectionError(
            f"{flag} {selection.kind}:...: no {what} {', '.join(map(str, missing))} on this node (it has {known})"
        )


class FilteredBackend:
    """A ``GpuBackend`` showing only the selected GPUs and GPU instances of another one."""

    def __init__(self, backend: GpuBackend, selection: DeviceSelection) -> None:
        self._backend = backend
        self._selection = selection
        self._kept: dict[int, frozenset[int]] = {}  # GPU index -> kept GPU instance ids, as last listed

    def __getattr__(self, name: str) -> Any:  # methods a backend has beyond the protocol
        return getattr(self._backend, name)

    def driver_version(self) -> str:
        return self._backend.driver_version()

    def devices(self) -> list[DeviceInfo]:
        kept = select(self._backend.devices(), self._selection)
        self._kept = {d.index: frozenset(m.gpu_instance_id for m in d.mig) for d in kept}
        return kept

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        return self._backend.supported_fields(gpu, fields)

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        data = self._backend.read(gpu, fields)
        if self._selection.kind != "i":
            return data
        kept = self._kept.get(gpu, frozenset())
        return {e: v for e, v in data.items() if e.gpu_instance_id is None or e.gpu_instance_id in kept}

    def wait_xid(self, timeout_s: float) -> Any:  # the backend's event type: (gpu, xid[, GPU instance id])
        events = self._backend.wait_xid(timeout_s)
        if self._selection.everything:
            return events
        return [e for e in events if self._selected_event(tuple(e))]

    def _selected_event(self, event: tuple[int, ...]) -> bool:
        kept = self._kept.get(event[0])
        if kept is None:
            return False
        return len(event) < 3 or self._selection.kind != "i" or event[2] in kept

    def close(self) -> None:
        self._backend.close()


def apply(backend: GpuBackend, selection: DeviceSelection, flag: str = "--devices") -> GpuBackend:
    """The backend itself for ``f``; else checked against its devices and wrapped."""
    if selection.everything:
        return backend
    check(backend.devices(), selection, flag)
    filtered = FilteredBackend(backend, selection)
    filtered.devices()
    return filtered
