"""telemetry_common.httpfront's bounds and hooks: the connection bound (503 at once, one WARNING a
minute however many are refused), accept_peer refusing a TLS connection, server_close ending
kept-alive connections, the answer's headers and a large body sent intact."""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

from telemetry_common.httpfront import FrontServer, Handler, Reply
from tests.helpers import wait_until
from tests.tls_certs import Certs, make_certs

BIG = bytes(range(256)) * 1024  # 256 KiB: sent without being copied into one buffer


class App(Handler):
    def answer(self, method: str) -> Reply:
        if self.path == "/big":
            return Reply(200, BIG, "application/octet-stream")
        if self.path == "/own-nosniff":
            return Reply(200, b"x", headers={"x-content-type-options": "nosniff"})
        return Reply(200, b"ok\n")


class Refusing(App):
    def accept_peer(self) -> bool:
        return False


def _serve(srv: FrontServer) -> Iterator[FrontServer]:
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture()
def bounded() -> Iterator[FrontServer]:
    yield from _serve(FrontServer(("127.0.0.1", 0), App, max_connections=2, logger=logging.getLogger("front")))


def test_refusals_over_the_bound_are_one_warning_a_minute(bounded: FrontServer,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    held = [socket.create_connection(("127.0.0.1", bounded.port), timeout=5) for _ in range(2)]
    try:
        assert wait_until(lambda: bounded.open_connections == 2, timeout=10)
        with caplog.at_level(logging.WARNING, logger="front"):
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", bounded.port), timeout=5) as s:
                    assert s.recv(12) == b"HTTP/1.1 503"
        assert bounded.refused == 5
        warnings = [r for r in caplog.records if r.name == "front" and r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "refused 1 new connection" in warnings[0].getMessage()
    finally:
        for s in held:
            s.close()


def test_max_connections_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        FrontServer(("127.0.0.1", 0), App, max_connections=0)


def test_server_close_ends_kept_alive_connections(bounded: FrontServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", bounded.port, timeout=5)
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"ok\n"
    bounded.server_close()
    assert wait_until(lambda: bounded.open_connections == 0, timeout=5)
    conn.close()


def test_answers_carry_date_and_one_nosniff_and_a_large_body_arrives_intact(bounded: FrontServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", bounded.port, timeout=5)
    conn.request("GET", "/own-nosniff")
    resp = conn.getresponse()
    resp.read()
    assert resp.getheader("Date") and len(resp.msg.get_all("X-Content-Type-Options") or []) == 1
    conn.request("GET", "/big")
    resp = conn.getresponse()
    assert resp.read() == BIG and resp.getheader("Content-Length") == str(len(BIG))
    conn.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


def test_accept_peer_false_closes_the_connection_before_a_request_is_read(certs: Certs) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    for handler, served in ((App, True), (Refusing, False)):
        srv = FrontServer(("127.0.0.1", 0), handler, tls=lambda: ctx)  # the callable form (reloads)
        for s in _serve(srv):
            client = ssl.create_default_context(cafile=str(certs.ca))
            with socket.create_connection(("127.0.0.1", s.port), timeout=5) as raw, \
                    client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                try:
                    got = tls.recv(12)
                except (ssl.SSLError, ConnectionError):
                    got = b""
            assert (got == b"HTTP/1.1 200") == served
