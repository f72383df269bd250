"""The queue's files on disk: the disk plan under max_disk, damaged files (the loss log beside
them is relay.delivery.queue.losslog).

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

Loss log
    ``<name>.mark`` (relay.delivery.queue.losslog) is appended with what every commit stored and
    deleted. Ids only grow, so a file whose last id is below the log's lost committed entries (its
    WAL was deleted, or it was replaced or emptied): exactly which is reported, never passed in
    silence.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.delivery.queue import codec as queue_codec

PAGE_SIZE = 4096
_MAGIC = b"SQLite format 3\0"
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
    lost_entries: int | None = None  # entries the last run had acknowledged that are gone (None: unknown)
    lost_samples: int | None = None  # their samples (gpu_relay_queue_lost_samples_total)
    lost_cause: str = ""  # "wal_lost", "file_emptied", "file_replaced" or "damaged"
    problems: list[str] = field(default_factory=list)  # e.g. the loss log says entries went missing


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


def salvage(path: Path, max_bytes: int, last_id: int = 0, budget_s: float = 2.0,
            header: bytes | None = None) -> list[Row]:
    """Rows SQLite can still read from a damaged file: a forward scan until the first error, then a
    backward scan down to where the forward one stopped; if either broke off, each missing id up to
    ``last_id`` is looked up alone, newest first, for at most ``budget_s`` seconds (a lookup only
    needs the pages on its own path). ``header``: the first 100 bytes of a fresh queue file, put
    back (with this file's page count) when its own were overwritten. Never raises; at most
    max_bytes of payload."""
    rows: dict[int, Row] = {}
    budget = [max_bytes]
    if header is not None:
        _restore_header(path, header)
    _pad_to_header_size(path)
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=1.0)
    except sqlite3.Error:
        return []
    try:
        cols = {r[1] for r in db.execute("PRAGMA table_info(entries)")}
        oldest = "oldest_ts" if "oldest_ts" in cols else "0"
        raw_len = "raw_len" if "raw_len" in cols else "NULL"
        db.create_function("unpacked", 2, unpacked_or_garbage, deterministic=True)
        query = f"SELECT id, shard, samples, enqueued_at, {oldest}, unpacked(payload, {raw_len}) FROM entries"
        low, ok_fwd = _scan(db, query + " ORDER BY id", rows, budget)
        _, ok_back = _scan(db, query + f" WHERE id > {low} ORDER BY id DESC", rows, budget)
        if not (ok_fwd and ok_back):
            _probe(db, query + " WHERE id = ?", rows, budget, max(last_id, max(rows, default=0)), budget_s)
    except sqlite3.Error:
        pass
    finally:
        db.close()
    return [rows[i] for i in sorted(rows)]


def unpacked_or_garbage(payload: object, raw_len: object) -> bytes | None:
    """A salvaged row's payload as raw WriteRequest bytes (queue_codec); one that does not unpack
    comes back as bytes no WriteRequest check accepts, so the salvage drops it and goes on."""
    if not isinstance(payload, bytes):
        return None
    try:
        return queue_codec.unpack(payload, raw_len if isinstance(raw_len, int) else None)
    except queue_codec.CodecError:
        return b"\xff"


def _restore_header(path: Path, header: bytes) -> None:
    """A queue file whose header is gone (zeroed, overwritten) but whose size is whole pages: every
    queue file has the same header but for its page count and change counter, so write those."""
    with contextlib.suppress(OSError):
        size = path.stat().st_size
        with path.open("r+b") as f:
            if f.read(16) == _MAGIC or size < 2 * PAGE_SIZE or size % PAGE_SIZE:
                return
            fixed = bytearray(header[:100])
            fixed[24:28] = fixed[92:96] = (1).to_bytes(4, "big")  # change counter == version-valid-for
            fixed[28:32] = (size // PAGE_SIZE).to_bytes(4, "big")
            f.seek(0)
            f.write(bytes(fixed))


def _pad_to_header_size(path: Path) -> None:
    """A truncated file is unreadable as a whole ("malformed" on every query); zero-fill the set-aside
    copy up to the page count its header declares, so the pages still there can be read."""
    with contextlib.suppress(OSError, ValueError):
        with path.open("rb") as f:
            header = f.read(100)
        if len(header) < 100 or not header.startswith(_MAGIC):
            return
        page = int.from_bytes(header[16:18], "big") or 65536
        pages = int.from_bytes(header[28:32], "big")
        want = page * pages
        if path.stat().st_size < want <= 1 << 40:
            os.truncate(path, want)


def _keep(row: tuple[Any, ...], rows: dict[int, Row], budget: list[int]) -> bool:
    """Keep a salvaged row if it is well-formed and fits the budget; False stops the salvage."""
    rid, shard, samples, enq, oldest, payload = row
    if not isinstance(payload, bytes) or budget[0] < len(payload):
        return False
    budget[0] -= len(payload)
    rows[int(rid)] = (int(rid), int(shard), int(samples), float(enq), int(oldest), payload)
    return True


def _scan(db: sqlite3.Connection, query: str, rows: dict[int, Row], budget: list[int]) -> tuple[int, bool]:
    """(last id read, True if the scan reached the end without an error)."""
    last = 0
    try:
        for row in db.execute(query):
            if not _keep(row, rows, budget):
                return last, True
            last = int(row[0])
    except sqlite3.Error:
        return last, False
    return last, True


def _probe(db: sqlite3.Connection, query: str, rows: dict[int, Row], budget: list[int], hi: int,
           budget_s: float) -> None:
    deadline = time.monotonic() + budget_s
    for rid in range(hi, 0, -1):
        if rid in rows:
            continue
        if time.monotonic() > deadline:
            return
        try:
            row = db.execute(query, (rid,)).fetchone()
        except sqlite3.Error:
            continue
        if row is not None and not _keep(row, rows, budget):
            return
