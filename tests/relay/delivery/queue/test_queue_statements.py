"""The queue's hot statements return few rows and columns (each one read is a GIL hand-off in
CPython 3.11's sqlite3): a put's ids come from lastrowid, an ack sums what it deletes per shard, a
peek reads a row's integers as one text column. These pin what those shortcuts must keep exact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from relay.delivery.queue import reads as rq
from relay.delivery.queue.durable import ENTRY_OVERHEAD_BYTES, DurableQueue


def _db_ids(path: Path) -> list[int]:
    with sqlite3.connect(path) as db:
        return [rid for (rid,) in db.execute("SELECT id FROM entries ORDER BY id")]


def _recount(path: Path) -> dict[int, tuple[int, int]]:
    with sqlite3.connect(path) as db:
        return {s: (n, m) for s, n, m in db.execute(
            "SELECT shard, COUNT(*), SUM(samples) FROM entries GROUP BY shard")}


def test_last_id_is_the_newest_stored_id_across_chunked_inserts_and_an_acked_tail(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    q.put([(i % 3, b"x%d" % i, 1, 0) for i in range(100)])  # 64 + 32 + 4 rows: three INSERTs
    assert q.last_id() == _db_ids(tmp_path / "q.db")[-1] == 100
    q.ack(list(range(91, 101)))  # the newest rows go: AUTOINCREMENT never hands their ids out again
    q.put([(0, b"y", 1, 0), (1, b"z", 1, 0)])
    assert _db_ids(tmp_path / "q.db")[-2:] == [101, 102] and q.last_id() == 102
    got = q.peek(0, 1000, after=0)
    assert [e.id for e in got] == [i for i in _db_ids(tmp_path / "q.db") if (i - 1) % 3 == 0 and i <= 90] + [101]
    q.close()


def test_a_chunked_put_that_must_trim_never_deletes_its_own_first_chunk(tmp_path: Path) -> None:
    # 40 rows are two INSERTs (32 + 8): the rows trimming protects start at the FIRST one's first id.
    # The old rows are held by a sender, so trimming has nothing it may take: it must take nothing.
    size = 100
    entry = size + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 45 * entry)
    q.put([(0, b"o" * size, 1, 0) for _ in range(10)])
    assert len(q.peek(0, 10_000)) == 10
    assert q.put([(1, b"n" * size, 2, 0) for _ in range(40)]) == 0
    assert _db_ids(tmp_path / "q.db") == list(range(1, 51))
    assert q.depth() == (10 + 80, 50 * size)
    q.close()


def test_peek_reads_back_every_integer_exactly_nulls_negatives_and_64_bit_values(tmp_path: Path) -> None:
    # the file is edited under it: read its rows from the file, not memory
    q = DurableQueue(tmp_path / "q.db", 1 << 30, clock=lambda: 1733083200.123456789, memory_bytes=0)
    q.put([(3, b"raw", 2**40, -5), (3, b"r" * 3000, 7, -(2**62))])  # tiny: stored raw; long: compressed
    with sqlite3.connect(tmp_path / "q.db") as db:  # a row as files from before checksums hold it
        db.execute("INSERT INTO entries (shard, samples, enqueued_at, payload, oldest_ts) "
                   "VALUES (3, 1, 12.5, x'0a00', 9223372036854775807)")
        stored = db.execute("SELECT raw_len, crc FROM entries ORDER BY id").fetchall()
    assert stored[0] == (None, stored[0][1]) and stored[1][0] == 3000 and stored[2] == (None, None)
    got = q.peek(3, 2**50)
    assert [(e.id, e.shard, e.samples, e.oldest_ts_ms, e.raw_len) for e in got] == [
        (1, 3, 2**40, -5, None), (2, 3, 7, -(2**62), 3000), (3, 3, 1, 2**63 - 1, None)]
    assert [e.enqueued_at for e in got] == [1733083200.123456789, 1733083200.123456789, 12.5]
    assert [e.payload for e in got] == [b"raw", b"r" * 3000, b"\x0a\x00"]
    q.close()


def test_meta_reads_a_negative_crc_and_tells_null_from_every_real_value() -> None:
    assert rq._meta(f"7 1 2 -3 4 {-(2**31)}") == (7, 1, 2, -3, 4, -(2**31))
    assert rq._meta(f"7 1 2 0 {rq._NULL} {rq._NULL}") == (7, 1, 2, 0, None, None)
    assert rq._meta("7 1 2 0 0 0") == (7, 1, 2, 0, 0, 0)


def test_an_ack_over_several_shards_and_unknown_ids_moves_each_shards_depth_by_what_it_deleted(
    tmp_path: Path,
) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    q.put([(s, bytes([s]) * (10 + s), 1 + s, 0) for s in range(4) for _ in range(3)])  # ids 1..12
    q.ack([1, 2, 6, 7, 12, 999, 1000])  # shards 0, 1, 1, 2, 3, and two ids no row has
    assert _recount(tmp_path / "q.db") == {0: (1, 1), 1: (2, 4), 2: (2, 6), 3: (2, 8)}
    assert {s: q.backlog(s) for s in q.shards()} == {0: (1, 1), 1: (2, 4), 2: (2, 6), 3: (2, 8)}
    assert q.depth() == (1 + 4 + 6 + 8, 10 + 2 * 11 + 2 * 12 + 2 * 13)
    q.ack([1, 2])  # again: nothing left to delete, nothing counted twice
    assert q.depth() == (19, 10 + 2 * 11 + 2 * 12 + 2 * 13)
    q.close()
    reopened = DurableQueue(tmp_path / "q.db", 1 << 30)
    assert reopened.depth() == (19, 10 + 2 * 11 + 2 * 12 + 2 * 13)
    reopened.close()


def test_an_ack_of_more_than_one_chunk_of_ids_deletes_and_counts_them_all(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    q.put([(i % 2, b"p", 1, 0) for i in range(1203)])
    q.ack(list(range(1, 1201)))  # three chunks of the IN list
    assert _db_ids(tmp_path / "q.db") == [1201, 1202, 1203]
    assert q.depth() == (3, 3) and {s: q.backlog(s) for s in q.shards()} == {0: (2, 2), 1: (1, 1)}
    q.close()
