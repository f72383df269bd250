"""relay.server.RelayHTTPServer over real sockets with a recording Endpoints: framing (Content-Length,
chunked, short bodies), timeouts, the bounds on requests and connections, listeners, lifecycle,
one-write replies, and clients that hang up."""

from __future__ import annotations

import http.client
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import pytest

from relay.ingest.server import RelayHTTPServer, Reply, json_reply, parse_listen


class Recorder:
    """Endpoints that record what reached them; ``gate`` makes write() wait until it is set."""

    max_request_bytes = 1 << 16

    def __init__(self) -> None:
        self.writes: list[tuple[dict[str, str], bytes]] = []
        self.reloads = 0
        self.pages: list[Mapping[str, list[str]]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.write_reply = Reply(204)
        self.fail_with: Exception | None = None

    def write(self, headers: Mapping[str, str], body: bytes) -> Reply:
        self.writes.append((dict(headers), body))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        return self.write_reply

    def metrics(self, accept: str) -> Reply:
        return Reply(200, b"gpu_relay_up 1\n", "text/plain; version=0.0.4; charset=utf-8")

    def healthy(self) -> Reply:
        return Reply(200, b"gpu-relay is Healthy.\n")

    def ready(self) -> Reply:
        return Reply(200, b"gpu-relay is Ready.\n")

    def reload(self) -> Reply:
        self.reloads += 1
        return Reply(200, b"configuration reloaded\n")

    def cardinality(self, query: Mapping[str, list[str]]) -> Reply:
        return json_reply(200, {"destination": query.get("destination", [""])[0]})

    def status_page(self, query: Mapping[str, list[str]]) -> Reply:
        self.pages.append(query)
        return Reply(200, b"<!doctype html><title>gpu-relay</title>", "text/html; charset=utf-8")


class Serve(Protocol):
    def __call__(self, ep: Recorder | None = None, address: tuple[str, int] = ..., **kw: Any) -> RelayHTTPServer: ...


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[RelayHTTPServer] = []

    def go(ep: Recorder | None = None, address: tuple[str, int] = ("127.0.0.1", 0), **kw: Any) -> RelayHTTPServer:
        server = RelayHTTPServer(address, ep or Recorder(), **kw)
        server.start()
        servers.append(server)
        return server

    yield go
    for s in servers:
        s.stop()


def connect(server: RelayHTTPServer, timeout: float = 5.0) -> socket.socket:
    host, port = server.server_address[0], server.server_address[1]
    return socket.create_connection((str(host), int(port)), timeout=timeout)


def read_until_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout`` passes: then the
    bytes so far, which a test that expects a close will find incomplete)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        out += b"<still open>"
    except ConnectionResetError:
        out += b"<reset>"
    return out


def exchange(server: RelayHTTPServer, raw: bytes, *, half_close: bool = False, timeout: float = 5.0) -> bytes:
    with connect(server) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return read_until_closed(sock, timeout)


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer
    return int(answer[9:12])


def body_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1].removesuffix(b"<still open>")


WRITE_HEAD = b"POST /api/v1/write HTTP/1.1\r\nHost: relay\r\nContent-Type: application/x-protobuf\r\n"


# ---- Content-Length and framing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "reason"),
    [
        (b"", 411, b"Content-Length required"),
        (b"Content-Length: -5\r\n", 400, b"invalid Content-Length '-5'"),
        (b"Content-Length: abc\r\n", 400, b"invalid Content-Length 'abc'"),
        (b"Content-Length: +5\r\n", 400, b"invalid Content-Length '+5'"),
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", 400, b"conflicting Content-Length headers"),
        (b"Content-Length: 99999999999999999999999\r\n", 400, b"invalid Content-Length"),
        (b"Transfer-Encoding: chunked\r\n", 411, b"chunked transfer-encoding is not supported"),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", 411, b"chunked transfer-encoding is not supported"),
    ],
)
def test_write_with_a_missing_bad_or_unsupported_length_is_a_4xx_and_closes(
    serve: Serve, headers: bytes, status: int, reason: bytes
) -> None:
    ep = Recorder()
    server = serve(ep)
    answer = exchange(server, WRITE_HEAD + headers + b"\r\n5\r\nhello\r\n0\r\n\r\n", timeout=2)
    assert status_of(answer) == status
    assert body_of(answer).startswith(reason) and body_of(answer).count(b"\n") == 1, answer
    assert b"Connection: close" in answer and not answer.endswith(b"<still open>")
    assert ep.writes == []


@pytest.mark.parametrize(("head", "status", "reason"), [
    (b"Content-Length : 5\r\n", 400, b"malformed header line"),
    (b"X-Folded: a\r\n  b\r\nContent-Length: 5\r\n", 400, b"obsolete line folding in headers"),
    (b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"Content-Length: 5\r\n", 431, b"too many headers"),
    (b"X-Big: " + b"a" * 70000 + b"\r\nContent-Length: 5\r\n", 431, b"line too long"),
])
def test_a_write_whose_headers_cannot_be_read_strictly_is_refused_and_closed(
    serve: Serve, head: bytes, status: int, reason: bytes
) -> None:
    ep = Recorder()
    answer = exchange(serve(ep), WRITE_HEAD + head + b"\r\nhello", timeout=2)
    assert status_of(answer) == status and body_of(answer) == reason + b"\n", answer[:200]
    assert b"Connection: close" in answer and not answer.endswith(b"<still open>")
    assert ep.writes == []


@pytest.mark.parametrize(("request_line", "status"), [
    (b"GET /-/healthy HTTP/2.0\r\n", 505),  # http.server's own checks answer what we do not parse
    (b"get /-/healthy HTTP/1.1\r\n", 501),
    (b"GET /-/healthy HTTP/1.x\r\n", 400),
    (b"GET  /-/healthy HTTP/1.1\r\n", 200),  # http.server splits the line on any run of blanks
    (b"POST /api/v1/write HTTP/1.1 extra\r\n", 400),
])
def test_unusual_request_lines_get_http_servers_answers(serve: Serve, request_line: bytes, status: int) -> None:
    answer = exchange(serve(), request_line + b"Host: x\r\nConnection: close\r\n\r\n", timeout=2)
    assert status_of(answer) == status and not answer.endswith(b"<still open>")


def test_http_1_0_closes_after_the_reply_unless_it_asks_for_keep_alive(serve: Serve) -> None:
    server = serve()
    answer = exchange(server, b"GET /-/healthy HTTP/1.0\r\nHost: x\r\n\r\n", timeout=2)
    assert status_of(answer) == 200 and not answer.endswith(b"<still open>")
    with connect(server) as sock:
        sock.sendall(b"GET /-/healthy HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
        answer = read_until_closed(sock, timeout=0.5)
    assert status_of(answer) == 200 and answer.endswith(b"<still open>")


def test_expect_100_continue_gets_100_before_the_body_is_sent(serve: Serve) -> None:
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(WRITE_HEAD + b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        sock.settimeout(2)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(b"hello")
        assert status_of(sock.recv(1000)) == 204
    assert [b for _, b in ep.writes] == [b"hello"]


@pytest.mark.parametrize(("head", "status"), [
    (b"Content-Length: 999999999\r\n", 413),  # over max_request_bytes
    (b"Transfer-Encoding: chunked\r\n", 411),
])
def test_a_write_refused_on_its_head_gets_its_answer_and_no_100_continue(
    serve: Serve, head: bytes, status: int
) -> None:
    # RFC 9110 10.1.1: a 100 invites the upload of a body the server will not read
    ep = Recorder()
    with connect(serve(ep)) as sock:
        sock.sendall(WRITE_HEAD + head + b"Expect: 100-continue\r\n\r\n")
        answer = read_until_closed(sock, timeout=2)
    assert status_of(answer) == status and b"100 Continue" not in answer and ep.writes == []


def test_a_write_refused_for_load_gets_503_and_no_100_continue(serve: Serve) -> None:
    ep = Recorder()
    ep.gate = threading.Event()
    server = serve(ep, max_concurrent=1)
    with connect(server) as busy:
        busy.sendall(WRITE_HEAD + b"Content-Length: 2\r\n\r\nok")
        assert ep.entered.wait(2)
        with connect(server) as sock:
            sock.sendall(WRITE_HEAD + b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n")
            answer = read_until_closed(sock, timeout=2)
        ep.gate.set()
    assert status_of(answer) == 503 and b"100 Continue" not in answer


def test_a_path_starting_with_two_slashes_is_read_as_a_path_not_a_host(serve: Serve) -> None:
    ep = Recorder()
    answer = exchange(serve(ep), b"POST //api/v1/write HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    assert status_of(answer) == 204 and [b for _, b in ep.writes] == [b"ok"]


def test_the_write_endpoint_gets_lowercased_names_and_the_last_of_repeated_headers(serve: Serve) -> None:
    ep = Recorder()
    exchange(serve(ep), WRITE_HEAD + b"X-Rep: 1\r\nx-rep: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    [(headers, _)] = ep.writes
    assert headers["x-rep"] == "2" and headers["content-type"] == "application/x-protobuf" and "host" in headers


def test_body_shorter_than_content_length_is_400_and_not_processed(serve: Serve) -> None:
    ep = Recorder()
    server = serve(ep)
    answer = exchange(server, WRITE_HEAD + b"Content-Length: 100\r\n\r\n0123456789", half_close=True)
    assert status_of(answer) == 400
    assert body_of(answer) == b"request body shorter than its Content-Length: 10 of 100 bytes\n"
    assert ep.writes == []


def test_body_that_stops_arriving_is_408_after_read_timeout(serve: Serve) -> None:
    ep = Recorder()
    server = serve(ep, read_timeout=0.3)
    started = time.monotonic()
    answer = exchange(server, WRITE_HEAD + b"Content-Length: 100\r\n\r\n0123456789", timeout=3)
    assert status_of(answer) == 408 and not answer.endswith(b"<still open>")
    assert 0.25 < time.monotonic() - started < 2.0
    assert ep.writes == []


def test_headers_that_trickle_are_cut_off_at_read_timeout_in_total(serve: Serve) -> None:
    server = serve(read_timeout=0.5)
    request = WRITE_HEAD + b"X-Slow: " + b"a" * 60
    started = time.monotonic()
    with connect(server) as sock:
        closed_after = None
        for byte in request:  # one byte every 50 ms: each recv is quick, the whole is slow
            try:
                sock.sendall(bytes((byte,)))
            except OSError:
                closed_after = time.monotonic() - started
                break
            sock.settimeout(0.05)
            try:
                if sock.recv(1) == b"":
                    closed_after = time.monotonic() - started
                    break
            except TimeoutError:
                pass
    assert closed_after is not None and closed_after < 1.5


def test_content_length_over_the_limit_is_413_before_the_body_is_read(serve: Serve) -> None:
    ep = Recorder()
    server = serve(ep)
    limit = ep.max_request_bytes + ep.max_request_bytes // 5 + 64
    answer = exchange(server, WRITE_HEAD + f"Content-Length: {limit + 1}\r\n\r\n".encode())
    assert status_of(answer) == 413 and b"Connection: close" in answer
    assert body_of(answer) == f"request body of {limit + 1} bytes is over the limit of {limit}\n".encode()


def test_write_with_a_body_reaches_the_endpoint_and_keeps_the_connection(serve: Serve) -> None:
    ep = Recorder()
    server = serve(ep)
    answer = exchange(server, WRITE_HEAD + b"Content-Length: 5\r\nX-Extra: 1\r\n\r\nhello"
                              b"GET /-/healthy HTTP/1.1\r\nHost: relay\r\n\r\n", timeout=0.5)
    assert answer.count(b"HTTP/1.1 204 ") == 1 and answer.count(b"HTTP/1.1 200 ") == 1
    [(headers, body)] = ep.writes
    assert body == b"hello" and headers["x-extra"] == "1" and headers["content-type"] == "application/x-protobuf"


# ---- timeouts and bounds ------------------------------------------------------------------------------


def test_idle_keep_alive_connection_is_closed_after_idle_timeout(serve: Serve) -> None:
    server = serve(idle_timeout=0.6)
    host, port = server.server_address[0], server.server_address[1]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=5)
    try:
        for _ in range(3):  # requests closer together than idle_timeout share the connection
            conn.request("GET", "/-/healthy")
            assert conn.getresponse().read() == b"gpu-relay is Healthy.\n"
            time.sleep(0.1)
        sock = conn.sock
        assert sock is not None
        started = time.monotonic()
        assert read_until_closed(sock, timeout=3) == b""
        assert 0.3 < time.monotonic() - started < 2.0
    finally:
        conn.close()


def test_writes_beyond_max_concurrent_get_503_with_retry_after_at_once(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    ep = Recorder()
    ep.gate = threading.Event()
    server = serve(ep, max_concurrent=1)
    first = connect(server)
    try:
        first.sendall(WRITE_HEAD + b"Content-Length: 2\r\n\r\nok")
        assert ep.entered.wait(5)
        caplog.set_level(logging.WARNING, logger="relay.server")
        for _ in range(3):
            started = time.monotonic()
            # a large body that is never sent: the answer must not wait for (or buffer) it
            answer = exchange(server, WRITE_HEAD + b"Content-Length: 60000\r\n\r\n", timeout=2)
            assert time.monotonic() - started < 1.0
            assert status_of(answer) == 503 and b"Retry-After: 1\r\n" in answer and b"Connection: close" in answer
        assert len(ep.writes) == 1
        assert exchange(server, b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 200 ")  # health is not bounded by writes in flight
        ep.gate.set()
        assert read_until_closed(first, timeout=0.5).startswith(b"HTTP/1.1 204 ")
    finally:
        first.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "503" in warnings[0].getMessage()  # one line, not one per request
    assert status_of(exchange(server, WRITE_HEAD + b"Content-Length: 2\r\nConnection: close\r\n\r\nok")) == 204


def test_connections_beyond_the_bound_get_503_and_are_closed(serve: Serve) -> None:
    server = serve(max_concurrent=1, max_connections=2)
    held = [connect(server), connect(server)]
    try:
        time.sleep(0.1)  # both accepted
        with connect(server) as third:
            answer = read_until_closed(third, timeout=2)
        assert status_of(answer) == 503 and b"Retry-After: 1\r\n" in answer
        held.pop().close()
        time.sleep(0.2)
        assert exchange(server, b"GET /-/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 200 ")
    finally:
        for s in held:
            s.close()


# ---- replies ------------------------------------------------------------------------------------------


def test_replies_with_a_body_on_a_kept_alive_connection_come_well_under_40ms(serve: Serve) -> None:
    ep = Recorder()
    ep.write_reply = Reply(400, b"bad sample\n")
    server = serve(ep)
    host, port = server.server_address[0], server.server_address[1]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=5)
    took: list[float] = []
    try:
        for i in range(20):
            started = time.perf_counter()
            if i % 2:
                conn.request("POST", "/api/v1/write", body=b"x" * 100)
            else:
                conn.request("GET", "/-/healthy")
            resp = conn.getresponse()
            assert resp.read()
            took.append(time.perf_counter() - started)
    finally:
        conn.close()
    took.sort()
    assert took[len(took) // 2] < 0.025, took  # Nagle against delayed ACK made each 40+ ms


def test_head_on_health_and_readiness_sends_headers_only(serve: Serve) -> None:
    server = serve()
    for path, body in (("/-/healthy", b"gpu-relay is Healthy.\n"), ("/-/ready", b"gpu-relay is Ready.\n")):
        answer = exchange(server, f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert status_of(answer) == 200
        assert f"Content-Length: {len(body)}\r\n".encode() in answer and answer.endswith(b"\r\n\r\n")


def test_client_that_hangs_up_is_a_debug_line_not_an_internal_error(
    serve: Serve, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="relay.server")
    ep = Recorder()
    ep.gate = threading.Event()
    ep.write_reply = Reply(400, b"x" * 200_000 + b"\n")  # more than the socket buffers take
    server = serve(ep)
    sock = connect(server)
    sock.sendall(WRITE_HEAD + b"Content-Length: 2\r\n\r\nok")
    assert ep.entered.wait(5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset: the reply cannot be delivered
    ep.gate.set()
    # and one that resets while its body is being read
    sock = connect(server)
    sock.sendall(WRITE_HEAD + b"Content-Length: 1000\r\n\r\npartial")
    time.sleep(0.1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sum("hung up" in r.getMessage() for r in caplog.records) < 2:
        time.sleep(0.05)
    hung = [r for r in caplog.records if "hung up" in r.getMessage()]
    assert len(hung) == 2 and all(r.levelno == logging.DEBUG for r in hung), caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "Traceback" not in capsys.readouterr().err
    assert len(ep.writes) == 1


def test_endpoint_exception_is_a_500_without_its_message(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    ep = Recorder()
    ep.fail_with = RuntimeError("token=s3cr3t")
    server = serve(ep)
    answer = exchange(server, WRITE_HEAD + b"Authorization: Bearer s3cr3t\r\nContent-Length: 2\r\n"
                                           b"Connection: close\r\n\r\nok")
    assert status_of(answer) == 500 and body_of(answer) == b"internal error\n"
    assert b"s3cr3t" not in answer
    assert [r.levelno for r in caplog.records if r.name == "relay.server"] == [logging.ERROR]


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE /?token=s3cr3t HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET /?token=s3cr3t HTTP/9.9\r\n\r\n", 505),
        (b"GET /?token=s3cr3t HTTP/1.1\r\nX-Token: s3cr3t\r\n" + b"X: y\r\n" * 120 + b"\r\n", 431),
    ],
)
def test_malformed_requests_are_refused_echoing_nothing(serve: Serve, raw: bytes, status: int) -> None:
    answer = exchange(serve(), raw)
    assert status_of(answer) == status and b"s3cr3t" not in answer
    assert body_of(answer).count(b"\n") == 1


def test_unknown_method_on_a_known_path_is_405(serve: Serve) -> None:
    server = serve()
    answer = exchange(server, b"DELETE /api/v1/write HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 405 and b"Allow: POST\r\n" in answer
    answer = exchange(server, b"GET /api/v1/write HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 405


# ---- lifecycle, listeners, IPv6 ------------------------------------------------------------------------


def test_reload_over_http_is_403_unless_lifecycle_is_enabled(serve: Serve) -> None:
    ep = Recorder()
    server = serve(ep)
    answer = exchange(server, b"POST /-/reload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 403 and body_of(answer).startswith(b"lifecycle API is not enabled")
    assert ep.reloads == 0
    server = serve(ep, enable_lifecycle=True)
    answer = exchange(server, b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
                              b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n", timeout=0.5)
    assert answer.count(b"HTTP/1.1 200 ") == 2 and ep.reloads == 1


def request(server: RelayHTTPServer, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    host, port = server.server_address[0], server.server_address[1]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=5)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_write_only_and_telemetry_only_listeners_split_the_paths(serve: Serve) -> None:
    ep = Recorder()
    write = serve(ep, serve_telemetry=False)
    telemetry = serve(ep, serve_write=False, enable_lifecycle=True)
    assert request(write, "POST", "/api/v1/write", b"ok")[0] == 204
    for path in ("/metrics", "/api/v1/cardinality", "/"):
        assert request(write, "GET", path)[0] == 404
    assert request(write, "POST", "/-/reload")[0] == 404
    assert request(write, "GET", "/-/healthy")[0] == 200  # probes may use either listener
    assert request(telemetry, "GET", "/metrics") == (200, b"gpu_relay_up 1\n")
    assert request(telemetry, "GET", "/api/v1/cardinality?destination=amp")[0] == 200
    assert request(telemetry, "GET", "/?refresh=5") == (200, b"<!doctype html><title>gpu-relay</title>")
    assert ep.pages == [{"refresh": ["5"]}]
    assert request(telemetry, "GET", "/-/ready")[0] == 200
    assert request(telemetry, "POST", "/-/reload")[0] == 200
    answer = exchange(telemetry, WRITE_HEAD + b"Content-Length: 60000\r\n\r\n")  # body never sent
    assert status_of(answer) == 404 and b"not served on this listener" in answer and b"Connection: close" in answer
    assert len(ep.writes) == 1


def test_a_listener_serves_something() -> None:
    with pytest.raises(ValueError, match="serves nothing"):
        RelayHTTPServer(("127.0.0.1", 0), Recorder(), serve_write=False, serve_telemetry=False)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_listens_on_an_ipv6_literal(serve: Serve) -> None:
    host, port = parse_listen("[::1]:0")
    server = serve(address=(host, port))
    assert server.url == f"http://[::1]:{server.server_address[1]}"
    with socket.create_connection(("::1", server.server_address[1]), timeout=5) as sock:
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200 ")


def test_stop_closes_kept_alive_connections(serve: Serve) -> None:
    server = serve()
    sock = connect(server)
    sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    server.stop()
    assert read_until_closed(sock, timeout=3) in (b"", b"<reset>")
    sock.close()


def test_stop_without_start_releases_the_port() -> None:
    server = RelayHTTPServer(("127.0.0.1", 0), Recorder())
    port = server.server_address[1]
    server.stop()
    server.stop()  # idempotent
    again = RelayHTTPServer(("127.0.0.1", port), Recorder())
    again.stop()
    assert again.server_address[1] == port


def test_write_with_expect_100_continue_gets_continue_then_its_reply(serve: Serve) -> None:
    # curl sends "Expect: 100-continue" for bodies over 1 KiB and waits for it before the body
    ep = Recorder()
    server = serve(ep)
    with connect(server) as sock:
        sock.sendall(WRITE_HEAD + b"Expect: 100-continue\r\nContent-Length: 2000\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(b"x" * 2000)
        assert sock.recv(65536).startswith(b"HTTP/1.1 204 ")
    assert [len(body) for _, body in ep.writes] == [2000]


def test_http_1_0_request_is_answered_and_closed(serve: Serve) -> None:
    answer = exchange(serve(), b"GET /-/healthy HTTP/1.0\r\n\r\n", timeout=2)
    assert status_of(answer) == 200 and b"Connection: close" in answer and not answer.endswith(b"<still open>")


def test_listen_without_a_host_takes_ipv4_and_ipv6_connections(serve: Serve) -> None:
    # ":9202" (the sidecar's telemetry port) must be scrapable on the pod's IPv4 and IPv6 addresses
    assert parse_listen(":9202") == ("", 9202) and parse_listen("0.0.0.0:9202") == ("0.0.0.0", 9202)
    server = serve(address=parse_listen(":0"))
    port = server.server_address[1]
    families = [("127.0.0.1", socket.AF_INET)] + ([("::1", socket.AF_INET6)] if _ipv6_loopback() else [])
    for host, family in families:
        with socket.socket(family) as sock:
            sock.settimeout(5)
            sock.connect((host, port))
            sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_until_closed(sock).startswith(b"HTTP/1.1 200 "), host


class BrokenEndpoints(Recorder):
    @property
    def ready(self) -> Any:  # an endpoint that fails before it is even called
        raise RuntimeError("not wired")


def test_endpoints_failing_outside_a_call_still_get_a_500_not_a_dropped_connection(serve: Serve) -> None:
    answer = exchange(serve(BrokenEndpoints()), b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 500 and body_of(answer) == b"internal error\n"


def test_telemetry_paths_on_a_write_only_listener_say_where_telemetry_is_served(serve: Serve) -> None:
    # the sidecar serves telemetry on :9202; `gpu-relay report` on the write port must say so, not
    # "HTTP 404: not found"
    write = serve(Recorder(), serve_telemetry=False)
    for method, path in (("GET", "/metrics"), ("GET", "/api/v1/cardinality?destination=amp"), ("GET", "/"),
                         ("POST", "/-/reload")):
        status, body = request(write, method, path)
        assert status == 404, path
        assert b"telemetry_listen" in body and b"\n" not in body.rstrip(b"\n"), path
    assert request(write, "GET", "/nope") == (404, b"not found\n")
