"""A reply gets server.read_timeout to be sent, whatever the request's reads left of it: in CPython
the socket timeout bounds the WHOLE sendall, so a large reply (/metrics, cardinality) to a client that
reads it at an ordinary pace must not be cut off after what was left of the request's read time. Only a
request that came in quickly (nearly all of read_timeout left) keeps its timeout, saving a settimeout."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

from relay.ingest.server import RelayHTTPServer, Reply

BODY = 32 << 20


class Big:
    max_request_bytes = 1 << 16

    def write(self, headers: Mapping[str, str], body: bytes) -> Reply:
        return Reply(204)

    def metrics(self, accept: str) -> Reply:
        return Reply(200, b"x" * BODY, "text/plain; version=0.0.4; charset=utf-8")

    def healthy(self) -> Reply:
        return Reply(200, b"ok\n")

    def ready(self) -> Reply:
        return Reply(200, b"ok\n")


def test_a_large_reply_gets_read_timeout_to_be_sent_whatever_the_request_reads_left() -> None:
    server = RelayHTTPServer(("127.0.0.1", 0), Big(), read_timeout=4.0)  # type: ignore[arg-type]
    server.start()
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow link: little in flight
        sock.settimeout(10)
        sock.connect(server.server_address[:2])
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        time.sleep(2.5)  # the head arrives within read_timeout (4 s), in three parts
        sock.sendall(b"Host: x\r\n")
        time.sleep(0.1)
        sock.sendall(b"\r\n")  # its last read set the socket's timeout to about 1.4 s
        time.sleep(2.0)  # the client starts reading the reply 2 s later (well within read_timeout)
        got = 0
        while chunk := sock.recv(1 << 20):
            got += len(chunk)
            if got >= BODY:
                break
        assert got >= BODY, f"reply cut off after {got} of {BODY} body bytes"
        sock.close()
    finally:
        server.stop()
