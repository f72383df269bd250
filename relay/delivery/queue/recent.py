"""Committed queue rows kept in memory, per shard, so that a consumer that keeps up never reads back
what was just written (relay.queue).

A shard is *cached* while memory holds every row the file has for it; only then are its peeks
answered from here. Otherwise memory counts the shard's rows on file that it lacks (``_behind``:
all older than the ones it holds, which are the shard's newest) and keeps taking the shard's new
rows, so that the shard is cached again as soon as those older rows are deleted, without ever
having to drain to empty. Shards with rows on file when the queue is opened start with all of them
behind; a row that does not fit in ``max_bytes`` moves its shard's rows here behind (they are all on
file). Not thread-safe: the queue calls it under its lock, and keeps the order that makes it exact:
a row is added only after its commit, removed in the same step as its delete, before a reader can
see the change, and every delete of the file is reported (``gone_behind``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, ValuesView

from relay.delivery.queue.types import Entry

ROW_OVERHEAD_BYTES = 240  # the Entry object and two dict slots per row (CPython 3.11: ~240 for tiny rows)


class RecentRows:
    def __init__(self, max_bytes: int, uncached: Mapping[int, int] | None = None) -> None:
        self.max_bytes = max(0, max_bytes)
        self._rows: dict[int, dict[int, Entry]] = {}  # shard -> id -> entry, in id order
        self._shard_of: dict[int, int] = {}  # id -> shard, for removals by id
        # shard -> rows of it on file that memory does not hold (all older than those it holds)
        self._behind: dict[int, int] = {s: n for s, n in (uncached or {}).items() if n > 0}
        self.nbytes = 0  # stored bytes + ROW_OVERHEAD_BYTES a row

    def rows(self, shard: int) -> ValuesView[Entry] | None:
        """The shard's rows in id order, or None if they must be read from the file."""
        if not self.max_bytes or shard in self._behind:
            return None
        got = self._rows.get(shard)
        return got.values() if got is not None else _EMPTY

    def get(self, rid: int) -> Entry | None:
        shard = self._shard_of.get(rid)
        return None if shard is None else self._rows[shard][rid]

    def cached(self, shard: int) -> bool:
        return bool(self.max_bytes) and shard not in self._behind

    def add(self, entries: Iterable[Entry]) -> None:
        """Rows just committed, in id order. A shard with rows on file that memory lacks keeps its newest
        rows here too, so that it is cached again as soon as those older ones are gone."""
        if not self.max_bytes:
            return
        for e in entries:
            shard = e.shard
            size = len(e.stored) + ROW_OVERHEAD_BYTES
            if self.nbytes + size > self.max_bytes and not self._make_room(shard, size):
                self._drop(shard)
                self._behind[shard] = self._behind.get(shard, 0) + 1
                continue
            got = self._rows.get(shard)
            if got is None:
                got = self._rows[shard] = {}
            got[e.id] = e
            self._shard_of[e.id] = shard
            self.nbytes += size

    def remove(self, ids: Iterable[int]) -> dict[int, int]:
        """Rows deleted from the file; unknown ids are ignored. Returns the rows removed here, per shard."""
        out: dict[int, int] = {}
        for rid in ids:
            shard = self._shard_of.pop(rid, None)
            if shard is None:
                continue
            got = self._rows[shard]
            e = got.pop(rid)
            self.nbytes -= len(e.stored) + ROW_OVERHEAD_BYTES
            out[shard] = out.get(shard, 0) + 1
            if not got:
                del self._rows[shard]
        return out

    def gone_behind(self, removed: Mapping[int, Sequence[int]], *here: Mapping[int, int]) -> None:
        """Rows deleted from the file per shard (``removed``: shard -> [entries, ...]), those of them
        that memory held (``here``) excepted: the rest were rows memory lacked."""
        for shard, counts in removed.items():
            left = self._behind.get(shard)
            if left is None:
                continue
            left -= counts[0] - sum(h.get(shard, 0) for h in here)
            if left <= 0:
                del self._behind[shard]
            else:
                self._behind[shard] = left

    def drained(self, shard: int) -> None:
        """The file has no row of ``shard`` any more."""
        self._behind.pop(shard, None)

    def clear(self) -> None:
        for shard, got in self._rows.items():
            self._behind[shard] = self._behind.get(shard, 0) + len(got)
        self._rows.clear()
        self._shard_of.clear()
        self.nbytes = 0

    def _make_room(self, shard: int, size: int) -> bool:
        """Room for a row of ``shard``: the rows of shards already read from the file go first, then
        those of the shard holding the most rows (a shard whose destination is down would else
        fill memory and push out the shards that keep up). False: ``shard`` itself is that one."""
        for other in [b for b in self._behind if b != shard and b in self._rows]:
            self._drop(other)
            if self.nbytes + size <= self.max_bytes:
                return True
        while self.nbytes + size > self.max_bytes:
            largest = max(self._rows, key=lambda b: len(self._rows[b]), default=shard)
            if largest == shard:
                return False
            self._drop(largest)
        return True

    def _drop(self, shard: int) -> None:
        got = self._rows.pop(shard, {})
        if got:
            self._behind[shard] = self._behind.get(shard, 0) + len(got)
        for rid, e in got.items():
            del self._shard_of[rid]
            self.nbytes -= len(e.stored) + ROW_OVERHEAD_BYTES


_EMPTY: ValuesView[Entry] = {}.values()
