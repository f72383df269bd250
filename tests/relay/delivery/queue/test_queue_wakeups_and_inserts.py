"""The queue's wake-ups and group inserts: concurrent trimming puts keep order, ids and counts;
threshold waits wake at their own threshold or on close; puts prepare a bounded number of insert
statements.

From a hostile review of the heads, the queue, the name filter and the native tables."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.delivery.queue.durable import ENTRY_OVERHEAD_BYTES, DurableQueue


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[DurableQueue]:
    q = DurableQueue(tmp_path / "dest.queue.db", 1 << 20, clock=lambda: 1000.0)
    yield q
    q.close()


def test_concurrent_puts_that_trim_keep_order_ids_and_exact_counts(tmp_path: Path) -> None:
    # group commit + one INSERT ... RETURNING per put + queue_full trimming: what survives is in id
    # order per shard, each writer's entries in put order, and dropped + queued == put, to the sample
    entry = 300 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 40 * entry, clock=lambda: 1000.0)
    dropped = [0] * 6
    try:
        def writer(w: int) -> None:
            for i in range(30):
                pieces = [(s, f"{w}:{i}:".encode().ljust(300, b"x"), 1 + s, 0) for s in range(w % 3 + 1)]
                dropped[w] += q.put(pieces)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        put = sum(sum(1 + s for s in range(w % 3 + 1)) * 30 for w in range(6))
        kept = {s: q.peek(s, 10_000, 10_000) for s in q.shards()}
        samples = sum(e.samples for es in kept.values() for e in es)
        assert q.depth()[0] == samples and samples + sum(dropped) == put
        assert sum(len(es) for es in kept.values()) <= 40
        for es in kept.values():
            assert [e.id for e in es] == sorted(e.id for e in es)
            for w in range(6):
                mine = [int(e.payload.split(b":")[1]) for e in es if e.payload.startswith(f"{w}:".encode())]
                assert mine == sorted(mine)
        assert q.last_id() == max(e.id for es in kept.values() for e in es)
    finally:
        q.close()


def test_two_waits_on_one_shard_with_different_thresholds_each_wake_at_their_own(queue: DurableQueue) -> None:
    low: list[bool] = []
    high: list[bool] = []
    t_low = threading.Thread(target=lambda: low.append(queue.wait(0, 10, min_samples=2)))
    t_high = threading.Thread(target=lambda: high.append(queue.wait(0, 10, min_samples=5)))
    t_low.start()
    t_high.start()
    deadline = time.monotonic() + 2
    while len(queue._wants.get(0, ())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.put([(0, b"a", 2)])
    t_low.join(2)
    time.sleep(0.05)
    assert low == [True] and high == []  # the low one's wake-up left the high one asleep
    queue.put([(0, b"b", 3)])
    t_high.join(2)
    assert high == [True] and queue._wants[0] == []


def test_close_wakes_a_threshold_wait_that_no_put_would_fill(queue: DurableQueue) -> None:
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(queue.wait(0, 30, min_samples=10**9)))
    t.start()
    deadline = time.monotonic() + 2
    while not queue._wants.get(0) and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.put([(0, b"a", 1)])
    started = time.monotonic()
    queue.close()
    t.join(2)
    assert woke == [False] and time.monotonic() - started < 2


def test_puts_of_every_row_count_prepare_a_bounded_number_of_insert_statements(tmp_path: Path) -> None:
    # each distinct VALUES count is its own prepared statement, and sqlite3 keeps 128 of them per
    # connection: puts of 873..1000 rows (max_shards in the thousands) held ~76 MiB in that cache alone
    q = DurableQueue(tmp_path / "q.db", 1 << 30, clock=lambda: 1000.0)
    try:
        shapes: set[int] = set()  # the VALUES rows of each INSERT run (the trace may expand parameters)
        q._wdb.set_trace_callback(
            lambda sql: shapes.add(sql.count("), (") + 1) if sql.startswith("INSERT INTO entries") else None)
        total = 0
        for rows in range(1, 400, 3):
            q.put([(s, b"p", 1, 0) for s in range(rows)])
            total += rows
        q._wdb.set_trace_callback(None)
        assert len(shapes) <= 40, len(shapes)
        assert q.depth()[0] == total
        first = q.peek(0, 10_000, 10_000)
        assert [e.id for e in first] == sorted(e.id for e in first) and len(first) == len(range(1, 400, 3))
    finally:
        q.close()
