"""exporter.ratelimit: Go's duration syntax and golang.org/x/time/rate's Allow for the web
config's rate_limit (a full bucket of ``burst``, one token back every ``interval``)."""

from __future__ import annotations

import pytest

from exporter.ratelimit import RateLimit, TokenBucket, parse_go_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("1s", 1.0), ("100ms", 0.1), ("1m30s", 90.0), ("1.5h", 5400.0), ("250us", 0.00025),
    ("2µs", 0.000002), ("10ns", 1e-8), ("-1s", -1.0), ("+2s", 2.0), (".5s", 0.5),
])
def test_go_durations_parse(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "1 s", "s", "1d", "1s2", "1.2.3s", "-"])
def test_what_go_refuses_is_refused_with_the_expected_syntax(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_go_duration(text)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_full_bucket_allows_burst_requests_then_refuses_until_a_token_is_back() -> None:
    clock = Clock()
    bucket = TokenBucket(RateLimit(interval_s=1.0, burst=3), clock)
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]
    clock.t += 0.5
    assert bucket.allow() is False  # half a token
    clock.t += 0.5
    assert bucket.allow() is True and bucket.allow() is False
    assert bucket.refused == 3


def test_idle_time_refills_at_most_burst_tokens() -> None:
    clock = Clock()
    bucket = TokenBucket(RateLimit(interval_s=0.1, burst=2), clock)
    assert bucket.allow() and bucket.allow() and not bucket.allow()
    clock.t += 3600.0
    assert [bucket.allow() for _ in range(3)] == [True, True, False]


def test_a_clock_going_backwards_adds_no_tokens() -> None:
    clock = Clock()
    bucket = TokenBucket(RateLimit(interval_s=1.0, burst=1), clock)
    assert bucket.allow() is True
    clock.t -= 50.0
    assert bucket.allow() is False
