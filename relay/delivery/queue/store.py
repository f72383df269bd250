"""The queue's file and its upkeep, under the DurableQueue's other parts (relay.delivery.queue.durable).

``QueueStore`` declares what every part of a DurableQueue shares (the two SQLite connections and
their locks, the disk plan, the rows kept in memory, the page bounds) and does what each of them
needs after a write: connect, roll back without masking the real error (a connection stuck in a
transaction is replaced), give free pages back and keep the WAL small after a commit, write the
loss log (relay.delivery.queue.losslog) again from the file after a complete checkpoint, and
apply a delete to the per-shard counts. It never decides what is written; acks (relay.delivery.queue.acks), reads
(relay.delivery.queue.reads) and the put path (relay.delivery.queue.commit) build on it.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from relay.delivery.queue import files as qf
from relay.delivery.queue import losslog
from relay.delivery.queue import opening as qo
from relay.delivery.queue.files import DiskPlan, OpenReport
from relay.delivery.queue.losslog import LossLog
from relay.delivery.queue.pages import PageBounds
from relay.delivery.queue.recent import RecentRows
from relay.delivery.queue.state import QueueState
from relay.delivery.queue.types import PendingPut, QueueError

log = logging.getLogger("relay.queue")



class QueueStore(QueueState):
    """The shared part of a DurableQueue (its __init__ and _open set every attribute declared here)."""

    path: Path
    name: str
    plan: DiskPlan
    report: OpenReport
    _max_disk: int
    _clock: Callable[[], float]
    _sync: str
    _factory: type[sqlite3.Connection]
    _wlock: threading.Lock  # the write connection
    _rlock: threading.Lock  # the read connection
    _wdb: sqlite3.Connection
    _rdb: sqlite3.Connection
    _pending: list[PendingPut]
    _committing: bool
    _log: LossLog  # what every commit stored and deleted (relay.delivery.queue.losslog)
    _damage_taken: bool
    _memory_bytes: int
    _recent: RecentRows
    _pages: PageBounds
    _reserve: bool
    _need_reserve: bool

    @property
    def max_disk_bytes(self) -> int:
        return self._max_disk

    @max_disk_bytes.setter
    def max_disk_bytes(self, value: int) -> None:
        """Changing the bound on a running queue (reload) takes effect at the next put."""
        if value <= 0:
            raise QueueError("max_disk_bytes must be positive", value)
        self._max_disk = value
        self.plan = DiskPlan.for_max_disk(value)

    # -- opening (relay.queue_open) ----------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        return qo.connect(self.path, self._factory, self._sync, self.plan)

    def _removed(self, removed: dict[int, list[int]]) -> None:
        """Under _cond: rows deleted from the file; a shard left with none is held in memory again."""
        self._apply_removed(removed)
        for shard in removed:
            if shard not in self._entries:
                self._recent.drained(shard)

    def _rollback(self, db: sqlite3.Connection) -> None:
        """After a failed write; never raises, never masks the real error. A connection stuck in a
        transaction is replaced."""
        if qo.rollback(db) and db is self._wdb:
            with contextlib.suppress(sqlite3.Error):
                db.close()
                self._wdb = self._connect()

    def _maintain(self, db: sqlite3.Connection, free_pages: int | None = None) -> None:
        """After a commit: give free pages back, keep the WAL small, restart the loss log. Best effort:
        the data is already committed, so a failure here is not the caller's. ``free_pages``: the
        free pages the commit's transaction last read (saves reading them again)."""
        if free_pages is None and self._pages.free_below(self.plan.vacuum_pages):
            free_pages = self._pages.free  # cannot have reached the count that is given back: not read
        try:
            self._pages.set_free(qo.upkeep(db, self.path, self.plan, self._rlock, free_pages))
        except (sqlite3.Error, OSError) as e:
            log.debug("queue %s: maintenance skipped: %s", self.name, e)
        if self._log.size > losslog.RESTART_BYTES:
            self._checkpoint_log(db)

    def _checkpoint_log(self, db: sqlite3.Connection) -> None:
        """Under the write lock: move every commit into the database file (no reader of ours pins
        the WAL meanwhile) and, once that is complete, start the loss log again from it."""
        try:
            with self._rlock:
                busy, frames, done = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as e:
            log.debug("queue %s: checkpoint skipped: %s", self.name, e)
            return
        if busy == 0 and frames == done:
            self._restart_log()

    def _restart_log(self) -> None:
        """The loss log starts again from what the database file holds (all of it committed)."""
        with self._cond:
            last, entries, samples = self._last_id, sum(self._entries.values()), self._samples
        self._log.restart(last, entries, samples)

    def files_size(self) -> int:
        """Bytes of the db, WAL and shm files: what max_disk bounds from 4 MiB on."""
        return qf.files_size(self.path)
