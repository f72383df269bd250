"""Issue 20 point 5: a 401/403 holds the data in the durable queue (on_auth_error: hold, the default),
retried with capped backoff and credentials refreshed first, bounded only by the queue's own limits;
one WARNING on entering the auth-blocked state and one INFO on leaving it; on_auth_error: drop is
the old behaviour."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import Sender, SenderSettings
from relay.delivery.transport import Response
from tests.helpers import wait_until
from tests.relay.delivery.test_sender_faults import Clock, Recorder, Rig, points, rig, series


class Gate:
    """Answers 403 (or ``status``) while closed, 204 once opened."""

    def __init__(self, status: int = 403) -> None:
        self.status = status
        self.closed = threading.Event()
        self.closed.set()
        self.refused = 0
        self.accepted: list[bytes] = []

    def __call__(self, body: bytes) -> Response:
        if self.closed.is_set():
            self.refused += 1
            return Response(self.status, {}, b"User: arn:aws:sts::1:assumed-role/x is not authorized")
        self.accepted.append(body)
        return Response(204)


def short_sleeps(r: Rig) -> list[float]:
    asked: list[float] = []

    def sleep(seconds: float) -> bool:
        asked.append(seconds)
        return r.sender._stop.wait(min(seconds, 0.002))

    r.sender._sleep = sleep
    return asked


def lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [m.getMessage() for m in caplog.records if m.levelno == level and text in m.getMessage()]


@pytest.mark.parametrize("status", [401, 403])
def test_an_auth_error_holds_every_sample_until_the_destination_accepts_then_all_arrive(
    tmp_path: Path, rigs: list[Rig], caplog: pytest.LogCaptureFixture, status: int
) -> None:
    gate = Gate(status)
    r = rig(tmp_path, rigs, answer=gate)
    asked = short_sleeps(r)
    refreshes: list[int] = []
    r.sender.auth_refresh = lambda: refreshes.append(len(r.transport.bodies))
    sent = [(f"m{i}", 1000 + i, float(i)) for i in range(5)]
    for name, ts, v in sent:
        r.queue.put([(0, series(name, [(ts, v)]), 1, ts)])
    with caplog.at_level(logging.INFO, logger="relay.sender"):
        r.sender.start()
        assert wait_until(lambda: gate.refused >= 20)
        assert r.sender.state() == "auth_blocked"
        assert r.queue.depth()[0] == 5  # nothing dropped, nothing acked
        assert r.value("samples_failed_total", reason=f"http_{status}") == 0
        assert len(refreshes) >= 19  # credentials refreshed before each retry
        gate.closed.clear()
        assert wait_until(lambda: r.queue.depth() == (0, 0))
        assert wait_until(lambda: r.sender.state() == "sending")
    got = sorted(p for body in gate.accepted for p in points(body))
    assert got == sorted(sent)
    assert r.value("samples_sent_total") == 5 and r.sender.drops_last_hour() == {}
    assert len(lines(caplog, logging.WARNING, "holding the data in the queue")) == 1  # not one a retry
    assert len(lines(caplog, logging.INFO, "no longer refuses our credentials")) == 1
    assert len(lines(caplog, logging.WARNING, "")) == 1  # no per-retry failure line either
    assert max(asked) <= 30.0 and asked[1] > asked[0]  # capped backoff, doubling


def test_on_auth_error_drop_drops_a_403_batch_and_counts_it(tmp_path: Path, rigs: list[Rig]) -> None:
    r = rig(tmp_path, rigs, answer=lambda _: Response(403, {}, b"not authorized"), on_auth_error="drop")
    r.queue.put([(0, series("m", [(1000, 1.0), (2000, 2.0)]), 2, 1000)])
    r.sender.start()
    assert wait_until(lambda: r.queue.depth() == (0, 0))
    assert len(r.transport.bodies) == 1
    assert r.value("samples_failed_total", reason="http_403") == 2
    assert r.sender.state() == "rejecting" and r.sender.drops_last_hour() == {"http_403": 2}


def test_a_held_destination_is_bounded_only_by_the_queue_whose_oldest_are_dropped_and_counted(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    """While the sender holds its batch, puts go on; the queue drops its oldest rows to stay under
    max_disk (queue_full, counted by the put), never the batch the sender holds; once the
    destination accepts, the rest arrives: sent + dropped is everything that was put."""
    clock = Clock()
    queue = DurableQueue(tmp_path / "amp.queue.db", 20 * (600 + 64), clock=clock)
    gate = Gate(403)
    transport = Recorder(gate)
    metrics = RelayMetrics(CollectorRegistry())
    sender = Sender("amp", "http://x/w", queue, transport,
                    SenderSettings(max_samples_per_send=1, batch_send_deadline=0.01, min_backoff=0.001,
                                   max_backoff=0.002, max_sample_age=1e12), metrics, clock=clock)
    r = Rig(sender, queue, transport, metrics)
    rigs.append(r)
    short_sleeps(r)
    pad = "x" * 500
    dropped = 0
    sender.start()
    for i in range(60):
        dropped += queue.put([(0, series(f"m{i}", [(1000 + i, float(i))], pad=pad), 1, 1000 + i)])
        if i == 0:
            assert wait_until(lambda: gate.refused >= 1)
    assert dropped > 0 and sender.state() == "auth_blocked"
    assert r.value("samples_failed_total", reason="http_403") == 0
    gate.closed.clear()
    assert wait_until(lambda: queue.depth() == (0, 0))
    arrived = [name for body in gate.accepted for name, _, _ in points(body)]
    assert len(arrived) == len(set(arrived))  # each once
    assert "m0" in arrived  # the held batch was never the one dropped
    assert len(arrived) + dropped == 60
    assert metrics.registry.get_sample_value("gpu_relay_samples_sent_total", {"destination": "amp"}) == len(arrived)
