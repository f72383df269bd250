"""relay.shardplan: how many shards a destination runs (between min_shards and max_shards), and a
change of that count on a running sender without breaking per-series order."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay import shardplan
from relay.pipeline import Pipeline
from relay.shardplan import Planner, SendTotals, desired
from relay.transport import Response
from tests.helpers import wait_until
from tests.test_pipeline import _config, harnesses
from tests.test_sender_faults import Rig, parse, rig, series


def totals(at: float = 0.0, busy: float = 0.0, sent: int = 0, failed: int = 0, backlog: int = 0) -> SendTotals:
    return SendTotals(at, busy, sent, failed, backlog)


# (name, current, lo, hi, before, after, expected count, expected want or None)
CASES = [
    ("fixed bounds", 3, 4, 4, totals(), totals(10, 10, 100), 4, None),
    ("a failing destination keeps its count", 2, 1, 8, totals(), totals(10, 9, 1000, failed=1, backlog=1e6), 2, None),
    ("idle: back to the fewest", 5, 2, 8, totals(), totals(10), 2, None),
    ("stalled (nothing sent, samples wait): as it is", 5, 1, 8, totals(), totals(10, backlog=500), 5, None),
    ("no time passed", 3, 1, 8, totals(5), totals(5, 1, 10), 3, None),
    # 1 ms a sample, 1,000 a second in: one shard is exactly busy
    ("keeps up on one", 1, 1, 8, totals(), totals(10, 10, 10_000), 1, 1.0),
    # 1 ms a sample, 3,000 a second in: three
    ("needs three", 1, 1, 8, totals(), totals(10, 30, 30_000), 3, 3.0),
    ("within 30% of four: four", 4, 1, 8, totals(), totals(10, 35, 35_000), 4, 3.5),
    ("more than max_shards: max_shards", 2, 1, 8, totals(), totals(10, 200, 200_000), 8, 20.0),
    ("far below: down to what it needs", 8, 1, 8, totals(), totals(10, 0.01, 10_000), 1, 0.001),
    ("never below min_shards", 8, 3, 8, totals(), totals(10, 0.01, 10_000), 3, 0.001),
    # 0.5 ms a sample, 1,000 a second in (sent 10,000 and the backlog stayed at 100,000), plus 5% of
    # the backlog a second: (1,000 + 5,000) x 0.5 ms = 3 shards
    ("a backlog is caught up", 1, 1, 8, totals(backlog=100_000), totals(10, 5, 10_000, backlog=100_000), 3, 3.0),
    # the backlog grew by 20,000 while 10,000 went out: 3,000 a second came in
    ("what came in counts what is still queued", 1, 1, 8, totals(), totals(10, 10, 10_000, backlog=20_000), 4, 4.0),
    ("a count outside the bounds is brought in", 12, 1, 8, totals(), totals(10, 80, 80_000), 8, 8.0),
]


@pytest.mark.parametrize(("name", "current", "lo", "hi", "before", "after", "count", "want"), CASES,
                         ids=[c[0] for c in CASES])
def test_desired(name: str, current: int, lo: int, hi: int, before: SendTotals, after: SendTotals, count: int,
                 want: float | None) -> None:
    got, got_want = desired(current, lo, hi, before, after)
    assert got == count
    if want is None:
        assert got_want is None
    else:
        assert got_want == pytest.approx(want)


def test_the_planner_answers_once_an_interval_per_destination() -> None:
    p = Planner(update_s=10)
    assert p.plan("a", 1, 1, 8, totals(0)) is None  # first sight: remembered only
    assert p.plan("a", 1, 1, 8, totals(5, 30, 30_000)) is None  # too soon
    assert p.plan("b", 1, 1, 8, totals(5)) is None  # another destination has its own interval
    assert p.plan("a", 1, 1, 8, totals(10, 30, 30_000)) == (3, pytest.approx(3.0))
    # the next interval is measured from the last plan: nothing sent since, nothing queued: idle
    assert p.plan("a", 3, 1, 8, totals(20, 30, 30_000)) == (1, None)
    p.forget("a")
    assert p.plan("a", 1, 1, 8, totals(40, 99, 99_000)) is None  # starts over


# -- a change on a running sender ------------------------------------------------------------------
@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for r in made:
        r.sender.stop(timeout=2)
        r.queue.close()


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
def test_wait_written_waits_only_for_writers_that_began_before_the_mark(tmp_path: Path) -> None:
    with harnesses(tmp_path) as build:
        h = build(_config(tmp_path, "  - {name: amp, url: 'http://127.0.0.1:1/w', queue: {max_shards: 4}}\n"))
        _wait_written(h.pipeline)


def _wait_written(p: Pipeline) -> None:
    assert p.stages[0].shards == 4  # built without shards: each destination's max_shards
    first = p._begin_write()
    mark = p.set_shards(p.stages[0].name, 3)
    assert p.stages[0].shards == 3
    later = p._begin_write()
    assert p.wait_written(mark, 0.2) is False  # ``first`` may have been routed under the old count
    p._end_write(first)
    assert p.wait_written(mark, 0.2) is True  # ``later`` began after: not waited for
    p._end_write(later)
    with pytest.raises(KeyError):
        p.set_shards("nope", 2)


def test_change_is_refused_without_effect_when_the_sender_cannot_pause(tmp_path: Path, rigs: list[Rig]) -> None:
    class Dest:
        def __init__(self, r: Rig) -> None:
            self.sender, self.queue, self.shards = r.sender, r.queue, 1

    class NoPipeline:
        def set_shards(self, name: str, shards: int) -> int:  # pragma: no cover - must not be called
            raise AssertionError("changed the pipeline although the sender did not pause")

    r = rig(tmp_path, rigs)
    r.sender.drain_first = 5  # a drain under way: pause refuses
    r.queue.set_shard_count(1)
    d = Dest(r)
    assert shardplan.change(NoPipeline(), d, 4) is False  # type: ignore[arg-type]
    assert d.shards == 1 and r.queue.shard_count() == 1 and r.sender.drain_first == 5


def test_a_count_that_cannot_be_recorded_leaves_it_unknown_and_the_sender_draining(
    tmp_path: Path, rigs: list[Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk when the new count is recorded: the error reaches the caller, the file says
    "unknown" (a restart drains in id order), and the sender goes on, old entries first."""
    from types import SimpleNamespace

    from relay.queue import StorageError

    r = rig(tmp_path, rigs)
    r.queue.set_shard_count(1)
    real = r.queue.set_shard_count

    def record(n: int) -> None:
        if n:
            raise StorageError("could not record the shard count", "database or disk is full")
        real(n)

    class Routes:
        def set_shards(self, name: str, shards: int) -> int:
            assert name == "amp" and shards == 2
            return 0

        def wait_written(self, mark: int, timeout: float) -> bool:
            return True

    monkeypatch.setattr(r.queue, "set_shard_count", record)
    r.sender.start()
    r.queue.put([(0, series("x", [(1, 1.0)]), 1, 1)])
    assert wait_until(lambda: len(r.transport.bodies) == 1, timeout=5)
    r.queue.put([(0, series("x", [(2, 1.0)]), 1, 2)])
    d = SimpleNamespace(sender=r.sender, queue=r.queue, shards=1, config=SimpleNamespace(name="amp"))
    with pytest.raises(StorageError):
        shardplan.change(Routes(), d, 2)  # type: ignore[arg-type]
    assert d.shards == 2  # the pipeline routes under the new count already
    assert r.queue.shard_count() is None  # unknown: a restart drains what is queued in id order
    r.queue.put([(1, series("x", [(3, 1.0)]), 1, 3)])
    assert wait_until(lambda: r.queue.shards() == [] and r.sender.drain_first is None, timeout=5)
    assert sent_points(r) == [("x", 1), ("x", 2), ("x", 3)]
