"""The queue's page bounds (relay.queue_pages): the real page counts are read only near the page
budget or the count that is given back, and the bounds are never below the real counts (issue 9:
reading them was a statement per put)."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from relay.delivery.queue import files as qf
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.queue.pages import PAGE_SLACK, PageBounds, row_pages


class Log(sqlite3.Connection):
    log: list[str] = []

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        Log.log.append(sql)
        return super().execute(sql, *args)


def real(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
    return pages - free, free


def test_puts_and_acks_far_from_the_page_budget_do_not_read_the_page_counts(tmp_path: Path) -> None:
    Log.log = []
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Log)
    for i in range(40):
        q.put([(i % 2, os.urandom(3000), 1, 0)])
        q.ack([e.id for e in q.peek(i % 2, 10)])
    reads = [s for s in Log.log if "page_count" in s or "freelist_count" in s]
    # was one a put (40); now the first put's, and one each time the deletes' bound of the free pages
    # (15 a small row) reaches the count given back (256 at 1 GiB)
    assert len(reads) <= 4
    assert q.depth() == (0, 0)
    q.close()


def test_a_put_near_the_page_budget_reads_the_counts_and_trims_as_before(tmp_path: Path) -> None:
    Log.log = []
    q = DurableQueue(tmp_path / "q.db", qf.PHYSICAL_MIN_BYTES, connection_factory=Log)
    dropped = 0
    for _ in range(40):
        dropped += q.put([(0, os.urandom(100_000), 1, 0)])
    assert dropped > 0  # the budget was reached: the oldest went
    assert len([s for s in Log.log if "page_count" in s]) >= 10
    assert qf.files_size(tmp_path / "q.db") <= qf.PHYSICAL_MIN_BYTES
    q.close()


@pytest.mark.parametrize("seed", range(4))
def test_the_bounds_are_never_below_the_real_counts(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "q.db"
    q = DurableQueue(path, 8 << 20, durability="normal")
    held: dict[int, list[int]] = {}
    for _ in range(150):
        op = rng.random()
        if op < 0.5:
            q.put([(rng.randrange(3), os.urandom(rng.choice([10, 900, 5000, 70_000])), 1, 0)
                   for _ in range(rng.randrange(1, 4))])
        elif op < 0.8:
            s = rng.randrange(3)
            held[s] = [e.id for e in q.peek(s, rng.randrange(1, 6))]
        else:
            s = rng.randrange(3)
            q.ack(held.pop(s, []))
        used, free = real(path)
        b = q._pages
        assert b.used is None or b.used >= used
        assert b.free is None or b.free >= free
    q.close()


def test_page_bounds_arithmetic() -> None:
    assert row_pages(0) == PAGE_SLACK and row_pages(qf.PAGE_SIZE - 4) == 1 + PAGE_SLACK
    assert row_pages(qf.PAGE_SIZE - 3) == 2 + PAGE_SLACK
    b = PageBounds()
    b.inserted(10_000, 2)
    b.deleted(10_000, 2)
    assert (b.used, b.free) == (None, None) and not b.fits(1 << 40) and not b.free_below(1 << 40)
    b.read(100, 10)
    b.inserted(3 * (qf.PAGE_SIZE - 4), 3)
    assert b.used == 90 + 3 + 3 * (1 + PAGE_SLACK) and b.fits(b.used) and not b.fits(b.used - 1)
    b.deleted(0, 1)
    assert b.free == 10 + 1 + PAGE_SLACK and b.free_below(b.free + 1) and not b.free_below(b.free)
