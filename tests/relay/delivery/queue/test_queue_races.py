"""Threads racing put / peek / ack against the memory path, the trims and the acks written by puts'
transactions. Each consumer acks everything it peeks, so every row is delivered exactly once or counted
lost by queue_full, never both, and the in-memory counts end equal to the file's."""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from relay.delivery.queue.durable import DurableQueue, StorageError

SHARDS = 3


def file_counts(path: Path) -> tuple[dict[int, int], int]:
    with sqlite3.connect(path) as db:
        per = dict(db.execute("SELECT shard, COUNT(*) FROM entries GROUP BY shard").fetchall())
        (samples,) = db.execute("SELECT IFNULL(SUM(samples), 0) FROM entries").fetchone()
    return per, samples


class Flaky(sqlite3.Connection):
    """Fails a writer's INSERT / DELETE / COMMIT now and then, as a full or failing disk would (the
    statement is not run; half the time the whole transaction is rolled back first, as SQLite may)."""

    rate = 0.0
    rng = random.Random(0)

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if Flaky.rate and sql.startswith(("INSERT", "DELETE", "COMMIT")) and Flaky.rng.random() < Flaky.rate:
            if self.in_transaction and Flaky.rng.random() < 0.5:  # SQLite rolled it all back itself
                super().execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("max_disk", "memory_bytes", "seed", "fail_rate"), [
    (1 << 20, 64 << 10, 0, 0.0),  # no page budget, memory overflows and drains
    (1 << 20, 1 << 30, 1, 0.0),
    (6 << 20, 256 << 10, 2, 0.0),  # page budget
    (1 << 20, 64 << 10, 3, 0.08),  # and the same with failing writes
    (1 << 20, 1 << 30, 4, 0.08),
    (6 << 20, 256 << 10, 5, 0.08),
])
def test_racing_puts_peeks_and_acks_deliver_each_row_once_or_count_it_lost(
        tmp_path: Path, max_disk: int, memory_bytes: int, seed: int, fail_rate: float) -> None:
    path = tmp_path / "q.db"
    Flaky.rate, Flaky.rng = 0.0, random.Random(seed)
    q = DurableQueue(path, max_disk, durability="normal", memory_bytes=memory_bytes, connection_factory=Flaky)
    Flaky.rate = fail_rate
    stop = threading.Event()
    delivered: list[int] = []
    lost = [0]
    put_rows = [0]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def putter(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        try:
            while not stop.is_set():
                pieces = [(rng.randrange(SHARDS), os.urandom(rng.choice([50, 3000, 40_000])), 1, 0)
                          for _ in range(rng.randrange(1, 4))]
                try:
                    dropped = q.put(pieces)
                except StorageError:  # a failing write (fail_rate): nothing of it was stored
                    time.sleep(0.001)
                    continue
                with lock:
                    lost[0] += dropped
                    put_rows[0] += len(pieces)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def consumer(shard: int) -> None:
        rng = random.Random(seed * 1000 + shard)
        try:
            while not stop.is_set():
                q.wait(shard, 0.01)
                got = q.peek(shard, rng.randrange(1, 8))
                if got:
                    more = q.peek(shard, rng.randrange(0, 8), after=got[-1].id) if rng.random() < 0.5 else []
                    ids = [e.id for e in got + more]
                    assert all(e.shard == shard for e in got + more)
                    with lock:
                        delivered.extend(ids)
                    if rng.random() < 0.1:
                        time.sleep(0.002)
                    q.ack(ids)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=putter, args=(k,)) for k in range(2)]
    threads += [threading.Thread(target=consumer, args=(s,)) for s in range(SHARDS)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(10)
    Flaky.rate = 0.0
    assert not errors, errors
    assert len(delivered) == len(set(delivered)), "a row was handed out twice"
    q.put([(0, b"flush", 0, 0)])  # writes the acks still in memory
    for s in range(SHARDS):  # drain what is left, from a fresh peek of each shard
        while got := q.peek(s, 1000):
            delivered.extend(e.id for e in got if e.stored != b"flush")
            q.ack([e.id for e in got])
    q.put([(1, b"flush", 0, 0)])
    q.ack([e.id for e in q.peek(1, 10)])
    assert len(delivered) == len(set(delivered)), "a row was handed out twice"
    assert len(delivered) + lost[0] == put_rows[0], (len(delivered), lost[0], put_rows[0])
    per, samples = file_counts(path)
    assert per == {} and samples == 0, per
    assert q.depth() == (0, 0)
    assert all(q.backlog(s) == (0, 0) for s in range(SHARDS))
    assert not q._delivered and not q._recent._rows and q._recent.nbytes == 0
    q.close()
