"""The dict reference's tracker gives back what churn left in its tables: a label's value dict that lost
most of its values at expire is rebuilt (a dict never shrinks on delete), and the per-(metric, slot)
objects no series refers to any more are forgotten at expire; counts are unchanged by either."""

from __future__ import annotations

import sys

import pytest

from relay.state.series_tracker import PySeriesTracker, _sparse_bytes

WINDOW = 600.0
SLOTS = 60
SLOT_S = WINDOW / SLOTS


def labels(i: int) -> tuple[tuple[str, str], ...]:
    return (("__name__", "m"), ("UUID", f"GPU-{i:08d}"), ("job", "gpu"))


def churned(seen: int, kept: int) -> tuple[PySeriesTracker, list[float]]:
    """``seen`` series with a UUID each over one slot; then only the first ``kept`` for a window and
    a half, expired every 6 slots as the daemon does."""
    now = [0.0]
    t = PySeriesTracker(WINDOW, lambda: now[0], slots=SLOTS)
    t.observe_batch([(i + 1, "m") for i in range(seen)], lambda i: labels(i))
    for step in range(int(1.5 * SLOTS)):
        now[0] += SLOT_S
        t.observe_batch([(i + 1, "m") for i in range(kept)], lambda i: labels(i))
        if step % 6 == 5:
            t.expire()
    return t, now


@pytest.mark.parametrize(("seen", "kept"), [
    (20_000, 10),  # most values gone: a table for 20k rebuilt for 10
    (20_000, 1),
    (20_000, 2_000),  # a tenth left
    (20_000, 12_000),  # most left: kept as it is
    (100, 99),  # small
])
def test_a_label_that_lost_most_of_its_values_is_rebuilt(seen: int, kept: int) -> None:
    t, _ = churned(seen, kept)
    values = t._values["m"]["UUID"]
    assert len(values) == kept
    assert sys.getsizeof(values) <= _sparse_bytes(kept)  # not the peak's table
    assert t.top_labels(5, "m") == [("UUID", kept), ("job", 1)]  # the counts are the same
    assert t.active() == kept and t.active_for_metric("m") == kept


def test_a_label_with_no_value_left_is_dropped() -> None:
    t, _ = churned(5_000, 0)
    assert t.active() == 0 and t.top_labels(5) == []
    assert "m" not in t._values


@pytest.mark.parametrize(("seen", "kept"), [(5_000, 10), (5_000, 0), (300, 300)])
def test_only_slots_a_series_refers_to_are_kept(seen: int, kept: int) -> None:
    t, _ = churned(seen, kept)
    used = {id(s) for s in t._series.values()}
    assert all(id(s) in used for s in t._slots.values())
    assert len(t._slots) <= 2  # one metric, labels noted at most twice a window: a slot or two
    assert t.active() == kept


def test_sweeping_when_every_slot_left_keeps_the_counts_exact() -> None:
    now = [0.0]
    t = PySeriesTracker(WINDOW, lambda: now[0], slots=SLOTS)
    t.observe_batch([(i + 1, "m") for i in range(1_000)], lambda i: labels(i))
    now[0] += SLOT_S * 3
    t.observe_batch([(i + 1, "m") for i in range(500)], lambda i: labels(i))  # half refreshed
    now[0] += WINDOW - SLOT_S  # the first slot is out of the window, the refreshed one is not
    assert t.expire() == 500
    assert t.active() == 500 and t.active_for_metric("m") == 500
    assert t.expire() == 0  # nothing more to sweep
    now[0] += SLOT_S * 4
    assert t.expire() == 500 and t.active() == 0 and t.active_for_metric("m") == 0
