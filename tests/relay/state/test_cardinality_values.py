"""Label value statistics at their narrow width (issue 9: 8-byte entries in the C tables).

A value is kept as a 48-bit hash with the slot it was last supplied in mod 2**16; the full slot is
rebuilt from the tracker's base, which a sweep of the values moves forward whenever a slot reaches
the base + 2**16 (expire() not run for that long). The reference and the C tracker do the same
arithmetic; each test runs on both (the C one when relay.native._cstage is in use).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest

from relay import native
from relay.common.labels import Labels
from relay.state import series_tracker
from relay.state.series_tracker import CSeriesTracker, PySeriesTracker, SeriesTracker

IMPLS: list[type[SeriesTracker]] = [PySeriesTracker]
if native.load("cstage") is not None:
    IMPLS.append(CSeriesTracker)

SPAN = 1 << 16


class Clock:
    def __init__(self, t: float = 500.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Hashed:
    """A label value with a chosen hash (equal only to itself)."""

    def __init__(self, h: int) -> None:
        self.h = h

    def __hash__(self) -> int:
        return self.h


def uid(value: object, metric: str = "m") -> Labels:
    return cast(Labels, (("UUID", value), ("__name__", metric)))


@pytest.fixture(params=IMPLS, ids=lambda c: c.__name__)
def make(request: pytest.FixtureRequest) -> Callable[..., SeriesTracker]:
    impl: type[SeriesTracker] = request.param

    def build(clock: Clock, **kw: Any) -> SeriesTracker:
        return impl(60.0, clock, **kw)  # 60 slots of 1 s

    return build


def test_values_whose_hashes_agree_in_their_low_48_bits_count_once(make: Callable[..., SeriesTracker]) -> None:
    t = make(Clock())
    values = [Hashed(5), Hashed(5 + (1 << 48)), Hashed(5 + (1 << 60)),  # one key
              Hashed(0), Hashed(1 << 48), Hashed(-(1 << 48)),  # key 0 (kept aside in C)
              Hashed(-2), Hashed((1 << 48) - 2),  # negative: two's complement, as the C cast
              Hashed(6), Hashed(5 + (1 << 47))]  # two more (bit 47 is kept)
    for i, v in enumerate(values):
        t.observe(i, "m", uid(v))
    assert t.active() == 10
    assert t.top_labels(5) == [("UUID", 5)] and t.top_labels(5, "m") == [("UUID", 5)]


def test_values_colliding_at_48_bits_share_one_entry_against_the_cap(make: Callable[..., SeriesTracker]) -> None:
    t = make(Clock(), max_values=2)
    for i, v in enumerate([Hashed(1), Hashed(1 + (1 << 50)), Hashed(2), Hashed(3), Hashed(0), Hashed(1 << 49)]):
        t.observe(i, "m", uid(v))
    assert t.top_labels(5) == [("UUID", 2)] and t.capped_labels() == [("m", "UUID")]


def test_values_stale_for_2_16_slots_leave_at_the_next_labels_noted_without_expire(
        make: Callable[..., SeriesTracker]) -> None:
    clock = Clock()
    t = make(clock)
    t.observe(1, "m", uid("a"))  # slot 0
    clock.t += SPAN - 36  # slot 65500: still below base + 2**16, nothing swept
    t.observe(2, "m", uid("b"))
    assert t.top_labels(5) == [("UUID", 2)]
    clock.t += 46  # slot 65546: the values are swept first (cutoff 65486: "a" left, "b" stays)
    t.observe(3, "m", uid("c"))
    assert t.top_labels(5) == [("UUID", 2)]
    clock.t += 61  # slot 65607: "b" (65500) and "c" (65546) out of the window
    t.observe(4, "m", uid("a"))
    assert t.top_labels(5) == [("UUID", 3)]  # not swept again: the base moved to 65486
    assert t.expire() == 3 and t.top_labels(5) == [("UUID", 1)]
    assert t.active() == 1 and t.contains(4)


def test_values_supplied_at_the_base_plus_2_16_are_taken_for_new_not_for_the_old_ones(
        make: Callable[..., SeriesTracker]) -> None:
    clock = Clock()
    t = make(clock)
    t.observe(1, "m", uid("a"))  # slot 0
    clock.t += SPAN  # slot 65536, the same mod 2**16: the sweep comes first
    t.observe(2, "m", uid("a"))
    t.observe(3, "m", uid("b"))
    clock.t += 1  # cutoff 65477
    assert t.expire() == 1 and t.top_labels(5) == [("UUID", 2)]
    clock.t += 60  # slot 65597: cutoff 65537
    assert t.expire() == 2 and t.top_labels(5) == [] and t.active() == 0


def test_expire_after_2_16_slots_without_any_sample_still_sees_the_true_slots(
        make: Callable[..., SeriesTracker]) -> None:
    """Ages mod 2**16 would call these 40 and -7 slots old; from the base they are 65576 and 65529."""
    clock = Clock()
    t = make(clock)
    t.observe(1, "m", uid("a"))  # slot 0
    clock.t += 47
    t.observe(2, "m", uid("b"))  # slot 47
    clock.t += SPAN - 7  # slot 65576
    assert t.top_labels(5) == [("UUID", 2)]
    assert t.expire() == 2 and t.top_labels(5) == [] and t.active() == 0
    t.observe(3, "m", uid("a"))
    assert t.top_labels(5) == [("UUID", 1)]


def test_many_spans_of_2_16_slots_with_labels_noted_in_each(make: Callable[..., SeriesTracker]) -> None:
    clock = Clock()
    t = make(clock)
    for k in range(5):
        t.observe(k, "m", uid(f"v{k}"))
        assert t.top_labels(5) == [("UUID", 1)]  # the one before left in the sweep
        clock.t += SPAN + 1000
    assert t.expire() == 5 and t.top_labels(5) == []


def test_more_than_2_15_slots_a_window_are_refused(make: Callable[..., SeriesTracker]) -> None:
    clock = Clock()
    assert make(clock, slots=series_tracker.MAX_SLOTS).active() == 0
    with pytest.raises(ValueError, match="at most 32768"):
        make(clock, slots=series_tracker.MAX_SLOTS + 1)


@pytest.mark.skipif(CSeriesTracker not in IMPLS, reason="relay.native._cstage not in use")
def test_c_label_values_take_8_bytes_an_entry() -> None:
    """100,000 values of one label on one series: the value table grows (x1.25 from 8 past 0.85 load,
    relay/native/cstage/cstage.h) to 120,501 buckets of 8 bytes; every other table is the same as with one value."""
    one, many = CSeriesTracker(60.0, Clock()), CSeriesTracker(60.0, Clock())
    one.observe(1, "m", uid("v"))
    for i in range(100_000):
        many.observe(1, "m", uid(str(i)))
    assert many.top_labels(1) == [("UUID", 100_000)]
    assert many.table_bytes() - one.table_bytes() == (120_501 - 8) * 8
