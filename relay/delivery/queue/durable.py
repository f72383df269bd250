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

What was lost is known exactly (relay.delivery.queue.losslog)
    Every commit appends what it stored and deleted to ``<name>.mark`` before any put of it
    returns. At open, a file that lost its WAL, was emptied, replaced or damaged is compared with
    it: ``report.lost_entries``/``lost_samples``/``lost_cause`` are exactly the acknowledged rows
    that are gone (one ERROR line; the sender counts gpu_relay_queue_lost_samples_total).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from relay.delivery.queue import files as qf
from relay.delivery.queue import losslog
from relay.delivery.queue import opening as qo
from relay.delivery.queue.commit import QueueCommit
from relay.delivery.queue.files import OpenReport
from relay.delivery.queue.pages import PageBounds
from relay.delivery.queue.recent import RecentRows
from relay.delivery.queue.types import (
    ENTRY_OVERHEAD_BYTES,
    Entry,
    Piece,
    QueueError,
    QueueOpenError,
    RequestTooLargeError,
    StorageError,
)

__all__ = ["ENTRY_OVERHEAD_BYTES", "MEMORY_BYTES", "DurableQueue", "Entry", "Piece", "QueueError",
           "QueueOpenError", "RequestTooLargeError", "StorageError"]

log = logging.getLogger("relay.queue")

# Committed rows kept in memory for peek, at most (stored bytes + overhead). A shard whose rows do
# not all fit is read from the file (about 0.1 ms a row) until its backlog is gone. Issue 9's
# pass-through burst backs a queue up by ~30 MiB of compressed rows: at 8 MiB nine peeks in ten
# read the file and 0.44 s of CPU went on acks' own transactions; at 32 MiB one in eight, and the
# job costs ~8% less CPU for ~20 MiB more peak RSS (still below vmagent's; bench/README).
MEMORY_BYTES = 32 << 20



class DurableQueue(QueueCommit):
    """Sharded FIFO on one SQLite file. Thread-safe; one consumer per shard. Its parts, bottom up:
    relay.delivery.queue.state (counts), store (the file's upkeep), acks, reads, commit (puts)."""

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
        self._pending = []
        self._committing = False
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


    def _open(self, on_damaged: Callable[[OpenReport], None] | None) -> OpenReport:
        report = OpenReport()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replay = losslog.read(self.path)
            self._wdb, self._rdb = qo.open_or_recover(self.path, self._connect, self._clock(),
                                                      self.max_disk_bytes, report, replay.max_id if replay else 0)
            got = qo.load(self._rdb, self._clock(), report)
            self._last_id = qo.check_log(self._wdb, replay, got.last_id, report)
        except (OSError, sqlite3.Error) as e:
            raise QueueOpenError(
                f"destination {self.name!r}: cannot open its queue file {self.path} ({e}); make sure "
                "storage.path is a writable directory with free space", str(self.path)) from None
        self._entries, self._shard_samples = got.entries, got.shard_samples
        self._samples, self._bytes = got.samples, got.nbytes
        self._put_seq = dict.fromkeys(got.entries, 1)
        self._recent = RecentRows(self._memory_bytes, uncached=got.entries)  # rows on file: read from it
        self._pages = PageBounds()
        self._log = losslog.LossLog(self.path)
        self._restart_log()  # what the file holds now is the base
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
            self._log.close()
        with self._wlock, self._rlock:
            self._rdb.close()
            self._wdb.close()
