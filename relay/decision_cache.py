"""The pipeline's decision cache: raw label bytes -> the stateless decision of that label set.

Bounded by an estimate of its bytes and evicted incrementally, never cleared at once: two
generations; ``wire.route`` looks keys up in the young one, a miss looks in the old one (a hit moves
the entry to the young one) before deciding. When the budget is passed, old-generation entries are
popped one by one; when the old generation is empty, the young one becomes the old one (O(1)).
Entries only hold stateless results, so what is evicted or kept never changes any outcome.
"""

from __future__ import annotations

from collections.abc import Callable

from relay import wire
from relay.stage import POS_SHIFT

ENTRY_OVERHEAD = 260  # dict slot, key object, decision and input tuples, input id (bench/pipeline_memory_bench)
DEST_OVERHEAD = 120  # per destination that sends or aggregates: tuple, output bytes object, id


def entry_bytes(key: bytes, decision: wire.Decision) -> int:
    """Estimated memory of one cached entry (the output bytes shared with the key count once)."""
    size = ENTRY_OVERHEAD + len(key)
    for d in decision[1:]:
        if d is not None and d[0]:
            shared = d[0] is key or (d[1] > 0 and d[1] >> POS_SHIFT)
            size += DEST_OVERHEAD + (0 if shared else len(d[0]))
    return size


class DecisionCache:
    """Not thread-safe: the pipeline calls it under its lock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.young: dict[bytes, wire.Decision] = {}  # what wire.route reads and writes
        self._old: dict[bytes, wire.Decision] = {}
        self._young_bytes = self._old_bytes = 0

    def size(self) -> int:
        return self._young_bytes + self._old_bytes

    def __len__(self) -> int:
        return len(self.young) + len(self._old)

    def miss(self, key: bytes, decide: Callable[[bytes], wire.Decision]) -> wire.Decision:
        """For a key not in ``young``: from the old generation or ``decide``; the caller (wire.route)
        stores the result in ``young``."""
        decision = self._old.pop(key, None)
        if decision is None:
            decision = decide(key)
        else:
            self._old_bytes -= entry_bytes(key, decision)
        self._young_bytes += entry_bytes(key, decision)
        return decision

    def evict(self) -> None:
        while self._young_bytes + self._old_bytes > self.max_bytes:
            if not self._old:
                self._old, self.young = self.young, {}
                self._old_bytes, self._young_bytes = self._young_bytes, 0
                if not self._old:
                    break
            key, decision = self._old.popitem()
            self._old_bytes -= entry_bytes(key, decision)
