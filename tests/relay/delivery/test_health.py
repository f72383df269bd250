"""relay.delivery.health: one state a destination, drops of the last hour by reason (issue 20 point
5), and wall-clock steps seen against the monotonic clock so that max_sample_age is not fooled by
a forward step (point 15); through the sender: every drop path logs, too_old included."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.delivery.health import REJECTING_FOR_S, ClockWatch, DestinationHealth, DropWindow
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import Sender, SenderSettings
from tests.helpers import wait_until
from tests.relay.delivery.test_sender_faults import NOW, Clock, Recorder, Rig, points, rig, series


class Ticker:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- the state ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("events", "state"),
    [
        ([], "sending"),
        ([("retrying", 1)], "retrying"),
        ([("retrying", 1), ("settled", 1)], "sending"),
        ([("auth", 1)], "auth_blocked"),
        ([("auth", 1), ("retrying", 2)], "auth_blocked"),  # auth first: it is what holds the data
        ([("auth", 1), ("settled", 1)], "sending"),
        ([("auth", 1), ("auth", 2), ("settled", 1)], "auth_blocked"),  # another shard still held
        ([("rejected", 0)], "rejecting"),
        ([("rejected", 0), ("retrying", 1)], "retrying"),
    ],
)
def test_the_state_table(events: list[tuple[str, int]], state: str) -> None:
    h = DestinationHealth(Ticker())

    def rejected(_key: int) -> None:
        h.dropped("http_400", 1, rejected=True)

    calls: dict[str, Callable[[int], object]] = {"retrying": h.retrying, "settled": h.settled,
                                                 "auth": h.auth_failed, "rejected": rejected}
    for what, key in events:
        calls[what](key)
    assert h.state() == state


def test_rejecting_lasts_five_minutes_after_the_last_final_4xx() -> None:
    clock = Ticker()
    h = DestinationHealth(clock)
    h.dropped("http_400", 3, rejected=True)
    clock.t += REJECTING_FOR_S - 1
    assert h.state() == "rejecting"
    clock.t += 2
    assert h.state() == "sending"


def test_entering_and_leaving_auth_blocked_are_said_once_each() -> None:
    h = DestinationHealth(Ticker())
    assert h.auth_failed(1) is True
    assert h.auth_failed(1) is False and h.auth_failed(2) is False  # already blocked
    assert h.settled(1) is False  # shard 2 still held
    assert h.retrying(2) is True  # the last one: the destination leaves auth_blocked
    assert h.settled(3) is False  # never held: nothing to leave


def test_drops_of_the_last_hour_by_reason_forget_what_is_older() -> None:
    clock = Ticker(0.0)
    w = DropWindow(clock)
    w.add("http_400", 5)
    w.add("too_old", 2)
    w.add("http_400", 0)  # nothing dropped: nothing recorded
    clock.t = 1800
    w.add("http_400", 1)
    assert w.counts() == {"http_400": 6, "too_old": 2}
    clock.t = 3600 + 30
    assert w.counts() == {"http_400": 1}
    clock.t = 1800 + 3600 + 60
    assert w.counts() == {}


# -- the clock watch ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("wall_step", "mono_step", "seen"),
    [(7200.0, 1.0, 7199.0), (-7200.0, 1.0, -7201.0), (30.0, 1.0, None), (61.5, 0.5, 61.0), (1.0, 600.0, -599.0)],
    ids=["forward", "backward", "small", "just-over", "wall-stood-still"],
)
def test_a_step_is_a_disagreement_of_more_than_a_minute_between_two_checks(
    wall_step: float, mono_step: float, seen: float | None
) -> None:
    wall, mono = Ticker(NOW), Ticker(50.0)
    steps: list[float] = []
    w = ClockWatch(wall, mono, steps.append)
    wall.t += wall_step
    mono.t += mono_step
    assert w.check() == wall.t
    assert steps == ([] if seen is None else [pytest.approx(seen)])
    w.check()
    assert len(steps) <= 1  # one line a step, not one a check


def test_corrected_moves_only_times_read_before_a_forward_step() -> None:
    wall, mono = Ticker(NOW), Ticker(0.0)
    w = ClockWatch(wall, mono, lambda _s: None)
    before = wall.t
    wall.t += 7200 + 1
    mono.t += 1
    w.check()
    after = wall.t
    assert w.corrected(before - 10, before) == pytest.approx(before - 10 + 7200)
    assert w.corrected(after - 10, after) == after - 10  # read after the step: as it is
    wall.t -= 3600  # a backward step moves nothing (samples look younger: kept, not dropped)
    mono.t += 1
    w.check()
    assert w.corrected(after - 10, after) == after - 10


# -- through the sender ------------------------------------------------------------------------
def test_a_forward_clock_step_past_max_sample_age_does_not_drop_fresh_samples(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wall, mono = Ticker(NOW), Ticker(0.0)
    queue = DurableQueue(tmp_path / "amp.queue.db", 1 << 20, clock=wall)
    transport = Recorder()
    metrics = RelayMetrics(CollectorRegistry())
    sender = Sender("amp", "http://x/w", queue, transport,
                    SenderSettings(batch_send_deadline=0.01, max_sample_age=3600), metrics,
                    clock=wall, monotonic=mono, sleep=lambda _: False)
    try:
        ts = int((NOW - 5) * 1000)
        queue.put([(0, series("fresh", [(ts, 1.0)]), 1, ts)])
        with caplog.at_level(logging.WARNING, logger="relay.sender"):
            wall.t += 7200  # NTP steps the wall clock 2 h forward; 1 s really passed
            mono.t += 1
            sender.start()
            assert wait_until(lambda: queue.depth() == (0, 0))
            sender._now()  # more checks: the step is not logged again
        assert [p for b in transport.bodies for p in points(b)] == [("fresh", ts, 1.0)]
        assert metrics.registry.get_sample_value("gpu_relay_samples_failed_total",
                                                 {"destination": "amp", "reason": "too_old"}) is None
        steps = [m.getMessage() for m in caplog.records if "stepped forward" in m.getMessage()]
        assert len(steps) == 1 and "7199s" in steps[0]
    finally:
        sender.stop(timeout=2)
        queue.close()


def test_samples_really_older_than_max_sample_age_are_dropped_counted_and_logged(
    tmp_path: Path, rigs: list[Rig], caplog: pytest.LogCaptureFixture
) -> None:
    r = rig(tmp_path, rigs, clock=Clock(), max_sample_age=3600)
    old_ms = int((NOW - 7200) * 1000)
    r.queue.put([(0, series("old", [(old_ms, 1.0)]), 1, old_ms)])
    with caplog.at_level(logging.WARNING, logger="relay.sender"):
        r.sender.start()
        assert wait_until(lambda: r.queue.depth() == (0, 0))
    assert r.value("samples_failed_total", reason="too_old") == 1 and r.transport.bodies == []
    lines = [m for m in caplog.records if getattr(m, "reason", None) == "too_old"]
    assert len(lines) == 1 and "older than max_sample_age" in lines[0].getMessage()
    assert r.sender.drops_last_hour() == {"too_old": 1}
