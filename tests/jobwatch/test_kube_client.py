"""telemetry_common.kubeapi against the fake API server: paged lists, watch streams, 410, errors,
discovery, and that it writes nothing but reviews."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from telemetry_common.kubeapi import Gone, KubeClient, KubeError
from telemetry_common.kubeconfig import ClusterConfig, TokenSource, from_kubeconfig
from tests.jobwatch.fake_apiserver import FakeAPIServer, gpu_pod

PODS = "/api/v1/pods"


@pytest.fixture()
def fake() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.2, max_watch_s=5) as f:
        yield f


def client_for(fake: FakeAPIServer, tmp_path: Path, token: str | None = None) -> KubeClient:
    return KubeClient(from_kubeconfig([str(fake.kubeconfig(tmp_path / "kc", token=token))]), timeout=5)


def test_list_pages_and_keeps_only_what_keep_returns(fake: FakeAPIServer, tmp_path: Path) -> None:
    for i in range(25):
        fake.apply("pods", gpu_pod(f"p{i:02d}", gpus=8 if i % 2 else 0))
    client = client_for(fake, tmp_path)
    res = client.list(PODS, page_size=4, keep=lambda o: o["metadata"]["name"]
                      if o["spec"]["containers"][0]["resources"]["limits"] else None)
    assert res.items == [f"p{i:02d}" for i in range(25) if i % 2]
    assert int(res.resource_version) == fake.rv
    assert sum(1 for m, p in fake.requests if "limit=4" in p) == 7  # 25 items, 4 a page


def test_list_restarts_once_when_the_continue_token_expires(fake: FakeAPIServer, tmp_path: Path) -> None:
    for i in range(6):
        fake.apply("pods", gpu_pod(f"p{i}"))
    client = client_for(fake, tmp_path)
    calls = {"n": 0}

    def keep(o: dict[str, object]) -> object:
        calls["n"] += 1
        if calls["n"] == 2:  # between page 1 and page 2, the server forgets that version
            fake.apply("pods", gpu_pod("late"))
            fake.compact()
        return o

    res = client.list(PODS, page_size=2, keep=keep)
    assert {o["metadata"]["name"] for o in res.items} == {f"p{i}" for i in range(6)} | {"late"}


def test_watch_streams_events_and_bookmarks(fake: FakeAPIServer, tmp_path: Path) -> None:
    client = client_for(fake, tmp_path)
    rv = client.list(PODS).resource_version
    stream = client.watch(PODS, resource_version=rv, timeout_seconds=5)
    fake.apply("pods", gpu_pod("a"))
    fake.apply("pods", gpu_pod("a", node="other"))
    fake.delete("pods", "ml", "a")
    seen = []
    for ev in stream:
        seen.append(ev.type)
        if ev.type == "BOOKMARK" and len(seen) > 3:
            break
    stream.close()
    assert seen[:3] == ["ADDED", "MODIFIED", "DELETED"]
    assert "BOOKMARK" in seen
    assert any("allowWatchBookmarks=true" in p and "timeoutSeconds=5" in p for _, p in fake.requests)


def test_watch_from_a_compacted_version_raises_gone(fake: FakeAPIServer, tmp_path: Path) -> None:
    client = client_for(fake, tmp_path)
    rv = client.list(PODS).resource_version
    fake.apply("pods", gpu_pod("a"))
    fake.compact()
    with pytest.raises(Gone):  # 200, then an ERROR event with code 410, as kube-apiserver does
        list(client.watch(PODS, resource_version=rv, timeout_seconds=5))
    fake.gone_as_http = True
    with pytest.raises(Gone):  # a plain HTTP 410 too
        client.watch(PODS, resource_version=rv, timeout_seconds=5)


def test_close_from_another_thread_ends_the_iteration(fake: FakeAPIServer, tmp_path: Path) -> None:
    client = client_for(fake, tmp_path)
    stream = client.watch(PODS, resource_version=str(fake.rv), timeout_seconds=30, bookmarks=False)
    threading.Timer(0.3, stream.close).start()
    assert list(stream) == []


@pytest.mark.parametrize(("mode", "status"), [("forbidden", 403), ("down", None)])
def test_errors_carry_the_status(fake: FakeAPIServer, tmp_path: Path, mode: str, status: int | None) -> None:
    client = client_for(fake, tmp_path)
    fake.set_mode(mode)
    with pytest.raises(KubeError) as err:
        client.list(PODS)
    assert err.value.status == status
    with pytest.raises(KubeError):
        client.watch(PODS, resource_version="1")


def test_bad_token_is_401_and_never_in_the_error(fake: FakeAPIServer, tmp_path: Path) -> None:
    client = client_for(fake, tmp_path, token="wrong-secret-token")
    with pytest.raises(KubeError) as err:
        client.get(PODS)
    assert err.value.status == 401
    assert "wrong-secret" not in str(err.value)


def test_unreachable_server(tmp_path: Path) -> None:
    client = KubeClient(ClusterConfig("http://127.0.0.1:1", TokenSource(token="t"), None), timeout=2)
    with pytest.raises(KubeError) as err:
        client.get(PODS)
    assert err.value.status is None


def test_discovery_present_and_absent(fake: FakeAPIServer, tmp_path: Path) -> None:
    client = client_for(fake, tmp_path)
    assert "trainjobs" in (client.discover("trainer.kubeflow.org/v1alpha1") or set())
    fake.trainer_served = False
    assert client.discover("trainer.kubeflow.org/v1alpha1") is None
    fake.set_mode("forbidden")
    with pytest.raises(KubeError):
        client.discover("trainer.kubeflow.org/v1alpha1")


def test_the_client_writes_nothing_but_reviews(fake: FakeAPIServer, tmp_path: Path) -> None:
    client = client_for(fake, tmp_path)
    with pytest.raises(ValueError, match="read-only"):
        client.post("/api/v1/namespaces/ml/pods", {})
    fake.review("tok", "ml", "p")
    answer = client.post("/apis/authentication.k8s.io/v1/tokenreviews",
                         {"spec": {"token": "tok", "audiences": ["gpu-telemetry"]}})
    assert answer["status"]["authenticated"] is True
    assert fake.writes == []
    assert not hasattr(client, "put") and not hasattr(client, "patch") and not hasattr(client, "delete")


def test_keep_alive_connection_is_reused_and_recovers(fake: FakeAPIServer, tmp_path: Path) -> None:
    client = client_for(fake, tmp_path)
    for _ in range(3):
        client.get(PODS)
    fake.set_mode("down")
    with pytest.raises(KubeError):
        client.get(PODS)
    fake.set_mode("ok")
    assert client.get(PODS)["kind"] == "PodList"
