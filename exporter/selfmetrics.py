"""The exporter's own metrics (``gpu_exporter_*``), rendered as text next to the cached body.

Pure: ``render_self_metrics(state, openmetrics)``. Names follow Prometheus conventions (counters
end in ``_total``, units in the name) so ``promtool check metrics`` has nothing to say about them.
In OpenMetrics a counter family is declared without ``_total`` and its sample carries it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.render import escape_label_value

PREFIX = "gpu_exporter_"


@dataclass(frozen=True, slots=True)
class DeviceStat:
    gpu: int
    uuid: str
    up: bool
    duration_s: float | None  # last pass; None before the first one
    errors: int


@dataclass(frozen=True, slots=True)
class BuildInfo:
    version: str
    python_version: str
    backend: str


@dataclass(frozen=True, slots=True)
class SelfState:
    devices: Sequence[DeviceStat]
    build: BuildInfo
    last_collection_ts: float | None = None  # unix seconds of the last finished cycle
    kubelet_errors: int | None = None  # None: --kubernetes off, family omitted
    # (gpu, uuid, xid) -> count since start
    xid_counts: Mapping[tuple[int, str, int], int] = field(default_factory=dict)


def _num(value: float) -> str:
    return repr(float(value))


def _gpu(gpu: int, uuid: str) -> str:
    return f'gpu="{gpu}",UUID="{escape_label_value(uuid)}"'


class _Out:
    def __init__(self, openmetrics: bool) -> None:
        self.openmetrics = openmetrics
        self.parts: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Sequence[tuple[str, str]]) -> None:
        """``samples``: (label block without braces, value)."""
        full = PREFIX + name
        family = full[: -len("_total")] if self.openmetrics and kind == "counter" else full
        self.parts.append(f"# HELP {family} {help_text}\n# TYPE {family} {kind}\n")
        for labels, value in samples:
            self.parts.append(f"{full}{{{labels}}} {value}\n" if labels else f"{full} {value}\n")


def render_self_metrics(state: SelfState, openmetrics: bool = False) -> str:
    out = _Out(openmetrics)
    b = state.build
    out.family(
        "build_info", "gauge", "gpu-exporter build information, always 1.",
        [(f'version="{escape_label_value(b.version)}",python_version="{escape_label_value(b.python_version)}",'
          f'backend="{escape_label_value(b.backend)}"', "1")],
    )
    out.family(
        "device_up", "gauge", "Whether the GPU answered in the last collection cycle (1) or not (0).",
        [(_gpu(d.gpu, d.uuid), "1" if d.up else "0") for d in state.devices],
    )
    out.family(
        "collection_duration_seconds", "gauge", "Duration of the last collection pass for the GPU.",
        [(_gpu(d.gpu, d.uuid), _num(d.duration_s)) for d in state.devices if d.duration_s is not None],
    )
    out.family(
        "collection_errors_total", "counter", "Collection passes for the GPU that failed.",
        [(_gpu(d.gpu, d.uuid), str(d.errors)) for d in state.devices],
    )
    if state.last_collection_ts is not None:
        out.family(
            "last_collection_timestamp_seconds", "gauge", "Unix time the last collection cycle finished.",
            [("", _num(state.last_collection_ts))],
        )
    if state.kubelet_errors is not None:
        out.family(
            "kubelet_errors_total", "counter", "Failed calls to the kubelet PodResources API.",
            [("", str(state.kubelet_errors))],
        )
    out.family(
        "xid_errors_total", "counter", "XID errors seen on the GPU since the exporter started, by XID code.",
        [(f'{_gpu(gpu, uuid)},xid="{xid}"', str(n))
         for (gpu, uuid, xid), n in sorted(state.xid_counts.items())],
    )
    return "".join(out.parts)
