"""Pod UID and labels from the API server, for ``--kubernetes-enable-pod-uid`` and
``--kubernetes-enable-pod-labels`` (the kubelet's PodResources API names pods but has no UID or
labels; dcgm-exporter 4.8.2 reads them from the API server too).

``PodMetadata.enrich(pods)`` never waits on the network: it fills each holder's ``uid`` and
``labels`` from a small cache and queues the pods it has not seen; one worker thread fetches them
with ``GET /api/v1/namespaces/{ns}/pods/{name}`` (RBAC: ``get`` on pods, the kustomize component
``deploy/exporter/pod-metadata``). A pod's first cycle is therefore served without them. Entries
expire after ``ttl_s`` (labels can change) and the cache holds at most ``max_entries`` pods (the
node's pods; the oldest go first). Label names are sanitized as dcgm-exporter does (every character
outside ``[a-zA-Z0-9_]`` becomes ``_``). A failing API server is logged once per kind of failure
(status) until a fetch succeeds again; holders then keep the values last fetched, or none.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from exporter.kubernetes import PodInfo

log = logging.getLogger("exporter.podmeta")
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
Meta = tuple[str, tuple[tuple[str, str], ...]]  # (uid, sanitized labels)


class PodGetter(Protocol):
    def get(self, path: str) -> dict[str, Any]: ...


def sanitize_label_name(name: str) -> str:
    return _INVALID.sub("_", name)


def meta_of(obj: Mapping[str, Any], labels: bool) -> Meta:
    md = obj.get("metadata") or {}
    uid = str(md.get("uid") or "")
    raw = md.get("labels") or {} if labels else {}
    pairs = {sanitize_label_name(str(k)): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    return uid, tuple(sorted(pairs.items()))


class PodMetadata:
    def __init__(
        self,
        client: PodGetter,
        *,
        uid: bool,
        labels: bool,
        ttl_s: float = 300.0,
        retry_s: float = 30.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._uid, self._labels = uid, labels
        self._ttl_s, self._retry_s, self._max = ttl_s, retry_s, max_entries
        self._clock = clock
        self._cache: OrderedDict[tuple[str, str], tuple[float, Meta | None]] = OrderedDict()
        self._pending: set[tuple[str, str]] = set()
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._failing: str | None = None
        self._thread: threading.Thread | None = None
        self.fetches = 0
        self.errors = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-metadata", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def enrich(self, pods: Mapping[str, Sequence[PodInfo]]) -> dict[str, tuple[PodInfo, ...]]:
        """The same map with each holder's ``uid``/``labels`` from the cache; misses are queued."""
        now = self._clock()
        out: dict[str, tuple[PodInfo, ...]] = {}
        for key, holders in pods.items():
            out[key] = tuple(self._one(p, now) for p in holders)
        return out

    def _one(self, pod: PodInfo, now: float) -> PodInfo:
        k = (pod.namespace, pod.pod)
        with self._lock:
            entry = self._cache.get(k)
            stale = entry is None or now >= entry[0]
            if stale and k not in self._pending:
                self._pending.add(k)
                self._queue.put(k)
        meta = entry[1] if entry is not None else None
        if meta is None:
            return pod
        return replace(pod, uid=meta[0] if self._uid else "", labels=meta[1] if self._labels else ())

    def fetch(self, namespace: str, name: str) -> None:
        """Fetch one pod now (the worker's step; tests call it directly)."""
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}"
        self.fetches += 1
        try:
            meta: Meta | None = meta_of(self._client.get(path), self._labels)
            expires = self._clock() + self._ttl_s
            if self._failing is not None:
                log.info("pod metadata from the API server works again")
                self._failing = None
        except Exception as exc:  # KubeError, OSError, a bad answer: keep what we had
            self.errors += 1
            status = str(getattr(exc, "status", type(exc).__name__))
            if status != self._failing:
                self._failing = status
                hint = " (the exporter needs RBAC get on pods: deploy/exporter/pod-metadata)" if status == "403" else ""
                log.warning("pod metadata for %s/%s from the API server failed: %s%s", namespace, name, exc, hint)
            with self._lock:
                old = self._cache.get((namespace, name))
            meta = old[1] if old is not None else None
            expires = self._clock() + self._retry_s
        with self._lock:
            self._cache[(namespace, name)] = (expires, meta)
            self._cache.move_to_end((namespace, name))
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
            self._pending.discard((namespace, name))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self.fetch(*item)
