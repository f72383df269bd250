"""A fake kubelet: a real gRPC PodResourcesLister server on a unix socket, serving scripted data.

Usage::

    with FakeKubelet() as kubelet:             # socket in a fresh short temp dir
        kubelet.set_pods([pod("train-0", "ml", {"main": [("nvidia.com/gpu", ["GPU-a"])]})])
        kubelet.fail_with(grpc.StatusCode.UNAVAILABLE)   # every List fails until fail_with(None)
        kubelet.hang()                          # List blocks until release() or stop()
        kubelet.restart()                       # stop and serve again on the same path

Unix socket paths are limited to 107 bytes, so the socket lives in a short ``/tmp/kl*`` dir rather
than pytest's long ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from types import TracebackType
from typing import Any

import grpc

from exporter.proto import podresources_v1_pb2 as pb
from exporter.proto import podresources_v1_pb2_grpc as pb_grpc

Devices = Sequence[tuple[str, Sequence[str]]]  # (resource_name, device_ids)
_HANG_LIMIT_S = 10.0  # a hung List returns by itself after this, so no test can wedge a worker


def pod(name: str, namespace: str, containers: Mapping[str, Devices]) -> pb.PodResources:
    """A PodResources message: container name -> [(resource name, [device ids])]."""
    return pb.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            pb.ContainerResources(
                name=cname,
                devices=[pb.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in devs],
            )
            for cname, devs in containers.items()
        ],
    )


class _Servicer(pb_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        return self._kubelet._answer(context)


class FakeKubelet:
    """A real ``grpc.server`` bound to ``unix://<socket_path>``; see the module docstring."""

    def __init__(self, socket_path: str | None = None) -> None:
        self._own_dir: str | None = None
        if socket_path is None:
            self._own_dir = tempfile.mkdtemp(prefix="kl", dir="/tmp")
            socket_path = os.path.join(self._own_dir, "kubelet.sock")
        self.socket_path = socket_path
        self.calls = 0
        self._lock = threading.Lock()
        self._pods: list[pb.PodResources] = []
        self._fail: tuple[grpc.StatusCode, str] | None = None
        self._release = threading.Event()
        self._release.set()
        self._server: Any = None

    # -- scripting ---------------------------------------------------------------------------

    def set_pods(self, pods: Sequence[pb.PodResources]) -> None:
        with self._lock:
            self._pods = list(pods)

    def fail_with(self, code: grpc.StatusCode | None, details: str = "scripted failure") -> None:
        """Every List answers this status until called with None."""
        with self._lock:
            self._fail = None if code is None else (code, details)

    def hang(self) -> None:
        """Every List blocks until ``release()`` or ``stop()`` (at most 10 s)."""
        self._release.clear()

    def release(self) -> None:
        self._release.set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        if self._server is not None:
            raise RuntimeError("already started")
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet"))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        if server.add_insecure_port("unix://" + self.socket_path) == 0:
            raise RuntimeError(f"cannot bind {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket, as a kubelet that went away."""
        self._release.set()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the RPC -----------------------------------------------------------------------------

    def _answer(self, context: Any) -> pb.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
            fail = self._fail
            pods = list(self._pods)
        self._release.wait(_HANG_LIMIT_S)
        if fail is not None:
            context.abort(fail[0], fail[1])
        return pb.ListPodResourcesResponse(pod_resources=pods)
