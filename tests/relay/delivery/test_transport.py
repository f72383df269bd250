"""relay.transport.HttpTransport, the relay's default HTTP client, against real servers on 127.0.0.1:
keep-alive, a server that closed an idle connection, errors as status 0 with their reason, TLS
verification, proxies from the environment, no redirects, bounded error bodies, signing hooks."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import botocore.exceptions
import pytest
import requests

from relay.delivery.transport import CREDENTIALS_PREFIX, HttpTransport
from tests.helpers import free_port
from tests.tls_certs import make_certs


@dataclass
class Seen:
    line: str
    headers: dict[str, str]
    body: bytes
    peer: tuple[str, int]


@dataclass
class Server:
    """HTTP/1.1 server answering each POST with the next scripted (status, headers, body), else 204."""

    httpd: ThreadingHTTPServer
    seen: list[Seen] = field(default_factory=list)
    script: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    close_after_each: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/api/v1/write"


def _handler(srv: list[Server]) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            s = srv[0]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            s.seen.append(Seen(self.requestline, {k.lower(): v for k, v in self.headers.items()}, body,
                               self.client_address))
            status, headers, out = s.script.pop(0) if s.script else (204, {}, b"")
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(out)))
            if s.close_after_each:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(out)

    return H


@pytest.fixture
def server() -> Iterator[Server]:
    holder: list[Server] = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(holder))
    httpd.daemon_threads = True
    holder.append(Server(httpd))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield holder[0]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                "ALL_PROXY", "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)


def test_one_connection_is_kept_alive_across_requests_of_a_thread(server: Server) -> None:
    t = HttpTransport()
    for i in range(5):
        assert t.post(server.url, b"body%d" % i, {"Content-Type": "x"}, 5).status == 204
    assert [s.body for s in server.seen] == [b"body%d" % i for i in range(5)]
    assert len({s.peer for s in server.seen}) == 1  # one TCP connection
    assert server.seen[0].line == "POST /api/v1/write HTTP/1.1"
    assert server.seen[0].headers["host"] == f"127.0.0.1:{server.httpd.server_address[1]}"
    assert server.seen[0].headers["content-type"] == "x" and server.seen[0].headers["content-length"] == "5"
    t.close()


def test_a_kept_connection_sets_its_timeout_again_only_when_it_changes(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float | None] = []
    real = socket.socket.settimeout

    def spy(sock: socket.socket, value: float | None) -> None:
        calls.append(value)
        real(sock, value)

    t = HttpTransport()
    assert t.post(server.url, b"a", {}, 5).status == 204
    monkeypatch.setattr(socket.socket, "settimeout", spy)
    for _ in range(3):
        assert t.post(server.url, b"b", {}, 5).status == 204
    assert calls == []  # each one a syscall and a GIL hand-off
    assert t.post(server.url, b"c", {}, 7).status == 204
    assert calls == [7]
    conns = list(t._local.conns.values())
    assert len(conns) == 1 and conns[0].sock is not None and conns[0].sock.gettimeout() == 7
    t.close()


def test_each_thread_has_its_own_connection(server: Server) -> None:
    t = HttpTransport()
    threads = [threading.Thread(target=lambda: [t.post(server.url, b"x", {}, 5) for _ in range(3)]) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(server.seen) == 9 and len({s.peer for s in server.seen}) == 3
    t.close()


def test_a_connection_the_server_closed_is_replaced_without_an_error(server: Server) -> None:
    server.close_after_each = True
    t = HttpTransport()
    statuses = [t.post(server.url, b"x", {}, 5).status for _ in range(3)]
    assert statuses == [204, 204, 204] and len({s.peer for s in server.seen}) == 3


def test_an_idle_connection_closed_by_the_server_is_noticed_before_the_next_request(server: Server) -> None:
    t = HttpTransport()
    assert t.post(server.url, b"a", {}, 5).status == 204
    [conn] = list(t._all)
    assert conn.sock is not None
    conn.sock.shutdown(socket.SHUT_RD)  # what an idle timeout at the server looks like to us: EOF
    assert t.post(server.url, b"b", {}, 5).status == 204
    assert [s.body for s in server.seen] == [b"a", b"b"]


def test_status_headers_and_an_error_body_come_back_bounded_and_lower_cased(server: Server) -> None:
    written = {"Retry-After": "7", "X-Prometheus-Remote-Write-Samples-Written": "3"}
    server.script = [(429, written, b"slow down\n" * 1000), (200, {}, b"ignored")]
    t = HttpTransport()
    r = t.post(server.url, b"x", {}, 5)
    assert r.status == 429 and r.headers["retry-after"] == "7"
    assert r.headers["x-prometheus-remote-write-samples-written"] == "3"
    assert r.body.startswith(b"slow down\n") and len(r.body) == 4096
    ok = t.post(server.url, b"y", {}, 5)
    assert (ok.status, ok.body) == (200, b"")  # the whole body was read: the connection is reused
    assert len({s.peer for s in server.seen}) == 1


def test_a_redirect_is_not_followed(server: Server) -> None:
    server.script = [(302, {"Location": "http://127.0.0.1:9/elsewhere"}, b"moved")]
    r = HttpTransport().post(server.url, b"x", {}, 5)
    assert (r.status, r.body) == (302, b"moved") and len(server.seen) == 1


def test_a_refused_connection_is_a_network_error_with_its_reason() -> None:
    r = HttpTransport().post(f"http://127.0.0.1:{free_port()}/w", b"x", {}, 2)
    assert r.status == 0 and r.body.startswith(b"ConnectionRefusedError")
    assert not r.body.startswith(CREDENTIALS_PREFIX)


def test_a_server_that_never_answers_times_out_as_a_network_error() -> None:
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    try:
        r = HttpTransport().post(f"http://127.0.0.1:{lsock.getsockname()[1]}/w", b"x", {}, 0.3)
        assert r.status == 0 and b"timed out" in r.body
    finally:
        lsock.close()


def test_a_botocore_error_while_signing_is_a_credentials_error(server: Server) -> None:
    class NoCreds(requests.auth.AuthBase):
        def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
            raise botocore.exceptions.NoCredentialsError()

    r = HttpTransport(auth=NoCreds()).post(server.url, b"x", {}, 1)
    assert r.status == 0 and r.body.startswith(b"credentials: NoCredentialsError") and server.seen == []


def test_the_auth_hook_signs_every_request_and_its_headers_are_sent(server: Server) -> None:
    calls: list[bytes] = []

    class Stamp(requests.auth.AuthBase):
        def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
            assert isinstance(r.body, bytes)
            calls.append(r.body)
            r.headers["Authorization"] = f"stamp {len(calls)}"
            return r

    t = HttpTransport(auth=Stamp())
    assert t.post(server.url, b"one", {"Content-Type": "x"}, 5).status == 204
    assert t.post(server.url, b"two", {"Content-Type": "x"}, 5).status == 204
    assert calls == [b"one", b"two"]
    assert [s.headers["authorization"] for s in server.seen] == ["stamp 1", "stamp 2"]
    assert server.seen[0].headers["content-type"] == "x"


def test_an_http_proxy_from_the_environment_gets_the_absolute_url_with_credentials(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = server.httpd.server_address[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://user:p%40ss@127.0.0.1:{port}")
    r = HttpTransport().post("http://remote.example:9090/api/v1/write", b"x", {}, 5)
    assert r.status == 204
    [seen] = server.seen
    assert seen.line == "POST http://remote.example:9090/api/v1/write HTTP/1.1"
    assert seen.headers["host"] == "remote.example:9090"
    assert seen.headers["proxy-authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss


def test_no_proxy_bypasses_the_proxy(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "127.0.0.0/8")
    assert HttpTransport().post(server.url, b"x", {}, 5).status == 204
    assert server.seen[0].line == "POST /api/v1/write HTTP/1.1"


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    certs = make_certs(tmp_path / "certs")
    holder: list[Server] = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(holder))
    httpd.daemon_threads = True
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    holder.append(Server(httpd))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield holder[0], certs.ca
    httpd.shutdown()
    httpd.server_close()


def test_tls_is_verified_an_unknown_ca_is_a_network_error(tls_server: tuple[Server, Path]) -> None:
    srv, _ = tls_server
    r = HttpTransport().post(srv.url.replace("http://", "https://"), b"x", {}, 5)
    assert r.status == 0 and b"CERTIFICATE_VERIFY_FAILED" in r.body and srv.seen == []


def test_tls_with_the_ca_bundle_from_requests_ca_bundle_is_accepted(
    tls_server: tuple[Server, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, ca = tls_server
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    t = HttpTransport()
    for _ in range(2):
        r = t.post(srv.url.replace("http://", "https://"), b"x", {}, 5)
        assert (r.status, r.body, r.headers["content-length"]) == (204, b"", "0")
    assert len({s.peer for s in srv.seen}) == 1


class ConnectProxy:
    """A CONNECT-only HTTP proxy on 127.0.0.1 that records the request lines and headers it gets."""

    def __init__(self) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.seen: list[tuple[str, dict[str, str]]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        line, *rest = head.split(b"\r\n\r\n")[0].decode().split("\r\n")
        self.seen.append((line, {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in rest)}))
        host, port = line.split()[1].rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    s.close()

        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)

    def close(self) -> None:
        self.lsock.close()


def test_https_through_a_proxy_from_the_environment_is_a_verified_connect_tunnel(
    tls_server: tuple[Server, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, ca = tls_server
    proxy = ConnectProxy()
    try:
        monkeypatch.setenv("HTTPS_PROXY", f"http://me:secret@127.0.0.1:{proxy.port}")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
        t = HttpTransport()
        url = srv.url.replace("http://", "https://")
        assert [t.post(url, b"x", {}, 5).status for _ in range(2)] == [204, 204]
        port = srv.httpd.server_address[1]
        [(line, headers)] = proxy.seen  # one tunnel, kept alive for both requests
        assert line == f"CONNECT 127.0.0.1:{port} HTTP/1.0" or line == f"CONNECT 127.0.0.1:{port} HTTP/1.1"
        assert headers["proxy-authorization"] == "Basic bWU6c2VjcmV0"  # me:secret
        assert srv.seen[0].headers["host"] == f"127.0.0.1:{port}" and "proxy-authorization" not in srv.seen[0].headers
    finally:
        proxy.close()


def test_an_https_proxy_for_an_https_url_is_a_network_error_that_says_what_to_use(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "https://proxy.example:3128")
    r = HttpTransport().post("https://aps.example/api/v1/remote_write", b"x", {}, 1)
    assert r.status == 0 and b"use an http:// proxy" in r.body
