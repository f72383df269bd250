"""The exporter's own metrics (``gpu_exporter_*``), rendered as text next to the cached body.

Pure: ``render_self_metrics(state, openmetrics)``. Names follow Prometheus conventions (counters
end in ``_total``, units in the name) so ``promtool check metrics`` has nothing to say about them.
In OpenMetrics a counter family is declared without ``_total`` and its sample carries it.

Every sample carries ``Hostname`` (when the exporter has one, as the DCGM series do, under the same
name: ``hostname`` with ``--hostname-label hostname``) and per-GPU
samples ``gpu,UUID,pci_bus_id`` too, so an alert on ``gpu_exporter_device_up == 0`` or on XIDs names
the node and the GPU. Label sets:

- ``build_info{version,python_version,backend,Hostname}``
- ``device_up``, ``collection_duration_seconds``, ``collection_errors_total``:
  ``{gpu,UUID,pci_bus_id,Hostname}``
- ``xid_errors_total{gpu,UUID,pci_bus_id,Hostname,xid}``
- ``field_unavailable{gpu,UUID,pci_bus_id,Hostname,field,reason}`` (1 per refused field)
- ``last_collection_timestamp_seconds{Hostname}``, ``kubelet_errors_total{Hostname}``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.render import HOSTNAME_LABEL, escape_label_value

PREFIX = "gpu_exporter_"


@dataclass(frozen=True, slots=True)
class DeviceStat:
    gpu: int
    uuid: str
    up: bool
    duration_s: float | None  # last pass; None before the first one
    errors: int
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A field the GPU could report but NVML refuses (e.g. GPM: NO_PERMISSION)."""

    gpu: int
    uuid: str
    pci_bus_id: str
    field: str
    reason: str


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
    # (gpu, uuid, pci_bus_id, xid) -> count since start
    xid_counts: Mapping[tuple[int, str, str, int], int] = field(default_factory=dict)
    hostname: str | None = None
    hostname_label: str = HOSTNAME_LABEL
    unavailable: Sequence[Unavailable] = ()


def _num(value: float) -> str:
    return repr(float(value))


def _host(hostname: str | None, label: str = HOSTNAME_LABEL) -> str:
    return "" if hostname is None else f'{label}="{escape_label_value(hostname)}"'


def _gpu(gpu: int, uuid: str, pci_bus_id: str, host: str) -> str:
    """``host``: the ``_host`` pair, "" without a host name."""
    out = f'gpu="{gpu}",UUID="{escape_label_value(uuid)}",pci_bus_id="{escape_label_value(pci_bus_id)}"'
    return f"{out},{host}" if host else out


def _join(*parts: str) -> str:
    return ",".join(p for p in parts if p)


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
    host = _host(state.hostname, state.hostname_label)
    out.family(
        "build_info", "gauge", "gpu-exporter build information, always 1.",
        [(_join(f'version="{escape_label_value(b.version)}",python_version="{escape_label_value(b.python_version)}",'
                f'backend="{escape_label_value(b.backend)}"', host), "1")],
    )
    out.family(
        "device_up", "gauge", "Whether the GPU answered in the last collection cycle (1) or not (0).",
        [(_gpu(d.gpu, d.uuid, d.pci_bus_id, host), "1" if d.up else "0") for d in state.devices],
    )
    out.family(
        "collection_duration_seconds", "gauge", "Duration of the last collection pass for the GPU.",
        [(_gpu(d.gpu, d.uuid, d.pci_bus_id, host), _num(d.duration_s))
         for d in state.devices if d.duration_s is not None],
    )
    out.family(
        "collection_errors_total", "counter", "Collection passes for the GPU that failed.",
        [(_gpu(d.gpu, d.uuid, d.pci_bus_id, host), str(d.errors)) for d in state.devices],
    )
    if state.last_collection_ts is not None:
        out.family(
            "last_collection_timestamp_seconds", "gauge", "Unix time the last collection cycle finished.",
            [(host, _num(state.last_collection_ts))],
        )
    if state.kubelet_errors is not None:
        out.family(
            "kubelet_errors_total", "counter", "Failed calls to the kubelet PodResources API.",
            [(host, str(state.kubelet_errors))],
        )
    out.family(
        "xid_errors_total", "counter", "XID errors seen on the GPU since the exporter started, by XID code.",
        [(f'{_gpu(gpu, uuid, pci, host)},xid="{xid}"', str(n))
         for (gpu, uuid, pci, xid), n in sorted(state.xid_counts.items())],
    )
    if state.unavailable:
        out.family(
            "field_unavailable", "gauge",
            "A field the GPU could report but NVML refuses (1), with why (e.g. NO_PERMISSION for profiling).",
            [(f'{_gpu(u.gpu, u.uuid, u.pci_bus_id, host)},field="{escape_label_value(u.field)}",'
              f'reason="{escape_label_value(u.reason)}"', "1") for u in state.unavailable],
        )
    return "".join(out.parts)
