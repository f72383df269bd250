"""relay.shardplan: how many shards a destination runs (between min_shards and max_shards), and a
change of that count on a running sender without breaking per-series order."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.control import shardplan
from relay.control.shardplan import Planner, SendTotals, desired
from relay.delivery.transport import Response
from relay.state.pipeline import Pipeline
from tests.helpers import wait_until
from tests.relay.delivery.test_sender_faults import Rig, parse, rig, series
from tests.relay.state.test_pipeline import _config, harnesses


def totals(at: float = 0.0, busy: float = 0.0, sent: int = 0, failed: int = 0, backlog: int = 0,
           posts: int | None = None) -> SendTotals:
    return SendTotals(at, busy, sent, failed, sent // 100 if posts is None else posts, backlog)


# (name, current, lo, hi, want, expected count)
DESIRED = [
    ("within 30% of four: four", 4, 1, 8, 3.5, 4),
    ("within 30% of four, above: four", 4, 1, 8, 5.1, 4),
    ("needs three", 1, 1, 8, 3.0, 3),
    ("a little more than one and a third: two", 1, 1, 8, 1.31, 2),
    ("more than max_shards: max_shards", 2, 1, 8, 20.0, 8),
    ("far below: down to what it needs", 8, 1, 8, 0.001, 1),
    ("never below min_shards", 8, 3, 8, 0.001, 3),
    ("a count outside the bounds is brought in", 12, 1, 8, 8.0, 8),
]


@pytest.mark.parametrize(("name", "current", "lo", "hi", "want", "count"), DESIRED, ids=[c[0] for c in DESIRED])
def test_desired(name: str, current: int, lo: int, hi: int, want: float, count: int) -> None:
    assert desired(current, lo, hi, want) == count


# (name, current, lo, hi, totals before, totals 10 s later, expected (count, want or None))
PLANS = [
    ("fixed bounds", 3, 4, 4, totals(), totals(10, 10, 100), (4, None)),
    ("a destination retrying keeps its count", 2, 1, 8, totals(), totals(10, 9, 1000, failed=1, backlog=10**6),
     (2, None)),
    ("requests too slow to pause for keep it", 1, 1, 8, totals(), totals(10, 30, 30_000, posts=10), (1, None)),
    ("stalled (nothing sent, samples wait): as it is", 5, 1, 8, totals(), totals(10, backlog=500), (5, None)),
    # 1 ms a sample, 1,000 a second in: one shard is exactly busy
    ("keeps up on one", 1, 1, 8, totals(), totals(10, 10, 10_000), (1, 1.0)),
    # 1 ms a sample, 3,000 a second in: three
    ("needs three", 1, 1, 8, totals(), totals(10, 30, 30_000), (3, 3.0)),
    # 0.5 ms a sample, 1,000 a second in (sent 10,000 and the backlog stayed at 100,000), plus 5% of
    # the backlog a second: (1,000 + 5,000) x 0.5 ms = 3 shards
    ("a backlog is caught up", 1, 1, 8, totals(backlog=100_000), totals(10, 5, 10_000, backlog=100_000), (3, 3.0)),
    # the backlog grew by 20,000 while 10,000 went out: 3,000 a second came in
    ("what came in counts what is still queued", 1, 1, 8, totals(), totals(10, 10, 10_000, backlog=20_000),
     (4, 4.0)),
]


@pytest.mark.parametrize(("name", "current", "lo", "hi", "before", "after", "expected"), PLANS,
                         ids=[c[0] for c in PLANS])
def test_a_first_plan(name: str, current: int, lo: int, hi: int, before: SendTotals, after: SendTotals,
                      expected: tuple[int, float | None]) -> None:
    p = Planner(update_s=10)
    assert p.plan("a", current, lo, hi, before) is None  # first sight: remembered only
    got = p.plan("a", current, lo, hi, after)
    assert got is not None and got[0] == expected[0]
    assert got[1] == (None if expected[1] is None else pytest.approx(expected[1]))


def test_the_planner_answers_once_an_interval_per_destination_and_smooths_its_rates() -> None:
    p = Planner(update_s=10)
    assert p.plan("a", 1, 1, 8, totals(0)) is None  # first sight: remembered only
    assert p.plan("a", 1, 1, 8, totals(5, 30, 30_000)) is None  # too soon
    assert p.plan("b", 1, 1, 8, totals(5)) is None  # another destination has its own interval
    assert p.plan("a", 1, 1, 8, totals(10, 30, 30_000)) == (3, pytest.approx(3.0))
    # idle from here on: the smoothed rate decays (x0.8 an interval), the count comes down by steps,
    # not at once on a quiet interval between two bursts
    got = p.plan("a", 3, 1, 8, totals(20, 30, 30_000))
    assert got == (3, pytest.approx(2.4))
    counts = [got[0]]
    for k in range(3, 12):
        got = p.plan("a", counts[-1], 1, 8, totals(10 * k, 30, 30_000))
        assert got is not None
        counts.append(got[0])
    assert counts[0] == 3 and counts[-1] == 1 and counts == sorted(counts, reverse=True)
    p.forget("a")
    assert p.plan("a", 1, 1, 8, totals(400, 99, 99_000)) is None  # starts over


def test_bursts_between_quiet_intervals_do_not_flap_the_count() -> None:
    """A 10 s burst needing 4 shards every 30 s (1.33 on average): the smoothed rate settles on two
    shards after a few changes at the start, instead of changing on every burst (unsmoothed, the
    count went 4, 1, 1, 4, 1, 1, ...: 40 changes in these 10 minutes)."""
    p = Planner(update_s=10)
    p.plan("a", 1, 1, 8, totals(0))
    current, counts, busy, sent = 1, [], 0.0, 0
    for k in range(1, 61):
        if k % 3 == 0:  # the burst: 4 shards' worth
            busy, sent = busy + 40, sent + 40_000
        got = p.plan("a", current, 1, 8, totals(10 * k, busy, sent))
        assert got is not None
        current = got[0]
        counts.append(current)
    changes = sum(a != b for a, b in itertools.pairwise(counts))
    assert changes <= 6 and set(counts[20:]) == {2}, counts


# -- a change on a running sender ------------------------------------------------------------------
def sent_points(r: Rig) -> list[tuple[str, int]]:
    """(series name, timestamp) of every sample posted, in the order the posts were made."""
    return [(ts.labels[0].value, s.timestamp) for b in list(r.transport.bodies) for ts in parse(b).timeseries
            for s in ts.samples]


def test_pause_lets_the_held_batch_go_out_and_nothing_more_until_resume(tmp_path: Path, rigs: list[Rig]) -> None:
    release = threading.Event()
    posting = threading.Event()

    def answer(_: bytes) -> Response:
        posting.set()
        release.wait(5)
        return Response(204)

    r = rig(tmp_path, rigs, answer=answer)
    r.queue.put([(0, series("a", [(1, 1.0)]), 1, 1)])
    r.sender.start()
    assert posting.wait(5)
    paused: list[bool] = []
    t = threading.Thread(target=lambda: paused.append(r.sender.pause(5)))
    t.start()
    time.sleep(0.3)
    assert paused == []  # the batch in flight is shipped (and acked) first
    release.set()
    t.join(5)
    assert paused == [True]
    assert r.queue.shards() == []
    r.queue.put([(1, series("b", [(2, 2.0)]), 1, 2)])
    time.sleep(0.5)
    assert len(r.transport.bodies) == 1  # paused: nothing sent
    r.sender.resume(None)
    assert wait_until(lambda: len(r.transport.bodies) == 2, timeout=5)
    assert sent_points(r) == [("a", 1), ("b", 2)]


def test_pause_gives_up_on_a_batch_that_stays_in_flight_and_resume_none_goes_on(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    release = threading.Event()
    r = rig(tmp_path, rigs, answer=lambda _: Response(204) if release.wait(10) else Response(500))
    r.queue.put([(0, series("a", [(1, 1.0)]), 1, 1)])
    r.sender.start()
    assert wait_until(lambda: r.sender.in_flight == 1, timeout=5)
    started = time.monotonic()
    assert r.sender.pause(0.3) is False
    assert time.monotonic() - started < 2
    r.sender.resume(None)
    assert r.sender.drain_first is None
    release.set()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    r.queue.put([(3, series("c", [(3, 3.0)]), 1, 3)])  # a thread for a new shard starts again
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert sorted(sent_points(r)) == [("a", 1), ("c", 3)]


def test_pause_is_refused_while_a_drain_is_under_way(tmp_path: Path, rigs: list[Rig]) -> None:
    r = rig(tmp_path, rigs)
    r.sender.drain_first = 10
    assert r.sender.pause(1) is False


def test_resume_with_a_barrier_ships_what_the_old_count_sharded_before_anything_newer(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    """Series x and y were in shards 0 and 1 under two shards; under one shard both are in shard 0.
    Their old points must reach the destination before their new ones, and the old shards are
    shipped side by side (each on its own thread), not one entry at a time."""
    concurrent: list[int] = []
    now = [0]
    lock = threading.Lock()

    def answer(_: bytes) -> Response:
        with lock:
            now[0] += 1
            concurrent.append(now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return Response(204)

    r = rig(tmp_path, rigs, answer=answer, max_samples_per_send=1)
    r.sender.start()
    assert r.sender.pause(2)
    for t in range(1, 4):  # old count (2 shards): x in 0, y in 1
        r.queue.put([(0, series("x", [(t, 1.0)]), 1, t), (1, series("y", [(t, 1.0)]), 1, t)])
    barrier = r.queue.last_id()
    for t in range(4, 6):  # new count (1 shard): both in 0
        r.queue.put([(0, series("x", [(t, 1.0)]) + series("y", [(t, 1.0)]), 2, t)])
    r.sender.resume(barrier)
    assert wait_until(lambda: r.queue.shards() == [], timeout=10)
    got = sent_points(r)
    for name in ("x", "y"):
        assert [t for n, t in got if n == name] == [1, 2, 3, 4, 5]
    assert max(concurrent) == 2  # the two old shards drained side by side
    assert r.sender.drain_first is None


def test_a_stop_during_the_drain_leaves_it_for_the_successor(tmp_path: Path, rigs: list[Rig]) -> None:
    gate = threading.Event()
    r = rig(tmp_path, rigs, answer=lambda _: Response(204) if gate.wait(10) else Response(500),
            max_samples_per_send=1)
    r.sender.start()
    assert r.sender.pause(2)
    r.queue.put([(0, series("x", [(1, 1.0)]), 1, 1), (1, series("y", [(1, 1.0)]), 1, 1)])
    barrier = r.queue.last_id()
    r.sender.resume(barrier)
    assert wait_until(lambda: r.sender.in_flight >= 1, timeout=5)
    stopper = threading.Thread(target=r.sender.stop, kwargs={"timeout": 5})
    stopper.start()
    time.sleep(0.1)
    gate.set()
    stopper.join(10)
    assert r.sender.drain_first == barrier  # not finished: a successor built on it drains it in id order


def test_peek_upto_stops_at_the_barrier_in_memory_and_from_the_file(tmp_path: Path, rigs: list[Rig]) -> None:
    for memory in (32 << 20, 0):
        r = rig(tmp_path / str(memory), rigs, memory_bytes=memory)
        for t in range(1, 5):
            r.queue.put([(0, series("x", [(t, 1.0)]), 1, t)])
        ids = [e.id for e in r.queue.peek(0, 100)]
        assert [e.id for e in r.queue.peek(0, 100, upto=ids[1])] == ids[:2]
        assert [e.id for e in r.queue.peek(0, 100, after=ids[0], upto=ids[2])] == ids[1:3]
        assert r.queue.peek(0, 100, upto=ids[0] - 1) == []


# -- the pipeline's side: set_shards and the writers routed before it ------------------------------
def test_hold_writes_waits_for_writers_in_progress_and_holds_new_ones_back(tmp_path: Path) -> None:
    with harnesses(tmp_path) as build:
        h = build(_config(tmp_path, "  - {name: amp, url: 'http://127.0.0.1:1/w', queue: {max_shards: 4}}\n"))
        _hold_writes(h.pipeline)


def _hold_writes(p: Pipeline) -> None:
    assert p.stages[0].shards == 4  # built without shards: each destination's max_shards
    p._begin_write()  # a request routed (under 4) and still writing
    began: list[str] = []
    later = threading.Thread(target=lambda: (p._begin_write(), began.append("later"), p._end_write()))
    with p.hold_writes(0.2) as written:
        assert written is False  # the first one is still writing
        later.start()
        time.sleep(0.2)
        assert began == []  # a new one waits at the door while the count changes
        p._end_write()
        p.set_shards(p.stages[0].name, 3)
        assert p.stages[0].shards == 3
    later.join(2)
    assert began == ["later"]
    with p.hold_writes(0.2) as written:
        assert written is True  # nothing in progress
    with pytest.raises(KeyError):
        p.set_shards("nope", 2)


def test_change_is_refused_without_effect_when_the_sender_cannot_pause(tmp_path: Path, rigs: list[Rig]) -> None:
    class Dest:
        def __init__(self, r: Rig) -> None:
            self.sender, self.queue, self.shards = r.sender, r.queue, 1

    class NoPipeline:
        def set_shards(self, name: str, shards: int) -> None:  # pragma: no cover - must not be called
            raise AssertionError("changed the pipeline although the sender did not pause")

    r = rig(tmp_path, rigs)
    r.sender.drain_first = 5  # a drain under way: pause refuses
    r.queue.set_shard_count(1)
    d = Dest(r)
    assert shardplan.change(NoPipeline(), d, 4) is False  # type: ignore[arg-type]
    assert d.shards == 1 and r.queue.shard_count() == 1 and r.sender.drain_first == 5


class _Routes:
    """The pipeline's side of a change, for a sender rig (no requests are routed here)."""

    def __init__(self) -> None:
        self.shards: list[int] = []
        self.holding = False

    def set_shards(self, name: str, shards: int) -> None:
        assert name == "amp" and self.holding  # new requests are held back while the count changes
        self.shards.append(shards)

    @contextlib.contextmanager
    def hold_writes(self, timeout: float) -> Iterator[bool]:
        self.holding = True
        try:
            yield True
        finally:
            self.holding = False


def _dest(r: Rig, shards: int) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(sender=r.sender, queue=r.queue, shards=shards, config=SimpleNamespace(name="amp"))


def test_the_file_says_unknown_until_the_drain_is_done_then_the_new_count(tmp_path: Path, rigs: list[Rig]) -> None:
    """A stop or crash in the middle of the drain must drain again at the next start (review: the new
    count was recorded before the drain, so a restart sent old and new entries side by side)."""
    gates = [threading.Event(), threading.Event()]
    calls: list[int] = []

    def answer(_: bytes) -> Response:
        calls.append(1)
        gates[min(len(calls), 2) - 1].wait(10)
        return Response(204)

    r = rig(tmp_path, rigs, answer=answer, max_samples_per_send=1)
    r.queue.set_shard_count(2)
    r.queue.put([(1, series("x", [(1, 1.0)]), 1, 1)])
    r.queue.put([(1, series("x", [(2, 1.0)]), 1, 2)])
    r.sender.start()
    assert wait_until(lambda: len(calls) == 1, timeout=5)  # x@1 in flight, x@2 queued (old count)
    d = _dest(r, 2)
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(shardplan.change(_Routes(), d, 1)))  # type: ignore[arg-type]
    t.start()
    time.sleep(0.2)
    assert r.queue.shard_count() == 2  # pausing: nothing changed yet
    gates[0].set()  # x@1 goes out; the shard thread stops; the drain sends x@2 and waits
    assert wait_until(lambda: len(calls) == 2, timeout=5)
    t.join(5)
    assert done == [True] and d.shards == 1  # type: ignore[attr-defined]
    assert r.queue.shard_count() is None  # unknown while the drain is under way
    gates[1].set()
    assert wait_until(lambda: r.sender.drain_first is None, timeout=5)
    assert r.queue.shard_count() == 1  # recorded once the drain was done
    from relay.control.destinations import shard_barrier

    assert shard_barrier(r.queue, 1) is None  # a restart now needs no drain
    assert sent_points(r) == [("x", 1), ("x", 2)]


def test_a_stop_in_the_middle_of_the_drain_leaves_the_count_unknown_for_the_next_start(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    from relay.control.destinations import shard_barrier

    gate = threading.Event()
    r = rig(tmp_path, rigs, answer=lambda _: Response(204) if gate.wait(10) else Response(500),
            max_samples_per_send=1)
    r.queue.set_shard_count(2)
    r.sender.start()
    assert r.sender.pause(2)
    r.queue.put([(1, series("x", [(1, 1.0)]), 1, 1), (0, series("y", [(1, 1.0)]), 1, 1)])
    r.sender.resume(None)
    assert wait_until(lambda: r.sender.in_flight >= 1, timeout=5)
    d = _dest(r, 2)
    changer = threading.Thread(target=lambda: shardplan.change(_Routes(), d, 1))  # type: ignore[arg-type]
    changer.start()
    time.sleep(0.1)
    gate.set()
    changer.join(5)
    gate.clear()
    r.queue.put([(0, series("x", [(2, 1.0)]), 1, 2)])  # new count: x is in shard 0 now
    stopper = threading.Thread(target=r.sender.stop, kwargs={"timeout": 5})
    stopper.start()
    time.sleep(0.1)
    gate.set()
    stopper.join(10)
    assert r.queue.shard_count() is None  # never recorded: the drain did not finish
    barrier = shard_barrier(r.queue, 1)
    assert barrier == r.queue.last_id()  # the next start drains everything in id order


def test_a_count_that_cannot_be_recorded_stays_unknown_and_nothing_is_lost(
    tmp_path: Path, rigs: list[Rig], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk when the new count is recorded after the drain: one warning, the file says
    "unknown" (a restart drains in id order), and the sender goes on, old entries first."""
    from relay.delivery.queue.durable import StorageError

    r = rig(tmp_path, rigs)
    r.queue.set_shard_count(1)
    real = r.queue.set_shard_count

    def record(n: int) -> None:
        if n:
            raise StorageError("could not record the shard count", "database or disk is full")
        real(n)

    monkeypatch.setattr(r.queue, "set_shard_count", record)
    r.sender.start()
    r.queue.put([(0, series("x", [(1, 1.0)]), 1, 1)])
    assert wait_until(lambda: len(r.transport.bodies) == 1, timeout=5)
    r.queue.put([(0, series("x", [(2, 1.0)]), 1, 2)])
    d = _dest(r, 1)
    routes = _Routes()
    assert shardplan.change(routes, d, 2)  # type: ignore[arg-type]
    assert routes.shards == [2] and d.shards == 2  # type: ignore[attr-defined]
    r.queue.put([(1, series("x", [(3, 1.0)]), 1, 3)])
    assert wait_until(lambda: r.queue.shards() == [] and r.sender.drain_first is None, timeout=5)
    assert sent_points(r) == [("x", 1), ("x", 2), ("x", 3)]
    assert r.queue.shard_count() is None  # unknown: a restart drains what is queued in id order
    assert any("could not record the shard count 2" in rec.getMessage() for rec in caplog.records)


def test_a_pause_and_resume_between_the_supervisor_s_look_and_its_thread_start_starts_no_shard_thread(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    """Review: the supervisor read (paused, drain_first), then listed the shards and started plain
    shard threads checking only the pause; a whole change in between had new-count entries sent beside
    the old ones still to drain."""
    done: list[tuple[str, int]] = []
    x3 = threading.Event()

    def answer(body: bytes) -> Response:
        got = [(ts.labels[0].value, smp.timestamp) for ts in parse(body).timeseries for smp in ts.samples]
        if ("x", 1) in got:
            x3.wait(1.0)  # x@3 (new count), if wrongly sent beside it, completes first
        if ("x", 3) in got:
            x3.set()
        done.extend(got)
        return Response(204)

    r = rig(tmp_path, rigs, answer=answer)
    r.queue.set_shard_count(2)
    real_shards = r.queue.shards
    armed, inside, release = threading.Event(), threading.Event(), threading.Event()

    def shards() -> list[int]:
        if armed.is_set() and threading.current_thread().name == "sender-amp" and not release.is_set():
            inside.set()
            release.wait(5)
        return real_shards()

    r.queue.shards = shards  # type: ignore[method-assign]
    r.sender.start()
    time.sleep(0.1)
    armed.set()
    assert inside.wait(2)  # the supervisor looked (not paused, no drain) and lists the shards now
    r.queue.put([(1, series("x", [(1, 1.0)]), 1, 1)])  # old count: x in shard 1
    assert shardplan.change(_Routes(), _dest(r, 2), 1)  # type: ignore[arg-type]
    r.queue.put([(0, series("x", [(3, 3.0)]), 1, 3)])  # new count: x in shard 0
    release.set()
    assert wait_until(lambda: r.queue.shards() == [] and r.sender.drain_first is None, timeout=5)
    assert done == [("x", 1), ("x", 3)]  # in the order they reached the destination


def test_a_backlog_seen_at_one_moment_and_gone_at_the_next_does_not_flap_the_count() -> None:
    """Review: the planner looks every 10 s, and a scrape's burst is queued or already sent depending
    on the moment; the backlog term is smoothed too."""
    p = Planner(update_s=10)
    p.plan("a", 1, 1, 8, totals(0))
    current, counts = 1, []
    for k in range(1, 61):  # steady 1 ms a sample, 1,500 a second; 40,000 queued every other look
        backlog = 40_000 if k % 2 else 0
        got = p.plan("a", current, 1, 8, totals(10 * k, 15 * k, 15_000 * k, backlog=backlog))
        assert got is not None
        current = got[0]
        counts.append(current)
    # it settles, never going back up and down with the moment it looks (unsmoothed: 8, 5, 7, 4, 7, 4, ...)
    assert counts == sorted(counts, reverse=True) and len(set(counts[20:])) == 1, counts


def test_pause_is_refused_at_once_while_a_request_has_been_in_flight_for_long(tmp_path: Path, rigs: list[Rig]) -> None:
    """Review: a pause set first, then waited for a slow request, idled every other shard meanwhile."""
    release = threading.Event()
    r = rig(tmp_path, rigs, answer=lambda _: Response(204) if release.wait(10) else Response(500))
    r.queue.put([(0, series("slow", [(1, 1.0)]), 1, 1)])
    r.sender.start()
    assert wait_until(lambda: r.sender.in_flight == 1, timeout=5)
    time.sleep(0.3)
    started = time.monotonic()
    assert r.sender.pause(0.4) is False  # in flight for more than half the pause's time: not now
    assert time.monotonic() - started < 0.1
    r.queue.put([(1, series("fast", [(1, 1.0)]), 1, 1)])
    assert wait_until(lambda: len(r.transport.bodies) == 2, timeout=5)  # the other shard was never paused
    release.set()


def test_a_change_gives_up_when_a_write_stays_in_progress_and_leaves_everything_as_it_was(
    tmp_path: Path, rigs: list[Rig]
) -> None:
    class Stuck(_Routes):
        @contextlib.contextmanager
        def hold_writes(self, timeout: float) -> Iterator[bool]:
            self.holding = True
            try:
                yield False  # a request's write still in progress after the timeout
            finally:
                self.holding = False

    r = rig(tmp_path, rigs)
    r.queue.set_shard_count(2)
    r.sender.start()
    routes = Stuck()
    d = _dest(r, 2)
    assert shardplan.change(routes, d, 1) is False  # type: ignore[arg-type]
    assert routes.shards == [] and d.shards == 2  # type: ignore[attr-defined]
    assert r.queue.shard_count() == 2 and r.sender.drain_first is None
    r.queue.put([(1, series("x", [(1, 1.0)]), 1, 1)])
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)  # not left paused
