"""Durable per-destination queue: SQLite in WAL mode, sharded FIFOs, bounded by max_disk.

Why SQLite and not append-only segments
    Both give an ordered log; SQLite also gives atomic multi-shard transactions (all shard pieces
    of one incoming request commit together or not at all), crash recovery that is decades old and
    fuzzed, random deletes for ack and for dropping the oldest entries, and a file we can inspect
    with the ``sqlite3`` shell. Segments would need our own framing, checksums, a torn-write
    recovery path and a per-shard read offset index: more code to get wrong for a queue that only
    has to keep up with one Prometheus's remote-write rate (see the report for measured figures).

Durability: ``synchronous=FULL`` (default) vs ``NORMAL``
    In WAL mode NORMAL already survives ``kill -9`` (a committed transaction sits in the WAL in
    the OS page cache), but a kernel panic or power cut may lose the last commits. FULL fsyncs the
    WAL on every commit, so an acknowledged request survives a node crash too. A 2xx tells
    Prometheus it may forget the data, so FULL is the default; ``durability="normal"`` is there
    for disks where fsync is too slow and node crashes are an accepted risk.

Group commit
    The fsync is the cost, not the insert. Concurrent ``put`` calls join a pending list; whichever
    caller finds no commit in progress becomes the leader, writes every pending request in one
    transaction, commits (one fsync) and wakes the others. Under N concurrent writers that is about
    one fsync per round instead of N.

Bounded by max_disk
    The bound applies to queued payload bytes plus a fixed per-entry overhead. A put that would
    exceed it deletes the OLDEST entries (any shard) inside the same transaction and returns their
    samples so the caller can count them as dropped (reason ``queue_full``). Acked and dropped rows
    are deleted; ``auto_vacuum=INCREMENTAL`` gives free pages back to the file system so the file
    tracks the queue instead of its high-water mark. Ids come from AUTOINCREMENT, so an id is never
    reused: a late ``ack`` of a row that was already dropped can never delete a newer row.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ENTRY_OVERHEAD_BYTES = 64  # row header, index entry and page slack per entry, for the max_disk bound
_VACUUM_FREE_PAGES = 1024  # give pages back once this many are free (4 MiB with 4 KiB pages)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    shard INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    enqueued_at REAL NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_shard ON entries (shard, id);
"""


class QueueError(ValueError):
    """A bad argument to the queue; carries the offending value."""

    def __init__(self, message: str, value: object) -> None:
        super().__init__(f"{message}: {value!r}")
        self.value = value


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    shard: int
    payload: bytes
    samples: int
    enqueued_at: float


# (shard, RW1 WriteRequest bytes, samples (float + histogram), oldest sample timestamp ms, 0 if none)
Piece = tuple[int, bytes, int, int]
_AnyPiece = tuple[int, bytes, int] | Piece


class _Pending:
    __slots__ = ("done", "dropped", "error", "pieces")

    def __init__(self, pieces: Sequence[_AnyPiece]) -> None:
        self.pieces = pieces
        self.done = False
        self.dropped = 0
        self.error: BaseException | None = None


class DurableQueue:
    """Sharded FIFO on one SQLite file. Thread-safe; one consumer per shard."""

    def __init__(
        self,
        path: Path,
        max_disk_bytes: int,
        clock: Callable[[], float] = time.time,
        *,
        durability: Literal["full", "normal"] = "full",
    ) -> None:
        if max_disk_bytes <= 0:
            raise QueueError("max_disk_bytes must be positive", max_disk_bytes)
        if durability not in ("full", "normal"):
            raise QueueError("durability must be 'full' or 'normal'", durability)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_disk_bytes = max_disk_bytes
        self._clock = clock
        self._sync = durability.upper()
        self._wdb = self._connect()
        self._rdb = self._connect()
        self._wlock = threading.Lock()  # the write connection
        self._rlock = threading.Lock()  # the read connection
        self._cond = threading.Condition()  # guards everything below
        self._pending: list[_Pending] = []
        self._committing = False
        self._closed = False
        self._samples = 0
        self._bytes = 0
        self._entries: dict[int, int] = {}  # shard -> entries queued
        self._put_seq: dict[int, int] = {}  # shard -> puts so far (1 at open when it has entries)
        self._seen_seq: dict[int, int] = {}  # shard -> _put_seq at its last peek
        for shard, count, samples, nbytes in self._rdb.execute(
            "SELECT shard, COUNT(*), SUM(samples), SUM(LENGTH(payload)) FROM entries GROUP BY shard"
        ):
            self._entries[shard] = count
            self._put_seq[shard] = 1
            self._samples += samples
            self._bytes += nbytes

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # only takes effect on a new file: set first
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self._sync}")
        db.execute("PRAGMA journal_size_limit=67108864")
        db.executescript(_SCHEMA)
        return db

    # -- writing ---------------------------------------------------------------------------------
    def put(self, pieces: Sequence[_AnyPiece]) -> int:
        """Store all pieces (shard, payload, samples) in one transaction; durable on return.

        Returns the samples of the oldest entries deleted to stay under max_disk (0 normally)."""
        for piece in pieces:
            shard, payload, samples = piece[0], piece[1], piece[2]
            if shard < 0 or samples < 0 or not isinstance(payload, bytes | bytearray | memoryview):
                raise QueueError("bad queue piece (shard, payload, samples)", (shard, type(payload), samples))
        if not pieces:
            return 0
        me = _Pending(pieces)
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
        except BaseException as e:
            for p in batch:
                p.error = e
            raise
        finally:
            with self._cond:
                self._committing = False
                for p in batch:
                    p.done = True
                self._cond.notify_all()
        return self._result(me)

    @staticmethod
    def _result(p: _Pending) -> int:
        if p.error is not None:
            raise p.error
        return p.dropped

    def _commit(self, batch: list[_Pending]) -> None:
        """One transaction (one fsync) for every pending put; the leader runs this."""
        now = self._clock()
        added: dict[int, int] = {}
        removed: dict[int, int] = {}
        d_samples = d_bytes = 0
        with self._wlock:
            db = self._wdb
            db.execute("BEGIN IMMEDIATE")
            try:
                for p in batch:
                    for piece in p.pieces:
                        shard, payload, samples = piece[0], piece[1], piece[2]
                        db.execute(
                            "INSERT INTO entries (shard, samples, enqueued_at, payload) VALUES (?, ?, ?, ?)",
                            (shard, samples, now, bytes(payload)),
                        )
                        added[shard] = added.get(shard, 0) + 1
                        d_samples += samples
                        d_bytes += len(payload)
                    rs, rb = self._trim(db, d_samples, d_bytes, removed, added)
                    p.dropped = rs
                    d_samples -= rs
                    d_bytes -= rb
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            with self._cond:
                self._samples += d_samples
                self._bytes += d_bytes
                for shard, n in added.items():
                    self._entries[shard] = self._entries.get(shard, 0) + n - removed.pop(shard, 0)
                    self._put_seq[shard] = self._put_seq.get(shard, 0) + 1
                for shard, n in removed.items():
                    self._entries[shard] = self._entries.get(shard, 0) - n
                self._forget_empty()
                self._cond.notify_all()
            self._maybe_vacuum(db)

    def _trim(
        self,
        db: sqlite3.Connection,
        d_samples: int,
        d_bytes: int,
        removed: dict[int, int],
        added: dict[int, int],
    ) -> tuple[int, int]:
        """Delete oldest entries until the queue fits max_disk. Returns (samples, bytes) freed."""
        with self._cond:
            entries = sum(self._entries.values()) + sum(added.values()) - sum(removed.values())
            used = self._bytes + d_bytes + ENTRY_OVERHEAD_BYTES * entries
        excess = used - self.max_disk_bytes
        freed_samples = freed_bytes = 0
        while excess > 0:
            rows = db.execute(
                "SELECT id, shard, samples, LENGTH(payload) FROM entries ORDER BY id LIMIT 256"
            ).fetchall()
            if not rows:
                break
            cut = []
            for rid, shard, samples, nbytes in rows:
                cut.append(rid)
                removed[shard] = removed.get(shard, 0) + 1
                freed_samples += samples
                freed_bytes += nbytes
                excess -= nbytes + ENTRY_OVERHEAD_BYTES
                if excess <= 0:
                    break
            db.execute(f"DELETE FROM entries WHERE id IN ({','.join('?' * len(cut))})", cut)
        return freed_samples, freed_bytes

    def ack(self, ids: Sequence[int]) -> None:
        """Delete entries (sent, or dropped by the sender). Unknown ids are ignored."""
        if not ids:
            return
        removed: dict[int, int] = {}
        d_samples = d_bytes = 0
        with self._wlock:
            if self._closed:
                return
            db = self._wdb
            db.execute("PRAGMA synchronous=NORMAL")  # losing an ack on a crash only resends
            try:
                db.execute("BEGIN IMMEDIATE")
                for i in range(0, len(ids), 500):
                    chunk = list(ids[i : i + 500])
                    for shard, samples, nbytes in db.execute(
                        f"DELETE FROM entries WHERE id IN ({','.join('?' * len(chunk))}) "
                        "RETURNING shard, samples, LENGTH(payload)",
                        chunk,
                    ).fetchall():
                        removed[shard] = removed.get(shard, 0) + 1
                        d_samples += samples
                        d_bytes += nbytes
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            finally:
                db.execute(f"PRAGMA synchronous={self._sync}")
            with self._cond:
                self._samples -= d_samples
                self._bytes -= d_bytes
                for shard, n in removed.items():
                    self._entries[shard] = self._entries.get(shard, 0) - n
                self._forget_empty()
            self._maybe_vacuum(db)

    def _forget_empty(self) -> None:
        for shard in [s for s, n in self._entries.items() if n <= 0]:
            del self._entries[shard]

    @staticmethod
    def _maybe_vacuum(db: sqlite3.Connection) -> None:
        (free,) = db.execute("PRAGMA freelist_count").fetchone()
        if free >= _VACUUM_FREE_PAGES:
            db.executescript("PRAGMA incremental_vacuum;")  # execute() would step (free) only one page

    # -- reading ---------------------------------------------------------------------------------
    def peek(self, shard: int, max_samples: int, max_entries: int = 1000) -> list[Entry]:
        """Oldest entries of a shard, up to max_samples (always >= 1 entry if any are queued)."""
        with self._cond:
            if self._closed:
                return []
            self._seen_seq[shard] = self._put_seq.get(shard, 0)
        out: list[Entry] = []
        total = 0
        with self._rlock:
            cur = self._rdb.execute(
                "SELECT id, payload, samples, enqueued_at FROM entries WHERE shard = ? ORDER BY id LIMIT ?",
                (shard, max(1, max_entries)),
            )
            for rid, payload, samples, enqueued_at in cur:
                if out and total + samples > max_samples:
                    break
                out.append(Entry(rid, shard, bytes(payload), samples, enqueued_at))
                total += samples
            cur.close()
        return out

    def shards(self) -> list[int]:
        with self._cond:
            return sorted(self._entries)

    def depth(self) -> tuple[int, int]:
        """(samples, payload bytes) queued. Cheap: kept in memory; still answers after close."""
        with self._cond:
            return self._samples, self._bytes

    def oldest_enqueued_at(self) -> float | None:
        with self._rlock:
            if self._closed:
                return None
            row = self._rdb.execute("SELECT enqueued_at FROM entries ORDER BY id LIMIT 1").fetchone()
        return None if row is None else float(row[0])

    def wait(self, shard: int, timeout: float) -> bool:
        """Block until something was put for ``shard`` since its last ``peek`` (True), or timeout or
        close (False). Entries present at open count as put, so a first wait returns at once."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or self._put_seq.get(shard, 0) != self._seen_seq.get(shard, 0),
                timeout,
            ) and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            while self._committing:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()
        with self._wlock, self._rlock:
            self._rdb.close()
            self._wdb.close()
