"""The queue's loss log, ``<name>.mark``: what every commit did, so that a lost WAL, an emptied or a
damaged file is reported as exactly what was lost.

Why beside the file and not in it
    A mark kept in the database would be lost with the WAL it was written to. So every commit that
    stores or deletes rows appends its records here, in one ``write()`` after its COMMIT and before
    the put returns: a put the sender got a 2xx for is always in the log (a kill -9 cannot undo a
    finished write; a power cut can, the file is not fsynced: the database is the data, this is
    the account of it).

Format (text, one record a line)
    ``base <last_id> <entries> <samples>``   first line: the queue as the database file held it
                                           when the log (re)started
    ``+ <id> <samples> <id> <samples> ...``  the rows a commit stored
    ``- <samples> <id> <id> ...``            the rows a commit deleted (acked, trimmed) and their samples

    The log starts again (atomic replace) at open and after a checkpoint that moved every commit
    into the database file, so it holds only what the WAL may hold. At open, ``Replay`` says what
    the last run had queued: ``queued()`` (entries, samples) and ``above(last_id)``: the rows put
    since the base that are still queued with an id above ``last_id``. A database that lost its WAL
    is the state of some earlier commit, at or after the base; every row of the last run with an
    id above the file's last id is what was lost, exactly (rows it holds that were acked since are
    sent again: duplicates, never losses). A trailing line a crash tore is ignored. A ``.mark``
    of the older JSON form (last id and counts, written once a second) is read as a base.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

RESTART_BYTES = 4 << 20  # past this, the log starts again after the next complete checkpoint


def log_path(path: Path) -> Path:
    return path.with_name(path.name + ".mark")


@dataclass(slots=True)
class Replay:
    """What the last run's log says it had queued."""

    base_last_id: int = 0
    base_entries: int = 0
    base_samples: int = 0
    live: dict[int, int] = field(default_factory=dict)  # id -> samples: put since the base, still queued
    base_removed: int = 0  # samples of base rows deleted since (their ids are not in ``live``)
    base_removed_entries: int = 0
    max_id: int = 0

    def queued(self) -> tuple[int, int]:
        """(entries, samples) the last run had queued when it stopped."""
        return (max(0, self.base_entries - self.base_removed_entries) + len(self.live),
                max(0, self.base_samples - self.base_removed) + sum(self.live.values()))

    def above(self, last_id: int) -> tuple[int, int]:
        """(entries, samples) still queued at the end with an id above ``last_id``."""
        rows = [s for rid, s in self.live.items() if rid > last_id]
        return len(rows), sum(rows)

    def _removed(self, samples: int, ids: list[int]) -> None:
        for rid in ids:
            got = self.live.pop(rid, None)
            if got is not None:
                samples -= got
            elif rid <= self.base_last_id:
                self.base_removed_entries += 1
        self.base_removed += max(0, samples)


def read(path: Path) -> Replay | None:
    """The last run's log; None if there is none (or not even its first line can be read)."""
    try:
        text = log_path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if text.startswith("{"):  # the older JSON mark: a base, as exact as it was
        try:
            data = json.loads(text)
            last = int(data["last_id"])
            return Replay(last, int(data.get("entries", 0)), int(data.get("samples", 0)), max_id=last)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
    lines = text.split("\n")
    try:
        kind, *base = lines[0].split()
        if kind != "base":
            return None
        last, entries, samples = (int(v) for v in base)
    except ValueError:
        return None
    out = Replay(last, entries, samples, max_id=last)
    for line in lines[1:]:
        try:
            kind, *values = line.split()
            nums = [int(v) for v in values]
        except ValueError:  # a torn last line, or an empty one
            continue
        if kind == "+" and len(nums) % 2 == 0:
            for rid, samples in zip(nums[::2], nums[1::2], strict=True):
                out.live[rid] = samples
                out.max_id = max(out.max_id, rid)
        elif kind == "-" and nums:
            out._removed(nums[0], nums[1:])
    return out


class LossLog:
    """The running queue's log. Not thread-safe: its writer holds the queue's write lock."""

    def __init__(self, path: Path) -> None:
        self.path = log_path(path)
        self._fd: int | None = None
        self.size = 0

    def restart(self, last_id: int, entries: int, samples: int) -> None:
        """A new log whose base is what the database file holds now (atomic replace). A failure
        (disk full) leaves the old one, still appended to: it only ever says more, never less."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        head = f"base {last_id} {entries} {samples}\n"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            try:
                os.write(fd, head.encode())
                os.replace(tmp, self.path)
            except OSError:
                os.close(fd)
                raise
        except OSError:
            return
        self.close()
        self._fd, self.size = fd, len(head)

    def commit(self, stored: list[tuple[int, int]], deleted: list[int], deleted_samples: int) -> None:
        """One commit's records: rows stored (id, samples) and rows deleted (ids, their samples)."""
        parts = []
        if deleted:
            parts.append(f"- {deleted_samples} {' '.join(map(str, deleted))}\n")
        if stored:
            parts.append("+ " + " ".join(f"{rid} {samples}" for rid, samples in stored) + "\n")
        if parts and self._fd is not None:
            data = "".join(parts).encode()
            with contextlib.suppress(OSError):  # a full volume: the log says less, the file stays right
                self.size += os.write(self._fd, data)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
