"""relay.state.memory_trim.PeakTrimmer: one trim after a peak of large requests, none for small ones,
at most one per interval, on a timer (never in the request); and map_large_blocks takes on glibc."""

from __future__ import annotations

import threading

import pytest

from relay.state import memory_trim
from relay.state.memory_trim import PeakTrimmer
from tests.helpers import wait_until

LARGE = 1000


def trimmer(interval: float = 0.0, settle: float = 0.01) -> tuple[PeakTrimmer, list[int]]:
    calls: list[int] = []
    return PeakTrimmer(LARGE, interval, settle_s=settle, trim_fn=lambda: calls.append(1)), calls


@pytest.mark.parametrize(("sizes", "trims"), [
    ([10], 0),  # small as sent, small decoded
    ([LARGE - 1, LARGE - 1], 0),  # just under the size, both times
    ([LARGE], 1),  # large as sent
    ([10, 5 * LARGE], 1),  # small as sent, large once decoded (a snappy bomb)
    ([LARGE, 5 * LARGE], 1),  # large twice: counted once
])
def test_one_request_trims_once_when_it_is_large_at_some_point(sizes: list[int], trims: int) -> None:
    t, calls = trimmer()
    with t.request(sizes[0]) as r:
        for size in sizes[1:]:
            r.saw(size)
    assert wait_until(lambda: not t.pending(), timeout=10.0)
    assert len(calls) == trims and t.trims == trims


def test_no_trim_while_a_large_request_is_in_flight_one_after_the_last() -> None:
    t, calls = trimmer()
    a, b = t.request(LARGE), t.request(LARGE)
    with a:
        pass
    with b:
        assert not t.pending() and calls == []  # a ended, b still in flight: the peak goes on
    assert wait_until(lambda: len(calls) == 1, timeout=10.0)
    assert not t.pending()


def test_a_peak_within_the_interval_is_trimmed_at_its_end_not_before() -> None:
    t, calls = trimmer(interval=0.5)
    with t.request(LARGE):
        pass
    assert wait_until(lambda: len(calls) == 1, timeout=10.0)
    with t.request(LARGE):
        pass
    assert t.pending() and len(calls) == 1  # due at the end of the interval
    assert wait_until(lambda: len(calls) == 2, timeout=10.0)


def test_the_trim_runs_on_a_timer_thread_never_in_the_request() -> None:
    threads: list[threading.Thread] = []
    t = PeakTrimmer(LARGE, 0.0, settle_s=0.01, trim_fn=lambda: threads.append(threading.current_thread()))
    with t.request(LARGE):
        pass
    assert wait_until(lambda: len(threads) == 1, timeout=10.0)
    assert threads[0] is not threading.current_thread()


def test_a_due_trim_waits_for_a_peak_that_began_meanwhile() -> None:
    t, calls = trimmer(settle=0.3)
    with t.request(LARGE):
        pass
    second = t.request(LARGE)  # began before the due trim ran
    with second:
        assert wait_until(lambda: not t.pending(), timeout=10.0)  # the timer fired and stood down
        assert calls == []
    assert wait_until(lambda: len(calls) == 1, timeout=10.0)


def test_an_exception_in_the_request_still_ends_it() -> None:
    t, calls = trimmer()
    with pytest.raises(ValueError), t.request(LARGE):
        raise ValueError("refused")
    assert wait_until(lambda: len(calls) == 1, timeout=10.0)


def test_glibc_takes_the_mmap_threshold_and_trim_reports_a_bool() -> None:
    if memory_trim._TRIM is None:
        pytest.skip("not glibc: nothing to set")
    assert memory_trim.map_large_blocks() is True
    assert isinstance(memory_trim.trim(), bool)


def burst_trimmer(quiet: float, interval: float = 0.0) -> tuple[PeakTrimmer, list[int]]:
    calls: list[int] = []
    return PeakTrimmer(LARGE, interval, settle_s=0.01, volume_bytes=10 * LARGE // 2, quiet_s=quiet,
                       trim_fn=lambda: calls.append(1)), calls


@pytest.mark.parametrize(("sizes", "trims"), [
    ([LARGE // 2] * 9, 0),  # usual-size requests, just under the burst's volume
    ([LARGE // 2] * 10, 1),  # the volume reached: one trim once quiet
    ([LARGE // 2] * 25, 1),  # far past it: still one
])
def test_a_burst_of_usual_requests_is_trimmed_once_when_quiet(sizes: list[int], trims: int) -> None:
    t, calls = burst_trimmer(quiet=0.05)
    for size in sizes:
        with t.request(10) as r:
            r.saw(size)  # counted at its largest (decoded), not as sent
    assert wait_until(lambda: not t.pending(), timeout=10.0)
    assert len(calls) == trims


def test_a_burst_is_not_trimmed_while_requests_keep_coming() -> None:
    t, calls = burst_trimmer(quiet=0.6)
    for _ in range(10):
        with t.request(LARGE // 2):
            pass
    for _ in range(6):  # a request every 0.2 s: never 0.6 s quiet
        threading.Event().wait(0.2)
        with t.request(10):
            pass
        assert calls == []
    assert wait_until(lambda: len(calls) == 1, timeout=10.0)  # then quiet: the trim
    assert not t.pending()


def test_a_burst_trim_stands_down_for_a_request_in_flight() -> None:
    t, calls = burst_trimmer(quiet=0.05)
    for _ in range(10):
        with t.request(LARGE // 2):
            pass
    long = t.request(10)
    with long:
        threading.Event().wait(0.3)  # the quiet time passes with a request in flight
        assert calls == []
    assert wait_until(lambda: len(calls) == 1, timeout=10.0)


def test_after_a_trim_the_volume_counts_again_from_zero() -> None:
    t, calls = burst_trimmer(quiet=0.05)
    for _ in range(10):
        with t.request(LARGE // 2):
            pass
    assert wait_until(lambda: len(calls) == 1, timeout=10.0)
    for _ in range(9):
        with t.request(LARGE // 2):
            pass
    assert wait_until(lambda: not t.pending(), timeout=10.0)
    threading.Event().wait(0.2)
    assert len(calls) == 1  # 9 more: under the volume again
