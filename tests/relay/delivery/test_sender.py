"""Sender: retry classes against a scripted fake transport, batching from the queue, shutdown."""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import snappy
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import (
    Sender,
    SenderSettings,
    SendResult,
    backoff_delay,
    classify,
    parse_retry_after,
    request_headers,
)
from relay.delivery.transport import Response
from relay.proto import remote_v1_pb2
from tests.helpers import wait_until

NOW = 1_800_000_000.0
EXPIRED = b'{"message":"The security token included in the request is expired"}'


@dataclass
class Call:
    url: str
    body: bytes
    headers: Mapping[str, str]
    timeout: float


@dataclass
class FakeTransport:
    """Answers from a script (Response or Exception), then ``default``; records every call."""

    script: list[Response | Exception] = field(default_factory=list)
    default: Response = field(default_factory=lambda: Response(200))
    calls: list[Call] = field(default_factory=list)
    on_post: Callable[[], None] | None = None

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        self.calls.append(Call(url, body, dict(headers), timeout))
        if self.on_post is not None:
            self.on_post()
        answer = self.script.pop(0) if self.script else self.default
        if isinstance(answer, Exception):
            raise answer
        return answer


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    sender: Sender
    transport: FakeTransport
    clock: FakeClock
    metrics: RelayMetrics
    sleeps: list[float]
    refreshes: list[int]

    def value(self, name: str, **labels: str) -> float:
        v = self.metrics.registry.get_sample_value(f"gpu_relay_{name}", {"destination": "amp", **labels})
        return 0.0 if v is None else v

    def total(self, name: str) -> float:
        """Sum over every label set of the destination (e.g. all retry reasons)."""
        return sum(
            s.value for fam in self.metrics.registry.collect() for s in fam.samples
            if s.name == f"gpu_relay_{name}" and s.labels.get("destination") == "amp"
        )


def make(
    tmp_path: Path,
    script: list[Response | Exception] | None = None,
    settings: SenderSettings | None = None,
    refresh: bool = True,
    advance_clock_on_sleep: bool = True,
) -> Harness:
    transport = FakeTransport(list(script or []))
    clock = FakeClock()
    metrics = RelayMetrics(CollectorRegistry())
    sleeps: list[float] = []
    refreshes: list[int] = []

    def sleep(seconds: float) -> bool:
        sleeps.append(seconds)
        if advance_clock_on_sleep:
            clock.now += seconds
        return False

    sender = Sender(
        "amp", "https://example.invalid/api/v1/write", DurableQueue(tmp_path / "q.db", 1 << 20, clock),
        transport, settings or SenderSettings(min_backoff=0.03, max_backoff=5.0), metrics,
        headers={"X-Team": "gpu", "content-type": "text/plain", "User-Agent": "evil"},
        auth_refresh=(lambda: refreshes.append(1)) if refresh else None, clock=clock, sleep=sleep,
    )
    return Harness(sender, transport, clock, metrics, sleeps, refreshes)


@pytest.fixture
def harnesses() -> Iterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for h in made:
        h.sender.stop()
        h.sender.queue.close()


def http_date(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


# -- pure helpers ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (200, b"", "ok"), (204, b"", "ok"), (0, b"ConnectionError", "retry"), (500, b"", "retry"),
        (503, b"", "retry"), (429, b"ingestion rate limit", "retry"), (408, b"", "retry"),
        (403, EXPIRED, "refresh"), (403, b"ExpiredTokenException", "refresh"),
        (403, b"Missing Authentication Token", "drop"), (400, b"out of order sample", "drop"),
        (401, b"", "drop"), (404, b"", "drop"), (409, b"", "drop"), (415, b"", "drop"), (301, b"", "drop"),
    ],
)
def test_classify_status_table(status: int, body: bytes, kind: str) -> None:
    assert classify(status, body) == kind


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None), ("", None), ("7", 7.0), (" 0 ", 0.0), (http_date(NOW + 12), 12.0),
        (http_date(NOW - 30), 0.0), ("soon", None), ("-5", None), ("1.5", None),
    ],
    ids=["absent", "empty", "seconds", "zero", "http-date", "http-date-in-past", "garbage", "negative",
         "fraction"],
)
def test_parse_retry_after_seconds_and_http_date(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, NOW) == expected


@pytest.mark.parametrize(("rnd", "expected"), [(0.0, 0.8), (0.5, 1.0), (0.999999, 1.2)])
def test_backoff_jitter_is_plus_minus_20_percent(rnd: float, expected: float) -> None:
    assert backoff_delay(1.0, 10.0, rnd) == pytest.approx(expected, abs=1e-5)


def test_backoff_jitter_never_exceeds_max_backoff() -> None:
    assert backoff_delay(5.0, 5.0, 0.99) == 5.0


def test_reserved_headers_cannot_be_overridden_and_retry_attempt_only_on_retries() -> None:
    user = {"Content-Encoding": "gzip", "content-type": "text/plain", "USER-AGENT": "x",
            "X-Prometheus-Remote-Write-Version": "2.0.0", "Retry-Attempt": "9", "X-Scope": "a"}
    first = request_headers(user, "gpu-relay/9", 0)
    assert first == {
        "X-Scope": "a", "Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
        "User-Agent": "gpu-relay/9", "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    assert request_headers(user, "gpu-relay/9", 3)["Retry-Attempt"] == "3"


# -- retry classes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    name: str
    script: list[Response | Exception]
    ok: bool
    reason: str
    posts: int
    min_sleeps: tuple[float, ...] = ()  # each sleep >= this
    max_sleeps: tuple[float, ...] = ()  # each sleep <= this
    refreshes: int = 0
    on_auth_error: str = "hold"  # issue 20 point 5: "drop" is the old behaviour (Prometheus's)


ROWS = [
    Row("500_then_200", [Response(500)], True, "sent", 2, (0.024,), (0.036,)),
    Row("503_twice_backs_off_doubling", [Response(503), Response(503)], True, "sent", 3,
        (0.024, 0.048), (0.036, 0.072)),
    Row("429_retry_after_seconds", [Response(429, {"retry-after": "3"})], True, "sent", 2, (3.0,), (3.0,)),
    Row("429_retry_after_http_date", [Response(429, {"retry-after": http_date(NOW + 7)})], True, "sent", 2,
        (7.0,), (7.0,)),
    Row("429_retry_after_http_date_in_past_means_plain_backoff",
        [Response(429, {"retry-after": http_date(NOW - 60)})], True, "sent", 2, (0.024,), (0.036,)),
    Row("503_retry_after_smaller_than_backoff_keeps_backoff", [Response(503, {"retry-after": "0"})],
        True, "sent", 2, (0.024,), (0.036,)),
    Row("408_then_200", [Response(408)], True, "sent", 2, (0.024,), (0.036,)),
    Row("network_error_then_200", [Response(0, {}, b"ConnectionError: refused")], True, "sent", 2,
        (0.024,), (0.036,)),
    Row("transport_that_raises_is_a_network_error", [OSError("boom")], True, "sent", 2, (0.024,), (0.036,)),
    Row("400_dropped", [Response(400, {}, b"out of order sample")], False, "http_400", 1),
    Row("404_dropped", [Response(404)], False, "http_404", 1),
    Row("403_not_expired_dropped_without_refresh", [Response(403, {}, b"Missing Authentication Token")],
        False, "http_403", 1, on_auth_error="drop"),
    Row("401_dropped_when_told_to", [Response(401)], False, "http_401", 1, on_auth_error="drop"),
    Row("403_held_refreshes_then_retries_with_backoff", [Response(403, {}, b"Missing Authentication Token")] * 2,
        True, "sent", 3, (0.024, 0.048), (0.036, 0.072), refreshes=2),
    Row("401_held_refreshes_then_retries", [Response(401)], True, "sent", 2, (0.024,), (0.036,), refreshes=1),
    Row("403_expired_twice_refreshes_at_once_then_holds", [Response(403, {}, EXPIRED)] * 2, True, "sent", 3,
        (0.024,), (0.036,), refreshes=2),
    Row("403_expired_refreshes_then_retries_at_once", [Response(403, {}, EXPIRED)], True, "sent", 2,
        refreshes=1),
    Row("403_expired_twice_refreshes_once_then_drops", [Response(403, {}, EXPIRED)] * 2, False, "http_403", 2,
        refreshes=1, on_auth_error="drop"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_send_batch_retry_classes(row: Row, tmp_path: Path, harnesses: list[Harness]) -> None:
    h = make(tmp_path, row.script, SenderSettings(min_backoff=0.03, max_backoff=5.0,
                                                  on_auth_error="drop" if row.on_auth_error == "drop" else "hold"))
    harnesses.append(h)
    h.sender._rng.seed(1)
    result = h.sender.send_batch(b"body", 10, NOW)
    assert (result.ok, result.reason) == (row.ok, row.reason)
    assert len(h.transport.calls) == row.posts
    assert result.retried == row.posts - 1
    assert len(h.sleeps) == len(row.min_sleeps)
    for got, lo, hi in zip(h.sleeps, row.min_sleeps, row.max_sleeps, strict=True):
        assert lo <= got <= hi
    assert len(h.refreshes) == row.refreshes
    for n, call in enumerate(h.transport.calls):
        assert call.headers.get("Retry-Attempt") == (str(n) if n else None)
        assert call.headers["Content-Encoding"] == "snappy"
        assert call.headers["Content-Type"] == "application/x-protobuf"
        assert call.headers["User-Agent"] == "gpu-relay/0.1.0"
        assert call.headers["X-Prometheus-Remote-Write-Version"] == "0.1.0"
        assert call.headers["X-Team"] == "gpu"
    assert h.total("samples_retried_total") == 10 * (row.posts - 1)  # now by reason (issue 8)
    if row.ok:
        assert result.dropped_samples == 0 and h.value("samples_sent_total") == 10
    else:
        assert result.dropped_samples == 10
        assert h.value("samples_failed_total", reason=row.reason) == 10
        assert h.value("samples_sent_total") == 0


def test_403_expired_without_auth_refresh_is_dropped_under_on_auth_error_drop(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    h = make(tmp_path, [Response(403, {}, EXPIRED)], SenderSettings(on_auth_error="drop"), refresh=False)
    harnesses.append(h)
    assert h.sender.send_batch(b"b", 1, NOW).reason == "http_403"
    assert len(h.transport.calls) == 1


def test_batch_older_than_max_sample_age_is_dropped_without_sending(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    h = make(tmp_path, settings=SenderSettings(max_sample_age=60))
    harnesses.append(h)
    result = h.sender.send_batch(b"b", 5, NOW - 61)
    assert result == SendResult(False, 0, "too_old", 0, 5)
    assert h.transport.calls == [] and h.value("samples_failed_total", reason="too_old") == 5


def test_retries_never_go_on_forever_past_max_sample_age(tmp_path: Path, harnesses: list[Harness]) -> None:
    settings = SenderSettings(min_backoff=1, max_backoff=8, max_sample_age=60)
    h = make(tmp_path, settings=settings)
    harnesses.append(h)
    h.transport.default = Response(429, {}, b"per-user series limit exceeded")
    result = h.sender.send_batch(b"b", 5, NOW)
    assert (result.ok, result.reason, result.status, result.dropped_samples) == (False, "too_old", 429, 5)
    assert h.clock.now - NOW == pytest.approx(60, abs=0.01)  # last sleep clipped to the deadline
    assert max(h.sleeps) <= 8 * 1.2 and 9 <= len(h.transport.calls) <= 12


def test_long_retry_after_is_honoured_but_clipped_to_the_age_deadline(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    h = make(tmp_path, [Response(503, {"retry-after": "7200"})], settings=SenderSettings(max_sample_age=100))
    harnesses.append(h)
    result = h.sender.send_batch(b"b", 1, NOW - 40)
    assert result.reason == "too_old" and h.sleeps == [pytest.approx(60, abs=0.01)]


def test_backoff_is_capped_at_max_backoff(tmp_path: Path, harnesses: list[Harness]) -> None:
    h = make(tmp_path, [Response(500)] * 8, settings=SenderSettings(min_backoff=0.1, max_backoff=0.4))
    harnesses.append(h)
    assert h.sender.send_batch(b"b", 1, NOW).ok
    assert len(h.sleeps) == 8
    assert all(s <= 0.4 for s in h.sleeps) and all(s >= 0.4 * 0.8 for s in h.sleeps[3:])


def test_stop_interrupts_a_long_backoff_and_the_batch_stays_queued(tmp_path: Path) -> None:
    transport = FakeTransport(default=Response(503, {"retry-after": "60"}))
    queue = DurableQueue(tmp_path / "q.db", 1 << 20)
    sender = Sender("amp", "http://127.0.0.1:1/w", queue, transport,
                    SenderSettings(batch_send_deadline=0.01), RelayMetrics(CollectorRegistry()))
    try:
        queue.put([(0, b"payload", 3)])
        sender.start()
        assert wait_until(lambda: len(transport.calls) == 1, timeout=5)
        started = time.monotonic()
        sender.stop(timeout=5)
        assert time.monotonic() - started < 1.0
        assert len(transport.calls) == 1
        assert queue.depth() == (3, 7)  # not acked: resent after restart
    finally:
        sender.stop()
        queue.close()


def test_send_batch_returns_shutdown_when_sleep_is_interrupted(tmp_path: Path) -> None:
    queue = DurableQueue(tmp_path / "q.db", 1 << 20)
    sender = Sender("amp", "u", queue, FakeTransport(default=Response(500)), SenderSettings(min_backoff=30),
                    RelayMetrics(CollectorRegistry()))
    out: list[SendResult] = []
    t = threading.Thread(target=lambda: out.append(sender.send_batch(b"b", 2, time.time())))
    t.start()
    time.sleep(0.05)
    sender.stop()
    t.join(2)
    queue.close()
    assert out == [SendResult(False, 500, "shutdown", 0, 0)]


# -- draining the queue ------------------------------------------------------------------------
def series_payload(name: str, value: float) -> bytes:
    wr = remote_v1_pb2.WriteRequest()
    ts = wr.timeseries.add()
    lb = ts.labels.add()
    lb.name, lb.value = "__name__", name
    s = ts.samples.add()
    s.value, s.timestamp = value, 1000
    return bytes(wr.SerializeToString())


def decoded(body: bytes) -> list[tuple[str, float]]:
    wr = remote_v1_pb2.WriteRequest()
    wr.ParseFromString(snappy.uncompress(body))
    return [(t.labels[0].value, t.samples[0].value) for t in wr.timeseries]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Sender, FakeTransport, DurableQueue]]:
    transport = FakeTransport()
    queue = DurableQueue(tmp_path / "q.db", 1 << 20)
    sender = Sender("amp", "http://x/w", queue, transport,
                    SenderSettings(max_samples_per_send=3, batch_send_deadline=0.05),
                    RelayMetrics(CollectorRegistry()))
    yield sender, transport, queue
    sender.stop()
    queue.close()


def test_sender_batches_consecutive_entries_per_shard_in_order(
    live: tuple[Sender, FakeTransport, DurableQueue],
) -> None:
    sender, transport, queue = live
    for i in range(7):
        queue.put([(0, series_payload("a", i), 1), (1, series_payload("b", i), 1)])
    sender.start()
    assert wait_until(lambda: queue.depth() == (0, 0), timeout=5)
    bodies = [decoded(c.body) for c in transport.calls]
    for name in ("a", "b"):
        shard = [b for b in bodies if b[0][0] == name]
        assert [len(b) for b in shard] == [3, 3, 1]  # max_samples_per_send, then the deadline
        assert [v for b in shard for _, v in b] == [float(i) for i in range(7)]  # FIFO per shard
    sent = sender.metrics.registry.get_sample_value("gpu_relay_samples_sent_total", {"destination": "amp"})
    assert sent == 14


def test_sender_picks_up_shards_that_appear_after_start(
    live: tuple[Sender, FakeTransport, DurableQueue],
) -> None:
    sender, transport, queue = live
    sender.start()
    sender.start()  # idempotent: reloads call it again
    queue.put([(5, series_payload("late", 1), 3)])
    assert wait_until(lambda: queue.depth() == (0, 0), timeout=5)
    assert [decoded(c.body) for c in transport.calls] == [[("late", 1.0)]]


def test_dropped_batches_are_removed_from_the_queue_and_counted(
    live: tuple[Sender, FakeTransport, DurableQueue],
) -> None:
    sender, transport, queue = live
    transport.default = Response(400, {}, b"bad labels")
    queue.put([(0, series_payload("x", 1), 2)])
    sender.start()
    assert wait_until(lambda: queue.depth() == (0, 0), timeout=5)
    v = sender.metrics.registry.get_sample_value(
        "gpu_relay_samples_failed_total", {"destination": "amp", "reason": "http_400"}
    )
    assert v == 2


def test_a_full_batch_is_sent_without_waiting_for_the_deadline(tmp_path: Path) -> None:
    transport = FakeTransport()
    queue = DurableQueue(tmp_path / "q.db", 1 << 20)
    sender = Sender("amp", "http://x/w", queue, transport,
                    SenderSettings(max_samples_per_send=2, batch_send_deadline=60),
                    RelayMetrics(CollectorRegistry()))
    try:
        queue.put([(0, series_payload("a", 1), 1)])
        sender.start()
        time.sleep(0.3)
        assert transport.calls == []  # waits for the batch to fill (deadline 60 s)
        queue.put([(0, series_payload("a", 2), 1)])
        assert wait_until(lambda: len(transport.calls) == 1, timeout=2)
        assert decoded(transport.calls[0].body) == [("a", 1.0), ("a", 2.0)]
    finally:
        sender.stop()
        queue.close()
