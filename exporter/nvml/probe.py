"""One GPU's NVML state, and its probe: which DCGM fields it answers, read once.

The probe calls every getter group (memory on a MIG device when the MIG parent refuses it), the
static getters and label strings, one batched ``nvmlDeviceGetFieldValues`` over every field-value
field this pynvml knows, which NVLink links exist (:mod:`exporter.nvml.nvlink`: no link, no
NVLink field), and GPM's support and permission check (:mod:`exporter.nvml_gpm`; a PROF field
that GPM refuses but the NVLink counters give is supported, read as a counter rate). A
failing call goes to the caller's ``failed``, which raises ``GpuLostError`` for the errors after
which the GPU no longer answers (and counts UNKNOWN); a GPU whose every call answered UNKNOWN is
lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.backend import DeviceInfo, GpuLostError, Value
from exporter.nvml.fields import (
    GETTERS,
    GROUP_FIELDS,
    LABELS,
    NVLINK_FIELDS,
    STATIC,
    Plan,
    answered,
    device_labels,
    probe_plan,
)
from exporter.nvml.gpm import GpmSampler
from exporter.nvml.nvlink import present_links

XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"


@dataclass(slots=True)
class GpuState:
    """Per-GPU state of the NVML backend."""

    handle: Any | None  # None: not open (failed at start, or dropped after a GPU-wide error)
    info: DeviceInfo
    mig_handles: dict[int, Any]
    gen: int = 0  # NVML initialisation the handle belongs to
    supported: frozenset[str] | None = None
    static: dict[str, Value] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    rate_prev: dict[str, tuple[float, int]] = field(default_factory=dict)
    plans: dict[frozenset[str], Plan] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # field -> why (NO_PERMISSION)
    gpm_fields: frozenset[str] = frozenset()  # the PROF fields GPM gives (else rates where they exist)
    nvlinks: tuple[int, ...] = ()  # NVLink link indices NVML reports a state for
    asked: set[str] = field(default_factory=set)  # every field supported_fields was asked about
    xid_watched: bool = False


@dataclass(slots=True)
class PassStats:
    """Calls of one pass that answered, and that answered NVML_ERROR_UNKNOWN."""

    ok: int = 0
    unknown: int = 0


Failed = Callable[[BaseException, PassStats], None]


def probe_gpu(
    nvml: Any, gpu: int, g: GpuState, gpm: GpmSampler, versions: tuple[str, str], failed: Failed
) -> frozenset[str]:
    """The fields GPU ``gpu`` answers; fills ``g.static``, ``g.labels``, ``g.unavailable`` and
    ``g.supported``. ``versions``: (driver, NVML) version strings."""
    n, h, stats = nvml, g.handle, PassStats()
    error: type[BaseException] = nvml.NVMLError
    sup: set[str] = set()
    for getter in GETTERS.values():
        try:
            sup.update(getter(n, h))
            stats.ok += 1
        except error as exc:
            failed(exc, stats)
    if g.mig_handles and not sup.intersection(GROUP_FIELDS["memory"]):
        sup.update(_mig_memory(nvml, g, stats, failed))
    g.static["DCGM_FI_DEV_MINOR_NUMBER"] = g.info.minor
    sup.add("DCGM_FI_DEV_MINOR_NUMBER")
    for name, read_static in STATIC.items():
        try:
            g.static[name] = read_static(n, h)
            sup.add(name)
            stats.ok += 1
        except error as exc:
            failed(exc, stats)
    g.labels.update(device_labels(versions[0], versions[1], g.info))
    for name, read_label in LABELS.items():
        try:
            g.labels[name] = read_label(n, h)
            stats.ok += 1
        except error as exc:
            failed(exc, stats)
    sup.update(g.labels)
    try:
        g.nvlinks = present_links(n, h)
    except error as exc:
        failed(exc, stats)
    counted = _probe_field_values(nvml, g, stats, failed)
    sup.update(counted)
    try:
        prof, refused = gpm.probe(gpu, h, tuple(sorted(g.mig_handles)), has_nvlink=bool(g.nvlinks))
        sup.update(prof)
        g.gpm_fields = frozenset(prof)
        g.unavailable.update({f: why for f, why in refused.items() if f not in counted})
    except error as exc:
        failed(exc, stats)
    if not g.nvlinks:  # no NVLink: no series, whatever the counters or GPM answer (0 on a PCIe board)
        sup -= NVLINK_FIELDS
        for name in NVLINK_FIELDS:
            g.unavailable.pop(name, None)
    if g.xid_watched:
        sup.add(XID_FIELD)
    if stats.ok == 0 and stats.unknown > 0:
        raise GpuLostError(gpu, "UNKNOWN (every NVML call failed)")
    g.supported = frozenset(sup)
    return g.supported


def _mig_memory(nvml: Any, g: GpuState, stats: PassStats, failed: Failed) -> set[str]:
    """FB support of a MIG GPU whose parent refused memory info: nvml.h (nvmlDeviceGetMemoryInfo)
    answers the parent "only if the caller has appropriate privileges"; per-instance information
    comes from the MIG device handles, which is all MIG publishes."""
    mh = g.mig_handles[min(g.mig_handles)]
    try:
        out = set(GETTERS["memory"](nvml, mh))
        stats.ok += 1
        return out
    except nvml.NVMLError as exc:
        failed(exc, stats)
        return set()


def _probe_field_values(nvml: Any, g: GpuState, stats: PassStats, failed: Failed) -> set[str]:
    plan = probe_plan(nvml, g.static)
    try:
        results = nvml.nvmlDeviceGetFieldValues(g.handle, list(plan.request))
        stats.ok += 1
    except nvml.NVMLError as exc:
        failed(exc, stats)
        return set()
    return answered(plan, results)
