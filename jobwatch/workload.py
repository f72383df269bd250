"""A GPU pod's workload, rank, GPU count and opt-outs, read from the Pod object alone.

Contract: every function takes the parsed JSON of a Kubernetes object (a ``Mapping``), never
raises on a malformed one (a missing or mistyped field reads as absent), and does no I/O.

:func:`resolve` names the workload in the issue's order, first match wins:

1. **TrainJob**: the label ``trainer.kubeflow.org/trainjob-name`` (Trainer versions whose
   progress or network-policy plugins label pods), else ``jobset.sigs.k8s.io/jobset-name`` when
   the pod carries ``trainer.kubeflow.org/trainjob-ancestor-step`` or the caller's
   ``trainjob_exists(namespace, name)`` says a TrainJob of that name exists. A TrainJob owns a
   JobSet of its own name; the pod's ownerReference is the JobSet's child Job, so the chain
   pod -> Job -> JobSet -> TrainJob can only be followed with the TrainJob list the caller has.
2. **JobSet**: ``jobset.sigs.k8s.io/jobset-name``.
3. **Legacy training-operator** (``training.kubeflow.org/job-name``): the kind is the controller
   ownerReference's when it is a ``kubeflow.org`` kind, else from ``training.kubeflow.org/operator-name``,
   else from the replica type (``launcher`` -> MPIJob; ``chief``/``ps``/``evaluator`` -> TFJob),
   else ``KubeflowJob`` (a legacy job whose kind cannot be told; never guessed).
4. **batch Job**: a controller ownerReference of kind Job, or ``batch.kubernetes.io/job-name`` /
   ``job-name``.
5. **RayCluster**: ``ray.io/cluster``.
6. **Top controller**: ReplicaSet -> Deployment (the name less ``-<pod-template-hash>``; a
   ReplicaSet without that suffix stays a ReplicaSet), StatefulSet, DaemonSet, or any other
   controller's own kind and name.
7. **Pod**: the pod itself.

The rank is ``batch.kubernetes.io/job-completion-index`` (label, then annotation), else
``training.kubeflow.org/replica-index``, else ``jobset.sigs.k8s.io/job-index`` (a JobSet of
one-pod Jobs), else the StatefulSet ordinal (``apps.kubernetes.io/pod-index``, then the name's
suffix), else None.

GPU counting (:func:`gpus_requested`): ``nvidia.com/gpu`` counts 1; ``nvidia.com/mig-<c>c.<g>g.<mem>``
or ``nvidia.com/mig-<g>g.<mem>`` counts its compute slices over the GPU's slices: 7 (A100, H100,
H200, B200), or 4 for the A30's profiles (``1g.6gb``, ``2g.12gb``, ``4g.24gb``). So a
``mig-1g.10gb`` is 1/7 of a GPU and a ``mig-3g.40gb`` 3/7, the share koku and the rules price.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
EXEMPT = "gpu-telemetry.io/exempt"
STALL_AFTER = "gpu-telemetry.io/stall-after"

TRAINJOB_NAME = "trainer.kubeflow.org/trainjob-name"
TRAINJOB_STEP = "trainer.kubeflow.org/trainjob-ancestor-step"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LEGACY_JOB_NAME = "training.kubeflow.org/job-name"
LEGACY_REPLICA_TYPE = "training.kubeflow.org/replica-type"
LEGACY_JOB_ROLE = "training.kubeflow.org/job-role"  # mpi-operator v2
LEGACY_REPLICA_INDEX = "training.kubeflow.org/replica-index"
LEGACY_OPERATOR = "training.kubeflow.org/operator-name"
RAY_CLUSTER = "ray.io/cluster"
POD_INDEX = "apps.kubernetes.io/pod-index"

_OPERATOR_KINDS = {
    "pytorchjob-controller": "PyTorchJob",
    "mpijob-controller": "MPIJob",
    "tfjob-controller": "TFJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
    "mpi-operator": "MPIJob",  # mpi-operator v2 (its launcher pod is owned by a batch Job)
}
_REPLICA_KINDS = {"launcher": "MPIJob", "chief": "TFJob", "ps": "TFJob", "evaluator": "TFJob"}
_MIG = re.compile(r"(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+\w+)?")
_A30_PROFILES = {"1g.6gb", "2g.12gb", "4g.24gb"}
_INT = re.compile(r"0|[1-9]\d{0,8}")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_STALL_AFTER = 30 * 86400.0


@dataclass(frozen=True)
class Workload:
    namespace: str
    kind: str
    name: str


def _map(obj: Any, *path: str) -> Mapping[str, Any]:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}


def _str(m: Mapping[str, Any], key: str) -> str | None:
    v = m.get(key)
    return v if isinstance(v, str) and v else None


def _list(obj: Any, *path: str) -> list[Mapping[str, Any]]:
    *head, last = path
    v = _map(obj, *head).get(last)
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []


def labels_of(obj: Any) -> Mapping[str, Any]:
    return _map(obj, "metadata", "labels")


def annotations_of(obj: Any) -> Mapping[str, Any]:
    return _map(obj, "metadata", "annotations")


def controller_ref(pod: Any) -> Mapping[str, Any] | None:
    """The ownerReference with ``controller: true``, else the first one, else None."""
    refs = [r for r in _list(pod, "metadata", "ownerReferences") if _str(r, "kind") and _str(r, "name")]
    return next((r for r in refs if r.get("controller") is True), refs[0] if refs else None)


def _index(value: str | None) -> str | None:
    return value if value is not None and _INT.fullmatch(value) else None


def resolve(
    pod: Mapping[str, Any], trainjob_exists: Callable[[str, str], bool] | None = None
) -> tuple[Workload, str | None]:
    """The pod's workload and rank (a decimal string or None); see the module docstring."""
    meta = _map(pod, "metadata")
    ns, pod_name = _str(meta, "namespace") or "", _str(meta, "name") or ""
    lab, ann = labels_of(pod), annotations_of(pod)
    ref = controller_ref(pod)
    rank = (
        _index(_str(lab, COMPLETION_INDEX))
        or _index(_str(ann, COMPLETION_INDEX))
        or _index(_str(lab, LEGACY_REPLICA_INDEX))
    )

    def done(kind: str, name: str, fallback_rank: str | None = None) -> tuple[Workload, str | None]:
        return Workload(ns, kind, name), rank if rank is not None else fallback_rank

    jobset = _str(lab, JOBSET_NAME)
    trainjob = _str(lab, TRAINJOB_NAME)
    if trainjob:
        return done("TrainJob", trainjob, _index(_str(lab, JOBSET_JOB_INDEX)))
    if jobset:
        known = trainjob_exists is not None and trainjob_exists(ns, jobset)
        is_trainjob = known or _str(lab, TRAINJOB_STEP) is not None
        return done("TrainJob" if is_trainjob else "JobSet", jobset, _index(_str(lab, JOBSET_JOB_INDEX)))
    legacy = _str(lab, LEGACY_JOB_NAME)
    if legacy:
        return done(_legacy_kind(lab, ref), legacy)
    if ref is not None and ref["kind"] == "Job":
        return done("Job", ref["name"])
    job = _str(lab, "batch.kubernetes.io/job-name") or _str(lab, "job-name")
    if job:
        return done("Job", job)
    ray = _str(lab, RAY_CLUSTER)
    if ray:
        return done("RayCluster", ray)
    if ref is not None:
        kind, name = ref["kind"], ref["name"]
        if kind == "ReplicaSet":
            h = _str(lab, "pod-template-hash")
            if h and name.endswith("-" + h) and len(name) > len(h) + 1:
                return done("Deployment", name[: -len(h) - 1])
        if kind == "StatefulSet":
            ordinal = _index(_str(lab, POD_INDEX))
            if ordinal is None and pod_name.startswith(name + "-"):
                ordinal = _index(pod_name[len(name) + 1 :])
            return done(kind, name, ordinal)
        return done(kind, name)
    return done("Pod", pod_name)


def _legacy_kind(lab: Mapping[str, Any], ref: Mapping[str, Any] | None) -> str:
    if ref is not None:
        group = str(ref.get("apiVersion", "")).split("/")[0]
        if group == "kubeflow.org" or group.endswith(".kubeflow.org"):
            return str(ref["kind"])
    op = _str(lab, LEGACY_OPERATOR)
    if op in _OPERATOR_KINDS:
        return _OPERATOR_KINDS[op]
    role = (_str(lab, LEGACY_REPLICA_TYPE) or _str(lab, LEGACY_JOB_ROLE) or "").lower()
    return _REPLICA_KINDS.get(role, "KubeflowJob")


def _count(resources: Mapping[str, Any]) -> dict[str, int]:
    """GPU resource -> count of one container; limits win over requests (extended resources)."""
    out: dict[str, int] = {}
    for section in ("requests", "limits"):
        for name, qty in _map(resources, section).items():
            if name != GPU and not (isinstance(name, str) and name.startswith(MIG_PREFIX)):
                continue
            n = qty if isinstance(qty, int) and not isinstance(qty, bool) else None
            if isinstance(qty, str) and _INT.fullmatch(qty.strip()):
                n = int(qty.strip())
            if n is not None and n >= 0:
                out[name] = n
    return {k: v for k, v in out.items() if v > 0}


def effective_gpu_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Per resource, what the scheduler holds: max(sum(app + sidecars), each init + sidecars before it)."""
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in _list(pod, "spec", "initContainers"):
        counts = _count(_map(c, "resources"))
        if c.get("restartPolicy") == "Always":
            for k, v in counts.items():
                sidecars[k] = sidecars.get(k, 0) + v
        else:
            for k in set(counts) | set(sidecars):
                init_peak[k] = max(init_peak.get(k, 0), counts.get(k, 0) + sidecars.get(k, 0))
    total = dict(sidecars)
    for c in _list(pod, "spec", "containers"):
        for k, v in _count(_map(c, "resources")).items():
            total[k] = total.get(k, 0) + v
    out = {k: max(total.get(k, 0), init_peak.get(k, 0)) for k in set(total) | set(init_peak)}
    return {k: v for k, v in sorted(out.items()) if v > 0}


def mig_share(resource: str) -> float | None:
    """The GPU share of one instance of a MIG resource (``nvidia.com/mig-3g.40gb`` -> 3/7), or None."""
    if not resource.startswith(MIG_PREFIX):
        return None
    m = _MIG.fullmatch(resource[len(MIG_PREFIX) :])
    if m is None:
        return None
    compute, gi = m.group(1), int(m.group(2))
    slices = 4 if f"{gi}g.{m.group(3)}gb" in _A30_PROFILES else 7
    used = int(compute) if compute is not None else gi
    return min(used, slices) / slices if used > 0 else None


def gpus_requested(pod: Mapping[str, Any]) -> tuple[float, dict[str, int]]:
    """(GPUs held, whole GPUs plus MIG shares; raw count per resource name). An unknown MIG name counts 1."""
    raw = effective_gpu_requests(pod)
    total = 0.0
    for name, n in raw.items():
        share = 1.0 if name == GPU else mig_share(name)
        total += n * (share if share is not None else 1.0)
    return total, raw


def is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    return bool(effective_gpu_requests(pod))


def main_container(pod: Mapping[str, Any]) -> str | None:
    """The first app container requesting a GPU, else the first container; None without containers."""
    containers = [c for c in _list(pod, "spec", "containers") if _str(c, "name")]
    gpu = [c for c in containers if _count(_map(c, "resources"))]
    chosen = gpu[0] if gpu else containers[0] if containers else None
    return None if chosen is None else str(chosen["name"])


def main_container_state(pod: Mapping[str, Any]) -> tuple[bool | None, str | None]:
    """(terminated?, reason) of the main container; (None, None) while it has no status yet."""
    name = main_container(pod)
    for st in _list(pod, "status", "containerStatuses"):
        if name is not None and st.get("name") == name:
            term = _map(st, "state", "terminated")
            if term:
                return True, _str(term, "reason")
            return (False, None) if _map(st, "state") else (None, None)
    return None, None


def main_container_terminated(pod: Mapping[str, Any]) -> bool | None:
    return main_container_state(pod)[0]


def exempt(obj: Mapping[str, Any]) -> bool:
    """True when the object's annotation ``gpu-telemetry.io/exempt`` is ``"true"`` (any case, trimmed)."""
    v = annotations_of(obj).get(EXEMPT)
    return isinstance(v, str) and v.strip().lower() == "true"


class DurationError(ValueError):
    """A duration text that is not ``<number><unit>...`` (units ms, s, m, h, d), or out of range."""


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (``90s``, ``30m``, ``1h30m``, ``1.5h``); above 0, at most 30 days."""
    t = text.strip()
    parts = _DURATION_PART.findall(t)
    if not t or "".join(n + u for n, u in parts) != t:
        raise DurationError(f"{text!r} is not a duration like 30m, 2h, 90s or 1h30m")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not 0 < seconds <= MAX_STALL_AFTER:
        raise DurationError(f"{text!r} is not above 0 and at most 30 days")
    return seconds


def stall_after_annotation(obj: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """(seconds, None) for a good ``gpu-telemetry.io/stall-after``; (None, reason) for a bad one; (None, None) unset."""
    v = annotations_of(obj).get(STALL_AFTER)
    if v is None:
        return None, None
    if not isinstance(v, str):
        return None, f"{STALL_AFTER}: not a string"
    try:
        return parse_duration(v), None
    except DurationError as e:
        return None, f"{STALL_AFTER}: {e}"


def stall_after_override(obj: Mapping[str, Any]) -> float | None:
    """The override in seconds, or None when unset or bad (:func:`stall_after_annotation` gives the reason)."""
    return stall_after_annotation(obj)[0]
