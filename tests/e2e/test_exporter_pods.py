"""The exporter process with --kubernetes against a real gRPC PodResources server (the fake kubelet
built from the podresources v1 proto): pod labels land on exactly the GPUs the pods hold."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from exporter.simulated import SimulatedBackend
from tests.e2e.procs import VENV_BIN, Proc, running
from tests.exporter.podresources_server import FakeKubelet, pod
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.e2e


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_pod_labels_from_kubelet_grpc_on_the_held_gpus_only(tmp_path: Path) -> None:
    uuids = [d.uuid for d in SimulatedBackend(n_gpus=3).devices()]
    with FakeKubelet() as kubelet:
        kubelet.set_pods([
            pod("trainer-0", "team-a", {"main": [("nvidia.com/gpu", [uuids[0]])]}),
            pod("notebook", "team-b", {"jupyter": [("nvidia.com/gpu", [f"{uuids[2]}::1"]), ("cpu", ["3"])]}),
        ])
        port = free_port()
        proc = Proc(
            [str(VENV_BIN / "gpu-exporter"), "--backend", "simulated", "--simulate-gpus", "3",
             "--listen", f"127.0.0.1:{port}", "--interval", "1s", "--kubernetes",
             "--pod-resources-socket", kubelet.socket_path, "--pod-attribution-max-age", "2s"],
            tmp_path / "exporter.log",
            env={"NODE_NAME": "gpu-node-1"},
        )
        url = f"http://127.0.0.1:{port}"
        with running(proc):
            proc.wait_http(url + "/health")

            def util_lines() -> list[str]:
                return [ln for ln in _scrape(url).splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]

            assert wait_until(lambda: any("pod=" in ln for ln in util_lines()), timeout=10), proc.tail()
            lines = {ln.split('gpu="')[1].split('"')[0]: ln for ln in util_lines()}
            assert 'container="main",namespace="team-a",pod="trainer-0"}' in lines["0"]
            assert "pod=" not in lines["1"]
            assert 'container="jupyter",namespace="team-b",pod="notebook"}' in lines["2"]
            assert 'Hostname="gpu-node-1"' in lines["0"]

            # The kubelet going away never fails the scrape; labels leave after --pod-attribution-max-age.
            kubelet.stop()
            assert wait_until(lambda: not any("pod=" in ln for ln in util_lines()), timeout=15), proc.tail()
            assert len(util_lines()) == 3


def test_virtual_gpus_give_one_series_per_pod_sharing_a_gpu_and_gke_ids_resolve(tmp_path: Path) -> None:
    # dcgm-exporter --kubernetes-virtual-gpus: one series per pod on a time-sliced GPU; without the
    # flag, one holder chosen by namespace/pod/container. GKE's nvidia<N>/vgpu<M> ids need
    # --kubernetes-gpu-id-type=device-name (internal/pkg/transformation/kubernetes.go).
    with FakeKubelet() as kubelet:
        kubelet.set_pods([
            pod("b-infer", "team-a", {"c": [("nvidia.com/gpu.shared", ["nvidia0/vgpu1"])]}),
            pod("a-infer", "team-a", {"c": [("nvidia.com/gpu.shared", ["nvidia0/vgpu0"])]}),
            pod("trainer", "team-b", {"c": [("nvidia.com/gpu", ["nvidia1"])]}),
        ])
        port = free_port()
        proc = Proc(
            [str(VENV_BIN / "gpu-exporter"), "--backend", "simulated", "--simulate-gpus", "2",
             "--listen", f"127.0.0.1:{port}", "--interval", "500ms", "-k",
             "--pod-resources-kubelet-socket", kubelet.socket_path, "--kubernetes-virtual-gpus",
             "--kubernetes-gpu-id-type=device-name", "--nvidia-resource-names", "nvidia.com/gpu.shared"],
            tmp_path / "exporter.log",
        )
        url = f"http://127.0.0.1:{port}"
        with running(proc):
            proc.wait_http(url + "/health")

            def util_lines() -> list[str]:
                return [ln for ln in _scrape(url).splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]

            assert wait_until(lambda: sum("pod=" in ln for ln in util_lines()) == 3, timeout=10), proc.tail()
            gpu0 = [ln for ln in util_lines() if 'gpu="0"' in ln]
            assert [ln.split('pod="')[1].split('"')[0] for ln in gpu0] == ["a-infer", "b-infer"]
            assert [ln.split('vgpu="')[1].split('"')[0] for ln in gpu0] == ["0", "1"]  # 4.8.2's vgpu label
            assert any('gpu="1"' in ln and 'pod="trainer"' in ln for ln in util_lines())
