"""Realistic Kubernetes objects for jobwatch's tests, as the API server serves them (parsed JSON).

Each builder returns a fresh dict, so a test may change it. The shapes follow what the
controllers create: Kubeflow Trainer v2 (TrainJob -> JobSet -> indexed Job -> pod), the legacy
training-operator (PyTorchJob owns its pods), mpi-operator v2 (the launcher is a batch Job),
a Deployment's ReplicaSet, a Kubeflow Notebook's StatefulSet, and a KubeRay worker.
"""

from __future__ import annotations

import copy
import json
from typing import Any

NS = "ml-team"


def _container(name: str, gpus: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}}
    for k, v in (gpus or {}).items():
        res["requests"][k] = v
        res["limits"][k] = v
    return {"name": name, "image": "ghcr.io/example/train:1.4", "resources": res, **extra}


def _running(*names: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "hostIP": "10.0.12.7",
        "podIP": "10.1.4.22",
        "containerStatuses": [
            {"name": n, "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "2026-06-12T01:00:00Z"}}}
            for n in names
        ],
    }


def _pod(
    name: str,
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    containers: list[dict[str, Any]],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "resourceVersion": "481516",
        "creationTimestamp": "2026-06-12T00:58:00Z",
        "labels": labels,
        "annotations": annotations or {},
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {"blockOwnerDeletion": True, "controller": True, "uid": f"uid-{owner['name']}", **owner}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": "ip-10-0-12-7.ec2.internal", "restartPolicy": "OnFailure", "containers": containers},
        "status": _running(*(c["name"] for c in containers)),
    }


def trainjob_pod(
    trainjob: str = "llama-ft", index: int = 1, trainjob_label: bool = False, gpus: str = "8"
) -> dict[str, Any]:
    """A trainer pod of a TrainJob as Kubeflow Trainer v2.x creates it (runtime torch-distributed).

    The TrainJob owns a JobSet of its name; the JobSet's replicated job ``node`` is one indexed
    batch Job ``<name>-node-0`` whose pods carry the completion index (the torch node rank).
    Trainer releases with the progress/network-policy plugins also label the pod with
    ``trainer.kubeflow.org/trainjob-name`` (``trainjob_label=True``).
    """
    job = f"{trainjob}-node-0"
    labels = {
        "batch.kubernetes.io/controller-uid": "5b1e9c1c-7d4e-4c7a-9b0e-0f2a1c3d4e5f",
        "batch.kubernetes.io/job-completion-index": str(index),
        "batch.kubernetes.io/job-name": job,
        "controller-uid": "5b1e9c1c-7d4e-4c7a-9b0e-0f2a1c3d4e5f",
        "job-name": job,
        "jobset.sigs.k8s.io/global-replicas": "2",
        "jobset.sigs.k8s.io/job-global-index": "0",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/job-key": "3c1f8f2a7e9b4d6c8a0e2f4b6d8c0a1e3f5b7d9c",
        "jobset.sigs.k8s.io/jobset-name": trainjob,
        "jobset.sigs.k8s.io/jobset-uid": "a0b1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c4d",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/restart-attempt": "0",
    }
    if trainjob_label:
        labels["trainer.kubeflow.org/trainjob-name"] = trainjob
    annotations = {
        "batch.kubernetes.io/job-completion-index": str(index),
        "jobset.sigs.k8s.io/job-global-index": "0",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/jobset-name": trainjob,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
    }
    node = _container(
        "node",
        {"nvidia.com/gpu": gpus},
        env=[
            {"name": "PET_NNODES", "value": "2"},
            {"name": "PET_NPROC_PER_NODE", "value": gpus},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
                },
            },
        ],
    )
    return _pod(
        f"{job}-{index}-x7k2p", labels, {"apiVersion": "batch/v1", "kind": "Job", "name": job}, [node], annotations
    )


def jobset_pod() -> dict[str, Any]:
    """A plain JobSet's pod (no TrainJob above it); its Jobs are not indexed, so the job index is the rank."""
    p = trainjob_pod("sweep-js", index=0)
    for k in ("batch.kubernetes.io/job-completion-index",):
        del p["metadata"]["labels"][k]
        del p["metadata"]["annotations"][k]
    p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] = "3"
    return p


def pytorchjob_pod(replica_type: str = "worker", index: int = 2) -> dict[str, Any]:
    """A PyTorchJob pod from the legacy training-operator v1.8: owned by the PyTorchJob itself."""
    labels = {
        "training.kubeflow.org/job-name": "bert-pt",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-index": str(index),
        "training.kubeflow.org/replica-type": replica_type,
    }
    if replica_type == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "bert-pt"}
    return _pod(f"bert-pt-{replica_type}-{index}", labels, owner, [_container("pytorch", {"nvidia.com/gpu": "4"})])


def mpijob_launcher_pod() -> dict[str, Any]:
    """The launcher of an mpi-operator v2 MPIJob: a batch Job's pod with the legacy labels."""
    labels = {
        "batch.kubernetes.io/job-name": "resnet-mpi-launcher",
        "job-name": "resnet-mpi-launcher",
        "training.kubeflow.org/job-name": "resnet-mpi",
        "training.kubeflow.org/job-role": "launcher",
        "training.kubeflow.org/operator-name": "mpi-operator",
    }
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "resnet-mpi-launcher"}
    return _pod("resnet-mpi-launcher-5fz8q", labels, owner, [_container("launcher", {"nvidia.com/gpu": "1"})])


def batch_job_pod() -> dict[str, Any]:
    labels = {
        "batch.kubernetes.io/controller-uid": "c0ffee00-1111-4222-8333-444455556666",
        "batch.kubernetes.io/job-name": "nightly-eval",
        "controller-uid": "c0ffee00-1111-4222-8333-444455556666",
        "job-name": "nightly-eval",
    }
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "nightly-eval"}
    return _pod("nightly-eval-9qv4t", labels, owner, [_container("eval", {"nvidia.com/gpu": "1"})])


def deployment_pod(gpus: dict[str, str] | None = None) -> dict[str, Any]:
    """A vLLM Deployment's pod: owned by its ReplicaSet ``<deployment>-<pod-template-hash>``."""
    labels = {"app": "vllm", "pod-template-hash": "7d9f8b6c5d"}
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-7d9f8b6c5d"}
    c = _container("vllm", gpus if gpus is not None else {"nvidia.com/gpu": "1"})
    p = _pod("vllm-7d9f8b6c5d-h4m2x", labels, owner, [c])
    p["spec"]["restartPolicy"] = "Always"
    return p


def statefulset_pod(ordinal: int = 0, index_label: bool = True) -> dict[str, Any]:
    """A Kubeflow Notebook's pod: the notebook controller runs a StatefulSet of the notebook's name."""
    labels = {
        "app": "nb-ana",
        "controller-revision-hash": "nb-ana-6c9d7f5b8",
        "notebook-name": "nb-ana",
        "statefulset": "nb-ana",
        "statefulset.kubernetes.io/pod-name": f"nb-ana-{ordinal}",
    }
    if index_label:
        labels["apps.kubernetes.io/pod-index"] = str(ordinal)
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "nb-ana"}
    p = _pod(f"nb-ana-{ordinal}", labels, owner, [_container("nb-ana", {"nvidia.com/gpu": "1"})])
    p["spec"]["restartPolicy"] = "Always"
    return p


def ray_worker_pod(owned: bool = True) -> dict[str, Any]:
    """A KubeRay 1.x worker pod: created by the operator, owned by the RayCluster."""
    labels = {
        "app.kubernetes.io/created-by": "kuberay-operator",
        "app.kubernetes.io/name": "kuberay",
        "ray.io/cluster": "rc-gpu",
        "ray.io/group": "gpu-group",
        "ray.io/identifier": "rc-gpu-worker",
        "ray.io/is-ray-node": "yes",
        "ray.io/node-type": "worker",
    }
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc-gpu"} if owned else None
    return _pod("rc-gpu-gpu-group-worker-8kq2w", labels, owner, [_container("ray-worker", {"nvidia.com/gpu": "2"})])


def bare_pod(gpus: dict[str, str] | None = None) -> dict[str, Any]:
    return _pod("scratch-gpu", {"run": "scratch-gpu"}, None, [_container("main", gpus or {"nvidia.com/gpu": "1"})])


def cpu_pod() -> dict[str, Any]:
    return _pod("web-0", {"app": "web"}, None, [_container("web")])


def with_annotations(obj: dict[str, Any], **ann: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out.setdefault("metadata", {}).setdefault("annotations", {}).update(ann)
    return out


# ---- progress payloads

UPSTREAM_STATUS: dict[str, Any] = {
    "progressPercentage": 45,
    "estimatedRemainingSeconds": 3600,
    "metrics": [
        {"name": "loss", "value": "0.2347"},
        {"name": "grad_norm", "value": "0.91"},
        {"name": "learning_rate", "value": "1.8e-05"},
        {"name": "eval_loss", "value": "0.31"},
        {"name": "current_step", "value": "450"},
        {"name": "total_steps", "value": "1000"},
        {"name": "current_epoch", "value": "1.35"},
    ],
    "lastUpdatedTime": "2026-06-12T03:00:00Z",
}


def trainjob(
    name: str = "llama-ft", trainer_status: dict[str, Any] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A TrainJob as the API serves it (trainer.kubeflow.org/v1alpha1), optionally with trainerStatus."""
    status: dict[str, Any] = {
        "conditions": [],
        "jobsStatus": [{"name": "node", "ready": 2, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}],
    }
    if trainer_status is not None:
        status["trainerStatus"] = copy.deepcopy(trainer_status)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "annotations": annotations or {}},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": "torch-distributed",
            },
            "trainer": {"numNodes": 2},
        },
        "status": status,
    }


RHOAI_ANNOTATION = json.dumps(
    {
        "progressPercentage": 45,
        "estimatedRemainingSeconds": 3600,
        "estimatedRemainingTimeSummary": "1 hour",
        "currentStep": 450,
        "totalSteps": 1000,
        "currentEpoch": 1.35,
        "totalEpochs": 3,
        "trainMetrics": {"loss": 0.2347, "learning_rate": 1.8e-05, "grad_norm": 0.91, "throughput_samples_sec": 52.1},
        "evalMetrics": {"eval_loss": 0.31},
        "lastUpdatedTime": "2026-06-12T03:00:00Z",
    },
    separators=(",", ":"),
)

# What the HF Transformers KubeflowCallback POSTs on a step end (datetime.now(timezone.utc).isoformat()).
HF_CALLBACK_BODY = json.dumps(
    {
        "trainerStatus": {
            "lastUpdatedTime": "2026-06-12T03:00:00.123456+00:00",
            "progressPercentage": 45,
            "estimatedRemainingSeconds": 3600,
            "metrics": [
                {"name": "loss", "value": "0.2347"},
                {"name": "grad_norm", "value": "0.91"},
                {"name": "learning_rate", "value": "1.8e-05"},
                {"name": "epoch", "value": "1.35"},
                {"name": "current_step", "value": "450"},
                {"name": "total_steps", "value": "1000"},
                {"name": "current_epoch", "value": "1.35"},
            ],
        }
    }
).encode()

T0 = 1781233200.0  # 2026-06-12T03:00:00Z
