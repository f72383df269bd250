"""The in-memory side of a DurableQueue: counts per shard, put sequence numbers for waiting
consumers, the ids consumers hold and the acks not yet written. One lock guards it all, so
depth, shards and wait never touch SQLite (they answer even after close). Puts and commits wait on
``_cond``; each shard's consumer waits on its own condition over the same lock, woken only by a
commit that added entries to that shard and brought it to the waiter's threshold (or by close), not
by every commit of every shard nor by puts that would not fill its batch."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence


class QueueState:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # guards everything below
        self._shard_cond: dict[int, threading.Condition] = {}  # shard -> its consumer's wake-up, same lock
        self._wants: dict[int, list[tuple[int, int]]] = {}  # shard -> thresholds of the waits under way
        self._closed = False
        self._samples = 0
        self._bytes = 0
        self._entries: dict[int, int] = {}  # shard -> entries queued
        self._shard_samples: dict[int, int] = {}  # shard -> samples queued
        self._put_seq: dict[int, int] = {}  # shard -> puts so far (1 at open when it has entries)
        self._seen_seq: dict[int, int] = {}  # shard -> _put_seq at its last peek
        self._held: dict[int, dict[int, tuple[int, int]]] = {}  # consumer key -> id -> (shard, samples)
        # of the entries handed out and not yet acked
        self._delivered: set[int] = set()  # acked ids whose delete is not written yet
        self._acked: dict[int, tuple[int, int]] = {}  # those of them that were held: id -> (shard, samples)
        self._acked_counts: dict[int, list[int]] = {}  # shard -> [entries, samples] of _acked
        # those of _acked read from the file after their commit but acked before it counted them
        # (id > _last_id): in _acked_counts once it has (_count_early_acks)
        self._acked_early: set[int] = set()
        self._last_id = 0

    def _note_acked(self, ids: Sequence[int]) -> None:
        """Under _cond: ``ids`` are delivered. They leave the shard's backlog now, though their rows
        stay on file (and in the depth) until the delete is written; an id acked twice, or never
        handed out, changes no count."""
        fresh = set(ids).difference(self._delivered)
        if not fresh:
            return
        self._delivered |= fresh
        found: dict[int, tuple[int, int]] = {}
        for held in self._held.values():  # (set operations: no Python loop over what is not held)
            for rid in held.keys() & fresh:
                found[rid] = held.pop(rid)
        for rid, count in found.items():
            self._acked[rid] = count
            if rid > self._last_id:  # its put has not counted it yet: nor is its ack subtracted
                self._acked_early.add(rid)
                continue
            c = self._acked_counts.setdefault(count[0], [0, 0])
            c[0] += 1
            c[1] += count[1]

    def _count_early_acks(self, last_id: int) -> None:
        """Under _cond, as a commit counts its rows (ids up to ``last_id``): the acks of those rows
        that came in before leave the backlog now."""
        for rid in [r for r in self._acked_early if r <= last_id]:
            self._acked_early.discard(rid)
            shard, samples = self._acked[rid]
            c = self._acked_counts.setdefault(shard, [0, 0])
            c[0] += 1
            c[1] += samples

    def _forget_delivered(self, ids: Iterable[int]) -> None:
        """Under _cond: the rows of these delivered ids are deleted from the file (their counts went
        with the delete)."""
        for rid in ids:
            self._delivered.discard(rid)
            count = self._acked.pop(rid, None)
            if count is None:
                continue
            if rid in self._acked_early:  # never counted: nothing to take back
                self._acked_early.discard(rid)
                continue
            c = self._acked_counts[count[0]]
            c[0] -= 1
            c[1] -= count[1]
            if c[0] <= 0:
                del self._acked_counts[count[0]]

    def _waiting(self, shard: int) -> tuple[int, int]:
        """Under _cond: (entries, samples) of a shard not yet delivered."""
        acked = self._acked_counts.get(shard)
        n, s = self._entries.get(shard, 0), self._shard_samples.get(shard, 0)
        return (n, s) if acked is None else (n - acked[0], s - acked[1])

    def _apply_added(self, added: dict[int, list[int]]) -> None:
        """Under _cond: shard -> [entries, samples] committed; wakes the shards' consumers."""
        for shard, (n, s) in added.items():
            self._entries[shard] = self._entries.get(shard, 0) + n
            self._shard_samples[shard] = self._shard_samples.get(shard, 0) + s
            self._put_seq[shard] = self._put_seq.get(shard, 0) + 1
            cond = self._shard_cond.get(shard)
            if cond is not None and any(self._ready(shard, *want) for want in self._wants.get(shard, ())):
                cond.notify_all()

    def _apply_removed(self, removed: dict[int, list[int]]) -> None:
        for shard, (n, s) in removed.items():
            self._entries[shard] = self._entries.get(shard, 0) - n
            self._shard_samples[shard] = self._shard_samples.get(shard, 0) - s
            if self._entries[shard] <= 0:
                self._entries.pop(shard, None)
                self._shard_samples.pop(shard, None)

    def last_id(self) -> int:
        """The newest id committed so far (the barrier for peek_upto)."""
        with self._cond:
            return self._last_id

    def backlog(self, shard: int) -> tuple[int, int]:
        """(entries, samples) queued for a shard and not yet delivered (an acked entry leaves it at
        the ack, before its delete is written)."""
        with self._cond:
            return self._waiting(shard)

    def shards(self) -> list[int]:
        with self._cond:
            return sorted(self._entries)

    def depth(self) -> tuple[int, int]:
        """(samples, payload bytes) queued. Cheap: kept in memory; still answers after close."""
        with self._cond:
            return self._samples, self._bytes

    def wait(self, shard: int, timeout: float, min_samples: int = 0, min_entries: int = 0) -> bool:
        """Block until something was put for ``shard`` since its last ``peek`` (True), or timeout or
        close (False). Entries present at open count as put, so a first wait returns at once.
        ``min_samples`` / ``min_entries``: wake only once the shard holds at least that many samples or
        entries in all (the ones its consumer holds included), so a consumer filling a batch sleeps
        through the puts that would not fill it."""
        with self._cond:
            cond = self._shard_cond.get(shard)
            if cond is None:
                cond = self._shard_cond[shard] = threading.Condition(self._lock)
            want = (min_samples, min_entries)
            wants = self._wants.setdefault(shard, [])
            wants.append(want)  # what a commit checks before waking this wait
            try:
                return cond.wait_for(lambda: self._closed or self._ready(shard, *want), timeout) and not self._closed
            finally:
                wants.remove(want)

    def _ready(self, shard: int, min_samples: int, min_entries: int) -> bool:
        """Under _cond: something was put for ``shard`` since its last peek, and it holds the threshold."""
        if self._put_seq.get(shard, 0) == self._seen_seq.get(shard, 0):
            return False
        entries, samples = self._waiting(shard)
        return samples >= min_samples or (min_entries > 0 and entries >= min_entries)

    def _wake_all(self) -> None:
        """Under _cond: wake every waiter, puts and consumers (close)."""
        self._cond.notify_all()
        for cond in self._shard_cond.values():
            cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
