"""Exposition rendering: pure functions producing dcgm-exporter 4.8.2's exact text.

Series line: ``NAME{gpu,UUID,pci_bus_id,device,modelName,[GPU_I_PROFILE,GPU_I_ID,]Hostname,
<label-fields sorted>[,container,namespace,pod]} VALUE``; ``Hostname`` is ``hostname`` with
``--hostname-label hostname`` (dcgm-exporter's main branch after 4.8.2), in the same place.
Integers print with ``%d``, doubles with ``%f`` (dcgm-exporter's Go format verbs). The static part
of each entity's label block is built once (``entity_labels``) and reused every cycle; pod labels
are appended per cycle.

OpenMetrics: DCGM "counters" have no ``_total`` suffix, which OpenMetrics requires of a counter
sample, so they are declared ``# TYPE NAME unknown`` there (values and names unchanged, so
queries work the same under either format). Gauges stay gauges. The body ends with ``# EOF``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from exporter.backend import DeviceInfo, MigInstance, Value

HOSTNAME_LABEL = "Hostname"  # dcgm-exporter 4.8.2's name of the node label
OWN_PREFIX = "gpu_exporter_"  # a per-GPU series of ours (gpu_exporter_compute_processes) joins on gpu/UUID/
_MODEL_NAME = re.compile(r',modelName="(?:[^"\\]|\\.)*"')  # ... and pod, without dcgm's camelCase modelName
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class SeriesSpec(Protocol):
    """A CSV row (``exporter.counters_csv.CounterSpec`` satisfies it)."""

    @property
    def field(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def help(self) -> str: ...


class PodLabels(Protocol):
    """Pod attribution (``exporter.kubernetes.PodInfo`` satisfies it)."""

    @property
    def pod(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def container(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Row:
    """One entity's values for one cycle. ``labels`` is the full ``{...}`` block."""

    labels: str
    values: Mapping[str, Value]


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str, openmetrics: bool = False) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n")
    return out.replace('"', '\\"') if openmetrics else out


def format_value(value: Value, integer: bool | None = None) -> str:
    """``%d`` for integer fields, ``%f`` for doubles. ``integer=None``: decide by the value's type."""
    if integer is None:
        integer = isinstance(value, int) and not isinstance(value, bool)
    if integer:
        return f"{int(value):d}"
    return f"{float(value):f}"


def labels_block(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs) + "}"


def entity_labels(
    device: DeviceInfo,
    mig: MigInstance | None,
    hostname: str | None,
    label_fields: Mapping[str, str],
    hostname_label: str = HOSTNAME_LABEL,
) -> str:
    """The static label prefix, without the closing brace: pod labels are appended per cycle.
    ``hostname_label``: the node label's name (``Hostname`` or ``hostname``)."""
    pairs = [
        ("gpu", str(device.index)),
        ("UUID", device.uuid),
        ("pci_bus_id", device.pci_bus_id),
        ("device", f"nvidia{device.index}"),  # dcgm-exporter: the GPU index, not the minor number
        ("modelName", device.name),
    ]
    if mig is not None:
        pairs += [("GPU_I_PROFILE", mig.profile), ("GPU_I_ID", str(mig.gpu_instance_id))]
    if hostname is not None:
        pairs.append((hostname_label, hostname))
    pairs += sorted(label_fields.items())
    return labels_block(pairs)[:-1]


def pod_attributes(pod: PodLabels | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """dcgm-exporter's attributes of a row: ``container, namespace, pod`` of the holder, its
    ``pod_uid`` (``--kubernetes-enable-pod-uid``) and ``vgpu`` when set, plus ``extra`` (``hpc_job``,
    ``err_code``, ...)."""
    attrs = dict(extra or {})
    if pod is not None:
        attrs.update(container=pod.container, namespace=pod.namespace, pod=pod.pod)
        for key, attr in (("pod_uid", "uid"), ("vgpu", "vgpu")):
            value = str(getattr(pod, attr, "") or "")
            if value:
                attrs[key] = value
    return attrs


def with_pod(prefix: str, pod: PodLabels | None, extra: Mapping[str, str] | None = None) -> str:
    """Close a static prefix with the holder's pod labels (``--kubernetes-enable-pod-labels``,
    sanitized keys, sorted; a key the row already has is left out, as dcgm-exporter does for
    attributes) and the attributes (``pod_attributes``) in sorted key order, as Go ranges a map."""
    if pod is None and not extra:
        return prefix + "}"
    attrs = pod_attributes(pod, extra)
    pod_labels = sorted(getattr(pod, "labels", ()) or ())
    own = "".join(
        f',{k}="{escape_label_value(v)}"' for k, v in pod_labels
        if k not in attrs and f',{k}="' not in prefix and not prefix.startswith(f'{{{k}="')
    )
    return prefix + own + "".join(f',{k}="{escape_label_value(v)}"' for k, v in sorted(attrs.items())) + "}"


def render_series(
    specs: Sequence[SeriesSpec],
    rows: Sequence[Row],
    integer_fields: frozenset[str] | None = None,
    openmetrics: bool = False,
) -> str:
    """All gauge/counter rows, grouped by metric in CSV order; a field with no value anywhere is
    absent (no HELP/TYPE either, as dcgm-exporter does for fields with no samples)."""
    out: list[str] = []
    for spec in specs:
        if spec.kind == "label":
            continue
        name = spec.field
        integer = None if integer_fields is None else name in integer_fields
        own = name.startswith(OWN_PREFIX)  # our own series: snake_case labels only (promtool check metrics)
        lines = [
            f"{name}{_MODEL_NAME.sub('', row.labels) if own else row.labels} "
            f"{format_value(row.values[name], integer)}\n"
            for row in rows
            if name in row.values
        ]
        if not lines:
            continue
        kind = spec.kind if not openmetrics or spec.kind == "gauge" else "unknown"
        out.append(f"# HELP {name} {escape_help(spec.help, openmetrics)}\n# TYPE {name} {kind}\n")
        out.extend(lines)
    return "".join(out)


def wants_openmetrics(accept: str | None) -> bool:
    """True when the scrape's Accept header asks for OpenMetrics text."""
    return accept is not None and "application/openmetrics-text" in accept
