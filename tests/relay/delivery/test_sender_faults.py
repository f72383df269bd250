"""Sender fault paths from issue 8: rejected metadata, sample age, hard batch cap, 413 splitting,
bad Retry-After, early send of full batches, partial writes, visible failures, stop and the
max_shards barrier."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import snappy
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.common.ratelog import RateLimitedLog
from relay.delivery.queue.durable import MEMORY_BYTES, DurableQueue
from relay.delivery.sender import Sender, SenderSettings, parse_retry_after, written_count
from relay.delivery.transport import Response
from relay.ingest import rwsplit
from relay.proto import remote_v1_pb2
from tests.helpers import wait_until

NOW = 1_800_000_000.0


def series(name: str, points: list[tuple[int, float]], **labels: str) -> bytes:
    """One TimeSeries as a RW1 WriteRequest."""
    wr = remote_v1_pb2.WriteRequest()
    ts = wr.timeseries.add()
    for k, v in sorted({"__name__": name, **labels}.items()):
        lb = ts.labels.add()
        lb.name, lb.value = k, v
    for t, v in points:
        s = ts.samples.add()
        s.timestamp, s.value = t, v
    return bytes(wr.SerializeToString())


def metadata(name: str) -> bytes:
    wr = remote_v1_pb2.WriteRequest()
    md = wr.metadata.add()
    md.metric_family_name, md.help, md.type = name, "help", remote_v1_pb2.MetricMetadata.GAUGE
    return bytes(wr.SerializeToString())


def parse(body: bytes) -> remote_v1_pb2.WriteRequest:
    wr = remote_v1_pb2.WriteRequest()
    wr.ParseFromString(snappy.uncompress(body))
    return wr


def points(body: bytes) -> list[tuple[str, int, float]]:
    return [(ts.labels[0].value if ts.labels[0].name == "__name__" else dict((lb.name, lb.value) for lb in
             ts.labels)["__name__"], s.timestamp, s.value) for ts in parse(body).timeseries for s in ts.samples]


@dataclass
class Recorder:
    """A transport answering with ``answer(body)``; records bodies; thread-safe."""

    answer: object = None
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        with self.lock:
            self.bodies.append(body)
        if callable(self.answer):
            r = self.answer(body)
            assert isinstance(r, Response)
            return r
        return Response(204)


class Clock:
    """NOW plus the real time elapsed (batch deadlines need time to pass); ``now`` set: frozen there."""

    def __init__(self, now: float | None = None) -> None:
        self.now = now
        self._start = time.monotonic()

    def __call__(self) -> float:
        return self.now if self.now is not None else NOW + time.monotonic() - self._start


@dataclass
class Rig:
    sender: Sender
    queue: DurableQueue
    transport: Recorder
    metrics: RelayMetrics

    def value(self, name: str, **labels: str) -> float:
        v = self.metrics.registry.get_sample_value(f"gpu_relay_{name}", {"destination": "amp", **labels})
        return 0.0 if v is None else v


def rig(tmp_path: Path, rigs: list[Rig], answer: object = None, clock: Clock | None = None,
        memory_bytes: int = MEMORY_BYTES, connection_factory: type[sqlite3.Connection] = sqlite3.Connection,
        **settings: float | str) -> Rig:
    c = clock or Clock()
    queue = DurableQueue(tmp_path / "amp.queue.db", 64 << 20, clock=c, memory_bytes=memory_bytes,
                         connection_factory=connection_factory)
    transport = Recorder(answer)
    metrics = RelayMetrics(CollectorRegistry())
    s = SenderSettings(**{"max_samples_per_send": 1000, "batch_send_deadline": 0.02, "min_backoff": 0.001,
                          "max_backoff": 0.002, "max_sample_age": 1e12,  # tests use timestamps near 0
                          **settings})  # type: ignore[arg-type]
    sender = Sender("amp", "http://x/w", queue, transport, s, metrics, clock=c, sleep=lambda _: False)
    r = Rig(sender, queue, transport, metrics)
    rigs.append(r)
    return r


# -- defect 2: rejected or metadata-only entries never stay at a shard's head ----------------------
def test_a_403_rejected_metadata_batch_is_acked_once_not_resent_forever(tmp_path: Path, rigs: list[Rig]) -> None:
    r = rig(tmp_path, rigs, answer=lambda _: Response(403, {}, b"metadata quota exceeded\nmore"),
            on_auth_error="drop")
    r.queue.put([(0, metadata("m"), 0, 0)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    time.sleep(0.2)
    assert len(r.transport.bodies) == 1  # was ~13,000 a second, forever
    assert r.queue.depth() == (0, 0)


def test_a_metadata_entry_that_is_sent_is_acked(tmp_path: Path, rigs: list[Rig]) -> None:
    r = rig(tmp_path, rigs)
    r.queue.put([(0, metadata("m"), 0, 0)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert len(r.transport.bodies) == 1 and parse(r.transport.bodies[0]).metadata[0].metric_family_name == "m"


# -- defect 10: max_sample_age from the sample's own timestamp ------------------------------------
def test_samples_older_than_max_sample_age_by_their_timestamp_are_dropped_though_just_queued(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    r = rig(tmp_path, rigs, max_sample_age=3600)
    old_ms = int((NOW - 7200) * 1000)
    r.queue.put([(0, series("old", [(old_ms, 1.0)]), 1, old_ms)])  # enqueued now, sampled 2 h ago
    fresh_ms = int((NOW - 60) * 1000)
    r.queue.put([(0, series("fresh", [(fresh_ms, 2.0)]), 1, fresh_ms)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert [p[0] for b in r.transport.bodies for p in points(b)] == ["fresh"]
    assert r.value("samples_failed_total", reason="too_old") == 1
    assert r.value("samples_sent_total") == 1


def test_send_batch_age_deadline_counts_from_the_oldest_sample_time(tmp_path: Path, rigs: list[Rig]) -> None:
    clock = Clock(NOW)
    r = rig(tmp_path, rigs, answer=lambda _: Response(503), clock=clock, max_sample_age=10)

    def sleep(d: float) -> bool:
        assert clock.now is not None
        clock.now += d
        return False

    r.sender._sleep = sleep
    result = r.sender.send_batch(snappy.compress(series("m", [(1, 1.0)])), 1, NOW - 9.5)
    assert result.reason == "too_old" and clock() - NOW < 1.0  # 0.5 s left of the sample's 10 s


# -- defect 9: hard cap and 413 splitting ----------------------------------------------------------
def test_every_request_respects_max_samples_per_send_even_for_one_large_entry(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    r = rig(tmp_path, rigs, max_samples_per_send=4)
    big = b"".join([series("a", [(t, float(t)) for t in range(1, 4)]),
                    series("b", [(t, float(t)) for t in range(1, 11)], gpu="0"), metadata("a")])
    r.queue.put([(0, big, 13, 1)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    sizes = [len(points(b)) for b in r.transport.bodies]
    assert max(sizes) <= 4 and sum(sizes) == 13
    got = sorted(p for b in r.transport.bodies for p in points(b))
    assert got == sorted([("a", t, float(t)) for t in range(1, 4)] + [("b", t, float(t)) for t in range(1, 11)])
    for b in r.transport.bodies:  # every cut of series b keeps its labels
        for ts in parse(b).timeseries:
            names = {lb.name for lb in ts.labels}
            assert "__name__" in names and (ts.labels[0].value != "b" or "gpu" in names)
    assert sum(len(parse(b).metadata) for b in r.transport.bodies) == 1
    assert r.value("samples_sent_total") == 13


def test_a_413_splits_the_batch_and_retries_the_halves_down_to_one_series(tmp_path: Path, rigs: list[Rig]) -> None:
    def answer(body: bytes) -> Response:
        return Response(413, {}, b"too big") if len(parse(body).timeseries) > 1 else Response(204)

    r = rig(tmp_path, rigs, answer=answer)
    payload = b"".join(series(f"s{i}", [(1, float(i))]) for i in range(5))
    r.queue.put([(0, payload, 5, 1)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    delivered = sorted(p for b in r.transport.bodies if len(parse(b).timeseries) == 1 for p in points(b))
    assert delivered == [(f"s{i}", 1, float(i)) for i in range(5)]
    assert r.value("samples_sent_total") == 5 and r.value("samples_failed_total", reason="http_413") == 0


def test_a_413_for_a_single_series_is_dropped_and_counted(tmp_path: Path, rigs: list[Rig]) -> None:
    r = rig(tmp_path, rigs, answer=lambda _: Response(413, {}, b"too big"))
    r.queue.put([(0, series("one", [(1, 1.0), (2, 2.0)]), 2, 1)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert len(r.transport.bodies) == 1
    assert r.value("samples_failed_total", reason="http_413") == 2


def test_rwsplit_halves_and_chunks_keep_every_byte_of_every_series() -> None:
    parts = [series(f"s{i}", [(t, 1.0) for t in range(i + 1)]) for i in range(4)]
    payload = b"".join(parts)
    halves = rwsplit.halves(payload)
    assert halves is not None
    (a, na), (b, nb) = halves
    assert a + b == payload and na + nb == 10 and na > 0 and nb > 0
    assert rwsplit.halves(parts[0]) is None
    assert b"".join(c for c, _ in rwsplit.chunks(payload, 100)) == payload


# -- defect 13: Retry-After that is neither a number nor a date ------------------------------------
@pytest.mark.parametrize("header", ["soon", "\u00b2", "1.5", "-1", "Mon, 99 Foo 2026 99:99:99 GMT",
                                    "9" * 40, "\x00", "Fri, 31 Dec 9999 23:59:60 GMT", "0x10", " , "])
def test_retry_after_that_is_neither_a_number_nor_an_http_date_is_ignored(
    header: str, tmp_path: Path, rigs: list[Rig]
) -> None:
    got = parse_retry_after(header, NOW)  # never raises
    assert got is None or got >= 0
    answers = [Response(503, {"retry-after": header}), Response(204)]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop(0))
    result = r.sender.send_batch(snappy.compress(series("m", [(1, 1.0)])), 1, NOW)
    assert (result.ok, result.retried) == (True, 1)


# -- defect 21: a full batch goes out at once -------------------------------------------------------
def test_a_batch_goes_out_at_once_when_the_next_entry_does_not_fit_though_samples_are_below_max(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    r = rig(tmp_path, rigs, max_samples_per_send=10, batch_send_deadline=30)
    for i in range(4):  # 3 + 3 + 3 = 9 < 10, the 4th does not fit: the batch is full
        r.queue.put([(0, series("m", [(i * 10 + k, 1.0) for k in range(3)]), 3, 1)])
    r.sender.start()
    assert wait_until(lambda: len(r.transport.bodies) >= 1, timeout=2)  # not at the 30 s deadline
    assert len(points(r.transport.bodies[0])) == 9


# -- defect 24: partial writes, stop, barrier -----------------------------------------------------
def test_written_count_reads_the_rw2_response_headers() -> None:
    assert written_count({}) is None
    assert written_count({"x-prometheus-remote-write-samples-written": "7",
                          "x-prometheus-remote-write-histograms-written": "2"}) == 9
    assert written_count({"x-prometheus-remote-write-samples-written": "lots"}) is None


def test_a_batch_partly_written_counts_only_the_rejected_samples_as_failed(tmp_path: Path, rigs: list[Rig]) -> None:
    answers = [Response(200, {"x-prometheus-remote-write-samples-written": "7"}),
               Response(400, {"x-prometheus-remote-write-samples-written": "4"}, b"out of order sample")]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop(0))
    body = snappy.compress(series("m", [(1, 1.0)]))
    assert r.sender.send_batch(body, 10, NOW).reason == "partial"
    assert r.sender.send_batch(body, 10, NOW).reason == "http_400"
    assert r.value("samples_sent_total") == 7 + 4
    assert r.value("samples_failed_total", reason="partial") == 3
    assert r.value("samples_failed_total", reason="http_400") == 6


def test_stop_returns_only_when_no_request_is_in_flight_and_none_starts_after(tmp_path: Path, rigs: list[Rig]) -> None:
    release = threading.Event()
    entered = threading.Event()

    def answer(_: bytes) -> Response:
        entered.set()
        release.wait(5)
        return Response(204)

    r = rig(tmp_path, rigs, answer=answer)
    r.queue.put([(0, series("m", [(1, 1.0)]), 1, 1)])
    r.sender.start()
    assert entered.wait(5)
    done = threading.Event()
    threading.Thread(target=lambda: (r.sender.stop(timeout=5), done.set()), daemon=True).start()
    time.sleep(0.2)
    assert not done.is_set() and r.sender.in_flight == 1  # the old request is still out there
    release.set()
    assert done.wait(5) and r.sender.in_flight == 0
    n = len(r.transport.bodies)
    r.queue.put([(0, series("m", [(2, 1.0)]), 1, 2)])
    assert r.sender.send_batch(snappy.compress(b"x"), 1, NOW).reason == "shutdown"
    time.sleep(0.2)
    assert len(r.transport.bodies) == n


def test_after_a_max_shards_change_old_entries_are_all_delivered_before_newer_ones(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    r = rig(tmp_path, rigs, max_samples_per_send=3)
    for i in range(12):  # sharded under the old count (4 shards)
        r.queue.put([(i % 4, series("m", [(i, float(i))], s=str(i % 3)), 1, i)])
    barrier = r.queue.last_id()
    for i in range(12, 24):  # newer entries, sharded under the new count (2 shards)
        r.queue.put([(i % 2, series("m", [(i, float(i))], s=str(i % 3)), 1, i)])
    r.sender.drain_first = barrier
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    order = [t for b in r.transport.bodies for _, t, _ in points(b)]
    assert sorted(order) == list(range(24))  # none lost, none twice
    assert max(order.index(t) for t in range(12)) < min(order.index(t) for t in range(12, 24))
    assert order[:12] == list(range(12))  # the barrier goes out oldest first


# -- failures are visible ---------------------------------------------------------------------
def test_a_failing_destination_logs_one_warning_a_minute_per_reason_with_the_body_and_a_count(
    tmp_path: Path, rigs: list[Rig], caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(tmp_path, rigs, answer=lambda _: Response(400, {}, b"\n  label name too long: gpu\nsecond line"))
    log_clock = Clock(0.0)
    r.sender.failures = RateLimitedLog(logging.getLogger("relay.sender"), clock=log_clock)
    body = snappy.compress(series("m", [(1, 1.0)]))
    with caplog.at_level(logging.WARNING, logger="relay.sender"):
        for _ in range(50):
            r.sender.send_batch(body, 1, NOW)
        log_clock.now = 30.0
        r.sender.send_batch(body, 1, NOW)
        log_clock.now = 61.0
        r.sender.send_batch(body, 1, NOW)
    lines = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(lines) == 2
    first, second = (rec.getMessage() for rec in lines)
    assert "amp" in first and "HTTP 400" in first and "label name too long: gpu" in first
    assert "second line" not in first
    assert "50 more" in second
    assert getattr(lines[0], "destination", None) == "amp" and getattr(lines[0], "reason", None) == "http_400"
    assert r.sender.last_error is not None and r.sender.last_error[1] == "HTTP 400: label name too long: gpu"


def test_last_success_metric_retry_reason_and_queue_max_bytes_are_exposed(tmp_path: Path, rigs: list[Rig]) -> None:
    answers = [Response(429), Response(0, {}, b"ConnectionError: refused"), Response(204)]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop(0), clock=Clock(NOW))
    assert r.sender.last_success is None and r.sender.last_error is None
    assert r.sender.send_batch(snappy.compress(series("m", [(1, 1.0)])), 2, NOW).ok
    assert r.sender.last_success == NOW
    assert r.value("last_send_success_timestamp_seconds") == NOW
    assert r.value("samples_retried_total", reason="http_429") == 2
    assert r.value("samples_retried_total", reason="network") == 2
    assert r.sender.last_error == (NOW, "network error: ConnectionError: refused")
    assert r.value("queue_max_bytes") == 64 << 20


def test_credentials_that_fail_while_signing_are_retried_and_reported_as_credentials(
    tmp_path: Path, rigs: list[Rig], caplog: pytest.LogCaptureFixture
) -> None:
    import botocore.exceptions
    import requests

    from relay.delivery.transport import RequestsTransport

    class NoCreds(requests.auth.AuthBase):
        def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
            raise botocore.exceptions.NoCredentialsError()

    resp = RequestsTransport(auth=NoCreds()).post("http://127.0.0.1:9/w", b"x", {}, 1)
    assert resp.status == 0 and resp.body.startswith(b"credentials: NoCredentialsError")
    answers = [resp, Response(204)]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop(0), clock=Clock(NOW))
    with caplog.at_level(logging.WARNING, logger="relay.sender"):
        assert r.sender.send_batch(snappy.compress(series("m", [(1, 1.0)])), 1, NOW).ok
    assert r.value("samples_retried_total", reason="credentials") == 1
    assert r.sender.last_error is not None and r.sender.last_error[1].startswith("credentials error: NoCredentials")
    [line] = [x for x in caplog.records if x.levelno == logging.WARNING]
    assert getattr(line, "reason", None) == "credentials" and "Unable to locate credentials" in line.getMessage()


def test_forget_destination_removes_the_new_per_destination_series(tmp_path: Path, rigs: list[Rig]) -> None:
    answers = [Response(503), Response(204)]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop(0))
    assert r.sender.send_batch(snappy.compress(series("m", [(1, 1.0)])), 1, NOW).ok
    r.metrics.queue_damaged_total.labels("amp").inc()
    r.metrics.forget_destination("amp")
    left = [s for fam in r.metrics.registry.collect() for s in fam.samples if s.labels.get("destination") == "amp"]
    assert left == []


def test_an_oversized_entry_that_does_not_parse_is_dropped_as_malformed_not_retried_forever(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    r = rig(tmp_path, rigs, max_samples_per_send=2)
    r.queue.put([(0, b"\x0a\xff\xff\xff\x0f garbage", 5, 1)])  # a length far past the end
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert r.transport.bodies == []
    assert r.value("samples_failed_total", reason="malformed") == 5


def test_a_damaged_queue_is_counted_once_in_gpu_relay_queue_damaged_total(tmp_path: Path) -> None:
    path = tmp_path / "amp.queue.db"
    path.write_bytes(b"this is not a database" * 400)
    queue = DurableQueue(path, 64 << 20)
    metrics = RelayMetrics(CollectorRegistry())
    try:
        Sender("amp", "http://x/w", queue, Recorder(), SenderSettings(), metrics)
        Sender("amp", "http://x/w", queue, Recorder(), SenderSettings(), metrics)  # a reload's new sender
        assert metrics.registry.get_sample_value("gpu_relay_queue_damaged_total", {"destination": "amp"}) == 1
    finally:
        queue.close()
