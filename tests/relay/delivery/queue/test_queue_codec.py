"""Queue rows store compressible payloads as snappy blocks (relay.queue_codec), read back exactly;
the accounting stays in raw bytes; an old-format file (no raw_len column) is still delivered."""

from __future__ import annotations

import logging
import random
import sqlite3
from pathlib import Path

import pytest

from relay.delivery.queue import codec as queue_codec
from relay.delivery.queue.durable import DurableQueue
from relay.ingest.wire import encode_write_request


def write_request(i: int, pad: int = 600) -> bytes:
    labels = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", str(i % 8)), ("pod", f"trainer-{i}-" + "x" * pad))
    return encode_write_request([(labels, [(1_700_000_000_000 + i, float(i))])])


def stored(path: Path) -> list[tuple[int, int | None]]:
    """(LENGTH(payload), raw_len) of every row, read with sqlite3 itself."""
    with sqlite3.connect(path) as db:
        return [(int(n), r) for n, r in db.execute("SELECT LENGTH(payload), raw_len FROM entries ORDER BY id")]


def test_a_compressible_payload_is_stored_compressed_and_read_back_byte_for_byte(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    payloads = [write_request(i) for i in range(3)]
    q.put([(0, p, 1, 1) for p in payloads])
    assert [e.payload for e in q.peek(0, 100)] == payloads
    assert q.depth() == (3, sum(map(len, payloads)))  # accounted in raw bytes, as before
    rows = stored(tmp_path / "q.db")
    assert [r for _, r in rows] == [len(p) for p in payloads]
    assert all(n * 4 < len(p) for (n, _), p in zip(rows, payloads, strict=True))  # was: the raw bytes
    q.close()


def test_small_or_incompressible_payloads_are_stored_as_they_are(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    noise = random.Random(3).randbytes(5000)
    q.put([(0, b"tiny", 1, 0), (0, noise, 1, 0)])
    assert [e.payload for e in q.peek(0, 100)] == [b"tiny", noise]
    assert stored(tmp_path / "q.db") == [(4, None), (5000, None)]
    q.close()


def test_an_old_format_queue_file_is_delivered_and_new_entries_follow_in_order(tmp_path: Path) -> None:
    path = tmp_path / "amp.queue.db"
    old = [write_request(i) for i in range(3)]
    with sqlite3.connect(path) as db:  # the schema before raw_len, with raw rows
        db.executescript("""
            CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, shard INTEGER NOT NULL,
                samples INTEGER NOT NULL, enqueued_at REAL NOT NULL, payload BLOB NOT NULL,
                oldest_ts INTEGER NOT NULL DEFAULT 0);
            CREATE INDEX entries_shard ON entries (shard, id);""")
        db.executemany("INSERT INTO entries (shard, samples, enqueued_at, payload, oldest_ts) VALUES (0, 1, 1.0, ?, 0)",
                       [(p,) for p in old])
    q = DurableQueue(path, 1 << 30)
    assert q.depth() == (3, sum(map(len, old))) and q.report.entries == 3
    new = write_request(99)
    q.put([(0, new, 1, 0)])
    got = q.peek(0, 100)
    assert [e.payload for e in got] == [*old, new]
    assert [r for _, r in stored(path)] == [None, None, None, len(new)]
    q.ack([e.id for e in got])
    assert q.depth() == (0, 0)
    q.close()


def test_a_damaged_compressed_row_is_dropped_with_one_error_not_sent_as_garbage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "amp.queue.db"
    q = DurableQueue(path, 1 << 30, memory_bytes=0)  # the file is edited under it: read rows from the file
    good = [write_request(i) for i in range(3)]
    q.put([(0, p, 1, 0) for p in good])
    with sqlite3.connect(path) as db:  # garbage where the middle row's snappy block was
        db.execute("UPDATE entries SET payload = ? WHERE id = 2", (b"\xff" * 40,))
    with caplog.at_level(logging.ERROR, logger="relay.queue"):
        got = q.peek(0, 100)
    assert [e.payload for e in got] == [good[0], b"", good[2]] and [e.samples for e in got] == [1, 0, 1]
    [line] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "entry 2 is damaged" in line.getMessage() and getattr(line, "reason", None) == "queue_damaged"
    q.ack([e.id for e in got])
    assert q.depth() == (0, 0)
    q.close()


def test_unpack_refuses_a_block_that_is_not_the_length_its_row_says() -> None:
    raw = write_request(1)
    z, n = queue_codec.pack(raw)
    assert n == len(raw) and queue_codec.unpack(z, n) == raw
    with pytest.raises(queue_codec.CodecError):
        queue_codec.unpack(z, len(raw) + 1)
    with pytest.raises(queue_codec.CodecError):
        queue_codec.unpack(z[: len(z) // 2], len(raw))
