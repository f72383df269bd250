"""Pod attribution: which pods hold which GPU, from the kubelet PodResources v1 API.

A background thread (``PodResourcesSource.start()``) asks the kubelet every ``refresh_s``; the
collector's ``get()`` only reads the last good answer, so a slow or hung kubelet never delays a
GPU collection cycle. Like dcgm-exporter, attribution is best effort: nothing here raises into the
collector, and a kubelet problem costs the pod labels, never the scrape.

Decisions:

* Keys are what NVML reports: the GPU UUID (``GPU-...``) or the MIG device UUID (``MIG-...``).
  The kubelet's device ids are translated with a lookup table built from the device list
  (``DeviceKeys``), following dcgm-exporter 4.8.2 ``internal/pkg/transformation/kubernetes.go``
  (``toDeviceToPod``, ``toDeviceToSharingPods``, ``gkeMigDeviceIDRegex``):

  - ``GPU-<uuid>`` and ``GPU-<uuid>::N`` (time-slicing / MPS replica): the GPU, with
    ``--kubernetes-gpu-id-type uid`` (the default);
  - ``nvidia<N>`` and GKE's ``nvidia<N>/vgpu<M>``: GPU index N, with ``device-name``;
  - ``MIG-<uuid>`` (``::N`` stripped): that MIG device, whatever the id type;
  - legacy ``MIG-GPU-<uuid>/<gi>/<ci>``: the MIG device of GPU instance ``gi`` on that GPU;
  - GKE ``nvidia<N>/gi<G>`` (optionally ``/vgpu<M>``): GPU instance G on GPU index N.

  Anything else (DRA claims, other vendors' ids) matches no GPU and is dropped.
* Shared GPUs (time-slicing, MPS): with ``virtual_gpus`` (``--kubernetes-virtual-gpus``) every pod
  holding a share is returned, each replica it holds (``::N``, ``/vgpuN``) as its own holder with
  ``vgpu="N"`` (one series per pod and replica, as dcgm-exporter's flag does); without it one
  holder is chosen deterministically (the first by namespace, pod, container), never by the
  kubelet's List order, which changes between calls and would flap the labels.
* Failure policy: the last good answer is served for at most ``max_age_s`` (default 5 min) after
  the last successful call, then ``{}``: a kubelet restart does not strip and re-add pod labels
  (new series in Prometheus and AMP), and a long outage drops the labels rather than attribute
  GPUs to pods that may have gone. Each failed call counts in ``errors``.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import grpc

from exporter.backend import DeviceInfo
from exporter.proto import podresources_v1_pb2 as pb
from exporter.proto import podresources_v1_pb2_grpc as pb_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCE_NAMES = ("nvidia.com/gpu",)  # dcgm-exporter appconfig.NvidiaResourceName
DEFAULT_RESOURCE_PREFIXES = ("nvidia.com/mig-",)  # dcgm-exporter appconfig.NvidiaMigResourcePrefix
GPU_ID_TYPES = ("uid", "device-name")  # dcgm-exporter appconfig.GPUUID, appconfig.DeviceName
GpuIdType = Literal["uid", "device-name"]
_MAX_RECEIVE_BYTES = 16 * 1024 * 1024  # same as the kubelet's own podresources client
_GKE_MIG = re.compile(r"^nvidia([0-9]+)/gi([0-9]+)(?:/vgpu[0-9]+)?$")
_GKE_VGPU = re.compile(r"^(nvidia[0-9]+)/vgpu[0-9]+$")
_DEVICE_NAME = re.compile(r"^nvidia([0-9]+)$")
_VGPU_SUFFIX = re.compile(r"/vgpu([0-9]+)$")
_LEGACY_MIG = re.compile(r"^MIG-(GPU-[^/]+)/([0-9]+)/([0-9]+)$")
_LOG = logging.getLogger(__name__)

PodMap = dict[str, tuple["PodInfo", ...]]


@dataclass(frozen=True, slots=True)
class PodInfo:
    """Who holds a device: the pod, its namespace, and the container the device is allocated to."""

    pod: str
    namespace: str
    container: str
    # the replica of a shared GPU (``--kubernetes-virtual-gpus`` only): "N" of ``GPU-<uuid>::N`` or
    # GKE's ``.../vgpuN``, dcgm-exporter's ``vgpu`` label; "" when none
    vgpu: str = ""
    # from the API server (exporter.podmeta, --kubernetes-enable-pod-uid / -pod-labels); empty otherwise
    uid: str = ""
    labels: tuple[tuple[str, str], ...] = ()


def holder_order(info: PodInfo) -> tuple[str, str, str, int, str]:
    """The deterministic order of a shared GPU's holders: namespace, pod, container, replica."""
    replica = int(info.vgpu) if info.vgpu.isdigit() else -1
    return (info.namespace, info.pod, info.container, replica, info.vgpu)


def replica_of(device_id: str) -> str:
    """The shared-GPU replica a kubelet device id names, as dcgm-exporter 4.8.2's ``getSharedGPU``:
    ``GPU-<uuid>::3`` and GKE's ``nvidia0/vgpu3`` (or ``nvidia0/gi1/vgpu3``) -> ``"3"``; else ``""``."""
    if m := _VGPU_SUFFIX.search(device_id):
        return m.group(1)
    head, sep, tail = device_id.rpartition("::")
    return tail if sep and head and tail.isdigit() else ""


@dataclass(frozen=True, slots=True)
class DeviceKeys:
    """The lookup from kubelet device ids to NVML keys, built from the device list."""

    by_index: Mapping[int, str]  # NVML index -> GPU UUID
    mig: Mapping[tuple[str, int], str]  # (GPU UUID, GPU instance id) -> MIG UUID

    @classmethod
    def from_devices(cls, devices: Iterable[DeviceInfo]) -> DeviceKeys:
        by_index: dict[int, str] = {}
        mig: dict[tuple[str, int], str] = {}
        for d in devices:
            by_index[d.index] = d.uuid
            for m in d.mig:
                mig[(d.uuid, m.gpu_instance_id)] = m.uuid
        return cls(by_index, mig)


NO_DEVICES = DeviceKeys({}, {})


def strip_replica(device_id: str) -> str:
    """``"GPU-<uuid>::3"`` -> ``"GPU-<uuid>"`` (time-slicing / MPS replica); else unchanged."""
    head, sep, tail = device_id.rpartition("::")
    if sep and head and tail.isdigit():
        return head
    return device_id


def resolve_device_id(device_id: str, keys: DeviceKeys, id_type: GpuIdType = "uid") -> str | None:
    """The NVML key (GPU or MIG UUID) a kubelet device id names, or None when it names none."""
    device_id = strip_replica(device_id)
    if m := _LEGACY_MIG.match(device_id):
        return keys.mig.get((m.group(1), int(m.group(2))))
    if device_id.startswith("MIG-"):
        return device_id
    if m := _GKE_MIG.match(device_id):
        gpu = keys.by_index.get(int(m.group(1)))
        return None if gpu is None else keys.mig.get((gpu, int(m.group(2))))
    if id_type == "uid":
        return device_id if device_id.startswith("GPU-") else None
    if m := _GKE_VGPU.match(device_id):
        device_id = m.group(1)
    if m := _DEVICE_NAME.match(device_id):
        return keys.by_index.get(int(m.group(1)))
    return None


def map_pod_resources(
    pods: Iterable[pb.PodResources],
    keys: DeviceKeys = NO_DEVICES,
    *,
    resource_names: Iterable[str] = DEFAULT_RESOURCE_NAMES,
    resource_prefixes: Iterable[str] = DEFAULT_RESOURCE_PREFIXES,
    id_type: GpuIdType = "uid",
    virtual_gpus: bool = False,
) -> PodMap:
    """Device key -> holders (sorted; only the first without ``virtual_gpus``). Pure."""
    names = frozenset(resource_names)
    prefixes = tuple(resource_prefixes)
    holders: dict[str, set[PodInfo]] = {}
    for pod in pods:
        for container in pod.containers:
            info = PodInfo(pod=pod.name, namespace=pod.namespace, container=container.name)
            for devices in container.devices:
                if devices.resource_name not in names and not devices.resource_name.startswith(prefixes):
                    continue
                for device_id in devices.device_ids:
                    key = resolve_device_id(device_id, keys, id_type)
                    if key is not None:
                        held = replace(info, vgpu=replica_of(device_id)) if virtual_gpus else info
                        holders.setdefault(key, set()).add(held)
    out: PodMap = {}
    for key, infos in holders.items():
        ordered = tuple(sorted(infos, key=holder_order))
        out[key] = ordered if virtual_gpus else ordered[:1]
    return out


class PodResourcesSource:
    """Asks the kubelet who holds which GPU, over one reused gRPC channel on its unix socket.

    ``refresh()`` makes one List call (bounded by ``timeout``) and never raises; ``start()`` runs
    it every ``refresh_s`` on a daemon thread; ``get()`` returns the last good answer at once.
    A problem is logged once when it starts (and again when it changes), recovery once. After a
    failed call the channel is rebuilt, so a restarted kubelet is picked up at once instead of
    after gRPC's reconnect backoff (up to two minutes). ``close()`` cancels a call in flight.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        timeout: float = 10.0,
        resource_names: Sequence[str] = DEFAULT_RESOURCE_NAMES,
        resource_prefixes: Sequence[str] = DEFAULT_RESOURCE_PREFIXES,
        log: logging.Logger = _LOG,
        *,
        devices: Callable[[], Iterable[DeviceInfo]] = lambda: (),
        id_type: GpuIdType = "uid",
        virtual_gpus: bool = False,
        refresh_s: float = 5.0,
        max_age_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be positive, got {refresh_s!r}")
        if max_age_s < 0:
            raise ValueError(f"max_age_s must be >= 0, got {max_age_s!r}")
        if id_type not in GPU_ID_TYPES:
            raise ValueError(f"id_type must be one of {', '.join(GPU_ID_TYPES)}, got {id_type!r}")
        self.socket_path = socket_path
        self.timeout = timeout
        self.resource_names = tuple(resource_names)
        self.resource_prefixes = tuple(resource_prefixes)
        self.id_type: GpuIdType = id_type
        self.virtual_gpus = virtual_gpus
        self.refresh_s = refresh_s
        self.max_age_s = max_age_s
        self.errors = 0
        self._devices = devices
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self._channel: Any = None
        self._list: Any = None
        self._closed = False
        self._problem: str | None = None
        self._last: PodMap = {}
        self._last_ok: float | None = None
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self) -> PodMap:
        """Device key (GPU or MIG UUID) -> holders; ``{}`` when unknown or too old. Never blocks."""
        with self._lock:
            if self._closed or self._last_ok is None or self._clock() - self._last_ok > self.max_age_s:
                return {}
            return dict(self._last)

    def refresh(self) -> bool:
        """One List call; True when it succeeded. Never raises."""
        if self._closed:
            return False
        try:
            problem, detail = self._socket_problem()
            if problem is None:
                pods, problem, detail = self._call()
                if problem is None:
                    keys = DeviceKeys.from_devices(self._devices())
                    mapping = map_pod_resources(
                        pods, keys, resource_names=self.resource_names, resource_prefixes=self.resource_prefixes,
                        id_type=self.id_type, virtual_gpus=self.virtual_gpus,
                    )
                    self._succeeded(mapping)
                    return True
        except Exception as exc:  # never let the refresher die
            problem, detail = "unexpected error", repr(exc)
        self._failed(problem, detail)
        return False

    def start(self) -> None:
        """Refresh now and then every ``refresh_s`` on a daemon thread, until ``close()``."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="kubelet-pods", daemon=True)
            self._thread.start()

    def wait_first(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the first refresh to finish (either way)."""
        return self._first.wait(timeout)

    def close(self) -> None:
        """Stop the refresher, close the channel (cancels a call in flight); ``get()`` is ``{}``."""
        self._stop.set()
        with self._lock:
            self._closed = True
            self._drop_channel_locked()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    # -- internals -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._first.set()
            self._stop.wait(self.refresh_s)

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

    def _call(self) -> tuple[Sequence[pb.PodResources], str | None, str]:
        with self._lock:
            if self._closed:
                return (), "closed", "the source was closed"
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
            return (), f"List failed: {name}", f"{name}: {details}"
        return response.pod_resources, None, ""

    def _drop_channel_locked(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._list = None

    def _succeeded(self, mapping: PodMap) -> None:
        with self._lock:
            self._last = mapping
            self._last_ok = self._clock()
        if self._problem is not None:
            self._log.info("kubelet pod-resources: recovered, %d GPU devices attributed", len(mapping))
            self._problem = None

    def _failed(self, problem: str, detail: str) -> None:
        self.errors += 1
        if problem != self._problem:
            self._log.warning(
                "kubelet pod-resources: %s (%s); keeping the last pod attribution for up to %gs",
                problem, detail, self.max_age_s, extra={"reason": problem},
            )
            self._problem = problem
