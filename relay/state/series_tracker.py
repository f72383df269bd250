"""Active series of one destination and direction: exact counts over a sliding window, from hashes
only (the trackers; ``relay.state.cardinality`` holds the per-destination reports built on them).

Memory model (measured by ``bench/cardinality_bench.py``): one dict entry per active series,
``series_id -> slot``, where the slot is a *shared* object per (metric, time slot), so a series
costs one dict entry (~30-60 bytes, depending on where the table is between resizes) plus its int
key (32-36 bytes). No labels are kept per series.

The window is cut into ``slots`` time slots (default 60: one minute for the 1 h window). A series
seen in slot ``g`` is active until slot ``g + slots`` ends, so it leaves between ``window_s`` and
``window_s + window_s/slots`` after its last sample. ``expire()`` sweeps at C speed (``map``/
``compress`` over the dict) and compacts the table when it shrank by half; it forgets the slots no
series refers to any more, and rebuilds a label's values (below) once they lost most of their entries
(a dict's table never shrinks on delete): after churn, what is left is what the active series need.

Distinct label values are kept apart from series, per metric and label name, as ``hash(value) -> slot
last supplied`` (values are only counted, so a 48-bit hash stands in for the string, and the slot is
kept mod 2**16: see ``_VALUE_MASK``); a value leaves when no series supplied it for the window (at
``expire()``; or, when expire has not run for 2**16 slots, at the next label statistics noted). Two
values of one (metric, label) whose hashes agree in 48 bits count once: about n**2 / 2**49 for n
values, 2e-5 at 100,000. :meth:`SeriesTracker.observe_batch` asks for a series'
labels when it is new and again every half window, so label statistics stay exact for stable
series too, without decoding labels on every occurrence.
At most ``max_values`` values per (metric, label) are tracked; :meth:`capped_labels` names those
that hit the cap (their counts are then lower bounds).

Native (issue 9): ``SeriesTracker(...)`` builds a :class:`CSeriesTracker` when ``relay.native._cstage`` is
built and not turned off (``GPU_RELAY_NATIVE=0``): the same state in C tables (12 bytes a series in
an open addressing table ``id -> shared slot``, 8 bytes a label value), the same results for every
public method. :class:`PySeriesTracker` is always this module's dict reference. Series ids are
64-bit (``0 <= id < 2**64``) in both.
"""

from __future__ import annotations

import collections
import itertools
import operator
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from relay import native
from relay.common.labels import METRIC_NAME, Labels

_VALUE_MASK = (1 << 48) - 1  # label values are kept as 48-bit hashes
# ... with the slot they were last supplied in mod 2**16 (the C table's entry: 8 bytes). A tracker's
# ``_vbase`` is a slot at or below every value's, and every value's is below _vbase + _GEN_SPAN, so the
# full slot is _vbase + ((g - _vbase) mod 2**16): _note_labels sweeps the values out of the window
# first when a slot reaches _vbase + _GEN_SPAN (expire() not run for that long), moving _vbase up.
_GEN_SPAN = 1 << 16
_GEN_MASK = _GEN_SPAN - 1
MAX_SLOTS = 1 << 15  # so that a sweep always brings _vbase within the span


def _sparse_bytes(n: int) -> int:
    """A dict of ``n`` entries holding more than this has lost most of what it once held (a compact
    one takes 30-60 bytes an entry, ~220 at the least: sys.getsizeof), and is rebuilt: a dict's table
    never shrinks on delete, so a label's values would keep their peak's table for good."""
    return 128 * n + 1024


_NATIVE = native.load("cstage")


class _Slot:
    """Shared by every series of one metric last seen in one time slot (identity hash)."""

    __slots__ = ("gen", "lgen", "metric")

    def __init__(self, metric: str, gen: int, lgen: int) -> None:
        self.metric = metric
        self.gen = gen  # slot the series was last seen in
        self.lgen = lgen  # slot its labels were last supplied in (-1: never)


class SeriesTracker:
    """Active series of one destination and direction, keyed by a 64-bit series hash.

    This class is the dict reference; constructing it gives the C twin :class:`CSeriesTracker`
    where the native core is in use."""

    def __new__(cls, *args: Any, **kwargs: Any) -> SeriesTracker:
        if cls is SeriesTracker and _NATIVE is not None:
            cls = CSeriesTracker
        return super().__new__(cls)

    def __init__(self, window_s: float = 3600.0, clock: Callable[[], float] = time.monotonic, *,
                 slots: int = 60, max_values: int = 100_000) -> None:
        if window_s <= 0 or slots <= 0:
            raise ValueError(f"window_s and slots must be positive, got {window_s}, {slots}")
        if slots > MAX_SLOTS:
            raise ValueError(f"slots must be at most {MAX_SLOTS}, got {slots}")
        self.window_s = window_s
        self._clock = clock
        self._slot_s = window_s / slots
        self._wslots = slots
        self._t0 = clock()
        self._max_values = max_values
        self._series: dict[int, _Slot] = {}
        self._peak = 0
        self._slots: dict[tuple[str, int, int], _Slot] = {}
        self._per_metric: dict[str, int] = {}
        # metric -> label name -> hash of a value -> slot last supplied, mod 2**16
        self._values: dict[str, dict[str, dict[int, int]]] = {}
        self._vbase = 0

    def _gen(self) -> int:
        return int((self._clock() - self._t0) // self._slot_s)

    def _slot(self, metric: str, gen: int, lgen: int) -> _Slot:
        key = (metric, gen, lgen)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(metric, gen, lgen)
        return slot

    def observe(self, series_id: int, metric: str, labels: Labels | None = None) -> bool:
        """Mark the series seen now; True if it was not active. ``labels`` feed the label statistics."""
        gen = self._gen()
        slot = self._series.get(series_id)
        if slot is not None:
            if gen - slot.gen <= self._wslots:
                if labels is None:
                    if slot.gen != gen:
                        self._series[series_id] = self._slot(slot.metric, gen, slot.lgen)
                    return False
                self._note_labels(slot.metric, labels, gen)
                self._series[series_id] = self._slot(slot.metric, gen, gen)
                return False
            self._forget(series_id, slot)  # out of the window but not swept yet: it is new again
        self._per_metric[metric] = self._per_metric.get(metric, 0) + 1
        lgen = -1
        if labels is not None:
            self._note_labels(metric, labels, gen)
            lgen = gen
        self._series[series_id] = self._slot(metric, gen, lgen)
        if len(self._series) > self._peak:
            self._peak = len(self._series)
        return True

    def observe_batch(self, items: Sequence[tuple[int, str]], labels_of: Callable[[int], Labels]) -> list[int]:
        """``observe`` for a request's worth of series, one clock read for all. ``labels_of(i)`` gives
        item i's labels; it is called only for series that are new or whose labels are due again (half
        a window), so label statistics stay exact without decoding every occurrence. Returns the
        indexes of the items that were not active (first sight in the window)."""
        gen = self._gen()
        series = self._series
        wslots = self._wslots
        due = wslots // 2
        new: list[int] = []
        for i, (series_id, metric) in enumerate(items):
            slot = series.get(series_id)
            if slot is not None:
                if slot.gen == gen:
                    continue  # the common case: already seen in this slot
                if gen - slot.gen <= wslots:
                    if slot.lgen >= 0 and gen - slot.lgen < due:
                        series[series_id] = self._slot(slot.metric, gen, slot.lgen)
                    else:
                        self._note_labels(slot.metric, labels_of(i), gen)
                        series[series_id] = self._slot(slot.metric, gen, gen)
                    continue
                self._forget(series_id, slot)  # out of the window but not swept yet: new again
            new.append(i)
            self._per_metric[metric] = self._per_metric.get(metric, 0) + 1
            self._note_labels(metric, labels_of(i), gen)
            series[series_id] = self._slot(metric, gen, gen)
        if len(series) > self._peak:
            self._peak = len(series)
        return new

    def observe_inputs(self, inputs: Sequence[tuple[tuple[bytes, int, str], Any, Any, Any]],
                       labels_of: Callable[[bytes], Labels]) -> list[int]:
        """``observe_batch`` of a request's input entries (``wire.route``'s ``per_dest[0]``: each
        ``((key, id, metric), rest, n, ts)``); ``labels_of(key)`` gives a series' labels."""
        return self.observe_batch([(e[0][1], e[0][2]) for e in inputs], lambda i: labels_of(inputs[i][0][0]))

    def has(self) -> Callable[[int], bool]:
        """Membership test over the series kept (active, or expired but not swept yet), at C speed."""
        return self._series.__contains__

    def observe_many(self, items: list[tuple[int, str]]) -> None:
        """``observe`` for a request's worth of series (no labels): one clock read for all."""
        gen = self._gen()
        series = self._series
        wslots = self._wslots
        for series_id, metric in items:
            slot = series.get(series_id)
            if slot is not None and slot.gen == gen:
                continue  # the common case: already seen in this slot
            if slot is not None and gen - slot.gen <= wslots:
                series[series_id] = self._slot(slot.metric, gen, slot.lgen)
            else:
                self.observe(series_id, metric)

    def _forget(self, series_id: int, slot: _Slot) -> None:
        del self._series[series_id]
        self._decrement(slot.metric, 1)

    def _decrement(self, metric: str, n: int) -> None:
        left = self._per_metric.get(metric, 0) - n
        if left > 0:
            self._per_metric[metric] = left
        else:
            self._per_metric.pop(metric, None)

    def _note_labels(self, metric: str, labels: Labels, gen: int) -> None:
        if gen - self._vbase >= _GEN_SPAN:
            self._expire_values(gen - self._wslots)
        per_name = self._values.get(metric)
        if per_name is None:
            per_name = self._values[metric] = {}
        cap = self._max_values
        for name, value in labels:
            if name == METRIC_NAME:
                continue
            values = per_name.get(name)
            if values is None:
                values = per_name[name] = {}
            key = hash(value) & _VALUE_MASK  # counted, never shown: a hash costs less than the string
            if key in values or len(values) < cap:
                values[key] = gen & _GEN_MASK

    def wants_labels(self, series_id: int) -> bool:
        """True when the series is unknown or its labels were last supplied over half a window ago."""
        slot = self._series.get(series_id)
        return slot is None or slot.lgen < 0 or self._gen() - slot.lgen >= self._wslots // 2

    def contains(self, series_id: int) -> bool:
        slot = self._series.get(series_id)
        return slot is not None and self._gen() - slot.gen <= self._wslots

    def active(self) -> int:
        return len(self._series)

    def active_for_metric(self, metric: str) -> int:
        return self._per_metric.get(metric, 0)

    def top_metrics(self, n: int) -> list[tuple[str, int]]:
        return sorted(self._per_metric.items(), key=lambda kv: (-kv[1], kv[0]))[:max(n, 0)]

    def top_labels(self, n: int, metric: str | None = None) -> list[tuple[str, int]]:
        """Label names by distinct values among series active in the window (all metrics by default)."""
        counts: dict[str, int]
        if metric is not None:
            counts = {name: len(v) for name, v in self._values.get(metric, {}).items() if v}
        else:
            union: dict[str, set[int]] = {}
            for per_name in self._values.values():
                for name, values in per_name.items():
                    union.setdefault(name, set()).update(values)
            counts = {name: len(v) for name, v in union.items() if v}
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max(n, 0)]

    def capped_labels(self) -> list[tuple[str, str]]:
        """(metric, label) pairs whose distinct values reached ``max_values`` (counts are lower bounds)."""
        return sorted((m, name) for m, per_name in self._values.items()
                      for name, values in per_name.items() if len(values) >= self._max_values)

    def expire(self) -> int:
        """Drop series (and label values) unseen for the window; returns how many series left."""
        cutoff = self._gen() - self._wslots  # slots strictly before this are out of the window
        self._expire_values(cutoff)
        series = self._series
        # a slot is only handed out for the current time slot, so one no series refers to is never
        # asked for again: kept, it would outlive its series by up to a window (small objects per
        # metric and time slot, which keep heap arenas from going back after churn)
        used = set(series.values())
        self._slots = {k: s for k, s in self._slots.items() if s in used and s.gen >= cutoff}
        dead = {s for s in used if s.gen < cutoff}
        if not dead:
            return 0
        per_slot = collections.Counter(filter(dead.__contains__, series.values()))
        n_dead = sum(per_slot.values())
        if n_dead * 2 > len(series):  # mostly dead: copying the survivors is cheaper, and compacts
            alive = list(map(dead.__contains__, series.values()))
            alive = list(map(operator.not_, alive))
            self._series = dict(zip(itertools.compress(series.keys(), alive),
                                    itertools.compress(series.values(), alive), strict=False))
            self._peak = len(self._series)
        else:
            gone = list(itertools.compress(series.keys(), map(dead.__contains__, series.values())))
            collections.deque(map(series.__delitem__, gone), maxlen=0)
            if len(series) < self._peak // 2:  # dicts never shrink on delete: rebuild to give memory back
                self._series = dict(series)
                self._peak = len(self._series)
        for slot, n in per_slot.items():
            self._decrement(slot.metric, n)
        return n_dead

    def _expire_values(self, cutoff: int) -> None:
        base = self._vbase
        for metric in list(self._values):
            per_name = self._values[metric]
            for name in list(per_name):
                values = per_name[name]
                stale = [v for v, g in values.items() if base + ((g - base) & _GEN_MASK) < cutoff]
                if len(stale) == len(values):
                    del per_name[name]
                    continue
                for v in stale:
                    del values[v]
                if stale and sys.getsizeof(values) > _sparse_bytes(len(values)):
                    per_name[name] = dict(values)  # a compact copy
            if not per_name:
                del self._values[metric]
        self._vbase = max(base, cutoff)


class PySeriesTracker(SeriesTracker):
    """The dict reference, whatever the native switch says (differential tests)."""


class CSeriesTracker(SeriesTracker):
    """:class:`SeriesTracker` with its state in ``relay.native._cstage.Tracker`` (C tables); this wrapper
    reads the clock and hands the time slot in. Same results as the reference for every method."""

    def __init__(self, window_s: float = 3600.0, clock: Callable[[], float] = time.monotonic, *,
                 slots: int = 60, max_values: int = 100_000) -> None:
        super().__init__(window_s, clock, slots=slots, max_values=max_values)
        if _NATIVE is None:
            raise RuntimeError("relay.native._cstage is not in use (not built, or GPU_RELAY_NATIVE=0)")
        self._t: Any = _NATIVE.Tracker(slots, max_values)

    def observe(self, series_id: int, metric: str, labels: Labels | None = None) -> bool:
        return bool(self._t.observe(series_id, metric, labels, self._gen()))

    def observe_batch(self, items: Sequence[tuple[int, str]], labels_of: Callable[[int], Labels]) -> list[int]:
        new: list[int] = self._t.observe_batch(items, labels_of, self._gen())
        return new

    def observe_inputs(self, inputs: Sequence[tuple[tuple[bytes, int, str], Any, Any, Any]],
                       labels_of: Callable[[bytes], Labels]) -> list[int]:
        new: list[int] = self._t.observe_inputs(inputs, labels_of, self._gen())
        return new

    def has(self) -> Callable[[int], bool]:
        has: Callable[[int], bool] = self._t.has
        return has

    def observe_many(self, items: list[tuple[int, str]]) -> None:
        self._t.observe_many(items, self._gen())

    def wants_labels(self, series_id: int) -> bool:
        slot = self._t.lookup(series_id)
        return slot is None or slot[2] < 0 or self._gen() - slot[2] >= self._wslots // 2

    def contains(self, series_id: int) -> bool:
        return bool(self._t.contains(series_id, self._gen()))

    def active(self) -> int:
        return len(self._t)

    def active_for_metric(self, metric: str) -> int:
        n: int = self._t.metric_count(metric)
        return n

    def top_metrics(self, n: int) -> list[tuple[str, int]]:
        return sorted(self._t.metric_counts(), key=lambda kv: (-kv[1], kv[0]))[:max(n, 0)]

    def top_labels(self, n: int, metric: str | None = None) -> list[tuple[str, int]]:
        counts: dict[str, int]
        if metric is not None:
            counts = {name: c for m, name, c in self._t.pairs() if c and m == metric}
        else:
            counts = self._t.label_union()
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max(n, 0)]

    def capped_labels(self) -> list[tuple[str, str]]:
        return sorted((m, name) for m, name, c in self._t.pairs() if c >= self._max_values)

    def expire(self) -> int:
        n: int = self._t.expire(self._gen() - self._wslots)
        return n

    def table_bytes(self) -> int:
        """Bytes held by the C tables (bench/pipeline_memory_bench.py)."""
        n: int = self._t.memory()
        return n
