"""relay.http_conn.DeadlineReader: every read ends by the request's deadline (a little after it at
most, never before it), and the reads of a request that arrives quickly reuse the timeout its first
read set instead of setting it again each time (a syscall and a GIL hand-off each, issue 9)."""

from __future__ import annotations

import pytest

from relay.ingest import http_conn
from relay.ingest.http_conn import LATE_S, DeadlineReader


class Sock:
    """What DeadlineReader uses of a socket: the timeout it holds and reads that return at once."""

    def __init__(self) -> None:
        self.timeout: float | None = None
        self.set: list[float | None] = []

    def gettimeout(self) -> float | None:
        return self.timeout

    def settimeout(self, value: float | None) -> None:
        self.set.append(value)
        self.timeout = value

    def recv_into(self, buffer: bytearray) -> int:
        buffer[:1] = b"x"
        return 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(http_conn.time, "monotonic", lambda: now[0])
    return now


def test_the_reads_of_a_quick_request_set_the_timeout_once(clock: list[float]) -> None:
    sock = Sock()
    r = DeadlineReader(sock)  # type: ignore[arg-type]
    r.deadline = clock[0] + 30
    for _ in range(5):
        clock[0] += 0.01
        assert r.readinto(bytearray(4)) == 1
    assert sock.set == [pytest.approx(29.99)]


def test_a_timeout_is_never_left_to_end_a_read_before_the_deadline(clock: list[float]) -> None:
    sock = Sock()
    r = DeadlineReader(sock)  # type: ignore[arg-type]
    r.deadline = clock[0] + 5
    r.readinto(bytearray(4))
    r.deadline = clock[0] + 30  # the next request: more time than the timeout the socket holds
    r.readinto(bytearray(4))
    assert sock.set == [5, 30]
    sock.timeout = None  # someone made it blocking: a read could outlast any deadline
    r.readinto(bytearray(4))
    assert sock.set == [5, 30, 30]


@pytest.mark.parametrize("left", [30.0, 2.0, 0.3])
def test_a_read_may_outlast_the_deadline_by_a_little_at_most(clock: list[float], left: float) -> None:
    sock = Sock()
    r = DeadlineReader(sock)  # type: ignore[arg-type]
    r.deadline = clock[0] + left
    for _ in range(200):
        r.readinto(bytearray(4))
        remaining = r.deadline - clock[0]
        assert sock.timeout is not None
        assert remaining <= sock.timeout <= remaining + min(LATE_S, remaining / 10) + 1e-9
        clock[0] += left / 250
    assert 1 < len(sock.set) < 200  # set again only as the deadline came closer


def test_a_read_past_the_deadline_is_a_timeout(clock: list[float]) -> None:
    r = DeadlineReader(Sock())  # type: ignore[arg-type]
    r.deadline = clock[0]
    with pytest.raises(TimeoutError):
        r.readinto(bytearray(4))
