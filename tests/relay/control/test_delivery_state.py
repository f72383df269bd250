"""What a destination's delivery is doing, as the status page and ``gpu-relay report`` show it
(issue 20 points 5 and 6): one state, samples/s out = sent, drops of the last hour by reason, a
full queue's rate-limited WARNING, and numbers that agree across a reload."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.common.ratelog import RateLimitedLog
from relay.control.delivery_watch import DeliveryWatch
from relay.delivery.transport import Response
from tests.helpers import wait_until
from tests.relay.control.test_reload import Running, ScriptedTransport, dest, start
from tests.relay.control.test_service import S, config_text, now_ms


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        r.runtime.stop()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watch(clock: Clock) -> tuple[DeliveryWatch, RelayMetrics]:
    rm = RelayMetrics(CollectorRegistry())
    return DeliveryWatch(rm, clock, RateLimitedLog(logging.getLogger("relay.service"), clock=clock)), rm


def test_samples_out_is_the_sent_rate_not_the_kept_one() -> None:
    clock = Clock()
    w, rm = watch(clock)
    w.tick(["d"])
    rm.samples_kept_total.labels("d").inc(10_000)  # kept, never sent
    clock.t += 10
    w.tick(["d"])
    assert w.sent_rate("d") == 0.0
    rm.samples_sent_total.labels("d").inc(500)
    clock.t += 10
    w.tick(["d"])
    assert w.sent_rate("d") == pytest.approx(500 / 20)
    clock.t += 120  # the window moves on: what was sent a minute ago no longer counts
    w.tick(["d"])
    clock.t += 1
    w.tick(["d"])
    assert w.sent_rate("d") == 0.0


def test_drops_of_the_last_hour_by_reason_from_both_counters() -> None:
    clock = Clock()
    w, rm = watch(clock)
    w.tick(["d", "e"])
    rm.samples_failed_total.labels("d", "http_400").inc(30)
    rm.samples_dropped_total.labels("d", "queue_full").inc(7)
    rm.samples_failed_total.labels("e", "too_old").inc(1)
    for _ in range(30):  # half an hour
        clock.t += 60
        w.tick(["d", "e"])
    assert w.drops_last_hour("d") == {"http_400": 30, "queue_full": 7}
    assert w.drops_last_hour("e") == {"too_old": 1}
    for _ in range(40):  # more than an hour after the drops
        clock.t += 60
        w.tick(["d", "e"])
    rm.samples_failed_total.labels("d", "http_400").inc(2)
    assert w.drops_last_hour("d") == {"http_400": 2}
    assert w.drops_last_hour("unknown") == {}


def test_a_full_queue_logs_one_warning_a_minute_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="relay.service")
    clock = Clock()
    w, rm = watch(clock)
    w.tick(["d"])
    for _ in range(10):  # ten seconds of a full queue
        rm.samples_dropped_total.labels("d", "queue_full").inc(100)
        clock.t += 1
        w.tick(["d"], lambda name: 1 << 30)
    lines = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "destination d: queue full (max_disk 1073741824 bytes): dropped the 100 oldest" in lines[0]
    clock.t += 61
    rm.samples_dropped_total.labels("d", "queue_full").inc(5)
    w.tick(["d"])
    lines = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert len(lines) == 2 and "dropped the 5 oldest" in lines[1] and "9 more like this" in lines[1]
    rm.samples_sent_total.labels("d").inc(1)
    clock.t += 61
    w.tick(["d"])  # no new queue_full drops: no line
    assert len([r for r in caplog.records if "queue full" in r.getMessage()]) == 2


class AnswerTransport(ScriptedTransport):
    def __init__(self, status: int, body: bytes = b"") -> None:
        super().__init__(status)
        self.body = body

    def post(self, url: str, body: bytes, headers: object, timeout: float) -> Response:
        super().post(url, body, {}, timeout)
        return Response(self.status, {}, self.body)


@pytest.mark.parametrize(
    ("status", "body", "states"),
    [
        (204, b"", {"sending"}),
        (503, b"busy", {"retrying"}),
        (400, b"out of order sample", {"rejecting"}),
        # 403: held where the sender holds on auth errors (on_auth_error: hold), else dropped
        (403, b"User is not authorized", {"auth_blocked", "rejecting"}),
    ],
)
def test_the_overview_gives_one_state_a_destination(running: list[Running], tmp_path: Path, status: int,
                                                     body: bytes, states: set[str]) -> None:
    t = AnswerTransport(status, body)
    r = start(running, tmp_path, dest("d", "http://rx/api/v1/write"), transport_factory=lambda d: t)
    assert r.post([(S("m", i="1"), [(now_ms(), 1.0)])]) == 204
    assert wait_until(lambda: len(t.bodies) >= 1)
    assert wait_until(lambda: r.runtime.overview("d")["sending"]["state"] in states), r.runtime.overview("d")
    sending = r.runtime.overview("d")["sending"]
    assert sending["state_text"] in {"sending", "retrying (queueing)", "rejecting (dropping 4xx)",
                                     "blocked by auth (holding)"}
    if status == 400:  # dropped: counted in the last hour's drops, by reason
        r.runtime._watch()
        assert wait_until(lambda: r.runtime.overview("d")["sending"]["dropped_last_hour"].get("http_400") == 1)


def test_last_success_and_the_counters_agree_across_a_reload(running: list[Running], tmp_path: Path) -> None:
    t = AnswerTransport(204)
    r = start(running, tmp_path, dest("d", "http://rx/api/v1/write"), transport_factory=lambda d: t)
    assert r.post([(S("m", i=str(i)), [(now_ms(), 1.0)]) for i in range(3)]) == 204
    assert wait_until(lambda: r.runtime.overview("d")["sending"]["samples_sent"] == 3)
    before = r.runtime.overview("d")["sending"]["last_success"]
    assert before is not None
    # a change that replaces the sender (the headers), on the same queue
    r.path.write_text(config_text(tmp_path, dest("d", "http://rx/api/v1/write", "    headers: {X-A: b}\n")))
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    sending = r.runtime.overview("d")["sending"]
    assert sending["samples_sent"] == 3
    assert sending["last_success"] == before  # not "never" beside "samples sent 3"
