"""--kubernetes-enable-pod-uid / --kubernetes-enable-pod-labels (issue 21 point 6): UID and sanitized
labels from the API server (GET pods/{name}), cached, never fetched on the collection path."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from exporter.kubernetes import PodInfo
from exporter.podmeta import PodMetadata, sanitize_label_name
from exporter.render import with_pod
from exporter.settings import load_settings
from telemetry_common.kubeapi import KubeError

POD = {"metadata": {"name": "train-0", "namespace": "ml", "uid": "6a1f-uid",
                    "labels": {"app.kubernetes.io/name": "llama", "team": "nlp"}}}


class Api:
    """Answers GET /api/v1/namespaces/{ns}/pods/{name} as the API server does (404 when absent)."""

    def __init__(self, pods: dict[str, Any], status: int | None = None) -> None:
        self.pods, self.status = pods, status
        self.paths: list[str] = []

    def get(self, path: str) -> dict[str, Any]:
        self.paths.append(path)
        if self.status is not None:
            raise KubeError(self.status, "Forbidden" if self.status == 403 else "Error")
        if path not in self.pods:
            raise KubeError(404, "NotFound", "pods not found")
        return dict(self.pods[path])


HOLDER = PodInfo("train-0", "ml", "main")
PATH = "/api/v1/namespaces/ml/pods/train-0"


def test_first_cycle_queues_then_the_next_has_uid_and_sanitized_labels() -> None:
    api = Api({PATH: POD})
    meta = PodMetadata(api, uid=True, labels=True)
    assert meta.enrich({"GPU-1": (HOLDER,)}) == {"GPU-1": (HOLDER,)}  # never waits on the network
    meta.fetch("ml", "train-0")  # what the worker does
    (got,) = meta.enrich({"GPU-1": (HOLDER,)})["GPU-1"]
    assert got.uid == "6a1f-uid"
    assert got.labels == (("app_kubernetes_io_name", "llama"), ("team", "nlp"))
    assert api.paths == [PATH]


@pytest.mark.parametrize(("uid", "labels", "expected"), [
    (True, False, ',container="main",namespace="ml",pod="train-0",pod_uid="6a1f-uid"}'),
    (False, True, ',app_kubernetes_io_name="llama",team="nlp",container="main",namespace="ml",pod="train-0"}'),
])
def test_rendered_as_dcgm_exporter_labels_then_sorted_attributes(uid: bool, labels: bool, expected: str) -> None:
    meta = PodMetadata(Api({PATH: POD}), uid=uid, labels=labels)
    meta.fetch("ml", "train-0")
    (got,) = meta.enrich({"k": (HOLDER,)})["k"]
    assert with_pod('{gpu="0"', got) == '{gpu="0"' + expected


def test_a_pod_label_named_like_an_existing_label_is_left_out() -> None:
    pod = PodInfo("p", "n", "c", labels=(("gpu", "x"), ("pod", "y"), ("tier", "z")))
    expected = '{gpu="0",UUID="GPU-1",tier="z",container="c",namespace="n",pod="p"}'
    assert with_pod('{gpu="0",UUID="GPU-1"', pod) == expected


def test_forbidden_is_logged_once_with_the_rbac_hint_and_serves_without(caplog: pytest.LogCaptureFixture) -> None:
    meta = PodMetadata(Api({}, status=403), uid=True, labels=False)
    with caplog.at_level(logging.WARNING, logger="exporter.podmeta"):
        for _ in range(3):
            meta.fetch("ml", "train-0")
    (record,) = caplog.records
    assert "deploy/exporter/pod-metadata" in record.getMessage() and meta.errors == 3
    assert meta.enrich({"k": (HOLDER,)})["k"] == (HOLDER,)


def test_entries_expire_and_the_cache_is_bounded() -> None:
    now = [0.0]
    api = Api({PATH: POD, "/api/v1/namespaces/ml/pods/b": {"metadata": {"uid": "b"}}})
    meta = PodMetadata(api, uid=True, labels=False, ttl_s=60.0, max_entries=1, clock=lambda: now[0])
    meta.fetch("ml", "train-0")
    meta.fetch("ml", "b")  # evicts train-0
    assert meta.enrich({"k": (HOLDER,)})["k"] == (HOLDER,)
    now[0] = 61.0
    meta.enrich({"k": (PodInfo("b", "ml", "c"),)})
    assert meta._queue.qsize() == 2  # both queued again (evicted, expired)


def test_sanitize_matches_dcgm_exporter() -> None:
    assert sanitize_label_name("app.kubernetes.io/name-x") == "app_kubernetes_io_name_x"


def test_pod_flags_are_settings_not_no_effect_warnings() -> None:
    s = load_settings(["--kubernetes-enable-pod-uid", "--kubernetes-enable-pod-labels"], {})
    assert (s.pod_uid, s.pod_labels, s.warnings) == (True, True, ())
