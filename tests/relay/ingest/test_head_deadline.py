"""The HTTP fronts cut a connection whose whole head has not arrived within ``head_timeout`` (a few
seconds by default; a deadline for the whole head, not each recv), so clients that trickle their
heads cannot hold the connection budget: a real write gets through meanwhile (issue 20 point 17)."""

from __future__ import annotations

import select
import threading
import time

import pytest

from relay.ingest.server import HEAD_TIMEOUT_S, RelayHTTPServer
from tests.relay.ingest.test_write_endpoint_http import WRITE_HEAD, Recorder, connect, status_of

TRICKLERS = 200


class Tricklers:
    """``n`` connections that send their request line one byte every ``every`` seconds, forever."""

    def __init__(self, server: RelayHTTPServer, n: int, every: float = 0.5) -> None:
        self.socks = [connect(server) for _ in range(n)]
        self.closed_at: dict[int, float] = {}
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        line = b"POST /api/v1/write HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
        i = 0
        while not self._stop.is_set():
            for k, sock in enumerate(self.socks):
                if k in self.closed_at:
                    continue
                readable, _, _ = select.select([sock], [], [], 0)
                try:
                    if readable and sock.recv(65536) == b"":
                        raise ConnectionResetError
                    sock.send(line[i : i + 1])
                except OSError:
                    self.closed_at[k] = time.monotonic() - self.started
            i += 1
            self._stop.wait(self._every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.socks:
            sock.close()


def write(server: RelayHTTPServer) -> int:
    with connect(server, timeout=10) as sock:
        sock.sendall(WRITE_HEAD + b"Content-Length: 3\r\n\r\nabc")
        return status_of(sock.recv(65536))


def test_200_trickling_heads_are_cut_and_a_real_write_gets_2xx_meanwhile() -> None:
    server = RelayHTTPServer(("127.0.0.1", 0), Recorder(), max_concurrent=50, max_connections=TRICKLERS,
                             read_timeout=30.0)
    server.start()
    tricklers = None
    try:
        tricklers = Tricklers(server, TRICKLERS)
        time.sleep(0.5)  # every trickler accepted: the connection budget is spent
        assert write(server) == 503
        answered = None
        while time.monotonic() - tricklers.started < 20:  # a sender retrying after Retry-After: 1
            if write(server) == 204:
                answered = time.monotonic() - tricklers.started
                break
            time.sleep(0.5)
        # within the head deadline and headroom for a loaded machine, far inside read_timeout (30 s)
        assert answered is not None and answered < HEAD_TIMEOUT_S + 12
        deadline = time.monotonic() + 10
        while len(tricklers.closed_at) < TRICKLERS and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(tricklers.closed_at) == TRICKLERS
        assert min(tricklers.closed_at.values()) > HEAD_TIMEOUT_S - 1  # cut by the deadline, not at once
    finally:
        if tricklers is not None:
            tricklers.stop()
        server.stop()


@pytest.mark.parametrize(("serve_write", "serve_telemetry"), [(True, False), (False, True)])
def test_each_listener_cuts_a_head_at_head_timeout_not_read_timeout(serve_write: bool, serve_telemetry: bool) -> None:
    server = RelayHTTPServer(("127.0.0.1", 0), Recorder(), serve_write=serve_write, serve_telemetry=serve_telemetry,
                             read_timeout=30.0, head_timeout=0.5)
    server.start()
    tricklers = Tricklers(server, 1, every=0.05)
    try:
        deadline = time.monotonic() + 10
        while not tricklers.closed_at and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.4 < tricklers.closed_at.get(0, 99.0) < 5.0
    finally:
        tricklers.stop()
        server.stop()


def test_a_head_that_arrives_in_time_leaves_the_body_the_rest_of_read_timeout() -> None:
    ep = Recorder()
    server = RelayHTTPServer(("127.0.0.1", 0), ep, read_timeout=30.0, head_timeout=0.5)
    server.start()
    try:
        with connect(server, timeout=10) as sock:
            sock.sendall(WRITE_HEAD + b"Content-Length: 3\r\n\r\na")
            time.sleep(1.0)  # past head_timeout, inside read_timeout: the body may still come
            sock.sendall(b"bc")
            assert status_of(sock.recv(65536)) == 204
        assert [body for _, body in ep.writes] == [b"abc"]
    finally:
        server.stop()


def test_a_kept_alive_connection_gets_a_fresh_head_deadline_for_each_request() -> None:
    server = RelayHTTPServer(("127.0.0.1", 0), Recorder(), read_timeout=30.0, head_timeout=0.5, idle_timeout=10)
    server.start()
    try:
        with connect(server, timeout=10) as sock:
            for _ in range(2):
                sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: relay\r\n\r\n")
                assert status_of(sock.recv(65536)) == 200
                time.sleep(0.8)  # idle between requests longer than head_timeout: not a slow head
    finally:
        server.stop()
