"""The queue's files on disk: the disk plan under max_disk, damaged files, and the high-water mark.

Disk plan
    ``max_disk`` bounds what the volume sees: the database file, its WAL and its shared-memory
    index together. Of ``max_disk``, a WAL allowance (1/8, 512 KiB to 4 MiB; SQLite checkpoints at
    half of it and we truncate it past 3/4), the ``-shm`` file and a ``.reserve`` file the size of
    the WAL allowance (given back when the volume is full) are set aside; the
    database may use the rest, counting pages in use plus the free pages kept until the next
    incremental vacuum. Below ``PHYSICAL_MIN_BYTES`` SQLite's own fixed pages would not fit, so
    only the payload bound applies (payload plus ENTRY_OVERHEAD_BYTES per entry).

Damaged files
    A file SQLite calls corrupt (not a database, malformed image, failed ``quick_check``) is moved
    aside as ``<name>.damaged-<UTC time>`` together with its WAL and shm, the rows SQLite can still
    read from it are salvaged (one forward and one backward scan: cheap, and gets everything but
    the damaged pages), and a fresh file takes its place. The relay starts either way.

High-water mark
    ``<name>.mark`` (JSON, replaced atomically, written at most once a second and at close) holds
    the last entry id committed. Ids only grow, so a file whose last id is below the mark lost
    committed entries (its WAL was deleted, or it was replaced or emptied): that is reported, never
    passed in silence. A loss inside the last second before a crash can go unseen.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

PAGE_SIZE = 4096
PHYSICAL_MIN_BYTES = 4 << 20
SHM_BYTES = 64 << 10
_SIDE_FILES = ("-wal", "-shm", ".reserve")
_CORRUPT_CODES = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_CORRUPT_VTAB", "SQLITE_CORRUPT_SEQUENCE",
                            "SQLITE_CORRUPT_INDEX", "SQLITE_IOERR_SHORT_READ"})
_CORRUPT_WORDS = ("malformed", "not a database", "corrupt", "quick_check")

Row = tuple[int, int, int, float, int, bytes]  # id, shard, samples, enqueued_at, oldest_ts, payload


@dataclass(frozen=True, slots=True)
class DiskPlan:
    wal_bytes: int  # WAL allowance. A small WAL keeps the data in the db file, where a delete frees
    # pages for the next put: on a full volume acks still go through and puts recover
    vacuum_pages: int  # give free pages back once this many are free
    db_pages: int | None  # pages the database may hold in use; None: payload bound only
    reserve_bytes: int = 0  # size of <name>.reserve (0: none, below PHYSICAL_MIN_BYTES)

    @staticmethod
    def for_max_disk(max_disk: int) -> DiskPlan:
        if max_disk < PHYSICAL_MIN_BYTES:
            return DiskPlan(4 << 20, 1024, None, 0)
        wal = min(4 << 20, max(512 << 10, max_disk // 8))
        vacuum = max(16, wal // 4 // PAGE_SIZE)
        reserve = wal  # room for a checkpoint to move the whole WAL into the db on a full volume
        return DiskPlan(wal, vacuum, (max_disk - wal - SHM_BYTES - reserve) // PAGE_SIZE - vacuum, reserve)


def make_reserve(path: Path, size: int) -> bool:
    """Create ``<name>.reserve`` (``size`` bytes, allocated): released when the volume is full so
    that a checkpoint can move the WAL into the db and deletes (acks) find room again."""
    target = Path(f"{path}.reserve")
    if size <= 0:
        return False
    if target.exists():
        return True
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            target.unlink()
        return False


def free_bytes(path: Path) -> int:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def release_reserve(path: Path) -> bool:
    """True if there was a reserve to give back."""
    try:
        Path(f"{path}.reserve").unlink()
        return True
    except OSError:
        return False


def files_size(path: Path) -> int:
    """Bytes the queue's files (db, WAL, shm, reserve) take: what max_disk bounds."""
    total = 0
    for p in (path, *(Path(f"{path}{s}") for s in _SIDE_FILES)):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def is_corruption(e: BaseException) -> bool:
    if not isinstance(e, sqlite3.DatabaseError):
        return False
    name = getattr(e, "sqlite_errorname", "") or ""
    return name in _CORRUPT_CODES or any(w in str(e).lower() for w in _CORRUPT_WORDS)


class DamagedError(sqlite3.DatabaseError):
    """quick_check found damage SQLite did not raise on by itself."""


@dataclass(slots=True)
class OpenReport:
    """What opening the queue found; the queue logs it once and the service may show it."""

    entries: int = 0
    samples: int = 0
    oldest_age_s: float | None = None
    damaged: str | None = None  # why the file was set aside
    moved_to: Path | None = None
    salvaged_entries: int = 0
    salvaged_samples: int = 0
    lost_entries: int | None = None  # known lower bound of entries lost (None: unknown)
    problems: list[str] = field(default_factory=list)  # e.g. the mark says entries went missing


def move_aside(path: Path, now: float) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    release_reserve(path)
    for suffix in ("", *_SIDE_FILES):
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.replace(src, Path(f"{target}{suffix}"))
    return target


def salvage(path: Path, max_bytes: int) -> list[Row]:
    """Rows SQLite can still read from a damaged file: a forward scan until the first error, then a
    backward scan down to where the forward one stopped. Never raises; at most max_bytes of payload."""
    rows: dict[int, Row] = {}
    budget = [max_bytes]
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=1.0)
    except sqlite3.Error:
        return []
    try:
        cols = {r[1] for r in db.execute("PRAGMA table_info(entries)")}
        oldest = "oldest_ts" if "oldest_ts" in cols else "0"
        query = f"SELECT id, shard, samples, enqueued_at, {oldest}, payload FROM entries"
        low = _scan(db, query + " ORDER BY id", rows, budget)
        _scan(db, query + f" WHERE id > {low} ORDER BY id DESC", rows, budget)
    except sqlite3.Error:
        pass
    finally:
        db.close()
    return [rows[i] for i in sorted(rows)]


def _scan(db: sqlite3.Connection, query: str, rows: dict[int, Row], budget: list[int]) -> int:
    last = 0
    try:
        for rid, shard, samples, enq, oldest, payload in db.execute(query):
            if not isinstance(payload, bytes) or budget[0] < len(payload):
                return last
            budget[0] -= len(payload)
            rows[int(rid)] = (int(rid), int(shard), int(samples), float(enq), int(oldest), payload)
            last = int(rid)
    except sqlite3.Error:
        pass
    return last


def mark_path(path: Path) -> Path:
    return path.with_name(path.name + ".mark")


def read_mark(path: Path) -> int | None:
    """The last id recorded by the previous run; None if there is no (readable) mark."""
    try:
        data = json.loads(mark_path(path).read_text())
        return int(data["last_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_mark(path: Path, last_id: int, entries: int, samples: int) -> None:
    """Atomic replace; a failure (disk full) is ignored: the mark is a hint, not data."""
    target = mark_path(path)
    tmp = target.with_name(target.name + ".tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps({"last_id": last_id, "entries": entries, "samples": samples}))
        os.replace(tmp, target)
