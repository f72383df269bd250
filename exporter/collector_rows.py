"""The rows one GPU contributes to a cycle's exposition: label values, pods, MIG, XID (pure).

MIG: a GPU in MIG mode is published per GPU instance only (as dcgm-exporter does); every GPU-wide
field (clocks, temperatures, power, energy, PCIe, remapped rows, XID, ...) is repeated on each
instance's series, while FB and PROF fields are the instance's own. Time-sliced pods: one row set
per pod holding the GPU (or any of a GPU instance's MIG UUIDs). XID: the last XID of the GPU, or of
the GPU instance NVML named, with dcgm-exporter 4.8.2's ``err_code`` and ``err_msg`` labels.

``RowBuilder`` adds, per cycle: the compute-process counts (withheld once NVML is seen blind), the
values of CSV names that are aliases or 1.x names (``renames``: listed name -> field read), the HPC
job rows and the ``DCGM_EXP_*`` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from exporter.backend import DeviceInfo, Entity, Value, per_instance
from exporter.exp_counters import ExpCounters
from exporter.processes import COMPUTE_PROCESSES, ProcessCount, Visibility
from exporter.render import PodLabels, Row, with_pod
from exporter.xid import XidState, xid_message

DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
# What the pod source returns per GPU or MIG UUID: the pods holding it (time-slicing: several).
# A bare PodLabels (the pre-issue-7 shape) is taken as a one-pod sequence.
PodMap = Mapping[str, Sequence[PodLabels] | PodLabels]

# CSV ``label`` rows this exporter can fill: field -> value from (device, driver version)
LABEL_SOURCES: dict[str, Callable[[DeviceInfo, str], str]] = {
    DRIVER_VERSION: lambda d, driver: driver,
    "DCGM_FI_DEV_NAME": lambda d, driver: d.name,
    "DCGM_FI_DEV_UUID": lambda d, driver: d.uuid,
    "DCGM_FI_DEV_PCI_BUSID": lambda d, driver: d.pci_bus_id,
}


def label_values(backend: object, d: DeviceInfo, driver: str, names: Sequence[str]) -> dict[str, str]:
    """Values for CSV ``label`` rows: the backend's optional ``labels(gpu)`` (static strings such as
    serial and VBIOS), else what ``DeviceInfo`` and the driver version give."""
    own: Mapping[str, str] = {}
    labels_fn = getattr(backend, "labels", None)
    if callable(labels_fn):
        own = labels_fn(d.index)
    out: dict[str, str] = {}
    for name in names:
        if name in own:
            out[name] = str(own[name])
        elif name in LABEL_SOURCES:
            out[name] = LABEL_SOURCES[name](d, driver)
    return out


def xid_labels(prefix: str, pod: PodLabels | None, code: int, extra: Mapping[str, str] | None = None) -> str:
    """The XID row's labels: dcgm-exporter 4.8.2 adds ``err_code`` and ``err_msg`` attributes,
    rendered with the pod attributes in sorted key order (container, err_code, err_msg, hpc_job,
    namespace, pod, pod_uid, vgpu), as its Go template ranges over the attribute map."""
    return with_pod(prefix, pod, {**(extra or {}), "err_code": str(code), "err_msg": xid_message(code)})


# (entity, static label prefix, pod keys: the GPU UUID or the GPU instance's MIG UUIDs)
EntityUnit = tuple[Entity, str, tuple[str, ...]]


def gpu_rows(
    device: DeviceInfo,
    entities: Sequence[EntityUnit],
    data: Mapping[Entity, Mapping[str, Value]],
    pods: PodMap,
    xids: XidState,
    with_xid: bool,
    hpc_jobs: Mapping[str, Sequence[str]] | None = None,
) -> list[Row]:
    """The rows of one GPU that is up, from its backend answer ``data``. ``hpc_jobs``: the HPC job
    mapping (``exporter.hpc``), key ``"<gpu>"`` or ``"<gpu>.<GPU instance id>"``: one row set per job
    with an ``hpc_job`` attribute, as dcgm-exporter's hpcMapper does."""
    gpu = device.index
    mig = bool(device.mig)
    wide = {k: v for k, v in data.get(Entity(gpu), {}).items() if not (mig and per_instance(k))}
    rows: list[Row] = []
    for entity, prefix, keys in entities:
        own = data.get(entity)
        if own is None:
            continue
        values = {**wide, **own} if mig else dict(own)
        values.pop(XID_ERRORS, None)
        holders: list[PodLabels | None] = list(holders_of(pods, keys)) or [None]
        xid = xids.last(gpu, entity.gpu_instance_id) if with_xid else None
        for pod in holders:
            for extra in job_attributes(hpc_jobs, entity):
                rows.append(Row(with_pod(prefix, pod, extra), values))
                if xid is not None:
                    rows.append(Row(xid_labels(prefix, pod, xid, extra), {XID_ERRORS: xid}))
    return rows


def job_attributes(hpc_jobs: Mapping[str, Sequence[str]] | None, entity: Entity) -> list[dict[str, str] | None]:
    """``[{"hpc_job": job}, ...]`` for the entity's mapped jobs, else ``[None]`` (one row, no attribute)."""
    if not hpc_jobs:
        return [None]
    key = str(entity.gpu) if entity.gpu_instance_id is None else f"{entity.gpu}.{entity.gpu_instance_id}"
    return [{"hpc_job": job} for job in hpc_jobs.get(key, ())] or [None]


def holders_of(pods: PodMap, keys: Sequence[str]) -> list[PodLabels]:
    """The pods holding any of ``keys`` (a GPU UUID, or a GPU instance's MIG UUIDs), each once."""
    out: list[PodLabels] = []
    for key in keys:
        held = pods.get(key)
        if not held:
            continue
        group: Sequence[PodLabels] = (held,) if hasattr(held, "pod") else held  # type: ignore[assignment]
        for pod in group:
            if pod not in out:
                out.append(pod)
    return out


class RowBuilder:
    """A collector's per-cycle row assembly beyond ``gpu_rows`` (see the module docstring)."""

    def __init__(self, xids: XidState, renames: Mapping[str, str], exp: ExpCounters | None = None) -> None:
        self.xids = xids
        self.renames = dict(renames)
        self.exp = exp
        self.visibility = Visibility()

    def rows(
        self,
        device: DeviceInfo,
        entities: Sequence[EntityUnit],
        answer: Mapping[Entity, Mapping[str, Value]],
        processes: Mapping[Entity, ProcessCount] | None,
        pods: PodMap,
        with_xid: bool,
        hpc_jobs: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Row]:
        data = dict(answer)
        if processes is not None:
            for entity, n in self.visibility.counts(processes).items():
                if entity in data:
                    data[entity] = {**data[entity], COMPUTE_PROCESSES: n}
        if self.renames:
            data = {e: {**v, **{n: v[src] for n, src in self.renames.items() if src in v}} for e, v in data.items()}
        rows = gpu_rows(device, entities, data, pods, self.xids, with_xid, hpc_jobs)
        if self.exp is not None and self.exp.names:
            self.exp.observe(device.index, data.get(Entity(device.index), {}))
            held: list[tuple[str, Sequence[PodLabels | None]]] = [
                (prefix, list(holders_of(pods, keys)) or [None]) for _e, prefix, keys in entities
            ]
            rows.extend(self.exp.rows(device.index, held, with_xid))
        return rows
