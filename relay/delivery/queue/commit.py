"""The put path of a DurableQueue: group commit and the trim that keeps it under max_disk.

Concurrent ``put`` calls join a pending list; the caller that finds no commit under way leads: it
writes every pending put in one transaction (one fsync), with the acks that came in since the last
write, and wakes the others. A put that does not fit deletes the oldest rows (never its own, never
one a consumer holds) in the same transaction and returns their samples (``queue_full``).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Callable, Sequence

from relay.delivery.queue import files as qf
from relay.delivery.queue import opening as qo
from relay.delivery.queue.pages import PageBounds
from relay.delivery.queue.reads import QueueReads
from relay.delivery.queue.types import (
    ENTRY_OVERHEAD_BYTES,
    Entry,
    PendingPut,
    QueueError,
    RequestTooLargeError,
    StorageError,
    check_pieces,
)

_ROWS_PER_INSERT = 1000  # 7 values a row: well below SQLite's 32,766 variables a statement
# Each VALUES count is a prepared statement of its own (sqlite3 caches 128 a connection, about 0.6 KiB a
# row): puts of up to _EXACT_ROWS rows get one of their exact size, larger ones are cut into chunks of
# a power of two, so that at most _EXACT_ROWS + 5 shapes are ever prepared, whatever max_shards is.
_EXACT_ROWS = 32
_PAGES = "SELECT * FROM pragma_page_count(), pragma_freelist_count()"  # both in one statement


# What a row costs in GIL hand-offs: CPython 3.11's sqlite3 releases the GIL for each row it steps to
# AND for each column it reads from it (sqlite3_data_count, sqlite3_column_type), and every release
# wakes a thread waiting for the GIL (a futex wake and a context switch). With four connections, the
# committer and the senders waiting, those wake-ups were about a fifth of the relay's CPU on issue 9's
# job. So the hot statements return as few rows and columns as they can: a put takes its ids from
# lastrowid (no RETURNING), an ack sums what it deletes per shard, and a peek reads a row's integers
# as one text column (_PEEK_COLUMNS).
@functools.lru_cache(maxsize=64)
def _insert(rows: int) -> str:
    """A put's rows in one INSERT. AUTOINCREMENT gives each row one more than the largest id the table
    ever had, in the VALUES' order, so the ids of the statement's rows are the ``rows`` ids ending at
    its lastrowid (the writer holds the write lock: no other insert runs between)."""
    return ("INSERT INTO entries (shard, samples, enqueued_at, oldest_ts, payload, raw_len, crc) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * rows))



class QueueCommit(QueueReads):
    # -- writing ---------------------------------------------------------------------------------
    def put(self, pieces: Sequence[Sequence[object]], blocks: Sequence[bytes | None] | None = None) -> int:
        """Store all pieces (shard, payload, samples, oldest_ts_ms) in one transaction; durable on
        return. Returns the samples of the oldest entries deleted to make room (0 normally).
        ``blocks``: per piece, None or a raw snappy block known to decode to exactly its payload
        (queue_codec.pack stores it instead of compressing the payload again)."""
        checked = check_pieces(pieces)
        if not checked:
            return 0
        if blocks is not None and len(blocks) != len(checked):
            raise QueueError("blocks must match the pieces one to one", len(blocks))
        cost = sum(len(p[1]) + ENTRY_OVERHEAD_BYTES for p in checked)
        limit = self.max_disk_bytes if self.plan.db_pages is None else min(
            self.max_disk_bytes, self.plan.db_pages * qf.PAGE_SIZE)
        if cost > limit:
            raise RequestTooLargeError(f"queue {self.name}: request needs more than max_disk "
                                       f"({limit} bytes) on its own", cost)
        if self._need_reserve:  # the volume filled up: wait until acks gave space back (and then some)
            size = self.plan.reserve_bytes
            if qf.free_bytes(self.path) < 2 * size or not qf.make_reserve(self.path, size):
                raise StorageError(f"queue {self.name}: the volume is full; waiting for sent entries to "
                                   "free space", str(self.path))
            self._need_reserve, self._reserve = False, True
        me = PendingPut(checked, blocks)
        with self._cond:
            if self._closed:
                raise QueueError("queue is closed", str(self.path))
            self._pending.append(me)
            while not me.done and self._committing:
                self._cond.wait()
            if me.done:
                return self._result(me)
            self._committing = True
            batch, self._pending = self._pending, []
        try:
            self._commit(batch)
        except Exception as e:  # disk full, I/O error, ...: one StorageError, the real cause in its text
            if isinstance(e, sqlite3.Error | OSError):
                self._make_room()
            err = e if isinstance(e, QueueError) else StorageError(
                f"queue {self.name}: cannot store the request ({type(e).__name__}: {e})", str(self.path))
            for p in batch:
                p.error = err
        finally:
            with self._cond:
                self._committing = False
                for p in batch:
                    p.done = True
                self._cond.notify_all()
                # acks that came in during the commit, and no commit after it to write them: now
                acks_left = bool(self._delivered) and not self._pending and not self._closed
            if acks_left:
                self._write_acks()
        return self._result(me)

    @staticmethod
    def _result(p: PendingPut) -> int:
        if p.error is not None:
            raise p.error
        return p.dropped

    def _commit(self, batch: list[PendingPut]) -> None:
        """One transaction (one fsync) for every pending put; the leader runs this."""
        now = self._clock()
        added: dict[int, list[int]] = {}  # shard -> [entries, samples]
        removed: dict[int, list[int]] = {}
        freed_delivered: set[int] = set()
        cut: list[int] = []  # ids the trim deleted
        mem_cut: dict[int, int] = {}
        stored_rows: list[tuple[int, tuple[int, bytes, int | None, int, int, int, int]]] = []  # (id, row)
        d_samples = d_bytes = 0
        free_pages: int | None = None
        with self._wlock, contextlib.ExitStack() as readers:
            db = self._wdb
            with self._cond:
                acked = list(self._delivered)
            holding: list[bool] = []

            def hold_readers() -> None:
                """Before the first delete: no peek until COMMIT (a consumer that read a row we delete
                would deliver what queue_full counts as lost)."""
                if not holding:
                    readers.enter_context(self._rlock)
                    holding.append(True)

            try:
                db.execute("BEGIN IMMEDIATE")
                if acked:  # the acks since the last write go in the same transaction
                    acked, d_bytes = self._delete_acked(db, acked, removed)
                    d_bytes = -d_bytes
                first_id: int | None = None
                last_id = 0
                for p in batch:
                    i = 0
                    while i < len(p.rows):  # one statement per put (a few for a large one), its ids back
                        left = len(p.rows) - i
                        n = min(_ROWS_PER_INSERT, left if left <= _EXACT_ROWS else 1 << (left.bit_length() - 1))
                        rows = p.rows[i : i + n]
                        i += n
                        last = db.execute(_insert(len(rows)), [
                            v for shard, stored, raw_len, crc, _, samples, oldest in rows
                            for v in (shard, samples, now, oldest, stored, raw_len, crc)]).lastrowid
                        if last is None:
                            raise StorageError(f"queue {self.name}: SQLite gave no id for the stored rows",
                                               str(self.path))
                        first_id = last - len(rows) + 1 if first_id is None else first_id
                        last_id = last
                        self._pages.inserted(sum(len(r[1]) for r in rows), len(rows))
                        stored_rows.extend(zip(range(last - len(rows) + 1, last + 1), rows, strict=True))
                    for shard, _stored, _raw_len, _crc, size, samples, _oldest in p.rows:
                        a = added.setdefault(shard, [0, 0])
                        a[0] += 1
                        a[1] += samples
                        d_samples += samples
                        d_bytes += size
                    rs, rb, free_pages = self._trim(db, d_bytes, added, removed, first_id or 0, freed_delivered,
                                                    hold_readers, cut)
                    p.dropped = rs
                    d_bytes -= rb
                db.execute("COMMIT")
                # before any put of it returns: the loss log has every row a sender was told is stored
                self._log.commit([(rid, row[5]) for rid, row in stored_rows], acked + cut,
                                 sum(r[1] for r in removed.values()))
                if cut:
                    with self._cond:  # still under the read lock: no peek saw the trimmed rows in memory
                        mem_cut = self._recent.remove(cut)
                readers.close()
            except BaseException:
                self._rollback(db)  # never masks the real error
                self._pages = PageBounds()  # counts read in the rolled-back transaction: read again
                readers.close()
                raise
            d_samples -= sum(r[1] for r in removed.values())
            with self._cond:
                self._samples += d_samples
                self._bytes += d_bytes
                self._forget_delivered(freed_delivered)
                self._forget_delivered(acked)
                self._recent.gone_behind(removed, mem_cut, self._recent.remove(acked))
                self._removed(removed)
                if self._recent.max_bytes:  # in memory before the consumers are woken
                    self._recent.add(
                        Entry(rid, shard, stored, samples, now, oldest, raw_len)
                        for rid, (shard, stored, raw_len, _crc, _size, samples, oldest) in stored_rows)
                if self._acked_early:
                    self._count_early_acks(last_id)  # before the consumers' thresholds are checked
                self._apply_added(added)
                self._last_id = max(self._last_id, last_id)  # (_apply_added woke the shards' consumers)
            self._maintain(db, free_pages)

    def _trim(self, db: sqlite3.Connection, d_bytes: int, added: dict[int, list[int]],
              removed: dict[int, list[int]], first_own: int, freed_delivered: set[int],
              hold_readers: Callable[[], None], cut_ids: list[int]) -> tuple[int, int, int | None]:
        """Delete the oldest entries until the queue fits; never rows of this commit (id >= first_own)
        nor rows a consumer holds. Returns (samples, bytes) freed, delivered rows not counted, and the
        database's free pages at the end (None: not read, the queue has no page bound); the ids it
        deleted are appended to ``cut_ids``.
        Held and delivered ids are read under _cond for each chunk: an ack moves an id from one to
        the other atomically, so a row is never counted lost when its sender has it."""
        freed_samples = freed_bytes = 0
        free: int | None = None
        after = 0
        while True:
            with self._cond:
                entries = sum(self._entries.values()) + sum(a[0] for a in added.values()) - sum(
                    r[0] for r in removed.values())
                used = self._bytes + d_bytes - freed_bytes + ENTRY_OVERHEAD_BYTES * entries
            excess = used - self.max_disk_bytes
            if self.plan.db_pages is not None and (after or excess > 0 or not self._pages.fits(self.plan.db_pages)):
                pages, free = db.execute(_PAGES).fetchone()
                self._pages.read(pages, free)
                excess = max(excess, (pages - free - self.plan.db_pages) * qf.PAGE_SIZE)
            if excess <= 0:
                break
            hold_readers()
            rows = db.execute(f"SELECT id, shard, samples, {qo.SIZE} FROM entries WHERE id > ? AND id < ? "
                              "ORDER BY id LIMIT 256", (after, first_own)).fetchall()
            if not rows:
                break  # only held or new rows left: they leave soon (acked) or are what we store
            with self._cond:
                protected = set().union(*self._held.values())
                delivered = set(self._delivered)
            cut = []
            cut_bytes = 0
            for rid, shard, samples, nbytes in rows:
                after = rid
                if rid in protected:
                    continue
                cut.append(rid)
                cut_bytes += nbytes
                r = removed.setdefault(shard, [0, 0])
                r[0] += 1
                r[1] += samples
                freed_bytes += nbytes
                if rid in delivered:  # already sent: leaves the depth, but was not lost
                    freed_delivered.add(rid)
                else:
                    freed_samples += samples
                excess -= nbytes + ENTRY_OVERHEAD_BYTES
                if excess <= 0:
                    break
            if cut:
                db.execute(f"DELETE FROM entries WHERE id IN ({','.join('?' * len(cut))})", cut)
                cut_ids.extend(cut)
                self._pages.deleted(cut_bytes, len(cut))
        return freed_samples, freed_bytes, free
