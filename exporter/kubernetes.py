"""Pod attribution: which pod holds which GPU, from the kubelet PodResources v1 API.

The collector calls ``PodResourcesSource.get()`` once per collection cycle (never on the scrape
path) and adds ``pod``, ``namespace``, ``container`` to the series of the GPUs (or MIG instances)
in the answer. Like dcgm-exporter, pod attribution is best effort: nothing here ever raises into
the collector, and a kubelet problem costs the pod labels, never the scrape.

Decisions (see also ``PodResourcesSource``):

* Keys are what NVML reports: the GPU UUID (``GPU-...``) or the MIG device UUID (``MIG-...``).
  The device plugin's time-slicing / MPS replica suffix ``::N`` is stripped (``parse_device_id``).
* Shared GPUs (time-slicing, MPS): several pods hold replicas of one GPU, but the map is
  device -> one holder, so the last container in the kubelet's answer wins. That is what
  dcgm-exporter does without ``--kubernetes-virtual-gpus``; per-pod shares of one GPU cannot be
  told apart from device counters anyway.
* Legacy MIG ids (``MIG-GPU-<uuid>/<gi>/<ci>``), GKE ids (``nvidia0/gi1``) and DRA claims
  (``dynamic_resources``) are not translated: such ids are kept as they are and simply match no
  NVML UUID.
* Failure policy: after a failed call (socket missing, gRPC error, timeout) the last good answer
  is served for at most ``grace_cycles`` (default 1) more cycles, then ``{}``. One failed cycle
  (a kubelet restart) then does not strip and re-add pod labels, which would start new series in
  Prometheus and in AMP; a longer outage drops the labels rather than attribute GPUs to pods that
  may have gone.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from exporter.proto import podresources_v1_pb2 as pb
from exporter.proto import podresources_v1_pb2_grpc as pb_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_MAX_RECEIVE_BYTES = 16 * 1024 * 1024  # same as the kubelet's own podresources client
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodInfo:
    """Who holds a device: the pod, its namespace, and the container the device is allocated to."""

    pod: str
    namespace: str
    container: str


def parse_device_id(device_id: str) -> str:
    """The NVML key of a device id from the kubelet.

    ``"GPU-<uuid>::3"`` -> ``"GPU-<uuid>"`` (time-slicing / MPS replica),
    ``"MIG-<uuid>::1"`` -> ``"MIG-<uuid>"``; any other id is returned unchanged.
    """
    head, sep, tail = device_id.rpartition("::")
    if sep and head and tail.isdigit():
        return head
    return device_id


def _wanted(resource: str, names: frozenset[str], prefixes: tuple[str, ...]) -> bool:
    return resource in names or resource.startswith(prefixes)


def map_pod_resources(
    pods: Iterable[pb.PodResources], resource_names: Iterable[str], resource_prefixes: Iterable[str]
) -> dict[str, PodInfo]:
    """Device key -> holder for the GPU resources in a List answer. Pure; later containers win."""
    names = frozenset(resource_names)
    prefixes = tuple(resource_prefixes)
    out: dict[str, PodInfo] = {}
    for pod in pods:
        for container in pod.containers:
            info = PodInfo(pod=pod.name, namespace=pod.namespace, container=container.name)
            for devices in container.devices:
                if not _wanted(devices.resource_name, names, prefixes):
                    continue
                for device_id in devices.device_ids:
                    out[parse_device_id(device_id)] = info
    return out


class PodResourcesSource:
    """Asks the kubelet who holds which GPU, over one reused gRPC channel on its unix socket.

    ``get()`` never raises. ``errors`` counts failed cycles (socket missing or unusable, gRPC
    error, timeout) for a self-metric. A problem is logged once when it starts (and again when it
    changes), and recovery is logged once; a persisting problem is not logged every cycle.
    After a failed call the channel is rebuilt on the next cycle, so a restarted kubelet is picked
    up at once instead of after gRPC's reconnect backoff (up to two minutes).

    ``get()`` is called by one thread (the collector's); ``close()`` may come from any thread and
    cancels a call in flight. Keep ``timeout`` under the collection interval: a hung kubelet
    delays the cycle by up to ``timeout``.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        timeout: float = 10.0,
        resource_names: Sequence[str] = ("nvidia.com/gpu",),
        resource_prefixes: Sequence[str] = ("nvidia.com/mig-",),
        log: logging.Logger = _LOG,
        grace_cycles: int = 1,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if grace_cycles < 0:
            raise ValueError(f"grace_cycles must be >= 0, got {grace_cycles!r}")
        self.socket_path = socket_path
        self.timeout = timeout
        self.resource_names = tuple(resource_names)
        self.resource_prefixes = tuple(resource_prefixes)
        self.grace_cycles = grace_cycles
        self.errors = 0
        self._log = log
        self._lock = threading.Lock()
        self._channel: Any = None
        self._list: Any = None
        self._closed = False
        self._problem: str | None = None
        self._last: dict[str, PodInfo] = {}
        self._failed_cycles = 0

    def get(self) -> dict[str, PodInfo]:
        """Device key (GPU or MIG UUID) -> who holds it; ``{}`` when unknown. Never raises."""
        if self._closed:
            return {}
        try:
            problem, detail = self._socket_problem()
            if problem is None:
                mapping, problem, detail = self._call()
                if problem is None:
                    return self._succeeded(mapping)
        except Exception as exc:  # never fail the collection cycle
            problem, detail = "unexpected error", repr(exc)
        return self._failed(problem, detail)

    def close(self) -> None:
        """Close the channel (cancels a call in flight). ``get()`` afterwards returns ``{}``."""
        with self._lock:
            self._closed = True
            self._drop_channel_locked()

    # -- internals -------------------------------------------------------------------------

    def _socket_problem(self) -> tuple[str | None, str]:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            return "socket missing", f"{self.socket_path} does not exist (is the hostPath mounted?)"
        except OSError as exc:
            return "socket unusable", f"{self.socket_path}: {exc.strerror}"
        if not stat.S_ISSOCK(mode):
            return "not a socket", f"{self.socket_path} is not a unix socket"
        return None, ""

    def _call(self) -> tuple[dict[str, PodInfo], str | None, str]:
        with self._lock:
            if self._closed:
                return {}, "closed", "the source was closed"
            if self._list is None:
                target = "unix://" + os.path.abspath(self.socket_path)
                self._channel = grpc.insecure_channel(
                    target, options=[("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES)]
                )
                stub = pb_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
                self._list = stub.List
            list_call = self._list
        try:
            response = list_call(pb.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            name = code.name if code is not None else "UNKNOWN"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            with self._lock:
                self._drop_channel_locked()
            return {}, f"List failed: {name}", f"{name}: {details}"
        mapping = map_pod_resources(response.pod_resources, self.resource_names, self.resource_prefixes)
        return mapping, None, ""

    def _drop_channel_locked(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._list = None

    def _succeeded(self, mapping: dict[str, PodInfo]) -> dict[str, PodInfo]:
        if self._problem is not None:
            self._log.info("kubelet pod-resources: recovered, %d GPU devices attributed", len(mapping))
            self._problem = None
        self._failed_cycles = 0
        self._last = mapping
        return dict(mapping)

    def _failed(self, problem: str, detail: str) -> dict[str, PodInfo]:
        self.errors += 1
        self._failed_cycles += 1
        if problem != self._problem:
            self._log.warning(
                "kubelet pod-resources: %s (%s); GPU series carry no pod labels until it recovers",
                problem,
                detail,
            )
            self._problem = problem
        if self._failed_cycles > self.grace_cycles:
            self._last = {}
        return dict(self._last)
