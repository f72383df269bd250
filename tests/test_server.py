"""HTTP server: cached bytes per scrape, content negotiation, health transitions, index, 404."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest

from exporter.collector import Collector
from exporter.server import Server
from tests.test_collector import SPECS, Clock, FakeBackend

Env = tuple[FakeBackend, Collector, Clock, Server]


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


def test_metrics_openmetrics_when_asked(env: Env) -> None:
    env[1].collect_once()
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    status, headers, body = fetch(env[3], "/metrics", {"Accept": accept})
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")


def test_health_200_when_fresh_then_503_with_reason_when_stale(
    env: Env,
) -> None:
    _, c, clock, server = env
    status, _, body = fetch(server, "/health")
    assert (status, body) == (503, b"no collection has finished yet")
    c.collect_once()
    assert fetch(server, "/health")[::2] == (200, b"OK")
    clock.t += 16.0
    status, _, body = fetch(server, "/health")
    assert status == 503 and b"more than 3 intervals" in body
    c.collect_once()
    assert fetch(server, "/health")[0] == 200


def test_health_503_when_no_gpu_answers(env: Env) -> None:
    be, c, _, server = env
    be.failing = {0, 1}
    c.collect_once()
    status, _, body = fetch(server, "/health")
    assert status == 503 and b"fallen off the bus" in body


@pytest.mark.parametrize(("path", "status", "needle"), [
    ("/", 200, b'<a href="/metrics">'),
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
