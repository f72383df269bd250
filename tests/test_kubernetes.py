"""exporter.kubernetes against a real gRPC PodResourcesLister server on a unix socket."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import grpc
import pytest

from exporter.kubernetes import PodInfo, PodResourcesSource, map_pod_resources, parse_device_id
from tests.helpers import wait_until
from tests.podresources_server import FakeKubelet, pod

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


# -- parse_device_id -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "key"),
    [
        (GPU_A, GPU_A),
        (GPU_A + "::3", GPU_A),  # NVIDIA device plugin time-slicing / MPS replica
        (GPU_A + "::12", GPU_A),
        (MIG_1, MIG_1),
        (MIG_1 + "::1", MIG_1),
        ("MIG-GPU-" + GPU_A[4:] + "/1/0", "MIG-GPU-" + GPU_A[4:] + "/1/0"),  # legacy MIG id, unchanged
        ("nvidia0/gi1", "nvidia0/gi1"),  # GKE, unchanged
        (GPU_A + "::", GPU_A + "::"),  # not a replica suffix
        (GPU_A + "::x", GPU_A + "::x"),
        ("::3", "::3"),
        ("", ""),
    ],
)
def test_parse_device_id_strips_only_a_numeric_replica_suffix(device_id: str, key: str) -> None:
    assert parse_device_id(device_id) == key


# -- map_pod_resources (pure) ----------------------------------------------------------------


def test_map_pod_resources_later_container_wins_a_shared_gpu() -> None:
    pods = [
        pod("a", "ns1", {"c1": [("nvidia.com/gpu", [GPU_A + "::0"])]}),
        pod("b", "ns2", {"c2": [("nvidia.com/gpu", [GPU_A + "::1"])]}),
    ]
    assert map_pod_resources(pods, ["nvidia.com/gpu"], []) == {GPU_A: PodInfo("b", "ns2", "c2")}


# -- PodResourcesSource against the fake kubelet ---------------------------------------------


def test_get_maps_nvidia_gpu_devices_to_pod_namespace_and_container(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods(
        [
            pod("train-0", "ml", {"main": [("nvidia.com/gpu", [GPU_A])], "sidecar": []}),
            pod("infer-1", "serving", {"server": [("nvidia.com/gpu", [GPU_B])]}),
        ]
    )
    source = make_source(kubelet.socket_path)
    assert source.get() == {
        GPU_A: PodInfo("train-0", "ml", "main"),
        GPU_B: PodInfo("infer-1", "serving", "server"),
    }
    assert source.errors == 0


def test_get_maps_mig_devices_from_mixed_and_single_strategy_resources(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods(
        [
            pod("mixed", "ml", {"c": [("nvidia.com/mig-1g.10gb", [MIG_1])]}),
            pod("single", "ml", {"c": [("nvidia.com/gpu", [MIG_2])]}),  # MIG strategy "single"
        ]
    )
    source = make_source(kubelet.socket_path)
    assert source.get() == {MIG_1: PodInfo("mixed", "ml", "c"), MIG_2: PodInfo("single", "ml", "c")}


def test_get_strips_time_slicing_suffix_and_last_container_wins(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods(
        [
            pod("first", "ml", {"c": [("nvidia.com/gpu", [GPU_A + "::0", GPU_B + "::0"])]}),
            pod("second", "ml", {"c": [("nvidia.com/gpu", [GPU_A + "::1"])]}),
        ]
    )
    source = make_source(kubelet.socket_path)
    assert source.get() == {GPU_A: PodInfo("second", "ml", "c"), GPU_B: PodInfo("first", "ml", "c")}


def test_get_ignores_non_gpu_resources_unless_named(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods(
        [
            pod("net", "default", {"c": [("example.com/sriov-nic", ["0000:3b:00.1"])]}),
            pod("shared", "ml", {"c": [("nvidia.com/gpu.shared", [GPU_A + "::2"])]}),
            pod("amd", "ml", {"c": [("amd.com/gpu", [GPU_B])]}),
        ]
    )
    assert make_source(kubelet.socket_path).get() == {}
    renamed = make_source(kubelet.socket_path, resource_names=["nvidia.com/gpu", "nvidia.com/gpu.shared"])
    assert renamed.get() == {GPU_A: PodInfo("shared", "ml", "c")}


def test_get_with_no_pods_is_empty_and_not_an_error(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    source = make_source(kubelet.socket_path)
    assert source.get() == {}
    assert source.errors == 0


def test_socket_missing_returns_empty_logs_once_and_recovers(
    make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    kubelet = FakeKubelet()  # not started: no socket yet
    try:
        source = make_source(kubelet.socket_path)
        assert [source.get() for _ in range(3)] == [{}, {}, {}]
        assert source.errors == 3
        assert len(warnings_of(caplog)) == 1
        assert "socket missing" in warnings_of(caplog)[0]
        assert kubelet.socket_path in warnings_of(caplog)[0]

        kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
        kubelet.start()
        assert source.get() == {GPU_A: PodInfo("p", "ns", "c")}
        assert len(infos_of(caplog)) == 1
        assert "recovered" in infos_of(caplog)[0]
        assert source.errors == 3
    finally:
        kubelet.close()


def test_path_that_is_not_a_socket_returns_empty(
    make_source: type[PodResourcesSource], tmp_path: os.PathLike[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = os.path.join(tmp_path, "kubelet.sock")
    with open(path, "w") as f:
        f.write("not a socket")
    source = make_source(path)
    assert source.get() == {}
    assert source.errors == 1
    assert "not a socket" in warnings_of(caplog)[0]


def test_unavailable_keeps_last_answer_one_cycle_then_empty(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path)
    good = {GPU_A: PodInfo("p", "ns", "c")}
    assert source.get() == good

    kubelet.fail_with(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
    assert source.get() == good  # grace cycle: no label flap on one failure
    assert source.get() == {}
    assert source.get() == {}
    assert source.errors == 3
    assert len(warnings_of(caplog)) == 1
    assert "UNAVAILABLE" in warnings_of(caplog)[0]

    kubelet.fail_with(None)
    assert source.get() == good
    assert source.errors == 3


def test_zero_grace_cycles_returns_empty_on_first_failure(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path, grace_cycles=0)
    assert source.get() == {GPU_A: PodInfo("p", "ns", "c")}
    kubelet.fail_with(grpc.StatusCode.INTERNAL)
    assert source.get() == {}
    assert source.errors == 1


def test_server_hanging_past_timeout_returns_empty_within_the_timeout(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource], caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    kubelet.hang()
    source = make_source(kubelet.socket_path, timeout=0.3)
    started = time.monotonic()
    assert source.get() == {}
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 2.0
    assert source.errors == 1
    assert "DEADLINE_EXCEEDED" in warnings_of(caplog)[0]

    kubelet.release()
    assert source.get() == {GPU_A: PodInfo("p", "ns", "c")}


def test_recovers_after_kubelet_restart_with_new_allocations(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods([pod("old", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path)
    assert source.get() == {GPU_A: PodInfo("old", "ns", "c")}

    kubelet.set_pods([pod("new", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    kubelet.restart()
    new = {GPU_A: PodInfo("new", "ns", "c")}
    assert wait_until(lambda: source.get() == new, timeout=5.0)


def test_recovers_after_kubelet_down_for_several_cycles(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path)
    assert source.get() != {}
    kubelet.stop()
    assert [source.get() for _ in range(3)][-1] == {}
    kubelet.start()
    assert source.get() == {GPU_A: PodInfo("p", "ns", "c")}


def test_reuses_one_channel_across_successful_cycles(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    source = make_source(kubelet.socket_path)
    source.get()
    channel = source._channel
    for _ in range(5):
        source.get()
    assert channel is not None
    assert source._channel is channel
    assert kubelet.calls == 6


def test_close_is_idempotent_and_get_after_close_is_empty(
    kubelet: FakeKubelet, make_source: type[PodResourcesSource]
) -> None:
    kubelet.set_pods([pod("p", "ns", {"c": [("nvidia.com/gpu", [GPU_A])]})])
    source = make_source(kubelet.socket_path, grace_cycles=0)
    assert source.get() != {}
    source.close()
    source.close()
    assert source.get() == {}


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"timeout": 0}, "timeout"), ({"grace_cycles": -1}, "grace")]
)
def test_invalid_arguments_raise_value_error(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodResourcesSource("/nonexistent.sock", **kwargs)  # type: ignore[arg-type]
