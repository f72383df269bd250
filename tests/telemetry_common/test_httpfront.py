"""The HTTP front: a slow or oversized request head cannot hold a thread, keep-alive works, and the
listen backlog is deep."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from telemetry_common.httpfront import FrontServer, Handler, Reply, parse_listen


class Echo(Handler):
    def answer(self, method: str) -> Reply:
        return Reply(200, f"{method} {self.path}\n".encode())


@pytest.fixture()
def server() -> Iterator[FrontServer]:
    srv = FrontServer(("127.0.0.1", 0), Echo, max_head_bytes=4096, head_timeout=1.0, idle_timeout=1.0)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _recv_all(s: socket.socket, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        out += chunk
    return out


def test_keep_alive_serves_several_requests(server: FrontServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for i in range(3):
        conn.request("GET", f"/x{i}")
        resp = conn.getresponse()
        assert resp.read() == f"GET /x{i}\n".encode()
    conn.close()


def test_a_head_over_the_cap_is_431(server: FrontServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 500)
                                                                for i in range(20)) + b"\r\n")
        assert _recv_all(s).startswith(b"HTTP/1.1 431")


def test_a_client_trickling_its_head_is_cut_off_at_the_deadline(server: FrontServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        start = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\n")
        closed = False
        for _ in range(40):  # a byte every 0.2 s: each read is quick, the whole head is not
            try:
                s.sendall(b"X")
            except OSError:
                closed = True
                break
            s.settimeout(0.2)
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed, "the server kept a trickling client past its head deadline"
        assert time.monotonic() - start < 5


def test_an_idle_keep_alive_connection_is_closed(server: FrontServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = _recv_all(s, timeout=4)
        assert data.startswith(b"HTTP/1.1 200")  # then closed after the 1 s idle limit (recv returned b"")


def test_backlog_and_listen_parsing() -> None:
    assert FrontServer.request_queue_size >= 1024
    assert parse_listen(":9403") == ("", 9403)
    assert parse_listen("127.0.0.1:9403") == ("127.0.0.1", 9403)
    assert parse_listen("[::1]:9403") == ("::1", 9403)
    with pytest.raises(ValueError):
        parse_listen("9403")
