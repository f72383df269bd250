"""The HTTP front both listeners share: a ThreadingHTTPServer with a deep listen backlog, a cap on
the request head's size and a deadline for the whole head (a client sending a byte every few
seconds cannot hold a thread), a keep-alive idle limit, optional TLS, and one place that writes
an answer (status, headers and body in one write). No access log above DEBUG; a request line,
which could carry a secret in its query, is never logged.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("jobwatch.http")

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0
BODY_TIMEOUT = 10.0


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


class HeadTooLarge(Exception):
    pass


class _DeadlineReader(io.RawIOBase):
    """A socket reader that gives up at ``deadline`` (monotonic), and counts the bytes of the head."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline: float | None = None
        self.head_budget: int | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline passed")
            self.sock.settimeout(left)
        n = self.sock.recv_into(b)
        if self.head_budget is not None:
            self.head_budget -= n
            if self.head_budget < 0:
                raise HeadTooLarge()
        return n


class Handler(BaseHTTPRequestHandler):
    """Subclasses implement ``answer(method) -> Reply`` and may call ``read_body(n)``."""

    protocol_version = "HTTP/1.1"
    server_version = "gpu-jobwatch"
    sys_version = ""
    disable_nagle_algorithm = True
    server: FrontServer

    def setup(self) -> None:
        self.connection = self.request
        self.connection.settimeout(self.server.head_timeout)
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # bounded by the timeout just set
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self._raw = _DeadlineReader(self.connection)
        self._buffered = io.BufferedReader(self._raw, 8192)
        self.rfile = self._buffered
        self.wfile = self.connection.makefile("wb", buffering=0)
        self._first = True

    def handle_one_request(self) -> None:
        try:
            if not self._first:  # keep-alive: wait for the next request's first byte, then time its head
                self._raw.deadline = time.monotonic() + self.server.idle_timeout
                if not self._buffered.peek(1):
                    self.close_connection = True
                    return
            self._first = False
            self._raw.deadline = time.monotonic() + self.server.head_timeout
            self._raw.head_budget = self.server.max_head_bytes + 8192  # + one read-ahead buffer
            super().handle_one_request()
        except HeadTooLarge:
            self.close_connection = True
            self._write(Reply(431, b"request header fields too large\n"))
        except (TimeoutError, OSError):
            self.close_connection = True

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        size = len(self.requestline) + sum(len(k) + len(v) + 4 for k, v in self.headers.items())
        if size > self.server.max_head_bytes:
            self.close_connection = True
            self._write(Reply(431, b"request header fields too large\n"))
            return False
        self._raw.head_budget = None
        self._raw.deadline = time.monotonic() + self.server.body_timeout
        return True

    def read_body(self, n: int) -> bytes:
        """Exactly ``n`` bytes of body, within the body deadline (OSError/TimeoutError otherwise)."""
        data = self.rfile.read(n)
        if len(data) < n:
            raise OSError("body shorter than Content-Length")
        return data

    def answer(self, method: str) -> Reply:
        return Reply(404, b"not found\n")

    def _dispatch(self) -> None:
        try:
            reply = self.answer(self.command)
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        except Exception:
            log.exception("answering a request failed")
            reply = Reply(500, b"internal error\n")
            self.close_connection = True
        self._write(reply)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = _dispatch

    def _write(self, reply: Reply) -> None:
        phrase = self.responses.get(reply.status, ("",))[0]
        lines = [f"HTTP/1.1 {reply.status} {phrase}", f"Content-Type: {reply.content_type}",
                 f"Content-Length: {len(reply.body)}", "X-Content-Type-Options: nosniff"]
        lines += [f"{k}: {v}" for k, v in reply.headers.items()]
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        body = b"" if getattr(self, "command", "") == "HEAD" else reply.body
        with contextlib.suppress(OSError):
            self._raw.deadline = None
            self.connection.settimeout(self.server.body_timeout)
            self.connection.sendall(head + body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (bad request line, too many headers): short, nothing echoed."""
        self.close_connection = True
        self._write(Reply(code, f"{code} {self.responses.get(code, ('error',))[0].lower()}\n".encode()))

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s: %s", self.client_address[0], format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class FrontServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # listen backlog: a burst of scrapers or pushes is queued, not refused

    def __init__(self, address: tuple[str, int], handler: type[Handler], *, tls: ssl.SSLContext | None = None,
                 max_head_bytes: int = MAX_HEAD_BYTES, head_timeout: float = HEAD_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT, body_timeout: float = BODY_TIMEOUT) -> None:
        host, port = address
        self.max_head_bytes = max_head_bytes
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.body_timeout = body_timeout
        self.tls = tls
        dual = not host and socket.has_ipv6
        self.address_family = socket.AF_INET6 if (":" in host or dual) else socket.AF_INET
        self._dual = dual
        try:
            super().__init__(("::" if dual else host, port), handler)
        except OSError:
            if not dual:
                raise
            self._dual, self.address_family = False, socket.AF_INET
            super().__init__(("0.0.0.0", port), handler)

    def server_bind(self) -> None:
        if self._dual:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        import socketserver
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's getfqdn(), which may wait on DNS
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        if self.tls is not None:  # the handshake runs in the request's thread (Handler.setup)
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port``; ValueError names the problem."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)

