"""The page bounds (relay.queue_pages) stay upper bounds after a put whose COMMIT fails: a trim reads
the real counts after deleting old rows, inside the transaction that is then rolled back, so those
counts are forgotten and the next put reads them again; the pages in use never get over the budget."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from relay.queue import DurableQueue, StorageError


class FailCommit(sqlite3.Connection):
    armed = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if FailCommit.armed and sql == "COMMIT":
            FailCommit.armed = False
            raise sqlite3.OperationalError("disk I/O error")  # as a failed WAL write / fsync
        return super().execute(sql, *args)


def real(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
    return pages - free, free


def test_a_put_whose_commit_fails_after_a_trim_leaves_the_used_page_bound_at_or_above_the_real_count(
        tmp_path: Path) -> None:
    FailCommit.armed = False
    path = tmp_path / "q.db"
    q = DurableQueue(path, 8 << 20, durability="normal", connection_factory=FailCommit)
    budget = q.plan.db_pages
    assert budget is not None
    q.put([(0, os.urandom(1 << 20), 1, 0)])  # the oldest row: 1 MiB, about 257 pages
    while real(path)[0] + 40 < budget:  # fill up to just below the page budget (nothing trimmed)
        assert q.put([(1, os.urandom(50_000), 1, 0)]) == 0
    FailCommit.armed = True
    with pytest.raises(StorageError):  # 300 kB over budget: trims the 1 MiB row, re-reads, COMMIT fails
        q.put([(1, os.urandom(300_000), 1, 0)])
    used, _ = real(path)
    assert q._pages.used is None or q._pages.used >= used, (q._pages.used, used)
    q.close()


def test_after_a_failed_commit_the_next_puts_still_keep_the_pages_in_use_within_the_budget(
        tmp_path: Path) -> None:
    FailCommit.armed = False
    path = tmp_path / "q.db"
    q = DurableQueue(path, 8 << 20, durability="normal", connection_factory=FailCommit)
    budget = q.plan.db_pages
    assert budget is not None
    q.put([(0, os.urandom(1 << 20), 1, 0)])
    while real(path)[0] + 40 < budget:
        assert q.put([(1, os.urandom(50_000), 1, 0)]) == 0
    FailCommit.armed = True
    with pytest.raises(StorageError):
        q.put([(1, os.urandom(300_000), 1, 0)])
    over = []
    for _ in range(20):  # what cb6cee6 kept after every put: pages in use <= db_pages
        q.put([(1, os.urandom(50_000), 1, 0)])
        used, _ = real(path)
        if used > budget:
            over.append(used - budget)
    assert not over, f"pages in use over the budget of {budget} after puts: {over}"
    q.close()


def test_a_put_whose_commit_fails_after_a_trim_leaves_the_free_page_bound_at_or_above_the_real_count(
        tmp_path: Path) -> None:
    FailCommit.armed = False
    path = tmp_path / "q.db"
    q = DurableQueue(path, 8 << 20, durability="normal", connection_factory=FailCommit)
    budget = q.plan.db_pages
    assert budget is not None
    q.put([(0, os.urandom(5_000), 1, 0)])  # the oldest row: trimmed first
    q.put([(2, os.urandom(200_000), 1, 0)])  # acked below: about 50 free pages, under the 64 given back
    while real(path)[0] + 40 < budget:
        assert q.put([(1, os.urandom(50_000), 1, 0)]) == 0
    q.ack([e.id for e in q.peek(2, 10)])
    before = real(path)[1]
    assert 0 < before < q.plan.vacuum_pages
    FailCommit.armed = True
    with pytest.raises(StorageError):  # reuses the free pages, trims, re-reads the counts, COMMIT fails
        q.put([(1, os.urandom(300_000), 1, 0)])
    _, free = real(path)
    assert q._pages.free is None or q._pages.free >= free, (q._pages.free, free)
    q.close()
