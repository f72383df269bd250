"""The pipeline's decision cache: raw label bytes -> the stateless decision of that label set.

Bounded by its bytes and evicted incrementally, never cleared at once: two generations;
``wire.route`` looks keys up in the young one, a miss looks in the old one (a hit moves the entry to
the young one) before deciding. When the budget is passed, old-generation entries are popped one by
one; when the old generation is empty, the young one becomes the old one (O(1)). Entries only hold
stateless results, so what is evicted or kept never changes any outcome.

Two implementations of a generation, picked at import: the native ``relay.native._cdcache.DecisionTable``
(relay/native/cdcache.c: no key bytes stored, decisions packed, about 47 bytes per dcgm-like series
instead of ~750; its budget is its real memory, ``nbytes()``), and the reference, a
``dict[bytes, Decision]`` whose bytes are estimated by ``entry_bytes`` (GPU_RELAY_NATIVE=0, or the
extension not built). Both answer ``get``, ``cache[key] = decision``, ``pop``, ``popitem`` and
``len`` the same way for what the pipeline stores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from relay import native
from relay.ingest import wire
from relay.state.stage import POS_SHIFT

_c = native.load("cdcache")

ENTRY_OVERHEAD = 260  # dict slot, key object, decision and input tuples, input id (bench/pipeline_memory_bench)
DEST_OVERHEAD = 120  # per destination that sends or aggregates: tuple, output bytes object, id
DICT_SLOT = 40  # of ENTRY_OVERHEAD, the dict table's share: held by a popped entry until the dict empties


def entry_bytes(key: bytes, decision: wire.Decision) -> int:
    """Estimated memory of one dict entry (the output bytes shared with the key count once)."""
    size = ENTRY_OVERHEAD + len(key)
    for d in decision[1:]:
        if d is not None and d[0]:
            shared = d[0] is key or (d[1] > 0 and d[1] >> POS_SHIFT)
            size += DEST_OVERHEAD + (0 if shared else len(d[0]))
    return size


def _index_size(n: int) -> int:
    """The index size of a native table that grew to ``n`` entries (cdcache.c reserve_one: from 8,
    doubled while ``n`` entries fill over 3/4)."""
    isize = 8
    while n * 4 > isize * 3:
        isize *= 2
    return isize


def resident_entries(start: int, n: int) -> int:
    """Entries whose room a native table that grew to ``start`` entries still holds now that it has
    ``n`` (only removals since): its entry array gives pages back only when the index shrinks
    (cdcache.c maybe_shrink: index under 3/16 full; the array cut to twice the entries left)."""
    if n <= 0:
        return 0
    isize, resident = _index_size(start), start
    while isize > 8:
        at = (isize * 3 - 1) // 16  # the entries left when the next shrink happens
        if n > at:
            break
        while isize > 8 and at * 16 < isize * 3:
            isize //= 2
        resident = min(resident, max(2 * at, 6))
    return resident


def native_table() -> bool:
    """True when the generations are native DecisionTables."""
    return _c is not None


class DecisionCache:
    """Not thread-safe: the pipeline calls it under its lock.

    The budget is what the cache costs in memory, both generations together: a generation's arrays
    give their memory back late (a dict's table when it empties, a native table's entries when its
    index shrinks), so the old generation counts the room it still holds (``resident_entries``). Each
    generation is kept to half the budget: the young one fills to half, while the old one is popped
    in proportion (empty when the young one is full), then they swap."""

    def __init__(self, max_bytes: int, *, table: bool | None = None) -> None:
        """``table``: use the native DecisionTable (default: when it is built and not turned off)."""
        self.max_bytes = max_bytes
        self._table: Any = _c.DecisionTable if (_c is not None and table is not False) else None
        if table and self._table is None:
            raise RuntimeError("relay.native._cdcache is not in use (not built, or GPU_RELAY_NATIVE=0)")
        # what wire.route reads and writes: a dict, or a DecisionTable (the same mapping methods)
        self.young: dict[bytes, wire.Decision] = self._new()
        self._old: dict[bytes, wire.Decision] = self._new()
        self._young_bytes = self._old_bytes = 0  # the dict generations' estimated bytes
        self._old_start = 0  # the old generation's entries when it became old
        self._young_since: float | None = None  # when the young generation began (age())

    def _new(self, width: int = 0) -> dict[bytes, wire.Decision]:
        return {} if self._table is None else cast(dict[bytes, wire.Decision], self._table(width))

    @property
    def native(self) -> bool:
        return self._table is not None

    def _young_cost(self) -> int:
        if self._table is not None:
            return self._nbytes(self.young)
        return self._young_bytes

    def size(self) -> int:
        """What the cache costs in memory: the young generation as it stands, the old one with the
        room its arrays still hold (a dict's table until it empties, a native table's entries until
        its index shrinks)."""
        return self._young_cost() + self._old_real()

    def _old_real(self) -> int:
        n = len(self._old)
        if not n:
            return 0
        if self._table is not None:
            words: int = cast(Any, self._old).words  # cdcache.c: an entry's words in its current layout
            return self._nbytes(self._old) + (resident_entries(self._old_start, n) - n) * words * 8
        return self._old_bytes + (self._old_start - n) * DICT_SLOT

    @staticmethod
    def _nbytes(table: object) -> int:
        return int(cast(Any, table).nbytes())

    def __len__(self) -> int:
        return len(self.young) + len(self._old)

    def miss(self, key: bytes, decide: Callable[[bytes], wire.Decision]) -> wire.Decision:
        """For a key not in ``young``: from the old generation or ``decide``; the caller (wire.route)
        stores the result in ``young``."""
        decision = self._old.pop(key, None)
        if self._table is not None:
            return decide(key) if decision is None else decision
        if decision is None:
            decision = decide(key)
        else:
            self._old_bytes -= entry_bytes(key, decision)
        self._young_bytes += entry_bytes(key, decision)
        return decision

    def evict(self) -> None:
        """Keep the cost within the budget: swap when the young generation reaches half of it, pop
        the old one in proportion to how full the young one is (a few entries a request)."""
        half = self.max_bytes // 2
        young = self._young_cost()
        if len(self._old) > self._old_start:  # generations swapped from outside (tests)
            self._old_start = len(self._old)
        if young >= half and len(self.young):
            self._swap()
            young = 0
        if self._old and young + self._old_real() > self.max_bytes:
            self._drop_old()  # over the budget even so (a zero budget, or lowered by a reload)
        if self._old:
            keep = max(0, self._old_start - self._old_start * young // half) if half else 0
            old = self._old
            while len(old) > keep:
                key, decision = old.popitem()
                if self._table is None:
                    self._old_bytes -= entry_bytes(key, decision)
            if not old:
                self._drop_old()

    def _swap(self) -> None:
        self._drop_old()
        width = cast(Any, self.young).width if self._table is not None else 0
        self._old, self.young = self.young, self._new(width)
        self._old_bytes, self._young_bytes = self._young_bytes, 0
        self._old_start = len(self._old)

    def _drop_old(self) -> None:
        """A fresh old generation: what was left in it is forgotten, its arrays freed."""
        if self._old:
            width = cast(Any, self._old).width if self._table is not None else 0
            self._old = self._new(width)
        self._old_bytes = self._old_start = 0

    def age(self, now: float, horizon_s: float) -> bool:
        """Forget what was not looked up for about two ``horizon_s``: once the young generation is
        ``horizon_s`` old, the old one is dropped and the young one becomes the old one. True when
        a generation was dropped or swapped (memory may be given back)."""
        if self._young_since is None or now < self._young_since:
            self._young_since = now  # first call, or the clock stepped back: start from now
            return False
        if now - self._young_since < horizon_s:
            return False
        self._young_since = now
        changed = bool(self._old) or bool(len(self.young))
        if len(self.young):
            self._swap()
        else:
            self._drop_old()
        return changed
