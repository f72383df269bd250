"""What gpu-jobwatch keeps of each API object: small frozen records built as the objects arrive
(never the objects themselves), and the sink a watch hands objects to.

A pod is kept only when it requests GPUs and may still hold them (not Succeeded or Failed); a node
only when it has GPUs; a TrainJob as its conditions, opt-outs and parsed progress sources.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobwatch import workload as wl
from jobwatch.progress import Report
from jobwatch.tracker import JobTracker
from jobwatch.workload import Workload

Obj = dict[str, Any]
Key = tuple[str, str]

CONDITIONS = ("Complete", "Failed", "Suspended")
TERMINAL_PHASES = ("Succeeded", "Failed")
NODE_LABELS = (("instance_type", ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")),
               ("capacity_type", ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType")),
               ("gpu_product", ("nvidia.com/gpu.product",)))


@dataclass(frozen=True, slots=True)
class PodRecord:
    namespace: str
    name: str
    workload: Workload  # resolved from the pod alone (a JobSet may turn out a TrainJob)
    rank: str | None
    node: str
    gpus: float
    terminated: bool | None
    exempt: bool
    stall_after: float | None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    price: float | None
    labels: tuple[tuple[str, str], ...]


@dataclass
class TrainJobRecord:
    namespace: str
    name: str
    conditions: dict[str, bool] = field(default_factory=dict)
    exempt: bool = False
    stall_after: float | None = None
    status_raw: str | None = None  # SHA-256 of the source's text: a change is told, the text not kept
    annotation_raw: str | None = None
    status_report: Report | None = None
    annotation_report: Report | None = None


@dataclass
class JobRecord:
    workload: Workload
    tracker: JobTracker | None = None
    observed: Report | None = None
    ended_at: float | None = None
    bad_logged: set[str] = field(default_factory=set)
    reset_logged: bool = False


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def key_of(obj: Mapping[str, Any]) -> Key:
    m = _meta(obj)
    return (str(m.get("namespace") or ""), str(m.get("name") or ""))


def pod_record(obj: Mapping[str, Any]) -> PodRecord | None:
    """What is kept of a pod: None unless it requests GPUs and may still hold them."""
    if not wl.is_gpu_pod(obj):
        return None
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    if status.get("phase") in TERMINAL_PHASES:
        return None
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    w, rank = wl.resolve(obj)
    ns, name = key_of(obj)
    return PodRecord(ns, name, w, rank, str(spec.get("nodeName") or ""), wl.gpus_requested(obj)[0],
                     wl.main_container_terminated(obj), wl.exempt(obj), wl.stall_after_override(obj))


def is_gpu_node(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    for section in ("capacity", "allocatable"):
        res = status.get(section)
        if isinstance(res, Mapping) and any(
                isinstance(k, str) and (k == wl.GPU or k.startswith(wl.MIG_PREFIX)) and str(v) not in ("0", "")
                for k, v in res.items()):
            return True
    return wl.labels_of(obj).get("nvidia.com/gpu.present") == "true"



class Sink:
    """A watch's sink for one resource (see ``jobwatch.watch.Sink``), applying under the state lock."""

    def __init__(self, convert: Callable[[Obj], Any], put: Callable[[Key, Any], None], drop: Callable[[Key], None],
                 replace: Callable[[list[Any]], None]) -> None:
        self.convert = convert
        self._put, self._drop, self._replace = put, drop, replace
        self.lock: threading.RLock | None = None

    def bind(self, lock: threading.RLock) -> Sink:
        self.lock = lock
        return self

    def replace(self, items: list[Any]) -> None:
        assert self.lock is not None
        with self.lock:
            self._replace(items)

    def upsert(self, obj: Obj) -> None:
        rec = self.convert(obj)
        assert self.lock is not None
        with self.lock:
            self._put(key_of(obj), rec)

    def delete(self, obj: Obj) -> None:
        assert self.lock is not None
        with self.lock:
            self._drop(key_of(obj))
