"""The runtime's fault paths (issue 8): queue errors mapped to 413 / 503 + Retry-After with one
warning line, a consistent report under concurrent ingest, open windows flushed on stop; and its
self-metrics (build_info, process_*, config_last_reload_successful)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import snappy

from relay.config.config import DestinationConfig, load_config
from relay.control.service import RequestTooLargeError, Runtime, StorageError
from relay.delivery.queue.durable import DurableQueue, QueueError
from relay.ingest import wire
from relay.ingest.server import RelayHTTPServer
from tests.relay.control.test_service import RW1, RW1_LOWER, S, Series, config_text, now_ms, simple_dest


def _error(cls: type[Exception], message: str) -> Exception:
    """An instance of the queue's exception class whatever its constructor takes."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


class FailingQueue(DurableQueue):
    def __init__(self, path: Path, max_disk: int, error: Exception) -> None:
        super().__init__(path, max_disk)
        self.error = error

    def put(self, pieces: Sequence[tuple[int, bytes, int]],  # type: ignore[override]
            blocks: Sequence[bytes | None] | None = None) -> int:
        raise self.error


def runtime_with(tmp_path: Path, error: Exception | None = None, extra: str = "") -> Runtime:
    path = tmp_path / "relay.yaml"
    path.write_text(config_text(tmp_path, simple_dest("http://127.0.0.1:1/api/v1/write", extra)))

    def factory(d: DestinationConfig, p: Path) -> DurableQueue:
        return FailingQueue(p, d.queue.max_disk, error) if error is not None else DurableQueue(p, d.queue.max_disk)

    return Runtime(str(path), load_config(path), queue_factory=factory)


def write(runtime: Runtime, series: list[Series]) -> tuple[int, dict[str, str], bytes]:
    reply = runtime.write(RW1_LOWER, snappy.compress(wire.encode_write_request(series)))
    return reply.status, dict(reply.headers), reply.body


def test_queue_that_cannot_store_is_503_with_retry_after_and_one_warning_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runtime = runtime_with(tmp_path, _error(StorageError, "database or disk is full\nsecond line"))
    try:
        caplog.set_level(logging.DEBUG, logger="relay")
        status, headers, body = write(runtime, [(S("m"), [(now_ms(), 1.0)])])
        assert status == 503
        assert int(headers["Retry-After"]) > 0
        assert body == b"could not store the request: database or disk is full\n"
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert warnings[0].levelno == logging.WARNING and warnings[0].exc_info is None
        assert "database or disk is full" in warnings[0].getMessage()
        assert "\n" not in warnings[0].getMessage()
        assert runtime.registry.get_sample_value("gpu_relay_requests_received_total", {"code": "503"}) == 1
    finally:
        runtime.stop()


def test_request_larger_than_the_whole_queue_is_413(tmp_path: Path) -> None:
    runtime = runtime_with(tmp_path, _error(RequestTooLargeError, "request of 9000 bytes exceeds max_disk 4096"))
    try:
        status, headers, body = write(runtime, [(S("m"), [(now_ms(), 1.0)])])
        assert status == 413
        assert "Retry-After" not in headers
        assert body == b"request too large for the queue: request of 9000 bytes exceeds max_disk 4096\n"
    finally:
        runtime.stop()


def test_an_unexpected_queue_error_is_503_and_never_a_500(tmp_path: Path) -> None:
    runtime = runtime_with(tmp_path, KeyError("boom"))
    try:
        status, headers, body = write(runtime, [(S("m"), [(now_ms(), 1.0)])])
        assert status == 503 and "Retry-After" in headers
        assert body == b"could not store the request: KeyError\n"
    finally:
        runtime.stop()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Runtime, RelayHTTPServer]]:
    runtime = runtime_with(tmp_path)
    server = RelayHTTPServer(("127.0.0.1", 0), runtime)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield runtime, server
    server.shutdown()
    server.server_close()
    thread.join(5)
    runtime.stop()


def test_cardinality_and_status_page_stay_200_under_concurrent_ingest(
        served: tuple[Runtime, RelayHTTPServer]) -> None:
    import http.client

    runtime, server = served
    stop = threading.Event()
    errors: list[str] = []

    def ingest(worker: int) -> None:
        i = 0
        t = now_ms()
        while not stop.is_set():
            # new metric names all the time: the report's loops over per-metric dicts see them grow
            batch = [(S(f"metric_{worker}_{i + k}", i=str(k)), [(t, 1.0)]) for k in range(20)]
            status = runtime.write(RW1_LOWER, snappy.compress(wire.encode_write_request(batch))).status
            if status != 204:
                errors.append(f"write {status}")
            i += 20

    threads = [threading.Thread(target=ingest, args=(w,), daemon=True) for w in range(3)]
    for th in threads:
        th.start()
    statuses: list[int] = []
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        for n in range(60):
            path = "/" if n % 5 == 0 else "/api/v1/cardinality?limit=1000"
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            statuses.append(resp.status)
        conn.close()
    finally:
        stop.set()
        for th in threads:
            th.join(5)
    assert statuses == [200] * 60
    assert errors == []
    assert RW1["Content-Encoding"] == "snappy"


def test_stop_queues_the_open_aggregation_windows(tmp_path: Path) -> None:
    agg = """\
    aggregate:
      - match: '{__name__="gpu_util"}'
        without: [gpu]
        interval: 1h
        outputs: [sum]
"""
    runtime = runtime_with(tmp_path, extra=agg)
    t = now_ms()
    assert write(runtime, [(S("gpu_util", gpu=str(g)), [(t, 1.0 + g)]) for g in range(3)])[0] == 204
    runtime.stop()  # the hour-long window is still open: it must be queued, not lost
    queue = DurableQueue(tmp_path / "queues" / "rx.queue.db", 1 << 30)
    try:
        got = [(lb, v) for shard in queue.shards() for e in queue.peek(shard, 1 << 20)
               for lb, samples in wire.decode_write_request(e.payload) for _ts, v in samples]
    finally:
        queue.close()
    assert (S("gpu_util:1h_without_gpu_sum"), 6.0) in got, got


def test_self_metrics_include_build_info_process_and_last_reload(tmp_path: Path) -> None:
    runtime = runtime_with(tmp_path)
    try:
        text = runtime.metrics("").body.decode()
        from relay import __version__, native

        built = "true" if native.status()[0] else "false"  # the native core exists since issue 9
        assert f'gpu_relay_build_info{{native="{built}",version="{__version__}"}} 1.0' in text
        assert "gpu_relay_config_last_reload_successful 1.0" in text
        assert "gpu_relay_config_last_reload_success_timestamp_seconds " in text
        assert "process_resident_memory_bytes " in text and "process_cpu_seconds_total " in text
        runtime.config_path = str(tmp_path / "missing.yaml")
        assert runtime.reload_config()[0] is False
        assert "gpu_relay_config_last_reload_successful 0.0" in runtime.metrics("").body.decode()
    finally:
        runtime.stop()


def test_a_disk_that_stays_full_is_one_warning_a_minute_not_one_per_request(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every request fails while the disk is full: the log says so once (then once a minute with a
    count), the sender is not buried in a line per request (issue 8, defect 17)."""
    runtime = runtime_with(tmp_path, _error(StorageError, "database or disk is full"))
    try:
        caplog.set_level(logging.DEBUG, logger="relay")
        statuses = [write(runtime, [(S("m"), [(now_ms(), float(i))])])[0] for i in range(5)]
        assert statuses == [503] * 5
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert runtime.registry.get_sample_value("gpu_relay_requests_received_total", {"code": "503"}) == 5
    finally:
        runtime.stop()


def test_the_decision_cache_budget_comes_from_the_config_and_changes_on_reload(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    dest = simple_dest("http://127.0.0.1:1/api/v1/write")
    path.write_text(config_text(tmp_path, dest).replace("server: {", "server: {decision_cache: 1MiB, ", 1))
    runtime = Runtime(str(path), load_config(path))
    try:
        assert runtime.pipeline.cache.max_bytes == 1 << 20
        path.write_text(config_text(tmp_path, dest).replace("server: {", "server: {decision_cache: 2MiB, ", 1))
        ok, message = runtime.reload_config()
        assert ok, message
        assert runtime.pipeline.cache.max_bytes == 2 << 20
    finally:
        runtime.stop()


@pytest.mark.parametrize("limit", ["-5", "0"])
def test_cardinality_with_a_limit_below_one_is_a_400_not_a_silently_odd_report(tmp_path: Path, limit: str) -> None:
    runtime = runtime_with(tmp_path)
    try:
        assert write(runtime, [(S(f"m{i}", i="1"), [(now_ms(), 1.0)]) for i in range(3)])[0] == 204
        reply = runtime.cardinality({"limit": [limit]})
        assert reply.status == 400 and b"positive integer" in reply.body
        assert runtime.cardinality({"limit": ["2"]}).status == 200
    finally:
        runtime.stop()


def test_scrapes_that_cannot_be_queued_on_a_full_disk_log_one_warning_not_one_per_scrape(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runtime = runtime_with(tmp_path, _error(StorageError, "database or disk is full"))
    body = wire.encode_write_request([(S("m"), [(now_ms(), 1.0)])])
    try:
        with caplog.at_level(logging.WARNING, logger="relay.service"):
            for _ in range(20):  # twenty scrapes in a row, the disk still full
                runtime._ingest_scraped(body)
        lines = [r for r in caplog.records if r.name == "relay.service"]
        assert len(lines) == 1 and not lines[0].exc_info
        assert "disk is full" in lines[0].getMessage()
    finally:
        runtime.stop()


def test_writes_to_a_closed_queue_are_503_with_one_warning_not_a_traceback_per_request(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a request still arriving while stop or a reload closes a destination's queue
    runtime = runtime_with(tmp_path, _error(QueueError, "queue is closed"))
    try:
        with caplog.at_level(logging.WARNING, logger="relay.service"):
            replies = [write(runtime, [(S("m"), [(now_ms(), 1.0)])]) for _ in range(10)]
        assert {(status, headers.get("Retry-After")) for status, headers, _ in replies} == {(503, "5")}
        lines = [r for r in caplog.records if r.name == "relay.service"]
        assert len(lines) == 1 and not lines[0].exc_info and "queue is closed" in lines[0].getMessage()
    finally:
        runtime.stop()
