"""The pipeline's decision cache: raw label bytes -> the stateless decision of that label set.

Bounded by its bytes and evicted incrementally, never cleared at once: two generations;
``wire.route`` looks keys up in the young one, a miss looks in the old one (a hit moves the entry to
the young one) before deciding. When the budget is passed, old-generation entries are popped one by
one; when the old generation is empty, the young one becomes the old one (O(1)). Entries only hold
stateless results, so what is evicted or kept never changes any outcome.

Two implementations of a generation, picked at import: the native ``relay.native._cdcache.DecisionTable``
(relay/native/cdcache.c: no key bytes stored, decisions packed, about 60 bytes per dcgm-like series
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


def entry_bytes(key: bytes, decision: wire.Decision) -> int:
    """Estimated memory of one dict entry (the output bytes shared with the key count once)."""
    size = ENTRY_OVERHEAD + len(key)
    for d in decision[1:]:
        if d is not None and d[0]:
            shared = d[0] is key or (d[1] > 0 and d[1] >> POS_SHIFT)
            size += DEST_OVERHEAD + (0 if shared else len(d[0]))
    return size


def native_table() -> bool:
    """True when the generations are native DecisionTables."""
    return _c is not None


class DecisionCache:
    """Not thread-safe: the pipeline calls it under its lock."""

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

    def _new(self, width: int = 0) -> dict[bytes, wire.Decision]:
        return {} if self._table is None else cast(dict[bytes, wire.Decision], self._table(width))

    @property
    def native(self) -> bool:
        return self._table is not None

    def size(self) -> int:
        if self._table is not None:
            return int(self._nbytes(self.young) + self._nbytes(self._old))
        return self._young_bytes + self._old_bytes

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
        if self._table is not None:
            self._evict_tables()
            return
        while self._young_bytes + self._old_bytes > self.max_bytes:
            if not self._old:
                self._old, self.young = self.young, {}
                self._old_bytes, self._young_bytes = self._young_bytes, 0
                if not self._old:
                    break
            key, decision = self._old.popitem()
            self._old_bytes -= entry_bytes(key, decision)

    def _evict_tables(self) -> None:
        nbytes = self._nbytes
        young = nbytes(self.young)
        old = nbytes(self._old)
        while young + old > self.max_bytes:
            if not self._old:
                width = cast(Any, self.young).width
                self._old, self.young = self.young, self._new(width)
                old, young = young, 0
                if not self._old:
                    break
            self._old.popitem()
            old = nbytes(self._old)
