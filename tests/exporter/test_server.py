"""HTTP server: cached bytes per scrape, text by default (as dcgm-exporter), OpenMetrics behind a
flag, liveness and readiness routes, index, 404."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from exporter.collector import Collector
from exporter.server import Server
from tests.exporter.test_collector import SPECS, Clock, FakeBackend

Env = tuple[FakeBackend, Collector, Clock, Server]


@dataclass
class Snap:
    text: bytes = b"# HELP x y\n# TYPE x gauge\nx 1\n"
    openmetrics: bytes = b"# HELP x y\n# TYPE x gauge\nx 1\n# EOF\n"


@dataclass
class StubSource:
    """Implements the server's ExpositionSource: fixed bytes, scripted liveness and readiness."""

    live: tuple[bool, str] = (True, "OK")
    ready: tuple[bool, str] = (True, "OK")
    snap: Snap = field(default_factory=Snap)

    @property
    def exposition(self) -> Snap:
        return self.snap

    def health(self) -> tuple[bool, str]:
        return self.live

    def readiness(self) -> tuple[bool, str]:
        return self.ready


@pytest.fixture
def stub() -> Iterator[tuple[StubSource, Server]]:
    source = StubSource()
    server = Server(("127.0.0.1", 0), source)
    server.start()
    yield source, server
    server.stop()


@pytest.fixture
def env() -> Iterator[Env]:
    be = FakeBackend(n=2)
    clock = Clock()
    c = Collector(be, SPECS, "node-a", 5.0, clock=clock)
    server = Server(("127.0.0.1", 0), c)
    server.start()
    yield be, c, clock, server
    server.stop()


def fetch(
    server: Server, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_binds_loopback_with_an_ephemeral_port(env: Env) -> None:
    server = env[3]
    assert server.address[0] == "127.0.0.1" and server.address[1] > 0
    assert server.url == f"http://127.0.0.1:{server.address[1]}"


def test_scrapes_serve_cached_bytes_without_reading_the_backend(
    env: Env,
) -> None:
    be, c, _, server = env
    c.collect_once()
    reads = be.reads
    bodies = {fetch(server, "/metrics")[2] for _ in range(5)}
    assert be.reads == reads
    assert bodies == {c.exposition.text}
    assert b'DCGM_FI_DEV_GPU_UTIL{gpu="1"' in c.exposition.text


def test_metrics_headers_text_format(env: Env) -> None:
    env[1].collect_once()
    status, headers, body = fetch(env[3], "/metrics")
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert headers["x-content-type-options"] == "nosniff"
    assert int(headers["content-length"]) == len(body)
    assert b"# EOF" not in body


OM_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def test_metrics_stay_classic_text_when_the_scraper_offers_openmetrics(env: Env) -> None:
    # dcgm-exporter 4.8.2 serves the text format whatever Prometheus offers; DCGM counters lack
    # _total, so OpenMetrics would type them unknown.
    env[1].collect_once()
    status, headers, body = fetch(env[3], "/metrics", {"Accept": OM_ACCEPT})
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert body == env[1].exposition.text and b"# EOF" not in body


def test_metrics_openmetrics_only_with_the_flag_and_when_asked() -> None:
    source = StubSource()
    server = Server(("127.0.0.1", 0), source, openmetrics=True)
    server.start()
    try:
        status, headers, body = fetch(server, "/metrics", {"Accept": OM_ACCEPT})
        assert status == 200
        assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert body == source.snap.openmetrics
        status, headers, body = fetch(server, "/metrics")
        assert headers["content-type"].startswith("text/plain; version=0.0.4") and body == source.snap.text
    finally:
        server.stop()


@pytest.mark.parametrize(("path", "attr"), [("/health", "live"), ("/ready", "ready")])
def test_health_is_liveness_and_ready_is_readiness_with_their_text(
    stub: tuple[StubSource, Server], path: str, attr: str
) -> None:
    source, server = stub
    assert fetch(server, path)[::2] == (200, b"OK")
    setattr(source, attr, (False, "gpu 1 (GPU-abc) down: RESET_REQUIRED"))
    status, headers, body = fetch(server, path)
    assert (status, body) == (503, b"gpu 1 (GPU-abc) down: RESET_REQUIRED")
    assert headers["content-type"] == "text/plain; charset=utf-8"


def test_liveness_stays_200_while_readiness_is_503_when_all_gpus_are_down(stub: tuple[StubSource, Server]) -> None:
    source, server = stub
    source.live = (True, "ok; gpu 0 (GPU-a) down: GPU_IS_LOST")
    source.ready = (False, "no GPU is up; gpu 0 (GPU-a) down: GPU_IS_LOST")
    assert fetch(server, "/health")[0] == 200  # restarting the pod cannot fix lost hardware
    assert fetch(server, "/ready")[0] == 503


@pytest.mark.parametrize(("path", "status", "needle"), [
    ("/", 200, b'<a href="/metrics">'),
    ("/", 200, b'<a href="/ready">'),
    ("/metrics?x=1", 200, b""),
    ("/nope", 404, b"not found"),
    ("/metricsx", 404, b"not found"),
])
def test_routes(env: Env, path: str, status: int, needle: bytes) -> None:
    got, _, body = fetch(env[3], path)
    assert got == status and needle in body


def test_keep_alive_serves_many_requests_on_one_connection(
    env: Env,
) -> None:
    env[1].collect_once()
    conn = http.client.HTTPConnection(*env[3].address, timeout=5)
    try:
        sizes = set()
        for _ in range(20):
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            sizes.add(len(resp.read()))
        assert sizes == {len(env[1].exposition.text)}
    finally:
        conn.close()


def test_head_sends_headers_only(env: Env) -> None:
    env[1].collect_once()
    conn = http.client.HTTPConnection(*env[3].address, timeout=5)
    try:
        conn.request("HEAD", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b""
        assert int(resp.getheader("Content-Length") or 0) == len(env[1].exposition.text)
    finally:
        conn.close()


def test_stop_releases_the_port() -> None:
    c = Collector(FakeBackend(n=1), SPECS, None, 5.0)
    s = Server(("127.0.0.1", 0), c)
    s.start()
    port = s.address[1]
    s.stop()
    s2 = Server(("127.0.0.1", port), c)  # rebinding works: the socket was closed
    s2.stop()
    assert s2.address[1] == port


def test_metrics_have_no_created_series(env: Env) -> None:
    env[1].collect_once()
    body = fetch(env[3], "/metrics")[2].decode()
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in body.splitlines() if line and line[0] != "#"}
    assert any(n.startswith("gpu_exporter_") and n.endswith("_total") for n in names)  # counters are there
    assert [n for n in names if n.endswith("_created")] == []
