"""Opening a queue file and keeping its connections healthy.

Opening: connect, create or upgrade the schema, check it, recover a damaged file, load the
in-memory counts, compare with the loss log (relay.delivery.queue.losslog), and say in ONE log
line what was found and exactly what was lost.
Upkeep: rollback that never masks the real error, vacuum and WAL truncation after commits.

A start never fails because of what is in the file: a damaged file is set aside and what can be
read of it is kept (relay.queue_files). It fails (QueueOpenError, raised by the caller) only when
the file cannot be opened or created at all: a directory that is not writable, a full volume.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from relay.delivery.queue import files as qf
from relay.delivery.queue import losslog
from relay.delivery.queue.files import DiskPlan, OpenReport
from relay.proto import remote_v1_pb2

log = logging.getLogger("relay.queue")

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    shard INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    enqueued_at REAL NOT NULL,
    payload BLOB NOT NULL,
    oldest_ts INTEGER NOT NULL DEFAULT 0,
    raw_len INTEGER,
    crc INTEGER
);
CREATE INDEX IF NOT EXISTS entries_shard ON entries (shard, id);
"""

Connect = Callable[[], sqlite3.Connection]

# Payload format of a row (queue_codec): raw_len NULL, the payload is the RW1 WriteRequest itself
# (every row of a file written before this column existed); raw_len = n, the payload is a snappy
# block of those n bytes. SIZE is a row's payload size as the queue accounts it: the raw bytes.
# crc: queue_codec.checksum(payload, raw_len), checked at peek; NULL in rows from before it existed.
RAW_LEN = "raw_len"
SIZE = "IFNULL(raw_len, LENGTH(payload))"


def connect(path: Path, factory: type[sqlite3.Connection], sync: str, plan: DiskPlan) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0, factory=factory)
    db.execute(f"PRAGMA page_size={qf.PAGE_SIZE}")  # both only take effect on a new file: set first
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA secure_delete=FAST")  # Debian builds default to ON: an ack rewrote every freed page
    db.execute(f"PRAGMA synchronous={sync}")
    db.execute(f"PRAGMA journal_size_limit={plan.wal_bytes // 2}")
    db.execute(f"PRAGMA wal_autocheckpoint={max(16, plan.wal_bytes // 2 // qf.PAGE_SIZE)}")
    return db


def _connections(open_db: Connect, check: bool) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    wdb = open_db()
    try:
        wdb.executescript(SCHEMA)
        cols = {r[1] for r in wdb.execute("PRAGMA table_info(entries)")}
        if "oldest_ts" not in cols:  # a file from before oldest_ts existed
            wdb.execute("ALTER TABLE entries ADD COLUMN oldest_ts INTEGER NOT NULL DEFAULT 0")
        if "raw_len" not in cols:  # a file from before payloads were stored compressed: its rows are raw
            wdb.execute(f"ALTER TABLE entries ADD COLUMN {RAW_LEN} INTEGER")
        if "crc" not in cols:  # a file from before rows had checksums: its rows are checked by decoding
            wdb.execute("ALTER TABLE entries ADD COLUMN crc INTEGER")
        if check:
            (res,) = wdb.execute("PRAGMA quick_check(1)").fetchone()
            if res != "ok":
                raise qf.DamagedError(f"quick_check: {res}")
        return wdb, open_db()
    except BaseException:
        wdb.close()
        raise


def open_or_recover(path: Path, open_db: Connect, now: float, max_disk: int, report: OpenReport,
                    last_id: int = 0) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """(write, read) connections. A damaged file is moved aside, salvaged into a fresh one."""
    existed = path.exists() and path.stat().st_size > 0
    try:
        return _connections(open_db, check=existed)
    except sqlite3.DatabaseError as e:
        if not qf.is_corruption(e):
            raise
        why = " ".join(f"{type(e).__name__}: {e}".split())  # quick_check answers span lines
    moved = qf.move_aside(path, now)
    salvaged = qf.salvage(moved, max_disk, last_id=last_id, header=_fresh_header())
    rows = [r for r in salvaged if intact(r[5])]
    report.damaged, report.moved_to = why, moved
    report.salvaged_entries, report.salvaged_samples = len(rows), sum(r[2] for r in rows)
    wdb, rdb = _connections(open_db, check=False)
    wdb.execute("BEGIN IMMEDIATE")
    wdb.executemany("INSERT INTO entries (id, shard, samples, enqueued_at, oldest_ts, payload) "
                    "VALUES (?, ?, ?, ?, ?, ?)", rows)
    wdb.execute("COMMIT")
    return wdb, rdb


def _fresh_header() -> bytes | None:
    """The first 100 bytes of a new, empty queue file (same pragmas and schema as ours)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ref = Path(tmp) / "ref.db"
            db = connect(ref, sqlite3.Connection, "NORMAL", DiskPlan.for_max_disk(1 << 30))
            db.executescript(SCHEMA)
            db.close()
            return ref.read_bytes()[:100]
    except (OSError, sqlite3.Error):
        return None


def intact(payload: bytes) -> bool:
    """Whether a salvaged payload is still the WriteRequest we wrote (SQLite has no checksums, so a
    garbage page reads back as garbage): it parses, and re-encodes to the same size once unknown
    fields are dropped (we never write any). One bad entry would make the destination refuse the
    whole batch it shares with good ones."""
    wr = remote_v1_pb2.WriteRequest()
    try:
        wr.ParseFromString(payload)
    except Exception:  # protobuf's DecodeError, or anything else a garbage buffer provokes
        return False
    wr.DiscardUnknownFields()
    return wr.ByteSize() == len(payload) and all(ts.labels for ts in wr.timeseries)


@dataclass(slots=True)
class Loaded:
    entries: dict[int, int] = field(default_factory=dict)  # shard -> entries
    shard_samples: dict[int, int] = field(default_factory=dict)
    samples: int = 0
    nbytes: int = 0
    last_id: int = 0


def load(rdb: sqlite3.Connection, now: float, report: OpenReport) -> Loaded:
    out = Loaded()
    for shard, count, samples, nbytes in rdb.execute(
        f"SELECT shard, COUNT(*), SUM(samples), SUM({SIZE}) FROM entries GROUP BY shard"
    ):
        out.entries[shard], out.shard_samples[shard] = count, samples
        out.samples += samples
        out.nbytes += nbytes
    row = rdb.execute("SELECT seq FROM sqlite_sequence WHERE name = 'entries'").fetchone()
    out.last_id = int(row[0]) if row else 0
    report.entries, report.samples = sum(out.entries.values()), out.samples
    oldest = rdb.execute("SELECT enqueued_at FROM entries ORDER BY id LIMIT 1").fetchone()
    report.oldest_age_s = None if oldest is None else max(0.0, now - float(oldest[0]))
    return out


def check_log(wdb: sqlite3.Connection, replay: losslog.Replay | None, last_id: int, report: OpenReport) -> int:
    """Compare what the file holds with what the last run's loss log says it had queued; sets
    ``report.lost_*`` and returns the id to continue from (ids stay above every id ever handed out,
    so a late ack can never hit a new entry)."""
    if replay is None:
        return last_id
    q_entries, q_samples = replay.queued()
    lost: tuple[int, int] | None = None
    if report.damaged:  # what SQLite could still read of the last run's rows was salvaged
        lost, cause = (max(0, q_entries - report.salvaged_entries), max(0, q_samples - report.salvaged_samples)), \
            "damaged"
    elif last_id < replay.max_id:
        if report.entries == 0 and last_id == 0:  # nothing of it left (or a WAL lost before any checkpoint)
            lost, cause = (q_entries, q_samples), "file_emptied"
        elif last_id >= replay.base_last_id:  # an earlier state of the same file: its WAL was lost
            lost, cause = replay.above(last_id), "wal_lost"
        else:  # an older copy of the file: what it holds is taken as what is still queued
            lost, cause = (max(0, q_entries - report.entries), max(0, q_samples - report.samples)), "file_replaced"
        if lost[0] or lost[1]:
            why = {"wal_lost": "its WAL was lost", "file_emptied": "the file was emptied or replaced by an empty one",
                   "file_replaced": "the file was replaced by an older copy"}[cause]
            report.problems.append(f"{lost[0]} entries ({lost[1]} samples) that the last run had stored, up to "
                                   f"entry {replay.max_id}, are missing ({why}): lost")
    if lost is not None and (lost[0] or lost[1] or report.damaged):
        report.lost_entries, report.lost_samples, report.lost_cause = lost[0], lost[1], cause
        if report.damaged:
            report.problems.append(f"the last run had {q_entries} entries ({q_samples} samples) queued: "
                                   f"{lost[0]} entries ({lost[1]} samples) lost")
    if last_id >= replay.max_id:
        return last_id
    wdb.execute("INSERT OR REPLACE INTO sqlite_sequence (rowid, name, seq) VALUES "
                "((SELECT rowid FROM sqlite_sequence WHERE name = 'entries'), 'entries', ?)", (replay.max_id,))
    return replay.max_id


def log_report(name: str, r: OpenReport) -> None:
    """One line: INFO with what was recovered, or ERROR with what was damaged and lost."""
    fields = {"destination": name, "entries": r.entries, "samples": r.samples,
              "oldest_age_s": None if r.oldest_age_s is None else round(r.oldest_age_s, 1)}
    if r.damaged or r.problems:
        what = []
        if r.damaged:
            unknown = "; the rest of the file (amount unknown: no loss log) is lost" if r.lost_entries is None else ""
            what.append(f"file damaged ({r.damaged}), moved to {r.moved_to}; salvaged "
                        f"{r.salvaged_entries} entries ({r.salvaged_samples} samples){unknown}")
        what.extend(r.problems)
        log.error("queue %s: %s; %d entries (%d samples) queued now", name, "; ".join(what), r.entries,
                  r.samples, extra={**fields, "reason": "queue_damaged", "lost_entries": r.lost_entries,
                         "lost_samples": r.lost_samples, "cause": r.lost_cause})
    else:
        log.info("queue %s: recovered %d entries, %d samples, oldest %s", name, r.entries, r.samples,
                 "-" if r.oldest_age_s is None else f"{r.oldest_age_s:.0f}s old", extra=fields)


def rollback(db: sqlite3.Connection) -> bool:
    """Roll back whatever state a failed write left (SQLite may have rolled back by itself).
    Never raises; True if the connection is still stuck in a transaction."""
    for undo in (lambda: db.execute("ROLLBACK"), db.rollback):
        if not db.in_transaction:
            return False
        with contextlib.suppress(sqlite3.Error):
            undo()
    return db.in_transaction


def upkeep(db: sqlite3.Connection, path: Path, plan: DiskPlan, rlock: threading.Lock,
           free: int | None = None) -> int:
    """After a commit: give free pages back to the volume, truncate a WAL past 3/4 of its allowance
    (holding the read lock, so no reader of ours pins it). ``free``: the free pages if known (or an
    upper bound). Returns the free pages after it (0 once given back). Raises sqlite3.Error or OSError."""
    if free is None:
        (free,) = db.execute("PRAGMA freelist_count").fetchone()
    if free >= plan.vacuum_pages:
        db.executescript("PRAGMA incremental_vacuum;")  # execute() would free one page only
        free = 0
    if os.stat(f"{path}-wal").st_size > plan.wal_bytes * 3 // 4:
        with rlock:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return free
