"""DurableQueue: per-shard FIFO, crash durability (SIGKILL), max_disk oldest-first drops, space reuse."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.delivery.queue.durable import ENTRY_OVERHEAD_BYTES, DurableQueue, Entry, QueueError, RequestTooLargeError
from tests.helpers import REPO_ROOT, wait_until

ROOT = REPO_ROOT


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[DurableQueue]:
    q = DurableQueue(tmp_path / "dest.queue.db", 1 << 20, clock=lambda: 1000.0)
    yield q
    q.close()


def payloads(entries: list[Entry]) -> list[bytes]:
    return [e.payload for e in entries]


# -- ordering and accounting -------------------------------------------------------------------
def test_put_then_peek_is_fifo_per_shard(queue: DurableQueue) -> None:
    queue.put([(0, b"a1", 1), (1, b"b1", 1)])
    queue.put([(0, b"a2", 1)])
    queue.put([(1, b"b2", 1), (0, b"a3", 1)])
    assert payloads(queue.peek(0, 100)) == [b"a1", b"a2", b"a3"]
    assert payloads(queue.peek(1, 100)) == [b"b1", b"b2"]
    assert queue.shards() == [0, 1]


def test_entries_carry_shard_samples_and_enqueue_time(queue: DurableQueue) -> None:
    queue.put([(3, b"xyz", 7)])
    [e] = queue.peek(3, 100)
    assert (e.shard, e.payload, e.samples, e.enqueued_at) == (3, b"xyz", 7, 1000.0)
    assert queue.oldest_enqueued_at() == 1000.0


@pytest.mark.parametrize(
    ("samples", "max_samples", "max_entries", "expected"),
    [
        ([5, 5, 5], 10, 1000, 2),
        ([5, 5, 5], 9, 1000, 1),
        ([50, 1], 10, 1000, 1),  # one entry even when it alone exceeds max_samples
        ([1] * 10, 100, 4, 4),
        ([3, 3, 3], 9, 1000, 3),
    ],
)
def test_peek_respects_max_samples_but_returns_at_least_one_entry(
    queue: DurableQueue, samples: list[int], max_samples: int, max_entries: int, expected: int
) -> None:
    queue.put([(0, b"p", n) for n in samples])
    assert len(queue.peek(0, max_samples, max_entries)) == expected


def test_ack_removes_entries_and_depth_tracks_samples_and_bytes(queue: DurableQueue) -> None:
    queue.put([(0, b"1234", 4), (0, b"12", 2), (1, b"123", 3)])
    assert queue.depth() == (9, 9)
    queue.ack([e.id for e in queue.peek(0, 4)])
    assert queue.depth() == (5, 5)
    assert payloads(queue.peek(0, 100)) == [b"12"]
    queue.ack([e.id for e in queue.peek(0, 100)] + [e.id for e in queue.peek(1, 100)])
    assert queue.depth() == (0, 0) and queue.shards() == [] and queue.oldest_enqueued_at() is None


def test_ack_of_unknown_or_repeated_ids_changes_nothing(queue: DurableQueue) -> None:
    queue.put([(0, b"x", 1), (0, b"y", 1)])
    first = queue.peek(0, 1)[0].id
    queue.ack([first])
    queue.ack([first, 999_999])
    assert queue.depth() == (1, 1)


def test_ids_are_never_reused_after_the_queue_drains(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    q.put([(0, b"a", 1)])
    old = q.peek(0, 1)[0].id
    q.ack([old])
    q.close()
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    q.put([(0, b"b", 1)])
    assert q.peek(0, 1)[0].id > old  # a late ack of `old` can never delete new data
    q.close()


def test_put_is_atomic_and_reopen_restores_depth_and_shards(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    q.put([(0, b"aa", 2), (2, b"bbb", 3)])
    q.close()
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    assert q.depth() == (5, 5) and q.shards() == [0, 2]
    assert q.wait(2, 0) is True  # entries present at open count as new
    q.close()


@pytest.mark.parametrize(
    "pieces",
    [[(-1, b"x", 1)], [(0, "text", 1)], [(0, b"x", -1)], [(0, b"x", 1, "0")], [(0, b"x", 1, 1.5)]],
    ids=["negative-shard", "str-payload", "negative-samples", "str-oldest", "float-oldest"],
)
def test_bad_pieces_are_value_errors(queue: DurableQueue, pieces: list[tuple[int, object, int]]) -> None:
    with pytest.raises(ValueError, match="bad queue piece"):
        queue.put(pieces)  # type: ignore[arg-type]
    assert queue.depth() == (0, 0)


def test_non_positive_max_disk_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(QueueError) as e:
        DurableQueue(tmp_path / "q.db", 0)
    assert e.value.value == 0


def test_put_after_close_is_an_error_but_depth_still_answers(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    q.put([(0, b"x", 1)])
    q.close()
    with pytest.raises(QueueError, match="closed"):
        q.put([(0, b"y", 1)])
    assert q.depth() == (1, 1) and q.peek(0, 1) == [] and q.oldest_enqueued_at() is None


# -- max_disk ----------------------------------------------------------------------------------
def test_full_queue_drops_oldest_entries_first_across_shards_and_counts_them(tmp_path: Path) -> None:
    entry = 1000 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 5 * entry)
    for i in range(5):
        assert q.put([(i % 2, bytes([i]) * 1000, 10 + i)]) == 0
    assert q.put([(1, b"\x05" * 1000, 15)]) == 10  # entry 0 (shard 0, 10 samples) goes
    assert q.put([(0, b"\x06" * 2000, 16)]) == 11 + 12  # needs two slots: entries 1 and 2
    assert [e.payload[0] for e in q.peek(0, 1000)] == [4, 6]
    assert [e.payload[0] for e in q.peek(1, 1000)] == [3, 5]
    assert q.depth() == (13 + 14 + 15 + 16, 5000)
    q.close()


def test_a_put_larger_than_max_disk_alone_is_request_too_large_and_keeps_the_queue(tmp_path: Path) -> None:
    # issue 8 defect 8 changed this: it used to drop everything queued and itself too (a 2xx for nothing)
    q = DurableQueue(tmp_path / "q.db", 1000)
    q.put([(0, b"a" * 500, 5, 0)])
    with pytest.raises(RequestTooLargeError) as e:
        q.put([(0, b"b" * 5000, 50, 0)])
    assert isinstance(e.value, QueueError) and e.value.value == 5000 + ENTRY_OVERHEAD_BYTES
    assert q.depth() == (5, 500) and payloads(q.peek(0, 100)) == [b"a" * 500]
    q.close()


def test_queue_full_drops_the_oldest_entries_never_the_request_being_stored(tmp_path: Path) -> None:
    entry = 400 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 3 * entry)
    assert q.put([(0, b"a" * 400, 1, 0), (1, b"b" * 400, 2, 0)]) == 0
    # three pieces of one request fill the queue alone: both old entries go, all three stay
    assert q.put([(0, b"c" * 400, 4, 0), (1, b"d" * 400, 8, 0), (2, b"e" * 400, 16, 0)]) == 3
    assert q.depth() == (28, 1200)
    assert [e.payload[:1] for s in q.shards() for e in q.peek(s, 100)] == [b"c", b"d", b"e"]
    q.close()


def test_queue_full_never_deletes_entries_a_sender_holds_so_the_drop_count_is_exact(tmp_path: Path) -> None:
    # issue 8 defect 20: trimming rows a sender held counted them as lost, then they were delivered anyway
    entry = 100 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 3 * entry)
    q.put([(0, b"h" * 100, 5, 0), (1, b"o" * 100, 7, 0)])
    held = q.peek(0, 100)  # a sender has shard 0's entry in flight
    assert q.put([(1, b"n" * 100, 1, 0), (1, b"m" * 100, 1, 0)]) == 7  # only the unheld entry is lost
    q.ack([e.id for e in held])  # ... and the held one is delivered
    assert q.depth() == (2, 200)
    assert payloads(q.peek(1, 100)) == [b"n" * 100, b"m" * 100]
    q.close()


def test_piece_carries_the_oldest_sample_timestamp_and_entries_expose_it(queue: DurableQueue) -> None:
    queue.put([(0, b"x", 2, 1_700_000_000_123), (0, b"meta", 0, 0)])
    first, meta = queue.peek(0, 100)
    assert (first.oldest_ts_ms, first.oldest_time) == (1_700_000_000_123, 1_700_000_000.123)
    assert (meta.samples, meta.oldest_ts_ms, meta.oldest_time) == (0, 0, 1000.0)  # none: enqueue time
    assert queue.oldest_sample_time() == 1000.0


def test_zero_sample_metadata_entries_are_stored_and_acked_like_any_entry(queue: DurableQueue) -> None:
    queue.put([(0, b"metadata", 0, 0)])
    [e] = queue.peek(0, 10)
    queue.ack([e.id])
    assert queue.peek(0, 10) == [] and queue.shards() == [] and queue.depth() == (0, 0)


def test_late_ack_of_an_entry_dropped_for_space_does_not_corrupt_depth(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 2 * (100 + ENTRY_OVERHEAD_BYTES))
    q.put([(0, b"a" * 100, 1)])
    in_flight = q.peek(0, 10)
    q.put([(0, b"b" * 100, 2), (0, b"c" * 100, 3)])  # drops "a" while a sender holds it
    q.ack([e.id for e in in_flight])
    assert q.depth() == (5, 200)
    q.close()


def test_acked_space_is_given_back_to_the_file_system(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    q = DurableQueue(path, 64 << 20, durability="normal")
    blob = os.urandom(64 * 1024)
    for _ in range(64):  # 16 MiB over 4 shards
        q.put([(s, blob, 100) for s in range(4)])
    q.close()  # checkpoints the WAL into the main file
    full = path.stat().st_size
    q = DurableQueue(path, 64 << 20, durability="normal")
    for s in range(4):
        q.ack([e.id for e in q.peek(s, 1 << 30, 10_000)])
    q.close()
    assert full >= 16 << 20
    assert q.depth() == (0, 0) and path.stat().st_size < 2 << 20


# -- waiting and concurrency -------------------------------------------------------------------
def test_wait_times_out_without_puts_and_wakes_on_a_put_for_its_shard(queue: DurableQueue) -> None:
    assert queue.wait(0, 0.05) is False
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(queue.wait(0, 5)))
    t.start()
    queue.put([(1, b"other shard", 1)])
    time.sleep(0.05)
    assert woke == []
    queue.put([(0, b"mine", 1)])
    t.join(2)
    assert woke == [True]


class _CountingSeq(dict[int, int]):
    """The queue's put sequence numbers, counting how often a waiter of ``shard`` looked at them."""

    def __init__(self, base: dict[int, int], shard: int) -> None:
        super().__init__(base)
        self.shard, self.looks = shard, 0

    def get(self, key: int, default: int = 0) -> int:  # type: ignore[override]
        if key == self.shard:
            self.looks += 1
        return super().get(key, default)


def test_commits_to_other_shards_do_not_wake_a_waiting_consumer(queue: DurableQueue) -> None:
    # Every wake-up is a context switch and a GIL hand-off: a consumer sleeps through the other shards' puts
    seq = _CountingSeq(queue._put_seq, 0)
    queue._put_seq = seq
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(queue.wait(0, 10)))
    t.start()
    time.sleep(0.05)
    looks_before = seq.looks
    for i in range(30):
        queue.put([(1 + i % 3, b"other shards", 1)])
    time.sleep(0.05)
    assert woke == [] and seq.looks == looks_before  # not one wake-up for 30 commits elsewhere
    queue.put([(0, b"mine", 1)])
    t.join(2)
    assert woke == [True]


def _spy_notify(cond: threading.Condition) -> list[int]:
    """Counts the notify_all calls on a shard's condition (each one wakes its waiting consumer)."""
    calls: list[int] = []
    real = cond.notify_all

    def notify_all() -> None:
        calls.append(1)
        real()

    cond.notify_all = notify_all  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize(("threshold", "below", "filling"), [
    ({"min_samples": 10}, [(0, b"x", 1)] * 9, [(0, b"y", 1)]),
    ({"min_samples": 100, "min_entries": 4}, [(0, b"x", 1)] * 3, [(0, b"y", 1)]),
])
def test_puts_below_a_waiting_consumers_threshold_do_not_wake_it(
    queue: DurableQueue, threshold: dict[str, int], below: list[tuple[int, bytes, int]],
    filling: list[tuple[int, bytes, int]]
) -> None:
    # the commit checks the waiter's threshold itself: a wake-up that finds too little is a context
    # switch and a GIL hand-off per put for nothing
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(queue.wait(0, 10, **threshold)))
    t.start()
    assert wait_until(lambda: 0 in queue._shard_cond, timeout=2)
    time.sleep(0.05)
    notified = _spy_notify(queue._shard_cond[0])
    for piece in below:
        queue.put([piece])
    time.sleep(0.05)
    assert woke == [] and notified == []
    queue.put(filling)
    t.join(2)
    assert woke == [True] and notified == [1]


def test_a_commit_wakes_a_waiting_consumer_once_its_wait_ended_by_timeout(queue: DurableQueue) -> None:
    # the threshold of a wait that timed out must not keep later, plain waits asleep
    assert queue.wait(0, 0.05, min_samples=10) is False
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(queue.wait(0, 10)))
    t.start()
    time.sleep(0.05)
    queue.put([(0, b"one", 1)])
    t.join(2)
    assert woke == [True]


def test_a_threshold_wait_sleeps_until_the_shard_holds_enough_samples_or_entries(queue: DurableQueue) -> None:
    queue.put([(0, b"a", 4)])
    queue.peek(0, 100)  # held by the consumer: still counted, it is what the batch has so far
    assert queue.wait(0, 0.05, min_samples=10) is False
    queue.put([(0, b"b", 5)])
    assert queue.wait(0, 0.05, min_samples=10) is False  # 9 of 10
    assert queue.wait(0, 0, min_samples=0) is True  # but something new is there
    queue.put([(0, b"c", 1)])
    assert queue.wait(0, 0, min_samples=10) is True
    queue.peek(0, 100)
    queue.put([(0, b"d", 1)])
    assert queue.wait(0, 0, min_samples=100, min_entries=4) is True  # 4 entries, 11 samples
    assert queue.wait(0, 0, min_samples=100, min_entries=5) is False


def test_close_wakes_a_threshold_waiter(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(q.wait(0, 10, min_samples=1000)))
    t.start()
    time.sleep(0.05)
    q.close()
    t.join(2)
    assert woke == [False]


def test_a_put_between_peek_and_wait_is_not_missed(queue: DurableQueue) -> None:
    assert queue.peek(0, 10) == []
    queue.put([(0, b"x", 1)])
    assert queue.wait(0, 0) is True
    queue.peek(0, 10)
    assert queue.wait(0, 0) is False


def test_close_wakes_waiters(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(q.wait(0, 10)))
    t.start()
    time.sleep(0.05)
    q.close()
    t.join(2)
    assert woke == [False] and q.closed


def test_concurrent_writers_group_commit_keeps_every_put_and_per_writer_order(queue: DurableQueue) -> None:
    def writer(w: int) -> None:
        for i in range(40):
            queue.put([(w % 2, f"{w}:{i}".encode(), 1), (2, f"{w}:{i}".encode(), 1)])

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert queue.depth()[0] == 8 * 40 * 2
    shard2 = [e.payload.decode().split(":") for e in queue.peek(2, 10_000, 10_000)]
    for w in range(8):
        assert [int(i) for ww, i in shard2 if int(ww) == w] == list(range(40))
    assert [len(queue.peek(s, 10_000, 10_000)) for s in (0, 1)] == [4 * 40, 4 * 40]


# -- durability --------------------------------------------------------------------------------
CHILD = """
import sys
from pathlib import Path
from relay.delivery.queue.durable import DurableQueue
q = DurableQueue(Path(sys.argv[1]), 1 << 30)
i = 0
while True:
    q.put([(i % 3, b"entry-%d|" % i + b"x" * 200, 1), (3, b"entry-%d" % i, 1)])
    sys.stdout.write(f"{i}\\n")
    sys.stdout.flush()
    i += 1
"""


def test_every_acknowledged_put_survives_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, env=env, cwd=ROOT
    )
    assert child.stdout is not None
    acked: list[int] = []
    try:
        deadline = time.monotonic() + 60  # 150 fsynced puts: seconds, more on a loaded CI disk
        while len(acked) < 150 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acked.append(int(line))
    finally:
        os.kill(child.pid, signal.SIGKILL)  # right after a put returned, maybe mid-way through the next
        child.wait(10)
        child.stdout.close()
    assert len(acked) == 150
    q = DurableQueue(path, 1 << 30)
    try:
        tails = [int(e.payload.removeprefix(b"entry-")) for e in q.peek(3, 1 << 30, 1 << 30)]
        assert tails[: len(acked)] == acked  # every acked put, in order; maybe one more
        assert len(tails) <= len(acked) + 1
        heads = sorted(int(e.payload.split(b"|")[0].removeprefix(b"entry-"))
                       for s in range(3) for e in q.peek(s, 1 << 30, 1 << 30))
        assert heads == tails  # each put is all-or-nothing across shards
    finally:
        q.close()


def test_max_disk_changed_on_a_running_queue_bounds_the_next_put(tmp_path: Path) -> None:
    entry = 100 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "amp.prod.queue.db", 10 * entry)
    assert q.name == "amp.prod"  # a dot in a destination name is kept
    for i in range(6):
        q.put([(0, bytes([i]) * 100, 1, 0)])
    q.max_disk_bytes = 3 * entry  # a reload shrank it
    assert q.put([(0, b"\x09" * 100, 1, 0)]) == 4
    assert [e.payload[0] for e in q.peek(0, 100)] == [4, 5, 9]
    with pytest.raises(QueueError):
        q.max_disk_bytes = 0
    q.close()


def test_a_piece_with_a_pre_1970_timestamp_is_stored_and_counts_as_too_old(tmp_path: Path) -> None:
    """A negative sample timestamp is legal in remote write (int64); the piece is stored, and its
    oldest sample time is that timestamp (older than any max_sample_age), not the enqueue time."""
    q = DurableQueue(tmp_path / "q.queue.db", 1 << 20)
    try:
        q.put([(0, b"\x0a\x00", 1, -1)])
        (entry,) = q.peek(0, 100)
        assert entry.oldest_ts_ms == -1 and entry.oldest_time == -0.001
    finally:
        q.close()


def _free_pages(q: DurableQueue) -> int:
    with q._wlock:
        (n,) = q._wdb.execute("PRAGMA freelist_count").fetchone()
    return int(n)


def test_free_pages_go_back_to_the_volume_after_each_commit_that_freed_enough(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "d.queue.db", 8 << 20, clock=lambda: 1000.0)
    try:
        big = os.urandom(3000)  # incompressible: about a page per entry
        free_seen: list[int] = []
        for _ in range(6):
            for _ in range(200):
                q.put([(0, big, 1)])
                free_seen.append(_free_pages(q))
            q.ack([e.id for e in q.peek(0, 10_000, 10_000)])
            free_seen.append(_free_pages(q))
        assert max(free_seen) < q.plan.vacuum_pages, (max(free_seen), q.plan.vacuum_pages)
    finally:
        q.close()


@pytest.mark.parametrize(("told", "vacuums"), [(None, True), ("actual", True), (0, False)])
def test_upkeep_vacuums_on_the_free_page_count_it_is_given_or_reads(
    tmp_path: Path, told: int | str | None, vacuums: bool
) -> None:
    # a put's transaction reads the page counts for its disk bound: upkeep reuses that count
    from relay.delivery.queue import opening as qo

    q = DurableQueue(tmp_path / "d.queue.db", 8 << 20, clock=lambda: 1000.0)
    try:
        with q._wlock:
            db = q._wdb
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT INTO entries (shard, samples, enqueued_at, oldest_ts, payload, raw_len, crc) "
                           "VALUES (0, 1, 0, 0, ?, 0, 0)", [(os.urandom(3000),)] * (2 * q.plan.vacuum_pages))
            db.execute("COMMIT")
            db.execute("DELETE FROM entries")
        free = _free_pages(q)
        assert free >= q.plan.vacuum_pages
        with q._wlock:
            qo.upkeep(q._wdb, q.path, q.plan, q._rlock, free if told == "actual" else told)  # type: ignore[arg-type]
        assert (_free_pages(q) < q.plan.vacuum_pages) is vacuums
    finally:
        q.close()


@pytest.mark.parametrize("per_insert", [1000, 3])
def test_a_puts_rows_keep_their_order_per_shard_whatever_the_rows_per_insert(
    queue: DurableQueue, monkeypatch: pytest.MonkeyPatch, per_insert: int
) -> None:
    from relay.delivery.queue import commit as queue_module

    monkeypatch.setattr(queue_module, "_ROWS_PER_INSERT", per_insert)
    queue.put([(0, b"a1", 1), (1, b"b1", 2), (0, b"a2", 3), (0, b"a3", 4), (1, b"b2", 5), (0, b"a4", 6),
               (2, b"c1", 7)])
    queue.put([(0, b"a5", 1)])
    a = queue.peek(0, 100)
    assert payloads(a) == [b"a1", b"a2", b"a3", b"a4", b"a5"] and [e.samples for e in a] == [1, 3, 4, 6, 1]
    assert [e.id for e in a] == sorted(e.id for e in a)
    assert payloads(queue.peek(1, 100)) == [b"b1", b"b2"] and payloads(queue.peek(2, 100)) == [b"c1"]
    assert queue.depth()[0] == 29 and queue.backlog(0) == (5, 15)
