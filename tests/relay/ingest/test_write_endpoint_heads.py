"""The write endpoint's request heads on one connection: pipelined writes, heads split at every byte,
malformed heads after a served request, bare CR and NUL, HEAD on keep-alive, a malformed head with a
large body behind it.

From a hostile review of the heads, the queue, the name filter and the native tables."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.relay.ingest.test_write_endpoint_http import (
    WRITE_HEAD,
    Recorder,
    Serve,
    connect,
    read_until_closed,
    serve,
    status_of,
)

__all__ = ["serve"]  # the fixture, imported for its use here


def _replies(sock: socket.socket, count: int, timeout: float = 3.0) -> list[bytes]:
    """``count`` replies read off a kept-alive connection (each has a Content-Length)."""
    sock.settimeout(timeout)
    buf = b""
    out: list[bytes] = []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, (out, buf)
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = int(head.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(rest) < length:
            rest += sock.recv(65536)
        out.append(head + b"\r\n\r\n" + rest[:length])
        buf = rest[length:]
    return out


def test_pipelined_writes_with_their_bodies_in_one_segment_are_each_served_in_order(serve: Serve) -> None:
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(WRITE_HEAD + b"Content-Length: 3\r\n\r\none"
                     + WRITE_HEAD + b"Content-Length: 3\r\n\r\ntwo"
                     + b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
                     + WRITE_HEAD + b"Content-Length: 5\r\n\r\nthree")
        replies = _replies(sock, 4)
    assert [status_of(r) for r in replies] == [204, 204, 200, 204]
    assert [b for _, b in ep.writes] == [b"one", b"two", b"three"]


def test_a_head_split_across_segments_at_every_byte_is_read_whole(serve: Serve) -> None:
    ep = Recorder()
    raw = WRITE_HEAD + b"X-Split: a\xe9b\r\nContent-Length: 2\r\n\r\nok"
    with connect(serve(ep)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(raw)):
            sock.sendall(raw[i : i + 1])
            if i % 16 == 0:
                time.sleep(0.002)
        [reply] = _replies(sock, 1)
    assert status_of(reply) == 204
    [(headers, body)] = ep.writes
    assert body == b"ok" and headers["x-split"] == "a\u00e9b"


def test_a_malformed_head_after_a_served_request_on_one_connection_is_400_and_closes(serve: Serve) -> None:
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(WRITE_HEAD + b"Content-Length: 2\r\n\r\nok")
        [first] = _replies(sock, 1)
        sock.sendall(WRITE_HEAD + b"Content-Length : 2\r\n\r\nno")
        rest = read_until_closed(sock, timeout=2)
    assert status_of(first) == 204 and status_of(rest) == 400 and not rest.endswith(b"<still open>")
    assert [b for _, b in ep.writes] == [b"ok"]


@pytest.mark.parametrize("raw", [
    WRITE_HEAD + b"Content-Length: 2\rX-Smuggled: 1\r\n\r\nok",  # a bare CR inside a line
    WRITE_HEAD + b"Content-Length: 2\r\n\rX: 1\r\n\r\nok",  # a line starting with a bare CR
    WRITE_HEAD + b"Content-Length: 2\r\nX-Nul: a\0b\r\n\r\nok",
])
def test_bare_cr_and_nul_in_a_request_head_are_refused(serve: Serve, raw: bytes) -> None:
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(raw)
        answer = read_until_closed(sock, timeout=2)
    assert status_of(answer) == 400 and ep.writes == []


def test_a_head_request_on_a_kept_alive_connection_gets_no_body_and_the_next_request_is_served(
    serve: Serve
) -> None:
    with connect(serve()) as sock:
        sock.sendall(b"HEAD /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(2)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            assert chunk
            head += chunk
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing after HEAD's head
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        [second] = _replies(sock, 1)
    assert status_of(head) == 200 and head.endswith(b"\r\n\r\n") and status_of(second) == 200


def test_a_head_refused_as_malformed_with_a_large_body_behind_it_is_answered_not_reset(serve: Serve) -> None:
    # the strict 400 is new for lines email used to accept: the body still on the wire must not turn
    # the close into a reset that destroys the answer before the client reads it
    ep = Recorder()
    body = b"x" * (3 << 20)
    errors: list[BaseException] = []
    with connect(serve(ep)) as sock:
        def send() -> None:
            try:
                sock.sendall(WRITE_HEAD + b"Content-Length : %d\r\n\r\n" % len(body) + body)
            except OSError as e:  # the server closed before taking it all: fine, the answer counts
                errors.append(e)

        sender = threading.Thread(target=send)
        sender.start()
        answer = read_until_closed(sock, timeout=5)
        sender.join(10)
    assert status_of(answer) == 400 and not answer.endswith((b"<still open>", b"<reset>")), answer[:100]
    assert ep.writes == []
