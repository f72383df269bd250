"""relay.http_conn.DeadlineReader: every read ends by the request's deadline (a little after it at
most, never before it), and the reads of a request that arrives quickly reuse the timeout its first
read set instead of setting it again each time (a syscall each, issue 9). The socket is blocking and
the kernel times the reads out (SO_RCVTIMEO): no poll() and GIL hand-off before each recv (issue 20
point 10); a kernel timeout that passes is a TimeoutError. SocketWriter: a write is sent whole within
its timeout, however slowly the peer reads, or it is a TimeoutError."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from relay.ingest import http_conn
from relay.ingest.http_conn import LATE_S, DeadlineReader, SocketWriter, blocking


class Sock:
    """What DeadlineReader uses of a socket: SO_RCVTIMEO as set (seconds) and reads that return at once."""

    def __init__(self) -> None:
        self.timeout: float | None = None
        self.set: list[float | None] = []
        self.expired = False  # the next read's kernel timeout passes with nothing read

    def setsockopt(self, level: int, opt: int, value: bytes) -> None:
        assert (level, opt) == (socket.SOL_SOCKET, socket.SO_RCVTIMEO)
        sec, usec = struct.unpack("@ll", value)
        self.timeout = sec + usec / 1e6
        self.set.append(self.timeout)

    def recv_into(self, buffer: bytearray) -> int:
        if self.expired:
            raise BlockingIOError(11, "Resource temporarily unavailable")
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
    assert sock.set == [pytest.approx(29.99, abs=1e-5)]


def test_a_timeout_is_never_left_to_end_a_read_before_the_deadline(clock: list[float]) -> None:
    sock = Sock()
    r = DeadlineReader(sock)  # type: ignore[arg-type]
    r.deadline = clock[0] + 5
    r.readinto(bytearray(4))
    r.deadline = clock[0] + 30  # the next request: more time than the timeout the socket holds
    r.readinto(bytearray(4))
    assert sock.set == [pytest.approx(5), pytest.approx(30)]


@pytest.mark.parametrize("left", [30.0, 2.0, 0.3])
def test_a_read_may_outlast_the_deadline_by_a_little_at_most(clock: list[float], left: float) -> None:
    sock = Sock()
    r = DeadlineReader(sock)  # type: ignore[arg-type]
    r.deadline = clock[0] + left
    for _ in range(200):
        r.readinto(bytearray(4))
        remaining = r.deadline - clock[0]
        assert sock.timeout is not None
        assert remaining - 1e-6 <= sock.timeout <= remaining + min(LATE_S, remaining / 10) + 1e-6
        clock[0] += left / 250
    assert 1 < len(sock.set) < 200  # set again only as the deadline came closer


def test_a_read_past_the_deadline_is_a_timeout(clock: list[float]) -> None:
    r = DeadlineReader(Sock())  # type: ignore[arg-type]
    r.deadline = clock[0]
    with pytest.raises(TimeoutError):
        r.readinto(bytearray(4))


def test_a_kernel_timeout_that_passes_is_a_timeout(clock: list[float]) -> None:
    sock = Sock()
    r = DeadlineReader(sock)  # type: ignore[arg-type]
    r.deadline = clock[0] + 5
    sock.expired = True
    with pytest.raises(TimeoutError):
        r.readinto(bytearray(4))


def test_a_silent_peer_on_a_real_socket_times_out_near_the_deadline() -> None:
    a, b = socket.socketpair()
    try:
        blocking(a)
        r = DeadlineReader(a)
        r.deadline = time.monotonic() + 0.3
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            r.readinto(bytearray(4))
        took = time.monotonic() - t0
        assert 0.29 <= took < 0.3 + LATE_S + 2.0, took  # not before the deadline; after it by little (busy machine)
        b.sendall(b"ok")
        r.deadline = time.monotonic() + 5
        buf = bytearray(4)
        assert r.readinto(buf) == 2 and buf[:2] == b"ok"
        assert a.gettimeout() is None  # blocking: CPython polls before each recv of a socket with a timeout
    finally:
        a.close()
        b.close()


def test_a_write_the_peer_does_not_read_ends_at_its_timeout() -> None:
    a, b = socket.socketpair()
    try:
        blocking(a)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        w = SocketWriter(a, timeout=0.5)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"not sent within 0\.5 s"):
            w.write(b"x" * (8 << 20))  # nobody reads b
        assert 0.45 <= time.monotonic() - t0 < 0.5 + 2.0
    finally:
        a.close()
        b.close()


def test_a_write_to_a_peer_that_reads_slowly_is_sent_whole_within_its_timeout() -> None:
    a, b = socket.socketpair()
    size = 1 << 20
    got = bytearray()

    def read_slowly() -> None:
        while len(got) < size and (chunk := b.recv(1 << 16)):
            got.extend(chunk)
            time.sleep(0.002)

    reader = threading.Thread(target=read_slowly)
    try:
        blocking(a)
        reader.start()
        assert SocketWriter(a, timeout=20.0).write(b"y" * size) == size
        reader.join(20)
        assert bytes(got) == b"y" * size
    finally:
        a.close()
        b.close()
