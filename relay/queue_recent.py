"""Committed queue rows kept in memory, per shard, so that a consumer that keeps up never reads back
what was just written (relay.queue).

A shard is *cached* while memory holds every row the file has for it; only then are its peeks
answered from here. It stops being cached when a row of it does not fit in ``max_bytes`` (its rows
here are dropped: they are all on file) and is cached again once the file has no row of it left
(``drained``). Shards with rows on file when the queue is opened start uncached. Not thread-safe:
the queue calls it under its lock, and keeps the order that makes it exact: a row is added only
after its commit, removed in the same step as its delete, before a reader can see the change.
"""

from __future__ import annotations

from collections.abc import Iterable, ValuesView

from relay.queue_types import Entry

ROW_OVERHEAD_BYTES = 200  # the Entry object and the two dict slots, per row (CPython 3.11, 64-bit)


class RecentRows:
    def __init__(self, max_bytes: int, uncached: Iterable[int] = ()) -> None:
        self.max_bytes = max(0, max_bytes)
        self._rows: dict[int, dict[int, Entry]] = {}  # shard -> id -> entry, in id order
        self._shard_of: dict[int, int] = {}  # id -> shard, for removals by id
        self._uncached: set[int] = set(uncached)
        self.nbytes = 0  # stored bytes + ROW_OVERHEAD_BYTES a row

    def rows(self, shard: int) -> ValuesView[Entry] | None:
        """The shard's rows in id order, or None if they must be read from the file."""
        if not self.max_bytes or shard in self._uncached:
            return None
        got = self._rows.get(shard)
        return got.values() if got is not None else _EMPTY

    def get(self, rid: int) -> Entry | None:
        """The row with this id, if it is held here."""
        shard = self._shard_of.get(rid)
        return None if shard is None else self._rows[shard][rid]

    def cached(self, shard: int) -> bool:
        return bool(self.max_bytes) and shard not in self._uncached

    def add(self, entries: Iterable[Entry]) -> None:
        """Rows just committed, in id order. A row of an uncached shard is not kept; one that does not
        fit makes its shard uncached (what it had here is dropped)."""
        for e in entries:
            shard = e.shard
            if shard in self._uncached or not self.max_bytes:
                continue
            size = len(e.stored) + ROW_OVERHEAD_BYTES
            if self.nbytes + size > self.max_bytes:
                self._drop(shard)
                continue
            got = self._rows.get(shard)
            if got is None:
                got = self._rows[shard] = {}
            got[e.id] = e
            self._shard_of[e.id] = shard
            self.nbytes += size

    def remove(self, ids: Iterable[int]) -> None:
        """Rows deleted from the file (acked or trimmed); unknown ids are ignored."""
        for rid in ids:
            shard = self._shard_of.pop(rid, None)
            if shard is None:
                continue
            got = self._rows[shard]
            e = got.pop(rid)
            self.nbytes -= len(e.stored) + ROW_OVERHEAD_BYTES
            if not got:
                del self._rows[shard]

    def drained(self, shard: int) -> None:
        """The file has no row of ``shard`` any more: from now on memory holds all of them."""
        self._uncached.discard(shard)

    def clear(self) -> None:
        self._uncached.update(self._rows)
        self._rows.clear()
        self._shard_of.clear()
        self.nbytes = 0

    def _drop(self, shard: int) -> None:
        self._uncached.add(shard)
        for rid, e in self._rows.pop(shard, {}).items():
            del self._shard_of[rid]
            self.nbytes -= len(e.stored) + ROW_OVERHEAD_BYTES


_EMPTY: ValuesView[Entry] = {}.values()
