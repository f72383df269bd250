"""Acks written by the put's transaction (issue 9): an ack that comes in while a put is committed
costs no transaction of its own, waits for nothing, is never handed out again, and is on file once
that put (or the one after it) is; every failure of that path leaves the acks to be written later."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from relay.delivery.queue.durable import DurableQueue, StorageError


class Gate(sqlite3.Connection):
    """A real connection that records its statements; a COMMIT waits on ``hold`` while it is set
    (a slow fsync); ``fail`` makes statements containing it fail like a full disk."""

    log: list[str] = []
    hold: threading.Event | None = None
    hold_at = "COMMIT"  # the statement (its start) that waits on hold
    entered = threading.Event()
    fail: str | None = None
    rolls_back = False  # a failure SQLite answers by rolling the whole transaction back

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if Gate.fail is not None and Gate.fail in sql:
            if Gate.rolls_back and self.in_transaction:
                super().execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        Gate.log.append(" ".join(sql.split()[:3]))
        if sql.startswith(Gate.hold_at) and Gate.hold is not None:
            Gate.entered.set()
            Gate.hold.wait(10)
        return super().execute(sql, *args)


@pytest.fixture(autouse=True)
def _reset() -> None:
    Gate.log, Gate.hold, Gate.fail, Gate.rolls_back, Gate.hold_at = [], None, None, False, "COMMIT"
    Gate.entered = threading.Event()


def rows_on_file(path: Path) -> list[bytes]:
    with sqlite3.connect(path) as db:
        return [bytes(r[0]) for r in db.execute("SELECT CAST(payload AS BLOB) FROM entries ORDER BY id")]


def wait_pending(q: DurableQueue) -> None:
    deadline = time.monotonic() + 5
    while not q._pending:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def slow_put(q: DurableQueue, pieces: list[tuple[int, bytes, int, int]]) -> tuple[threading.Thread, threading.Event]:
    """A put whose COMMIT waits until the returned event is set."""
    release = threading.Event()
    Gate.hold, Gate.entered = release, threading.Event()
    t = threading.Thread(target=q.put, args=(pieces,))
    t.start()
    assert Gate.entered.wait(5)
    return t, release


def ack_behind_a_slow_commit(q: DurableQueue, held: list[int], second: tuple[int, bytes, int, int],
                             fail: str | None = None, rolls_back: bool = False) -> list[BaseException]:
    """Ack ``held`` while a put of b"c" is being committed and a put of ``second`` waits behind it;
    then let both go on, with statements containing ``fail`` failing. The second put's errors."""
    t, release = slow_put(q, [(0, b"c", 1, 0)])
    errors: list[BaseException] = []
    waiting = threading.Thread(target=_catch, args=(errors, q.put, [second]))
    waiting.start()
    wait_pending(q)
    q.ack(held)
    Gate.hold, Gate.fail, Gate.rolls_back = None, fail, rolls_back
    release.set()
    t.join(5)
    waiting.join(5)
    assert not t.is_alive() and not waiting.is_alive()
    return errors


def test_an_ack_during_a_commit_waits_for_nothing_and_the_next_put_writes_it(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, durability="normal", connection_factory=Gate)
    q.put([(0, b"a", 1, 0), (0, b"b", 1, 0)])
    held = q.peek(0, 10)
    t, release = slow_put(q, [(1, b"c", 1, 0)])
    second = threading.Thread(target=q.put, args=([(1, b"d", 1, 0)],))
    second.start()  # waits behind the commit under way
    wait_pending(q)
    started = time.monotonic()
    q.ack([e.id for e in held])
    assert time.monotonic() - started < 1  # did not wait for the write lock the commit holds
    assert q.peek(0, 10) == []  # never handed out again
    Gate.log = []
    Gate.hold = None
    release.set()
    t.join(5)
    second.join(5)
    # the second put's transaction deleted them: no transaction of the ack's own, and no read of
    # what they held (counted from memory)
    assert Gate.log.count("BEGIN IMMEDIATE") == 1
    assert [x for x in Gate.log if x.startswith("SELECT shard")] == []
    delete = next(i for i, x in enumerate(Gate.log) if x.startswith("DELETE"))
    insert = next(i for i, x in enumerate(Gate.log) if x.startswith("INSERT"))
    assert Gate.log.index("BEGIN IMMEDIATE") < delete < insert < Gate.log.index("COMMIT")
    assert rows_on_file(tmp_path / "q.db") == [b"c", b"d"]
    assert q.depth() == (2, 2) and q.backlog(0) == (0, 0)
    q.close()


def test_an_ack_during_the_last_commit_is_written_before_that_put_returns(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, durability="normal", connection_factory=Gate)
    q.put([(0, b"a", 1, 0)])
    held = q.peek(0, 10)
    t, release = slow_put(q, [(0, b"b", 1, 0)])
    q.ack([e.id for e in held])
    Gate.hold = None
    release.set()
    t.join(5)
    assert not t.is_alive()
    assert rows_on_file(tmp_path / "q.db") == [b"b"]
    assert q.depth() == (1, 1) and q.backlog(0) == (1, 1)
    q.close()


def test_an_ack_with_no_commit_under_way_is_written_at_once(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"a", 1, 0)])
    q.ack([e.id for e in q.peek(0, 10)])
    assert rows_on_file(tmp_path / "q.db") == [] and q.depth() == (0, 0)
    q.close()


def test_a_delete_that_fails_in_a_puts_transaction_fails_not_the_put_and_is_retried(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"a", 1, 0), (0, b"b", 1, 0)])
    held = q.peek(0, 1)
    assert ack_behind_a_slow_commit(q, [e.id for e in held], (0, b"d", 1, 0), fail="DELETE") == []
    assert rows_on_file(tmp_path / "q.db") == [b"a", b"b", b"c", b"d"]  # the put went in; the ack did not
    assert q.backlog(0) == (3, 3)  # b, c, d: a is acked, though still on file
    assert [e.payload for e in q.peek(0, 10)] == [b"b", b"c", b"d"]  # a is still never handed out again
    Gate.fail = None
    q.put([(1, b"e", 1, 0)])  # the next write deletes it
    assert rows_on_file(tmp_path / "q.db") == [b"b", b"c", b"d", b"e"] and q.depth() == (4, 4)
    assert q.backlog(0) == (3, 3) and q.backlog(1) == (1, 1)  # written: counted once, not twice
    q.close()


def test_a_delete_whose_failure_ended_the_transaction_leaves_the_acks_and_the_put_still_goes_in(
    tmp_path: Path,
) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"a", 1, 0), (0, b"b", 1, 0)])
    held = q.peek(0, 1)
    assert ack_behind_a_slow_commit(q, [e.id for e in held], (0, b"d", 1, 0), fail="DELETE", rolls_back=True) == []
    assert rows_on_file(tmp_path / "q.db") == [b"a", b"b", b"c", b"d"]
    assert [e.payload for e in q.peek(0, 10)] == [b"b", b"c", b"d"] and q.depth() == (4, 4)
    Gate.fail = None
    q.put([(1, b"e", 1, 0)])
    assert rows_on_file(tmp_path / "q.db") == [b"b", b"c", b"d", b"e"] and q.depth() == (4, 4)
    q.close()


def test_an_ack_of_rows_read_from_the_file_is_counted_from_the_file(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    q.put([(0, b"a" * 3000, 2, 0), (1, b"b", 3, 0)])
    q.close()
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"c", 5, 0)])
    got = q.peek(0, 100)
    Gate.log = []
    q.ack([e.id for e in got] + [999])  # an unknown id is ignored
    assert len([x for x in Gate.log if x.startswith("SELECT shard")]) == 1  # shard 0 was on file at open
    assert q.depth() == (3, 1) and q.backlog(0) == (0, 0) and q.backlog(1) == (1, 3)
    q.close()


def test_acks_read_by_a_put_that_fails_stay_to_be_written_and_are_not_handed_out(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"a", 1, 0), (0, b"b", 1, 0)])
    held = q.peek(0, 1)
    errors = ack_behind_a_slow_commit(q, [e.id for e in held], (0, b"lost", 1, 0), fail="INSERT")
    assert [type(e) for e in errors] == [StorageError]
    Gate.fail = None
    assert [e.payload for e in q.peek(0, 10)] == [b"b", b"c"]
    q.put([(1, b"e", 1, 0)])
    assert rows_on_file(tmp_path / "q.db") == [b"b", b"c", b"e"] and q.depth() == (3, 3)
    q.close()


def _catch(errors: list[BaseException], f: Any, *args: Any) -> None:
    try:
        f(*args)
    except BaseException as e:
        errors.append(e)


def test_many_putters_and_ackers_leave_exactly_the_unacked_rows_on_file_and_in_the_counts(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, durability="normal")
    put_ids: list[bytes] = []
    acked: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def putter(k: int) -> None:
        rng = random.Random(k)
        for i in range(150):
            pieces = [(rng.randrange(3), f"{k}-{i}-{j}".encode(), 1, 0) for j in range(rng.randrange(1, 4))]
            q.put(pieces)
            with lock:
                put_ids.extend(p[1] for p in pieces)

    def consumer(shard: int) -> None:
        rng = random.Random(100 + shard)
        while not stop.is_set() or q.backlog(shard)[0]:
            got = q.peek(shard, rng.randrange(1, 8))
            if not got:
                q.wait(shard, 0.01)
                continue
            keep = got[: rng.randrange(len(got) + 1)]
            with lock:
                assert not acked & {e.payload for e in keep}  # never handed out once acked
                acked.update(e.payload for e in keep)
            q.ack([e.id for e in keep])
            if stop.is_set() and not keep:
                q.ack([e.id for e in got])
                with lock:
                    acked.update(e.payload for e in got)

    putters = [threading.Thread(target=putter, args=(k,)) for k in range(4)]
    consumers = [threading.Thread(target=consumer, args=(s,)) for s in range(3)]
    for t in putters + consumers:
        t.start()
    for t in putters:
        t.join(60)
    stop.set()
    for t in consumers:
        t.join(60)
    assert sorted(acked) == sorted(put_ids) and q.depth() == (0, 0)
    q.close()
    assert rows_on_file(tmp_path / "q.db") == []


def test_acks_left_in_memory_at_close_are_written_by_close(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"a", 1, 0), (0, b"b", 1, 0)])
    Gate.fail = "DELETE"
    q.ack([e.id for e in q.peek(0, 1)])  # not written yet
    Gate.fail = None
    q.close()
    assert rows_on_file(tmp_path / "q.db") == [b"b"]


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_an_ack_of_its_own_commits_without_an_fsync_and_toggles_nothing_it_need_not(
    tmp_path: Path, durability: str
) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, durability=durability, connection_factory=Gate)  # type: ignore[arg-type]
    q.put([(0, b"a", 1, 0)])
    got = q.peek(0, 10)
    Gate.log = []
    q.ack([e.id for e in got])
    pragmas = [x for x in Gate.log if x.startswith("PRAGMA synchronous")]
    assert pragmas == (["PRAGMA synchronous=NORMAL", "PRAGMA synchronous=FULL"] if durability == "full" else [])
    with sqlite3.connect(tmp_path / "q.db") as db:
        assert db.execute("SELECT COUNT(*) FROM entries").fetchone() == (0,)
    q.close()


# -- what a consumer is told the shard holds: acked entries are gone from the moment of the ack,
#    though their delete is written later (CI flake of test_sender_work: a batch sent at once
#    because the last batch's unwritten acks still counted as queued)
def test_acked_entries_leave_the_backlog_at_the_ack_while_their_delete_waits_for_the_commit(
    tmp_path: Path,
) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, durability="normal", connection_factory=Gate)
    q.put([(0, b"a", 4, 0), (0, b"b", 4, 0), (0, b"c", 4, 0)])
    held = q.peek(0, 8)
    assert [e.payload for e in held] == [b"a", b"b"]
    t, release = slow_put(q, [(1, b"x", 1, 0)])
    q.ack([e.id for e in held])
    assert rows_on_file(tmp_path / "q.db")[:3] == [b"a", b"b", b"c"]  # not written yet
    assert q.backlog(0) == (1, 4)  # was (3, 12) until the commit ended
    assert q.depth() == (12, 3)  # the file still holds them (max_disk counts what is on file)
    Gate.hold = None
    release.set()
    t.join(5)
    assert not t.is_alive()
    assert q.backlog(0) == (1, 4) and q.backlog(1) == (1, 1) and q.depth() == (5, 2)
    q.close()


def test_an_ack_of_an_entry_read_from_the_file_leaves_the_backlog_at_once(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, memory_bytes=0, connection_factory=Gate)
    q.put([(0, b"a", 2, 0), (0, b"b", 3, 0)])
    held = q.peek(0, 2)
    t, release = slow_put(q, [(1, b"x", 1, 0)])
    q.ack([e.id for e in held] + [999])  # an unknown id changes no count
    assert q.backlog(0) == (1, 3)
    q.ack([e.id for e in held])  # acked twice: counted once
    assert q.backlog(0) == (1, 3)
    Gate.hold = None
    release.set()
    t.join(5)
    assert q.backlog(0) == (1, 3) and q.shards() == [0, 1]
    q.close()


def test_an_entry_acked_while_a_trim_runs_is_trimmed_as_delivered_and_counted_gone_once(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"a" * 100, 2, 0), (0, b"b", 3, 0)])
    held = q.peek(0, 5)
    q.max_disk_bytes = 70  # room for one small row: the next put trims every row it may
    Gate.hold_at = "SELECT id, shard, samples"  # the trim's read of the oldest rows
    t, release = slow_put(q, [(0, b"c", 1, 0)])  # its transaction read no acks: none had come
    q.ack([e.id for e in held])  # while the trim waits: they are no longer held, but delivered
    assert q.backlog(0) == (0, 0)  # c is not committed yet
    Gate.hold = None
    release.set()
    t.join(5)
    assert not t.is_alive()
    assert rows_on_file(tmp_path / "q.db") == [b"c"]  # the trim deleted a and b
    assert q.backlog(0) == (1, 1) and q.depth() == (1, 1)
    q.max_disk_bytes = 1 << 30
    q.put([(0, b"d", 1, 0)])
    assert q.backlog(0) == (2, 2)
    q.close()


def test_a_wait_for_a_fuller_batch_is_not_woken_by_samples_already_acked(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Gate)
    q.put([(0, b"a", 8, 0)])
    held = q.peek(0, 100)
    Gate.fail = "DELETE"  # the ack is not written, nor by the put below
    q.ack([e.id for e in held])
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(q.wait(0, 0.5, min_samples=10)))
    waiter.start()
    time.sleep(0.05)
    q.put([(0, b"b", 3, 0)])  # 3 of 10: with a's 8 still counted it would wake
    waiter.join(5)
    assert woke == [False]
    assert rows_on_file(tmp_path / "q.db") == [b"a", b"b"] and q.backlog(0) == (1, 3)
    Gate.fail = None
    q.close()  # writes the ack
    assert rows_on_file(tmp_path / "q.db") == [b"b"]


class HeldAfterCommit(sqlite3.Connection):
    """A real connection whose COMMIT, once done, waits on ``hold``: the rows are on file (a consumer
    reading the file sees them) but the committing put has not counted them yet."""

    hold: threading.Event | None = None
    entered = threading.Event()

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        cur = super().execute(sql, *args)
        if sql == "COMMIT" and HeldAfterCommit.hold is not None:
            HeldAfterCommit.entered.set()
            HeldAfterCommit.hold.wait(10)
        return cur


def test_an_entry_acked_before_its_own_commit_counted_it_never_takes_the_backlog_below_what_is_queued(
    tmp_path: Path,
) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, durability="normal", memory_bytes=0,
                     connection_factory=HeldAfterCommit)
    q.put([(0, b"a", 2, 0)])
    release = threading.Event()
    HeldAfterCommit.hold, HeldAfterCommit.entered = release, threading.Event()
    t = threading.Thread(target=q.put, args=([(0, b"b", 3, 0)],))
    t.start()
    try:
        assert HeldAfterCommit.entered.wait(5)
        held = q.peek(0, 10)  # read from the file: b is there, though its put has not counted it yet
        assert [e.payload for e in held] == [b"a", b"b"]
        q.ack([e.id for e in held])
        assert q.backlog(0) == (0, 0)  # was (-1, -3): b's ack subtracted before b was added
    finally:
        HeldAfterCommit.hold = None
        release.set()
        t.join(5)
    assert not t.is_alive()
    assert q.backlog(0) == (0, 0) and q.shards() == []  # the put wrote both acks on its way out
    assert rows_on_file(tmp_path / "q.db") == []
    q.put([(0, b"c", 1, 0)])
    assert q.backlog(0) == (1, 1)
    q.close()
