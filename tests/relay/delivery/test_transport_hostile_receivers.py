"""The transport against receivers that misbehave: a CONNECT tunnel refused with 407, a head of endless junk lines.

From a hostile review of the heads, the queue, the name filter and the native tables."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from relay.common.http_head import Response


def test_a_connect_tunnel_refused_with_407_is_an_oserror_with_the_transports_response_class() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        seen: list[bytes] = []

        def proxy() -> None:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                seen.append(data)
                conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n"
                             b"Content-Length: 5\r\n\r\nnope!")
                time.sleep(0.2)

        t = threading.Thread(target=proxy)
        t.start()
        conn = http.client.HTTPConnection("127.0.0.1", listener.getsockname()[1], timeout=5)
        conn.response_class = Response
        conn.set_tunnel("example.invalid", 443, headers={"Proxy-Authorization": "Basic eA=="})
        with pytest.raises(OSError, match="Tunnel connection failed: 407"):
            conn.connect()
        t.join()
        conn.close()
    assert seen[0].startswith(b"CONNECT example.invalid:443 HTTP/1.")
    assert b"Proxy-Authorization: Basic eA==\r\n" in seen[0]


def _one_shot_receiver(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A receiver on 127.0.0.1 that reads one request head (and its body) and sends ``answer``."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_once() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, rest = data.split(b"\r\n\r\n", 1)
            length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            while len(rest) < length:
                rest += conn.recv(65536)
            try:
                conn.sendall(answer)
                time.sleep(0.2)
            except OSError:
                pass

    t = threading.Thread(target=serve_once)
    t.start()
    return listener, t


def test_the_transport_gives_up_on_a_receiver_whose_head_is_endless_junk_lines(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay.delivery.transport import NETWORK_ERROR, HttpTransport

    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    listener, t = _one_shot_receiver(b"HTTP/1.1 200 OK\r\n" + b"junk\r\n" * 5000 + b"Content-Length: 0\r\n\r\n")
    with listener:
        transport = HttpTransport()
        try:
            r = transport.post(f"http://127.0.0.1:{listener.getsockname()[1]}/api/v1/write", b"body", {}, 5.0)
        finally:
            transport.close()
        t.join(5)
    assert r.status == NETWORK_ERROR and b"too many headers" in r.body.lower(), r
