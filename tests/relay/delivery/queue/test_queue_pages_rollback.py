"""The page bounds (relay.queue_pages) stay upper bounds after a put whose COMMIT fails: a trim reads
the real counts after deleting old rows, inside the transaction that is then rolled back, so those
counts are forgotten and the next put reads them again; the pages in use never get over the budget."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from relay.delivery.queue.durable import DurableQueue, StorageError
from tests.relay.delivery.queue.test_queue_pages import real


class FailCommit(sqlite3.Connection):
    armed = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if FailCommit.armed and sql == "COMMIT":
            FailCommit.armed = False
            raise sqlite3.OperationalError("disk I/O error")  # as a failed WAL write / fsync
        return super().execute(sql, *args)


def at_the_budget(path: Path, first: list[tuple[int, bytes, int, int]]) -> DurableQueue:
    """A queue of 8 MiB holding ``first`` and then rows of 50 kB up to just below its page budget."""
    q = DurableQueue(path, 8 << 20, durability="normal", connection_factory=FailCommit)
    budget = q.plan.db_pages
    assert budget is not None
    for piece in first:
        q.put([piece])
    while real(path)[0] + 40 < budget:  # nothing trimmed yet
        assert q.put([(1, os.urandom(50_000), 1, 0)]) == 0
    return q


def fail_a_trimming_commit(q: DurableQueue) -> None:
    """A put 300 kB over the budget: it trims the oldest rows, re-reads the counts, and its COMMIT fails."""
    FailCommit.armed = True
    with pytest.raises(StorageError):
        q.put([(1, os.urandom(300_000), 1, 0)])


def test_a_put_whose_commit_fails_after_a_trim_leaves_the_used_page_bound_at_or_above_the_real_count(
        tmp_path: Path) -> None:
    FailCommit.armed = False
    path = tmp_path / "q.db"
    q = at_the_budget(path, [(0, os.urandom(1 << 20), 1, 0)])  # the oldest row: 1 MiB, about 257 pages
    fail_a_trimming_commit(q)
    used, _ = real(path)
    assert q._pages.used is None or q._pages.used >= used, (q._pages.used, used)
    q.close()


def test_after_a_failed_commit_the_next_puts_still_keep_the_pages_in_use_within_the_budget(
        tmp_path: Path) -> None:
    FailCommit.armed = False
    path = tmp_path / "q.db"
    q = at_the_budget(path, [(0, os.urandom(1 << 20), 1, 0)])
    budget = q.plan.db_pages
    assert budget is not None
    fail_a_trimming_commit(q)
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
    # the oldest row (trimmed first), and one acked below: about 50 free pages, under the 64 given back
    q = at_the_budget(path, [(0, os.urandom(5_000), 1, 0), (2, os.urandom(200_000), 1, 0)])
    q.ack([e.id for e in q.peek(2, 10)])
    before = real(path)[1]
    assert 0 < before < q.plan.vacuum_pages
    fail_a_trimming_commit(q)  # it reuses the free pages first
    _, free = real(path)
    assert q._pages.free is None or q._pages.free >= free, (q._pages.free, free)
    q.close()
