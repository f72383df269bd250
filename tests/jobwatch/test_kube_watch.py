"""gpu-jobwatch end to end against the fake API server: list + watch, 410 relist, TrainJob
discovery appearing later and going away, and a 403 or down API server leaving the last known
state served with gpu_jobwatch_watch_up 0."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwatch.health import Health
from jobwatch.watch import PODS, TRAINJOBS, Backoff, ResourceWatch
from telemetry_common.kubeapi import Gone, KubeClient
from telemetry_common.kubeconfig import resolve
from tests.jobwatch.fake_apiserver import FakeAPIServer, gpu_pod, node, trainer_status, trainjob, trainjob_pod
from tests.jobwatch.rig import FAST, Running, jobwatch


@pytest.fixture()
def fake() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.2, max_watch_s=3) as f:
        yield f


def pods(r: Running) -> set[str]:
    return {dict(ls)["pod"] for ls in r.scrape().get("gpu_pod_job_info", {})}


def test_list_then_watch_sees_gpu_pods_only(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("pods", gpu_pod("gpu-a"))
    fake.apply("pods", gpu_pod("cpu-a", gpus=0))
    fake.apply("pods", gpu_pod("mig-a", gpus=2, resource="nvidia.com/mig-3g.40gb"))
    fake.apply("pods", gpu_pod("done-a", phase="Succeeded"))
    with jobwatch(fake, tmp_path) as r:
        r.wait_for(lambda: pods(r) == {"gpu-a", "mig-a"}, what="the listed GPU pods")
        assert r.value("gpu_pod_gpus_requested", pod="mig-a") == pytest.approx(6 / 7)
        fake.apply("pods", gpu_pod("gpu-b", node="n2"))
        fake.apply("pods", gpu_pod("cpu-b", gpus=0))
        r.wait_for(lambda: pods(r) == {"gpu-a", "mig-a", "gpu-b"}, what="the watched pod")
        assert r.value("gpu_pod_job_info", pod="gpu-b") == 1
        fake.apply("pods", gpu_pod("gpu-a", phase="Succeeded"))  # finished: holds no GPU any more
        fake.delete("pods", "ml", "mig-a")
        r.wait_for(lambda: pods(r) == {"gpu-b"}, what="finished and deleted pods gone")
        assert len(r.app.state.pods) == 1  # only GPU pods that hold GPUs are kept in memory
        assert r.value("gpu_jobwatch_watch_up", resource="pods") == 1
        assert r.value("gpu_jobwatch_events_total", resource="pods", type="ADDED") == 2


def test_410_relists_and_catches_up_with_what_happened_meanwhile(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("pods", gpu_pod("keep"))
    fake.apply("pods", gpu_pod("goes"))
    with jobwatch(fake, tmp_path) as r:
        r.wait_for(lambda: pods(r) == {"keep", "goes"})
        fake.set_mode("down")  # the watch breaks; meanwhile the cluster changes and history is compacted
        r.wait_value("gpu_jobwatch_watch_up", 0, resource="pods")
        fake.set_mode("ok")
        fake.delete("pods", "ml", "goes")
        fake.apply("pods", gpu_pod("new"))
        fake.compact()
        r.wait_for(lambda: pods(r) == {"keep", "new"}, what="state after the relist")
        assert (r.value("gpu_jobwatch_relists_total", resource="pods") or 0) >= 2
        assert r.value("gpu_jobwatch_watch_up", resource="pods") == 1


def test_watch_reconnects_from_its_last_version_without_relisting(fake: FakeAPIServer, tmp_path: Path) -> None:
    with jobwatch(fake, tmp_path, watch_timeout=1) as r:
        r.wait_for(lambda: r.value("gpu_jobwatch_relists_total", resource="pods") == 1)
        before = fake.watch_connections
        r.wait_for(lambda: fake.watch_connections >= before + 3, what="several watch reconnects")
        fake.apply("pods", gpu_pod("later"))
        r.wait_for(lambda: pods(r) == {"later"})
        assert r.value("gpu_jobwatch_relists_total", resource="pods") == 1
        watches = [p for _, p in fake.requests if p.startswith("/api/v1/pods?") and "watch=true" in p]
        assert all("resourceVersion=" in p and "resourceVersion=&" not in p for p in watches)


def test_trainjobs_are_watched_once_discovery_serves_them(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.trainer_served = False
    fake.apply("pods", trainjob_pod("llama", 0))
    fake.apply("trainjobs", trainjob("llama", status=trainer_status(450)))
    with jobwatch(fake, tmp_path) as r:
        r.wait_for(lambda: pods(r) == {"llama-node-0-0-x0"})
        # discovery's first answer may come after the pods' list: waited for, not raced
        r.wait_value("gpu_jobwatch_resource_served", 0, resource="trainjobs")
        assert r.value("gpu_jobwatch_watch_up", resource="trainjobs") is None  # no CRD, no error
        assert r.value("gpu_job_progress_step", job_name="llama") is None
        fake.trainer_served = True  # the CRD is installed later
        r.wait_value("gpu_job_progress_step", 450, job_name="llama")
        # the watch thread lists (step 450 shows) before it marks itself up, and discovery marks the
        # resource served after starting that thread: each of the three is waited for, not raced
        r.wait_value("gpu_jobwatch_resource_served", 1, resource="trainjobs")
        r.wait_value("gpu_jobwatch_watch_up", 1, resource="trainjobs")
        assert r.value("gpu_job_progress_step", job_name="llama") == 450
        fake.trainer_served = False  # and removed again
        r.wait_value("gpu_jobwatch_resource_served", 0, resource="trainjobs")
        # served 0 is written after the stopped watch is gone: from then on it writes nothing
        assert r.value("gpu_jobwatch_watch_up", resource="trainjobs") is None
        assert r.app.state.trainjobs == {}
        time.sleep(1.5)  # a watch thread that outlived its stop would write here (reconnect: 404)
        assert r.value("gpu_jobwatch_watch_up", resource="trainjobs") is None
        assert r.app.state.trainjobs == {}


class _BlockingSink:
    """A sink whose ``convert`` (run while the list is read) waits until the test lets it go."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[str] = []

    def convert(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        self.release.wait(10)
        return obj

    def replace(self, items: list[Any]) -> None:
        self.calls.append("replace")

    def upsert(self, obj: dict[str, Any]) -> None:
        self.calls.append("upsert")

    def delete(self, obj: dict[str, Any]) -> None:
        self.calls.append("delete")


def test_a_stopped_watch_changes_nothing_after_stop_returns(fake: FakeAPIServer, tmp_path: Path) -> None:
    fake.apply("trainjobs", trainjob("late"))
    client = KubeClient(resolve(str(fake.kubeconfig(tmp_path / "kc")), {}), timeout=10)
    health = Health()
    sink = _BlockingSink()
    w = ResourceWatch(client, TRAINJOBS, sink, health, backoff=FAST)
    w.start()
    assert sink.entered.wait(10)  # the thread is inside the list
    w.stop()  # discovery stopping the TrainJob watch, then forgetting its objects
    health.forget_watch("trainjobs")
    sink.release.set()
    w.stop(join=10)
    assert not w.running
    assert sink.calls == []  # the list it was reading never reached the sink
    assert health.up("trainjobs") is None  # nor did it mark itself up again
    client.close()


class _GoneOnList:
    """A client whose list is always answered 410 (a broken proxy): never a tight loop."""

    def __init__(self) -> None:
        self.lists = 0

    def list(self, path: str, **kw: Any) -> Any:
        self.lists += 1
        raise Gone(410, "Expired", "too old")

    def watch(self, path: str, **kw: Any) -> Any:
        raise AssertionError("no watch without a list")


def test_a_list_answered_410_is_retried_with_backoff(caplog: pytest.LogCaptureFixture) -> None:
    client = _GoneOnList()
    health = Health()
    w = ResourceWatch(client, PODS, _BlockingSink(), health, backoff=Backoff(initial=0.2, cap=0.4))  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="jobwatch")
    w.start()
    time.sleep(1.0)
    w.stop(join=5)
    assert 2 <= client.lists <= 6  # backoff 0.2, 0.4, 0.4 ... (old: thousands of relists a second)
    assert health.up("pods") is False
    assert len([m for m in caplog.messages if "failing" in m]) == 1


def test_jobset_pod_becomes_a_trainjob_pod_when_the_trainjob_appears(fake: FakeAPIServer, tmp_path: Path) -> None:
    pod = trainjob_pod("qwen", 0)
    del pod["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
    fake.apply("pods", pod)
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_pod_job_info", 1, job_kind="JobSet", job_name="qwen")
        fake.apply("trainjobs", trainjob("qwen"))
        r.wait_value("gpu_pod_job_info", 1, job_kind="TrainJob", job_name="qwen")
        assert r.value("gpu_job_exempt", job_kind="JobSet", job_name="qwen") is None


@pytest.mark.parametrize("mode", ["forbidden", "down"])
def test_403_or_down_keeps_the_last_state_with_watch_up_0(fake: FakeAPIServer, tmp_path: Path, mode: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    fake.apply("nodes", node("gpu-node-1"))
    fake.apply("pods", trainjob_pod("llama", 0))
    fake.apply("trainjobs", trainjob("llama", status=trainer_status(450)))
    with jobwatch(fake, tmp_path) as r:
        r.wait_value("gpu_job_progress_step", 450, job_name="llama")
        caplog.clear()
        caplog.set_level(logging.INFO, logger="jobwatch")
        fake.set_mode(mode)
        for res in ("pods", "nodes", "trainjobs"):
            r.wait_value("gpu_jobwatch_watch_up", 0, resource=res)
        fake.requests.clear()
        r.wait_for(lambda: len(fake.requests) >= 12, what="several retries")  # backoff 50-300 ms in tests
        assert r.value("gpu_job_progress_step", job_name="llama") == 450  # the last known state is served
        assert pods(r) == {"llama-node-0-0-x0"}
        failing = [m for m in caplog.messages if "failing" in m]
        assert sorted(m.split()[2] for m in failing) == ["nodes", "pods", "trainjobs"]  # one line each, not per retry
        fake.set_mode("ok")
        for res in ("pods", "nodes", "trainjobs"):
            r.wait_value("gpu_jobwatch_watch_up", 1, resource=res)
        assert len([m for m in caplog.messages if "is back" in m]) == 3
        fake.apply("trainjobs", trainjob("llama", status=trainer_status(460, at="2026-06-12T03:00:30Z")))
        r.wait_value("gpu_job_progress_step", 460, job_name="llama")


def test_nodes_give_prices_from_the_config(fake: FakeAPIServer, tmp_path: Path) -> None:
    cfg = tmp_path / "jobwatch.yaml"
    cfg.write_text("prices:\n  - {instance_type: p5.48xlarge, usd_per_instance_hour: 55.04, gpus: 8}\n")
    fake.apply("nodes", node("p5-a", labels={"node.kubernetes.io/instance-type": "p5.48xlarge",
                                             "karpenter.sh/capacity-type": "on-demand"}))
    fake.apply("nodes", node("g6-a", labels={"node.kubernetes.io/instance-type": "g6.xlarge"}))
    fake.apply("nodes", node("cpu-a", gpus=0, labels={"node.kubernetes.io/instance-type": "p5.48xlarge"}))
    with jobwatch(fake, tmp_path, "--config", str(cfg)) as r:
        r.wait_value("gpu_node_price_usd_per_gpu_hour", 6.88, Hostname="p5-a", instance_type="p5.48xlarge",
                     capacity_type="on-demand")
        assert r.value("gpu_node_price_usd_per_gpu_hour", Hostname="g6-a") is None  # no price: no dollars
        assert r.value("gpu_node_price_usd_per_gpu_hour", Hostname="cpu-a") is None  # not a GPU node
        assert r.value("gpu_jobwatch_gpu_nodes_unpriced") == 1
