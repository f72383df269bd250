"""jobwatch.workload: pod -> workload and rank, GPUs requested, main container, annotations."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jobwatch import workload as wl
from jobwatch.workload import Workload
from tests.jobwatch import objects as o

NS = o.NS


def _strip_owner(p: dict[str, Any]) -> dict[str, Any]:
    p = copy.deepcopy(p)
    p["metadata"].pop("ownerReferences", None)
    return p


def _labels(p: dict[str, Any], **changes: str | None) -> dict[str, Any]:
    p = copy.deepcopy(p)
    for k, v in changes.items():
        key = k.replace("__", "/").replace("_", "-")
        if v is None:
            p["metadata"]["labels"].pop(key, None)
        else:
            p["metadata"]["labels"][key] = v
    return p


RESOLVE = [
    ("trainjob-label", o.trainjob_pod(trainjob_label=True), None, ("TrainJob", "llama-ft"), "1"),
    ("trainjob-known-to-caller", o.trainjob_pod(index=0), {(NS, "llama-ft")}, ("TrainJob", "llama-ft"), "0"),
    (
        "trainjob-other-namespace-is-jobset",
        o.trainjob_pod(index=0),
        {("other", "llama-ft")},
        ("JobSet", "llama-ft"),
        "0",
    ),
    ("jobset-without-trainjob", o.trainjob_pod(index=1), set(), ("JobSet", "llama-ft"), "1"),
    (
        "trainjob-ancestor-label-on-pod",
        _labels(o.trainjob_pod(index=1), **{"trainer.kubeflow.org__trainjob_ancestor_step": "trainer"}),
        None,
        ("TrainJob", "llama-ft"),
        "1",
    ),
    ("jobset-rank-from-job-index", o.jobset_pod(), None, ("JobSet", "sweep-js"), "3"),
    ("pytorchjob-worker", o.pytorchjob_pod("worker", 2), None, ("PyTorchJob", "bert-pt"), "2"),
    ("pytorchjob-master", o.pytorchjob_pod("master", 0), None, ("PyTorchJob", "bert-pt"), "0"),
    ("pytorchjob-no-owner-operator-label", _strip_owner(o.pytorchjob_pod()), None, ("PyTorchJob", "bert-pt"), "2"),
    ("mpijob-launcher-via-batch-job", o.mpijob_launcher_pod(), None, ("MPIJob", "resnet-mpi"), None),
    (
        "legacy-replica-type-chief-is-tfjob",
        _labels(_strip_owner(o.pytorchjob_pod("chief", 0)), **{"training.kubeflow.org__operator_name": None}),
        None,
        ("TFJob", "bert-pt"),
        "0",
    ),
    (
        "legacy-unknown-kind-not-guessed",
        _labels(_strip_owner(o.pytorchjob_pod("worker", 1)), **{"training.kubeflow.org__operator_name": None}),
        None,
        ("KubeflowJob", "bert-pt"),
        "1",
    ),
    ("batch-job", o.batch_job_pod(), None, ("Job", "nightly-eval"), None),
    ("batch-job-label-only", _strip_owner(o.batch_job_pod()), None, ("Job", "nightly-eval"), None),
    (
        "batch-job-old-label-only",
        _labels(_strip_owner(o.batch_job_pod()), **{"batch.kubernetes.io__job_name": None}),
        None,
        ("Job", "nightly-eval"),
        None,
    ),
    ("raycluster-owned", o.ray_worker_pod(), None, ("RayCluster", "rc-gpu"), None),
    ("raycluster-label-only", o.ray_worker_pod(owned=False), None, ("RayCluster", "rc-gpu"), None),
    ("deployment-via-replicaset", o.deployment_pod(), None, ("Deployment", "vllm"), None),
    (
        "replicaset-without-hash-stays",
        _labels(o.deployment_pod(), pod_template_hash=None),
        None,
        ("ReplicaSet", "vllm-7d9f8b6c5d"),
        None,
    ),
    (
        "replicaset-hash-mismatch-stays",
        _labels(o.deployment_pod(), pod_template_hash="abc"),
        None,
        ("ReplicaSet", "vllm-7d9f8b6c5d"),
        None,
    ),
    ("statefulset-pod-index-label", o.statefulset_pod(3), None, ("StatefulSet", "nb-ana"), "3"),
    ("statefulset-ordinal-from-name", o.statefulset_pod(12, index_label=False), None, ("StatefulSet", "nb-ana"), "12"),
    ("bare-pod", o.bare_pod(), None, ("Pod", "scratch-gpu"), None),
]


@pytest.mark.parametrize(("pod", "trainjobs", "want", "rank"), [r[1:] for r in RESOLVE], ids=[r[0] for r in RESOLVE])
def test_resolve(
    pod: dict[str, Any], trainjobs: set[tuple[str, str]] | None, want: tuple[str, str], rank: str | None
) -> None:
    exists = None if trainjobs is None else (lambda ns, name: (ns, name) in trainjobs)
    assert wl.resolve(pod, exists) == (Workload(NS, *want), rank)


def _daemonset_pod() -> dict[str, Any]:
    p = o.bare_pod()
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-burn", "controller": True, "uid": "u"}
    ]
    return p


def _two_owners_pod() -> dict[str, Any]:
    p = o.bare_pod()
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-controller", "uid": "a"},
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "wf-7", "controller": True, "uid": "b"},
    ]
    return p


MALFORMED = [
    ("empty", {}, Workload("", "Pod", ""), None),
    (
        "labels-not-a-map",
        {"metadata": {"name": "p", "namespace": "n", "labels": ["x"]}},
        Workload("n", "Pod", "p"),
        None,
    ),
    (
        "owner-refs-not-a-list",
        {"metadata": {"name": "p", "namespace": "n", "ownerReferences": "Job"}},
        Workload("n", "Pod", "p"),
        None,
    ),
    (
        "owner-ref-without-name",
        {"metadata": {"name": "p", "namespace": "n", "ownerReferences": [{"kind": "Job"}]}},
        Workload("n", "Pod", "p"),
        None,
    ),
    (
        "rank-not-a-number",
        _labels(o.trainjob_pod(trainjob_label=True), **{"batch.kubernetes.io__job_completion_index": "one"}),
        Workload(NS, "TrainJob", "llama-ft"),
        "1",
    ),  # falls back to the annotation
    ("daemonset", _daemonset_pod(), Workload(NS, "DaemonSet", "gpu-burn"), None),
    ("other-controller-kind", _two_owners_pod(), Workload(NS, "Workflow", "wf-7"), None),
]


@pytest.mark.parametrize(("pod", "want", "rank"), [r[1:] for r in MALFORMED], ids=[r[0] for r in MALFORMED])
def test_resolve_never_raises(pod: dict[str, Any], want: Workload, rank: str | None) -> None:
    assert wl.resolve(pod) == (want, rank)


def _with(
    resources: dict[str, Any], init: list[dict[str, Any]] | None = None, containers: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    p = o.bare_pod()
    p["spec"]["containers"] = containers or [{"name": "main", "resources": resources}]
    if init is not None:
        p["spec"]["initContainers"] = init
    return p


def _init(name: str, gpus: str, sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


GPUS = [
    ("whole-gpus", o.trainjob_pod(gpus="8"), 8.0, {"nvidia.com/gpu": 8}),
    ("limits-only", _with({"limits": {"nvidia.com/gpu": "2"}}), 2.0, {"nvidia.com/gpu": 2}),
    ("requests-only", _with({"requests": {"nvidia.com/gpu": "3"}}), 3.0, {"nvidia.com/gpu": 3}),
    ("int-quantity", _with({"limits": {"nvidia.com/gpu": 4}}), 4.0, {"nvidia.com/gpu": 4}),
    ("mig-1g", o.deployment_pod({"nvidia.com/mig-1g.10gb": "2"}), 2 / 7, {"nvidia.com/mig-1g.10gb": 2}),
    ("mig-3g", o.deployment_pod({"nvidia.com/mig-3g.40gb": "1"}), 3 / 7, {"nvidia.com/mig-3g.40gb": 1}),
    ("mig-7g-is-whole", o.deployment_pod({"nvidia.com/mig-7g.80gb": "1"}), 1.0, {"nvidia.com/mig-7g.80gb": 1}),
    (
        "mig-h200-media-ext",
        o.deployment_pod({"nvidia.com/mig-1g.18gb+me": "1"}),
        1 / 7,
        {"nvidia.com/mig-1g.18gb+me": 1},
    ),
    ("mig-a30-quarter", o.deployment_pod({"nvidia.com/mig-1g.6gb": "1"}), 1 / 4, {"nvidia.com/mig-1g.6gb": 1}),
    (
        "mig-compute-instance",
        o.deployment_pod({"nvidia.com/mig-1c.3g.40gb": "1"}),
        1 / 7,
        {"nvidia.com/mig-1c.3g.40gb": 1},
    ),
    ("mig-unknown-name-counts-one", o.deployment_pod({"nvidia.com/mig-weird": "1"}), 1.0, {"nvidia.com/mig-weird": 1}),
    (
        "two-containers-sum",
        _with(
            {},
            containers=[
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-2g.20gb": "1"}}},
            ],
        ),
        3 + 2 / 7,
        {"nvidia.com/gpu": 3, "nvidia.com/mig-2g.20gb": 1},
    ),
    (
        "init-bigger-than-app-wins",
        _with({"limits": {"nvidia.com/gpu": "1"}}, init=[_init("warm", "4")]),
        4.0,
        {"nvidia.com/gpu": 4},
    ),
    (
        "init-smaller-than-app",
        _with({"limits": {"nvidia.com/gpu": "4"}}, init=[_init("warm", "1")]),
        4.0,
        {"nvidia.com/gpu": 4},
    ),
    (
        "sidecar-adds-to-app",
        _with({"limits": {"nvidia.com/gpu": "2"}}, init=[_init("side", "1", sidecar=True)]),
        3.0,
        {"nvidia.com/gpu": 3},
    ),
    (
        "init-after-sidecar-adds-sidecar",
        _with({"limits": {"nvidia.com/gpu": "1"}}, init=[_init("side", "1", sidecar=True), _init("warm", "4")]),
        5.0,
        {"nvidia.com/gpu": 5},
    ),
    ("zero-gpu", _with({"limits": {"nvidia.com/gpu": "0"}}), 0.0, {}),
    ("cpu-only", o.cpu_pod(), 0.0, {}),
    (
        "bad-quantities-ignored",
        _with(
            {"limits": {"nvidia.com/gpu": "1.5", "nvidia.com/mig-1g.10gb": "-1"}, "requests": {"nvidia.com/gpu": True}}
        ),
        0.0,
        {},
    ),
    ("other-vendor-ignored", _with({"limits": {"amd.com/gpu": "1", "nvidia.com/gpu.shared": "1"}}), 0.0, {}),
    ("no-spec", {"metadata": {}}, 0.0, {}),
]


@pytest.mark.parametrize(("pod", "total", "raw"), [r[1:] for r in GPUS], ids=[r[0] for r in GPUS])
def test_gpus_requested(pod: dict[str, Any], total: float, raw: dict[str, int]) -> None:
    got_total, got_raw = wl.gpus_requested(pod)
    assert got_total == pytest.approx(total)
    assert got_raw == raw
    assert wl.is_gpu_pod(pod) is bool(raw)


def _status(p: dict[str, Any], name: str, state: dict[str, Any]) -> dict[str, Any]:
    p = copy.deepcopy(p)
    for st in p["status"]["containerStatuses"]:
        if st["name"] == name:
            st["state"] = state
    return p


def _sidecar_first() -> dict[str, Any]:
    p = o.deployment_pod()
    p["spec"]["containers"].insert(0, {"name": "log-shipper", "resources": {}})
    p["status"]["containerStatuses"].insert(0, {"name": "log-shipper", "state": {"running": {}}})
    return p


TERM = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-06-12T05:00:00Z"}}
TERMINATED = [
    ("running", o.trainjob_pod(), False, None),
    ("completed", _status(o.trainjob_pod(), "node", TERM), True, "Completed"),
    (
        "oom",
        _status(o.trainjob_pod(), "node", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}),
        True,
        "OOMKilled",
    ),
    (
        "waiting-crashloop-is-not-terminated",
        _status(o.trainjob_pod(), "node", {"waiting": {"reason": "CrashLoopBackOff"}}),
        False,
        None,
    ),
    ("main-is-gpu-container-not-first", _status(_sidecar_first(), "vllm", TERM), True, "Completed"),
    ("sidecar-ended-main-running", _status(_sidecar_first(), "log-shipper", TERM), False, None),
    ("no-status-yet", {**o.trainjob_pod(), "status": {"phase": "Pending"}}, None, None),
    ("empty-state", _status(o.trainjob_pod(), "node", {}), None, None),
]


@pytest.mark.parametrize(("pod", "terminated", "reason"), [r[1:] for r in TERMINATED], ids=[r[0] for r in TERMINATED])
def test_main_container_terminated(pod: dict[str, Any], terminated: bool | None, reason: str | None) -> None:
    assert wl.main_container_terminated(pod) is terminated
    assert wl.main_container_state(pod) == (terminated, reason)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("true", True),
        ("True", True),
        (" true ", True),
        ("false", False),
        ("yes", False),
        ("", False),
        (None, False),
    ],
    ids=["true", "True", "spaces", "false", "yes", "empty", "unset"],
)
def test_exempt(value: str | None, want: bool) -> None:
    obj = o.deployment_pod() if value is None else o.with_annotations(o.deployment_pod(), **{wl.EXEMPT: value})
    assert wl.exempt(obj) is want


STALL_AFTER = [
    ("30m", 1800.0, None),
    ("2h", 7200.0, None),
    ("90s", 90.0, None),
    ("1h30m", 5400.0, None),
    ("1.5h", 5400.0, None),
    ("1d", 86400.0, None),
    ("500ms", 0.5, None),
    (" 45m ", 2700.0, None),
    ("30", None, "not a duration"),
    ("thirty minutes", None, "not a duration"),
    ("1h 30m", None, "not a duration"),
    ("-5m", None, "not a duration"),
    ("0s", None, "above 0"),
    ("31d", None, "at most 30 days"),
    ("", None, "not a duration"),
    ("1x", None, "not a duration"),
]


@pytest.mark.parametrize(("text", "seconds", "problem"), STALL_AFTER, ids=[repr(r[0]) for r in STALL_AFTER])
def test_stall_after_override(text: str, seconds: float | None, problem: str | None) -> None:
    obj = o.with_annotations(o.trainjob(), **{wl.STALL_AFTER: text})
    assert wl.stall_after_override(obj) == seconds
    value, reason = wl.stall_after_annotation(obj)
    assert value == seconds
    if problem is None:
        assert reason is None
    else:
        assert reason is not None and problem in reason and wl.STALL_AFTER in reason


def test_stall_after_unset_has_no_reason() -> None:
    assert wl.stall_after_annotation(o.trainjob()) == (None, None)
    assert wl.stall_after_annotation({"metadata": {"annotations": {wl.STALL_AFTER: 30}}})[1] is not None
