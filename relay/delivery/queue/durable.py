"""Durable per-destination queue: SQLite in WAL mode, sharded FIFOs, bounded by max_disk.

Why SQLite and not append-only segments
    Both give an ordered log; SQLite also gives atomic multi-shard transactions (all shard pieces
    of one incoming request commit together or not at all), crash recovery that is decades old and
    fuzzed, random deletes for ack and for dropping the oldest entries, and a file we can inspect
    with the ``sqlite3`` shell. Segments would need our own framing, checksums, a torn-write
    recovery path and a per-shard read offset index.

Durability: ``synchronous=FULL`` (default) vs ``NORMAL``
    FULL fsyncs the WAL on every commit, so an acknowledged request survives a node crash too.
    ``durability="normal"`` survives ``kill -9`` but may lose the last commits on a power cut.

Group commit
    Concurrent ``put`` calls join a pending list; whichever caller finds no commit in progress
    becomes the leader, writes every pending request in one transaction (one fsync) and wakes
    the others. Acks that came in since the last write are deleted in that transaction too; an
    ack with no commit under way is written at once, in a transaction of its own without fsync.

Payloads (relay.queue_codec)
    A row holds a piece's WriteRequest bytes, as a snappy block when that is clearly smaller
    (``raw_len`` says so; rows of older files are raw and are read as they are). SQLite's cost per
    sample is mostly bytes (WAL, fsync, checkpoint, freed pages), so this cut the queue's CPU per
    sample about 3x (bench/queue_bench.py --pack-min: still about 4x with the sender below); counts,
    bounds and depth stay in raw bytes. ``peek`` hands rows out as stored (``Entry.stored``,
    ``Entry.raw_len``) once their checksum (``crc``, written at put) matches: the sender concatenates
    them into its snappy body without decompressing. A row that fails its checksum (rows of files
    from before ``crc``: that fails to decompress) is logged once at ERROR and handed out empty.
    A consumer waiting for a fuller batch peeks only entries after those it holds
    (``peek(..., after=)``): each row is read once.

Rows handed out from memory (relay.queue_recent)
    What a commit stored is also kept in memory, per shard, until it is acked or trimmed, as long
    as memory holds every row the file has for that shard: ``peek`` then hands those out without
    reading them back (no SQLite read, no page copy, no checksum: the bytes never left memory).
    A shard whose rows do not all fit in ``memory_bytes`` (a destination that is down, a file
    opened with rows in it) is read from the file, as before, while memory keeps its newest rows:
    once the older ones are sent, memory holds them all again. What a peek returns is the same
    either way (tests/relay/delivery/queue/test_queue_recent.py compares the two); only the file is the truth, and a row
    is in memory only once it is committed.

Bounded by max_disk (see relay.queue_files for the disk plan)
    Payload plus ENTRY_OVERHEAD_BYTES per entry stays under max_disk, and from 4 MiB on the pages
    of the files too. A put that does not fit deletes the OLDEST entries (any shard) in the same
    transaction and returns their samples (reason ``queue_full``); it never deletes what is being
    stored, nor an entry a sender holds (peeked, not yet acked), so the count is exactly what was
    lost. Pieces that alone exceed the bound raise RequestTooLargeError (the service answers 413).

Faults
    A write that cannot be made durable raises StorageError (the real SQLite error, never one from
    a failing ROLLBACK). An ack that cannot be written is kept in memory: those entries are never
    handed out again, and the delete is retried on the next put or ack. On a full volume the
    ``.reserve`` file (from 4 MiB) is given back so that the WAL can be checkpointed and acks
    written; puts stay refused until the sender's acks freed twice its size, then go on (no 503
    forever, and what the reserve freed is not eaten by new data). Ids come from
    AUTOINCREMENT, so an id is never reused: a late ack can never delete a newer row. A damaged
    file is set aside at open (relay.queue_files) and reported once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from relay.delivery.queue import codec as queue_codec
from relay.delivery.queue import files as qf
from relay.delivery.queue import opening as qo
from relay.delivery.queue.files import DiskPlan, OpenReport
from relay.delivery.queue.pages import PageBounds
from relay.delivery.queue.recent import RecentRows
from relay.delivery.queue.state import QueueState
from relay.delivery.queue.types import (
    ENTRY_OVERHEAD_BYTES,
    Entry,
    Piece,
    QueueError,
    QueueOpenError,
    RequestTooLargeError,
    StorageError,
    check_pieces,
)

__all__ = ["ENTRY_OVERHEAD_BYTES", "DurableQueue", "Entry", "Piece", "QueueError", "QueueOpenError",
           "RequestTooLargeError", "StorageError"]

log = logging.getLogger("relay.queue")

_MARK_EVERY_S = 1.0
_ROWS_PER_INSERT = 1000  # 7 values a row: well below SQLite's 32,766 variables a statement
# Each VALUES count is a prepared statement of its own (sqlite3 caches 128 a connection, about 0.6 KiB a
# row): puts of up to _EXACT_ROWS rows get one of their exact size, larger ones are cut into chunks of
# a power of two, so that at most _EXACT_ROWS + 5 shapes are ever prepared, whatever max_shards is.
_EXACT_ROWS = 32
_PAGES = "SELECT * FROM pragma_page_count(), pragma_freelist_count()"  # both in one statement
# Committed rows kept in memory for peek, at most (stored bytes + overhead). A shard whose rows do
# not all fit is read from the file (about 0.1 ms a row) until its backlog is gone. Issue 9's
# pass-through burst backs a queue up by ~30 MiB of compressed rows: at 8 MiB nine peeks in ten
# read the file and 0.44 s of CPU went on acks' own transactions; at 32 MiB one in eight, and the
# job costs ~8% less CPU for ~20 MiB more peak RSS (still below vmagent's; bench/README).
MEMORY_BYTES = 32 << 20


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


# A peeked row as three columns: its payload, its enqueue time (a REAL, read as it is) and its integers
# in one text, NULL raw_len and crc as _NULL (raw_len is below 2^32, crc a signed 32-bit value);
# _meta reads them back.
_NULL = -(1 << 63)
_PEEK_COLUMNS = ("payload, enqueued_at, printf('%d %d %d %d %d %d', id, shard, samples, oldest_ts, "
                 f"IFNULL(raw_len, {_NULL}), IFNULL(crc, {_NULL}))")


def _meta(text: str) -> tuple[int, int, int, int, int | None, int | None]:
    """(id, shard, samples, oldest_ts, raw_len, crc) of a peeked row's integer column."""
    rid, shard, samples, oldest, raw_len, crc = map(int, text.split())
    return rid, shard, samples, oldest, (None if raw_len == _NULL else raw_len), (None if crc == _NULL else crc)


class _Pending:
    __slots__ = ("done", "dropped", "error", "rows")

    def __init__(self, pieces: list[Piece], blocks: Sequence[bytes | None] | None = None) -> None:
        # (shard, stored payload, raw_len or None, crc, raw size, samples, oldest_ts_ms): packed by
        # the putting thread, before it joins the group commit
        self.rows = [(shard, *_packed(payload, block), samples, oldest) for (shard, payload, samples, oldest), block
                     in zip(pieces, blocks or (None,) * len(pieces), strict=True)]
        self.done = False
        self.dropped = 0
        self.error: BaseException | None = None


def _packed(payload: bytes, block: bytes | None = None) -> tuple[bytes, int | None, int, int]:
    stored, raw_len = queue_codec.pack(payload, block)
    return stored, raw_len, queue_codec.checksum(stored, raw_len), len(payload)


class DurableQueue(QueueState):
    """Sharded FIFO on one SQLite file. Thread-safe; one consumer per shard."""

    def __init__(
        self,
        path: Path,
        max_disk_bytes: int,
        clock: Callable[[], float] = time.time,
        *,
        durability: Literal["full", "normal"] = "full",
        name: str | None = None,
        on_damaged: Callable[[OpenReport], None] | None = None,
        connection_factory: type[sqlite3.Connection] = sqlite3.Connection,
        memory_bytes: int = MEMORY_BYTES,
    ) -> None:
        if max_disk_bytes <= 0:
            raise QueueError("max_disk_bytes must be positive", max_disk_bytes)
        if durability not in ("full", "normal"):
            raise QueueError("durability must be 'full' or 'normal'", durability)
        self.path = Path(path)
        self.name = name or self.path.name.removesuffix(".queue.db").removesuffix(".db")
        self.max_disk_bytes = max_disk_bytes  # sets self.plan
        self._clock = clock
        self._sync = durability.upper()
        self._factory = connection_factory
        self._wlock = threading.Lock()  # the write connection
        self._rlock = threading.Lock()  # the read connection
        super().__init__()
        self._pending: list[_Pending] = []
        self._committing = False
        self._mark_at = 0.0
        self._damage_taken = False
        self._memory_bytes = max(0, memory_bytes)
        self.report = self._open(on_damaged)

    def take_damage_report(self) -> OpenReport | None:
        """The open report if the file was damaged or lost entries, once (the sender counts it in
        gpu_relay_queue_damaged_total when it is built; a later sender on the same queue does not)."""
        with self._cond:
            if self._damage_taken or not (self.report.damaged or self.report.problems):
                return None
            self._damage_taken = True
            return self.report

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

    def _open(self, on_damaged: Callable[[OpenReport], None] | None) -> OpenReport:
        report = OpenReport()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            mark = qf.read_mark(self.path)
            self._wdb, self._rdb = qo.open_or_recover(self.path, self._connect, self._clock(),
                                                      self.max_disk_bytes, report, mark)
            got = qo.load(self._rdb, self._clock(), report)
            self._last_id = qo.check_mark(self._wdb, mark, got.last_id, report)
        except (OSError, sqlite3.Error) as e:
            raise QueueOpenError(
                f"destination {self.name!r}: cannot open its queue file {self.path} ({e}); make sure "
                "storage.path is a writable directory with free space", str(self.path)) from None
        self._entries, self._shard_samples = got.entries, got.shard_samples
        self._samples, self._bytes = got.samples, got.nbytes
        self._put_seq = dict.fromkeys(got.entries, 1)
        self._recent = RecentRows(self._memory_bytes, uncached=got.entries)  # rows on file: read from it
        self._pages = PageBounds()
        if self._last_id != got.last_id:
            self._write_mark()
        self._reserve = qf.make_reserve(self.path, self.plan.reserve_bytes)
        self._need_reserve = False
        qo.log_report(self.name, report)
        if (report.damaged or report.problems) and on_damaged is not None:
            on_damaged(report)
        return report

    # -- the shard count the entries were sharded under (SQLite's user_version; 0: unknown) --------
    def shard_count(self) -> int | None:
        """The shard count recorded by :meth:`set_shard_count` (None: never recorded, or a file
        rebuilt after damage); a sender on another count must first drain in id order."""
        with self._rlock:
            value = self._rdb.execute("PRAGMA user_version").fetchone()[0]
        return int(value) if value else None

    def set_shard_count(self, n: int) -> None:
        """Record the shard count new entries are sharded under (before they are put)."""
        with self._wlock:
            self._wdb.execute(f"PRAGMA user_version = {max(0, int(n))}")

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
        me = _Pending(checked, blocks)
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
    def _result(p: _Pending) -> int:
        if p.error is not None:
            raise p.error
        return p.dropped

    def _commit(self, batch: list[_Pending]) -> None:
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

    def ack(self, ids: Sequence[int]) -> None:
        """Delete entries (sent, or dropped by the sender). Unknown ids are ignored. Never raises for
        a storage failure: the ids are kept and the delete retried; they are not handed out again.

        While a put is being committed the delete is left to it: that commit, or the next one if it
        read the acks before these came in (its put then writes them on its own, when no other put
        waits), deletes them in its own transaction. So an ack costs no transaction of its own under
        load; it is on file once the put is, and never handed out again from the moment it returns."""
        with self._cond:
            if self._closed:
                return
            self._note_acked(ids)
            if self._committing or self._pending:
                return
        self._write_acks()

    def _write_acks(self) -> None:
        """The acks not yet written, in a transaction of their own."""
        with self._wlock:
            if self._closed:
                return
            if not self._flush_delivered(self._wdb) and self._make_room(locked=True):
                self._flush_delivered(self._wdb)
            self._maintain(self._wdb)

    def _make_room(self, locked: bool = False) -> bool:
        """After a failed write: give the reserve back to the volume and move the WAL into the db, so
        acks can be written and free pages for the next puts. True if the reserve was released."""
        released = qf.release_reserve(self.path)
        if released:
            self._reserve = False
            self._need_reserve = True  # no put until the reserve can be made again
            log.debug("queue %s: write failed; released the disk reserve", self.name)
        with contextlib.ExitStack() as stack:
            if not locked:
                stack.enter_context(self._wlock)
            with self._rlock, contextlib.suppress(sqlite3.Error):
                self._wdb.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return released

    def _delete_acked(self, db: sqlite3.Connection, ids: list[int],
                      removed: dict[int, list[int]]) -> tuple[list[int], int]:
        """In a put's transaction: delete acked rows. A chunk whose DELETE fails is undone by SQLite
        (a statement is atomic) and left, with the ones after it, for the next write; so is
        everything if the failure ended the transaction (then a new one is begun for the put).
        Returns (ids deleted, their bytes); their counts go to ``removed``."""
        done: list[int] = []
        nbytes = 0
        got: dict[int, list[int]] = {}
        try:
            for chunk in self._chunks(ids):
                nbytes += self._delete_chunk(db, chunk, got)
                done += chunk
        except sqlite3.Error as e:
            log.debug("queue %s: ack of %d entries not written yet (%s); will retry", self.name, len(ids), e)
            if not db.in_transaction:  # SQLite rolled the whole transaction back (full disk, I/O error)
                db.execute("BEGIN IMMEDIATE")
                return [], 0
        for shard, (n, samples) in got.items():
            r = removed.setdefault(shard, [0, 0])
            r[0] += n
            r[1] += samples
        return done, nbytes

    @staticmethod
    def _chunks(ids: list[int]) -> list[list[int]]:
        return [ids[i : i + 500] for i in range(0, len(ids), 500)]

    def _delete_ids(self, db: sqlite3.Connection, ids: list[int], removed: dict[int, list[int]]) -> int:
        """DELETE the rows; their (entries, samples) per shard added to ``removed``; returns their bytes."""
        return sum(self._delete_chunk(db, chunk, removed) for chunk in self._chunks(ids))

    def _delete_chunk(self, db: sqlite3.Connection, ids: list[int], removed: dict[int, list[int]]) -> int:
        """One DELETE of up to 500 rows; counts added to ``removed`` only once it succeeded. A row held in
        memory is counted from there (it is on file: memory drops a row in the same step as its delete);
        only the others are counted by a SELECT (a row a shard), those not on file not at all."""
        counts: dict[int, list[int]] = {}
        d_bytes = 0
        unknown: list[int] = []
        get = self._recent.get
        for rid in ids:
            e = get(rid)
            if e is None:
                unknown.append(rid)
                continue
            c = counts.get(e.shard)
            if c is None:
                c = counts[e.shard] = [0, 0]
            c[0] += 1
            c[1] += e.samples
            d_bytes += len(e.stored) if e.raw_len is None else e.raw_len
        if unknown:
            for shard, count, samples, nbytes in db.execute(
                    f"SELECT shard, COUNT(*), SUM(samples), SUM({qo.SIZE}) FROM entries "
                    f"WHERE id IN ({','.join('?' * len(unknown))}) GROUP BY shard", unknown).fetchall():
                c = counts.setdefault(shard, [0, 0])
                c[0] += count
                c[1] += samples
                d_bytes += nbytes
        db.execute(f"DELETE FROM entries WHERE id IN ({','.join('?' * len(ids))})", ids)
        self._pages.deleted(d_bytes, sum(c[0] for c in counts.values()))
        for shard, (n, samples) in counts.items():
            r = removed.setdefault(shard, [0, 0])
            r[0] += n
            r[1] += samples
        return d_bytes

    def _flush_delivered(self, db: sqlite3.Connection) -> bool:
        """Write the deletes of acked entries. True if done (or nothing to do)."""
        with self._cond:
            ids = list(self._delivered)
        if not ids:
            return True
        removed: dict[int, list[int]] = {}
        d_bytes = 0
        toggle = self._sync != "NORMAL"  # each PRAGMA is a statement: none when it is NORMAL anyway
        try:
            if toggle:
                db.execute("PRAGMA synchronous=NORMAL")  # losing an ack on a crash only resends
            db.execute("BEGIN IMMEDIATE")
            d_bytes = self._delete_ids(db, ids, removed)
            db.execute("COMMIT")
        except sqlite3.Error as e:
            self._rollback(db)
            log.debug("queue %s: ack of %d entries not written yet (%s); will retry", self.name, len(ids), e)
            return False
        finally:
            if toggle:
                with contextlib.suppress(sqlite3.Error):
                    db.execute(f"PRAGMA synchronous={self._sync}")
        with self._cond:
            self._forget_delivered(ids)
            self._samples -= sum(r[1] for r in removed.values())
            self._bytes -= d_bytes
            self._recent.gone_behind(removed, self._recent.remove(ids))
            self._removed(removed)
        return True

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
        """After a commit: give free pages back, keep the WAL small, refresh the mark. Best effort:
        the data is already committed, so a failure here is not the caller's. ``free_pages``: the
        free pages the commit's transaction last read (saves reading them again)."""
        if free_pages is None and self._pages.free_below(self.plan.vacuum_pages):
            free_pages = self._pages.free  # cannot have reached the count that is given back: not read
        try:
            self._pages.set_free(qo.upkeep(db, self.path, self.plan, self._rlock, free_pages))
        except (sqlite3.Error, OSError) as e:
            log.debug("queue %s: maintenance skipped: %s", self.name, e)
        now = time.monotonic()
        if now - self._mark_at >= _MARK_EVERY_S:
            self._mark_at = now
            self._write_mark()

    def _write_mark(self) -> None:
        with self._cond:
            last, entries, samples = self._last_id, sum(self._entries.values()), self._samples
        qf.write_mark(self.path, last, entries, samples)

    # -- reading ---------------------------------------------------------------------------------
    def peek(self, shard: int, max_samples: int, max_entries: int = 1000, *, after: int = 0,
             upto: int | None = None) -> list[Entry]:
        """Oldest entries of a shard, up to max_samples (always >= 1 entry if any are queued). The
        shard's consumer holds them until acked or its next peek: queue_full never deletes them.

        ``after`` (the id of the last entry the consumer holds): only newer entries, up to
        max_samples and max_entries MORE (none if the next one does not fit), held together with
        those it already holds. A consumer waiting for a fuller batch so reads each entry once.
        ``upto``: only entries with an id up to this one (a shard's part of a drain barrier)."""
        where, args = "shard = ?", [shard]
        if after > 0:
            where, args = where + " AND id > ?", [*args, after]
        if upto is not None:
            where, args = where + " AND id <= ?", [*args, upto]
        return self._read(shard, where, tuple(args), max_samples, max_entries, extend=after > 0, after=after, upto=upto)

    def peek_upto(self, max_id: int, max_samples: int, max_entries: int = 1000) -> list[Entry]:
        """Oldest entries of ANY shard with id <= max_id, in id order: the barrier a change of the
        shard count drains first, so per-series order holds across it (consumer key -1)."""
        return self._read(-1, "id <= ?", (max_id,), max_samples, max_entries)

    def _read(self, key: int, where: str, args: tuple[int, ...], max_samples: int, max_entries: int,
              extend: bool = False, after: int = 0, upto: int | None = None) -> list[Entry]:
        if extend and (max_entries <= 0 or max_samples < 0):
            return []
        with self._cond:
            if self._closed:
                return []
            if key >= 0:
                self._seen_seq[key] = self._put_seq.get(key, 0)
        out: list[Entry] = []
        counts: dict[int, tuple[int, int]] = {}  # as on file (a damaged entry is handed out with none)
        total = 0
        with self._rlock:
            with self._cond:
                rows = self._recent.rows(key) if key >= 0 else None
                if rows is not None:  # every row of the shard is in memory: the same selection, no read
                    delivered = self._delivered
                    for e in rows:
                        if upto is not None and e.id > upto:
                            break
                        if e.id <= after or e.id in delivered:
                            continue
                        if (out or extend) and (total + e.samples > max_samples or len(out) >= max_entries):
                            break
                        out.append(e)
                        total += e.samples
                    self._hold(key, {e.id: (e.shard, e.samples) for e in out}, extend)
                    return out
                skip = set(self._delivered)  # (the file is read outside _cond)
            cur = self._rdb.execute(
                f"SELECT {_PEEK_COLUMNS} FROM entries WHERE {where} ORDER BY id LIMIT ?",
                (*args, max(1, max_entries) + len(skip)))
            for payload, enqueued_at, meta in cur:
                rid, shard, samples, oldest, raw_len, crc = _meta(meta)
                if rid in skip:
                    continue
                if (out or extend) and (total + samples > max_samples or len(out) >= max_entries):
                    break
                out.append(self._entry(rid, shard, payload, raw_len, crc, samples, enqueued_at, oldest))
                counts[rid] = (shard, samples)
                total += samples
            cur.close()
            with self._cond:  # still under the read lock: a trimming commit sees it (see _commit)
                self._hold(key, counts, extend)
        return out

    def _hold(self, key: int, counts: dict[int, tuple[int, int]], extend: bool) -> None:
        """Under _cond: the consumer ``key`` holds these ids (id -> (shard, samples) as counted)."""
        if extend:
            self._held.setdefault(key, {}).update(counts)
        else:
            self._held[key] = counts

    def _entry(self, rid: int, shard: int, stored: bytes, raw_len: int | None, crc: int | None, samples: int,
               enqueued_at: float, oldest: int) -> Entry:
        """The row as stored once its checksum matches (a row from before checksums: decompressed, the
        old check). SQLite has no checksums of its own: a damaged page reads back as garbage."""
        stored = bytes(stored)
        try:
            if crc is None:
                return Entry(rid, shard, queue_codec.unpack(stored, raw_len), samples, enqueued_at, oldest)
            if queue_codec.checksum(stored, raw_len) != crc:
                raise queue_codec.CodecError("checksum mismatch")
            return Entry(rid, shard, stored, samples, enqueued_at, oldest, raw_len)
        except queue_codec.CodecError as e:
            log.error("queue %s: entry %d is damaged (%s); its %d samples are dropped", self.name, rid, e,
                      samples, extra={"destination": self.name, "reason": "queue_damaged"})
            return Entry(rid, shard, b"", 0, enqueued_at, oldest)

    def files_size(self) -> int:
        """Bytes of the db, WAL and shm files: what max_disk bounds from 4 MiB on."""
        return qf.files_size(self.path)

    def oldest_enqueued_at(self) -> float | None:
        with self._rlock:
            if self._closed:
                return None
            row = self._rdb.execute("SELECT enqueued_at FROM entries ORDER BY id LIMIT 1").fetchone()
        return None if row is None else float(row[0])

    def oldest_sample_time(self) -> float | None:
        """Unix time of the oldest sample still queued (enqueue time for entries without one)."""
        with self._rlock:
            if self._closed:
                return None
            row = self._rdb.execute("SELECT MIN(CASE WHEN oldest_ts > 0 THEN oldest_ts / 1000.0 "
                                    "ELSE enqueued_at END) FROM entries").fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            while self._committing:
                self._cond.wait()
        with self._wlock:
            self._flush_delivered(self._wdb)
            with self._cond:
                self._closed = True
                self._recent.clear()
                self._wake_all()
            self._write_mark()
        with self._wlock, self._rlock:
            self._rdb.close()
            self._wdb.close()
