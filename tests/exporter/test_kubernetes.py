"""exporter.kubernetes against a real gRPC PodResourcesLister server on a unix socket."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import grpc
import pytest

from exporter.backend import DeviceInfo, MigInstance
from exporter.kubernetes import (
    DeviceKeys,
    PodInfo,
    PodResourcesSource,
    map_pod_resources,
    resolve_device_id,
    strip_replica,
)
from exporter.proto import podresources_v1_pb2 as pb
from tests.exporter.podresources_server import FakeKubelet, pod
from tests.helpers import wait_until

GPU_A = "GPU-9b3c5d6e-1111-2222-3333-444455556666"
GPU_B = "GPU-0f0f0f0f-aaaa-bbbb-cccc-ddddeeeeffff"
MIG_1 = "MIG-5c2a7e1f-7777-8888-9999-000011112222"
MIG_2 = "MIG-6d3b8f20-7777-8888-9999-000011113333"
LOGGER = "test.kubernetes"


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


@pytest.fixture
def make_source() -> Iterator[type[PodResourcesSource]]:
    made: list[PodResourcesSource] = []

    class _Tracked(PodResourcesSource):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("timeout", 2.0)
            kwargs.setdefault("log", logging.getLogger(LOGGER))
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    yield _Tracked
    for source in made:
        source.close()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def infos_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


# An A100-like node: GPU 0 whole, GPU 1 in MIG mode with GPU instances 1 and 2.
GPU_M = "GPU-1a2b3c4d-5555-6666-7777-888899990000"
DEVICES = (
    DeviceInfo(index=0, uuid=GPU_A, pci_bus_id="00000000:07:00.0", name="NVIDIA A100-SXM4-80GB", minor=0),
    DeviceInfo(index=1, uuid=GPU_M, pci_bus_id="00000000:0F:00.0", name="NVIDIA A100-SXM4-80GB", minor=1,
               mig=(MigInstance(1, "3g.40gb", MIG_1), MigInstance(2, "3g.40gb", MIG_2))),
)
KEYS = DeviceKeys.from_devices(DEVICES)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def holds(name: str, ns: str, container: str, resource: str, ids: list[str]) -> pb.PodResources:
    return pod(name, ns, {container: [(resource, ids)]})


# -- device id translation (dcgm-exporter 4.8.2 internal/pkg/transformation/kubernetes.go) -------


@pytest.mark.parametrize(
    ("device_id", "key"),
    [
        (GPU_A, GPU_A),
        (GPU_A + "::3", GPU_A),  # NVIDIA device plugin time-slicing / MPS replica
        (GPU_A + "::12", GPU_A),
        (MIG_1, MIG_1),
        (MIG_1 + "::1", MIG_1),
        (GPU_A + "::", GPU_A + "::"),  # not a replica suffix
        (GPU_A + "::x", GPU_A + "::x"),
        ("::3", "::3"),
        ("", ""),
    ],
)
def test_strip_replica_strips_only_a_numeric_replica_suffix(device_id: str, key: str) -> None:
    assert strip_replica(device_id) == key


@pytest.mark.parametrize(
    ("device_id", "id_type", "key"),
    [
        (GPU_A, "uid", GPU_A),
        (GPU_A + "::2", "uid", GPU_A),
        (MIG_2 + "::1", "uid", MIG_2),
        ("MIG-" + GPU_M + "/1/0", "uid", MIG_1),  # legacy MIG-GPU-<uuid>/<gi>/<ci>
        ("MIG-" + GPU_M + "/2/1", "uid", MIG_2),
        ("MIG-" + GPU_M + "/9/0", "uid", None),  # no such GPU instance
        ("MIG-" + GPU_A + "/1/0", "uid", None),  # GPU not in MIG mode
        ("nvidia1/gi2", "uid", MIG_2),  # GKE MIG: gkeMigDeviceIDRegex, any id type
        ("nvidia1/gi1/vgpu3", "device-name", MIG_1),
        ("nvidia7/gi1", "uid", None),
        ("nvidia0", "uid", None),  # a device name only matches with --kubernetes-gpu-id-type=device-name
        ("nvidia0", "device-name", GPU_A),
        ("nvidia0/vgpu2", "device-name", GPU_A),  # GKE time-sharing
        ("nvidia5", "device-name", None),
        (GPU_A, "device-name", None),  # dcgm-exporter matches whole GPUs by the chosen id type only
        ("0000:3b:00.1", "uid", None),
    ],
)
def test_resolve_device_id_maps_kubelet_ids_to_nvml_keys(device_id: str, id_type: str, key: str | None) -> None:
    assert resolve_device_id(device_id, KEYS, id_type) == key  # type: ignore[arg-type]


# -- map_pod_resources (pure) ----------------------------------------------------------------


def test_shared_gpu_without_virtual_gpus_picks_the_same_holder_whatever_the_list_order() -> None:
    a = holds("b-pod", "ns2", "c2", "nvidia.com/gpu", [GPU_A + "::0"])
    b = holds("a-pod", "ns2", "c1", "nvidia.com/gpu", [GPU_A + "::1"])
    c = holds("z-pod", "ns1", "c9", "nvidia.com/gpu", [GPU_A + "::2"])
    expected = {GPU_A: (PodInfo("z-pod", "ns1", "c9"),)}
    assert map_pod_resources([a, b, c], KEYS) == expected
    assert map_pod_resources([c, b, a], KEYS) == expected
    assert map_pod_resources([b, c, a], KEYS) == expected


def test_shared_gpu_with_virtual_gpus_returns_every_holder_once_sorted_with_its_vgpu() -> None:
    # dcgm-exporter 4.8.2 --kubernetes-virtual-gpus (transformation/kubernetes.go, getSharedGPU and
    # toDeviceToSharingPods): one series per pod and replica sharing a time-sliced GPU, with the
    # replica ("GPU-<uuid>::N", GKE ".../vgpuN") as the ``vgpu`` label.
    pods = [
        holds("b", "ns", "c", "nvidia.com/gpu", [GPU_A + "::0", GPU_A + "::3"]),  # two replicas, one pod
        holds("a", "ns", "c", "nvidia.com/gpu", [GPU_A + "::1"]),
        holds("m", "ns", "c", "nvidia.com/mig-3g.40gb", [MIG_1]),
    ]
    got = map_pod_resources(pods, KEYS, virtual_gpus=True)
    assert got == {
        GPU_A: (PodInfo("a", "ns", "c", "1"), PodInfo("b", "ns", "c", "0"), PodInfo("b", "ns", "c", "3")),
        MIG_1: (PodInfo("m", "ns", "c"),),
    }


def test_virtual_gpus_replica_order_is_numeric_and_gke_vgpu_ids_carry_their_replica() -> None:
    pods = [holds("p", "ns", "c", "nvidia.com/gpu", [GPU_A + "::10", GPU_A + "::2"])]
    got = map_pod_resources(pods, KEYS, virtual_gpus=True)
    assert got[GPU_A] == (PodInfo("p", "ns", "c", "2"), PodInfo("p", "ns", "c", "10"))
    gke = [holds("g", "ns", "c", "nvidia.com/gpu", ["nvidia0/vgpu4", "nvidia0/vgpu1"])]
    got = map_pod_resources(gke, KEYS, id_type="device-name", virtual_gpus=True)
    assert [h.vgpu for h in got[GPU_A]] == ["1", "4"]


def test_without_virtual_gpus_no_holder_carries_a_vgpu() -> None:
    pods = [holds("b", "ns", "c", "nvidia.com/gpu", [GPU_A + "::3"])]
    assert map_pod_resources(pods, KEYS) == {GPU_A: (PodInfo("b", "ns", "c"),)}


def test_extra_resource_names_are_attributed_and_others_ignored() -> None:
    pods = [
        holds("net", "default", "c", "example.com/sriov-nic", ["0000:3b:00.1"]),
        holds("shared", "ml", "c", "nvidia.com/gpu.shared", [GPU_A + "::2"]),
        holds("amd", "ml", "c", "amd.com/gpu", [GPU_B]),
    ]
    assert map_pod_resources(pods, KEYS) == {}
    names = ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
    assert map_pod_resources(pods, KEYS, resource_names=names) == {
        GPU_A: (PodInfo("shared", "ml", "c"),)
    }


def test_legacy_and_gke_mig_ids_land_on_the_mig_uuid_key() -> None:
    pods = [
        holds("legacy", "ml", "c", "nvidia.com/mig-3g.40gb", ["MIG-" + GPU_M + "/1/0"]),
        holds("gke", "ml", "c", "nvidia.com/gpu", ["nvidia1/gi2"]),
    ]
    assert map_pod_resources(pods, KEYS) == {
        MIG_1: (PodInfo("legacy", "ml", "c"),),
        MIG_2: (PodInfo("gke", "ml", "c"),),
    }


def test_device_name_id_type_maps_nvidia_n_to_the_gpu_uuid() -> None:
    pods = [holds("p", "ns", "c", "nvidia.com/gpu", ["nvidia0"])]
    assert map_pod_resources(pods, KEYS) == {}
    assert map_pod_resources(pods, KEYS, id_type="device-name") == {
        GPU_A: (PodInfo("p", "ns", "c"),)
    }


# -- PodResourcesSource against the fake kubelet ---------------------------------------------


def test_refresh_then_get_maps_gpu_and_mig_devices_to_pod_namespace_and_container(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods(
        [
            pod("train-0", "ml", {"main": [("nvidia.com/gpu", [GPU_A])], "sidecar": []}),
            pod("mixed", "ml", {"c": [("nvidia.com/mig-1g.10gb", [MIG_1])]}),
            pod("single", "ml", {"c": [("nvidia.com/gpu", [MIG_2])]}),  # MIG strategy "single"
            pod("legacy", "ml", {"c": [("nvidia.com/gpu", ["MIG-" + GPU_M + "/2/0"])]}),
        ]
    )
    source = make_source(kubelet.socket_path, devices=lambda: DEVICES)
    assert source.get() == {}  # nothing asked yet
    assert source.refresh() is True
    assert source.get() == {
        GPU_A: (PodInfo("train-0", "ml", "main"),),
        MIG_1: (PodInfo("mixed", "ml", "c"),),
        MIG_2: (PodInfo("legacy", "ml", "c"),),  # two holders of one MIG device: the first by name
    }
    assert source.errors == 0


def test_no_pods_is_empty_and_not_an_error(kubelet: FakeKubelet, make_source: type[PodResourcesSource]) -> None:
    source = make_source(kubelet.socket_path)
    assert source.refresh() is True
    assert source.get() == {}
    assert source.errors == 0


def test_get_never_waits_for_a_hung_kubelet_and_serves_the_last_good_answer(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path, timeout=3.0, refresh_s=0.05)
    source.start()
    good = {GPU_A: (PodInfo("p", "ns", "c"),)}
    assert wait_until(lambda: source.get() == good, timeout=5.0)
    kubelet.hang()
    calls = kubelet.calls
    assert wait_until(lambda: kubelet.calls > calls, timeout=5.0)  # the refresher is now stuck in List
    started = time.monotonic()
    for _ in range(100):
        assert source.get() == good
    assert time.monotonic() - started < 0.5  # 100 collection cycles' worth, none waited on the kubelet
    kubelet.release()


def test_hung_list_is_bounded_by_the_timeout_and_counted(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    kubelet.hang()
    source = make_source(kubelet.socket_path, timeout=0.3)
    started = time.monotonic()
    assert source.refresh() is False
    assert 0.25 <= time.monotonic() - started < 2.0
    assert source.errors == 1
    assert "DEADLINE_EXCEEDED" in warnings_of(caplog)[0]
    kubelet.release()
    assert source.refresh() is True
    assert source.get() == {GPU_A: (PodInfo("p", "ns", "c"),)}


def test_last_good_answer_is_kept_for_max_age_then_dropped(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path, max_age_s=300.0, clock=clock)
    good = {GPU_A: (PodInfo("p", "ns", "c"),)}
    assert source.refresh() and source.get() == good

    kubelet.fail_with(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
    for _ in range(3):
        clock.t += 60.0
        assert source.refresh() is False
    assert source.get() == good  # 180 s old: no label flap through a kubelet restart
    clock.t += 121.0
    assert source.get() == {}  # 301 s old: dropped
    assert source.errors == 3
    assert len(warnings_of(caplog)) == 1
    assert "UNAVAILABLE" in warnings_of(caplog)[0]

    kubelet.fail_with(None)
    assert source.refresh() is True
    assert source.get() == good
    assert source.errors == 3


def test_zero_max_age_drops_the_answer_once_time_moves(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    clock = Clock()
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path, max_age_s=0.0, clock=clock)
    assert source.refresh() and source.get() != {}
    clock.t += 0.001
    assert source.get() == {}


def test_socket_missing_is_counted_logged_once_and_recovers(
    make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    kubelet = FakeKubelet()  # not started: no socket yet
    try:
        source = make_source(kubelet.socket_path)
        assert [source.refresh() for _ in range(3)] == [False, False, False]
        assert source.get() == {}
        assert source.errors == 3
        assert len(warnings_of(caplog)) == 1
        assert "socket missing" in warnings_of(caplog)[0]
        assert kubelet.socket_path in warnings_of(caplog)[0]

        kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
        kubelet.start()
        assert source.refresh() is True
        assert source.get() == {GPU_A: (PodInfo("p", "ns", "c"),)}
        assert len(infos_of(caplog)) == 1
        assert "recovered" in infos_of(caplog)[0]
        assert source.errors == 3
    finally:
        kubelet.close()


def test_path_that_is_not_a_socket_fails_the_refresh(
    make_source: type[PodResourcesSource], tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = os.path.join(tmp_path, "kubelet.sock")
    with open(path, "w") as f:
        f.write("not a socket")
    source = make_source(path)
    assert source.refresh() is False
    assert source.get() == {}
    assert source.errors == 1
    assert "not a socket" in warnings_of(caplog)[0]


def test_a_raising_device_list_is_a_counted_failure_not_a_crash(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> list[DeviceInfo]:
        raise RuntimeError("NVML went away")

    source = make_source(kubelet.socket_path, devices=broken)
    assert source.refresh() is False
    assert source.errors == 1
    assert "NVML went away" in warnings_of(caplog)[0]


def test_background_refresher_follows_kubelet_restart_with_new_allocations(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods([pod("old", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path, refresh_s=0.05)
    source.start()
    assert source.wait_first(5.0)
    assert source.get() == {GPU_A: (PodInfo("old", "ns", "c"),)}
    kubelet.set_pods([pod("new", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    kubelet.restart()
    assert wait_until(lambda: source.get() == {GPU_A: (PodInfo("new", "ns", "c"),)}, timeout=5.0)


def test_reuses_one_channel_across_successful_refreshes(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    source = make_source(kubelet.socket_path)
    source.refresh()
    channel = source._channel
    for _ in range(5):
        source.refresh()
    assert channel is not None
    assert source._channel is channel
    assert kubelet.calls == 6


def test_close_stops_the_refresher_cancels_a_hung_call_and_empties_get(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path, timeout=8.0, refresh_s=0.05)
    source.start()
    assert wait_until(lambda: source.get() != {}, timeout=5.0)
    kubelet.hang()
    calls = kubelet.calls
    assert wait_until(lambda: kubelet.calls > calls, timeout=5.0)
    thread = source._thread
    started = time.monotonic()
    source.close()
    source.close()
    assert time.monotonic() - started < 3.0  # did not wait out the 8 s timeout
    assert thread is not None and not thread.is_alive()
    assert source.get() == {}
    assert source.refresh() is False
    kubelet.release()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"timeout": 0}, "timeout"), ({"refresh_s": 0}, "refresh_s"), ({"max_age_s": -1}, "max_age_s"),
     ({"id_type": "serial"}, "id_type")],
)
def test_invalid_arguments_raise_value_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodResourcesSource("/nonexistent.sock", **kwargs)  # type: ignore[arg-type]
