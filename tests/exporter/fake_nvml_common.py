"""What the fake NVML's call groups share: the recording, handles, UUIDs, NVML value unions, and
the fault gate every call passes (:class:`FakeBase`, whose state ``FakeNvml.__init__`` sets)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pynvml as _real

REC: dict[str, Any] = json.loads(
    resources.files("exporter").joinpath("data", "h200.json").read_text(encoding="utf-8")
)
MIB = 1048576


@dataclass(frozen=True)
class Handle:
    gpu: int
    gi: int | None = None
    ci: int = 0
    gen: int = field(default=0, compare=False)


ERROR_NAMES = {getattr(_real, n): n for n in dir(_real) if n.startswith("NVML_ERROR_")}


def _not_supported(name: str) -> Callable[..., Any]:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)

    call.__name__ = name
    return call

def _value_obj(value_type: int, value: float) -> SimpleNamespace:
    names = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
    attrs: dict[str, float] = dict.fromkeys(names, 0)
    name = names[value_type]
    attrs[name] = float(value) if value_type == 0 else int(value)
    return SimpleNamespace(**attrs)

def _uuid(h: Handle) -> str:
    base = str(REC["static"]["uuid"])
    if h.gi is not None:
        return f"MIG-{base[4:-6]}{h.gpu:02x}{h.gi:02x}{h.ci:02x}"
    return f"{base[:-2]}{h.gpu:02x}"

class FakeBase:
    """The fault gate: counts a call, then raises what the test asked for (see ``FakeNvml``)."""

    calls: Counter[str]
    uninitialized: bool
    gen: int
    hang: dict[int, threading.Event]
    broken: dict[int, int]
    lost: set[int]
    unknown: set[int]
    fail: dict[str, int]
    clock: Callable[[], float]


    def _hit(self, name: str, handle: Handle | None = None) -> None:
        self.calls[name] += 1
        if self.uninitialized and name != "nvmlShutdown":
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        if handle is not None and handle.gen != self.gen:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        if handle is not None and handle.gpu in self.hang:
            self.hang[handle.gpu].wait()
        if handle is not None and handle.gpu in self.broken:
            raise _real.NVMLError(self.broken[handle.gpu])
        if handle is not None and handle.gpu in self.lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        if handle is not None and handle.gpu in self.unknown:
            raise _real.NVMLError(_real.NVML_ERROR_UNKNOWN)
        if name in self.fail:
            raise _real.NVMLError(self.fail[name])

    def _t(self) -> float:
        return self.clock()
