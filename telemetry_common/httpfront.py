"""A hardened HTTP/1.1 front for the programs' listeners (gpu-jobwatch, gpu-exporter).

A ThreadingHTTPServer with
- a listen backlog of 1,024 (a burst of new connections, e.g. kubelet probes, waits in the kernel's
  queue instead of being refused or stalled);
- a bound on open connections (``max_connections``): one over it is answered at once, on the
  accepting thread, without reading anything (plain HTTP: 503 with Retry-After; TLS: closed, since a
  handshake would block the accept loop), and never queued; refusals are one WARNING a minute;
- a cap on the request head's total bytes (request line and every header together:
  ``max_head_bytes``, 431 over it), counted as the bytes arrive, so a client never makes the server
  hold more than the cap and one read buffer;
- a deadline for the whole head (``head_timeout``, from the connection's first byte or the previous
  answer), not per recv(): a client trickling a byte a second is cut off; the TLS handshake gets the
  same whole deadline; keep-alive connections wait at most ``idle_timeout`` for the next request;
- hooks for the listener's policies: ``tls`` is a context or a callable returning the one in force
  (re-read per connection, for certificate rotation); ``Handler.accept_peer`` runs after the
  handshake (e.g. a client-certificate SAN allow-list) and may refuse the connection; basic auth,
  rate limits and routing belong to ``Handler.answer``;
- one place that writes an answer (status line, headers, body; small answers in one write, large
  bodies sent without being copied).
No access log above DEBUG; a request line, which could carry a secret in its query, is never logged.
"""

from __future__ import annotations

import contextlib
import io
import logging
import select
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)  # a server may pass its own (``logger=``)

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0
BODY_TIMEOUT = 10.0
MAX_CONNECTIONS = 1024
BACKLOG = 1024
RETRY_AFTER_S = 1
_WARN_EVERY_S = 60.0
_ONE_WRITE_MAX = 64 * 1024  # answers up to this size go out in one write; larger bodies are not copied
_BUSY_BODY = b"too many open connections; retry later\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: %d\r\nRetry-After: %d\r\nConnection: close\r\n\r\n%s"
         % (len(_BUSY_BODY), RETRY_AFTER_S, _BUSY_BODY))


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


def handshake(sock: ssl.SSLSocket, timeout: float) -> None:
    """The server side of a TLS handshake, all of it within ``timeout`` seconds (TimeoutError)."""
    deadline = time.monotonic() + timeout
    sock.settimeout(0.0)
    try:
        while True:
            try:
                sock.do_handshake()
                return
            except ssl.SSLWantReadError:
                want_read = True
            except ssl.SSLWantWriteError:
                want_read = False
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("TLS handshake deadline passed")
            readable, writable, _ = select.select([sock] if want_read else [], [] if want_read else [sock], [], left)
            if not readable and not writable:
                raise TimeoutError("TLS handshake deadline passed")
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(timeout)


class Handler(BaseHTTPRequestHandler):
    """Subclasses implement ``answer(method) -> Reply``, may call ``read_body(n)`` and may override
    ``accept_peer()``."""

    protocol_version = "HTTP/1.1"
    server_version = "gpu-jobwatch"
    sys_version = ""
    disable_nagle_algorithm = True
    server: FrontServer

    def setup(self) -> None:
        self.connection = self.request
        self.connection.settimeout(self.server.head_timeout)
        self._refused = False
        if isinstance(self.connection, ssl.SSLSocket):
            handshake(self.connection, self.server.head_timeout)
            self._refused = not self.accept_peer()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self._raw = _DeadlineReader(self.connection)
        self._buffered = io.BufferedReader(self._raw, 8192)
        self.rfile = self._buffered
        self.wfile = self.connection.makefile("wb", buffering=0)
        self._first = True

    def accept_peer(self) -> bool:
        """Called after a TLS handshake: False closes the connection before any request is read."""
        return True

    def handle(self) -> None:
        if self._refused:
            self.server.logger.debug("%s: connection refused after the TLS handshake", self.client_address[0])
            return
        super().handle()

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
            self.server.logger.exception("answering a request failed")
            reply = Reply(500, b"internal error\n")
            self.close_connection = True
        self._write(reply)

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _dispatch

    def _write(self, reply: Reply) -> None:
        phrase = self.responses.get(reply.status, ("",))[0]
        lines = [f"HTTP/1.1 {reply.status} {phrase}", f"Content-Type: {reply.content_type}",
                 f"Content-Length: {len(reply.body)}", f"Date: {formatdate(usegmt=True)}"]
        if not any(k.lower() == "x-content-type-options" for k in reply.headers):
            lines.append("X-Content-Type-Options: nosniff")
        lines += [f"{k}: {v}" for k, v in reply.headers.items()]
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        body = b"" if getattr(self, "command", "") == "HEAD" else reply.body
        with contextlib.suppress(OSError):
            self._raw.deadline = None
            self.connection.settimeout(self.server.body_timeout)  # the whole write (Python >= 3.5)
            if len(body) <= _ONE_WRITE_MAX:
                self.connection.sendall(head + body)
            else:  # TCP_NODELAY is on: no stall between the two; the (shared) body is not copied
                self.connection.sendall(head)
                self.connection.sendall(memoryview(body))

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (bad request line, too many headers): short, nothing echoed."""
        self.close_connection = True
        self._write(Reply(code, f"{code} {self.responses.get(code, ('error',))[0].lower()}\n".encode()))

    def log_message(self, format: str, *args: Any) -> None:
        self.server.logger.debug("%s: %s", self.client_address[0], format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class BoundedConnections:
    """For a ThreadingHTTPServer (listed before it) whose ``verify_request`` took one of
    ``self._connections`` (a BoundedSemaphore): the slot comes back when the connection's thread ends
    (or its start fails), and ``self._open`` holds the open sockets under ``self._lock``."""

    _connections: threading.BoundedSemaphore
    _open: set[Any]
    _lock: threading.Lock

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            self._connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._open.add(request)
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            with self._lock:
                self._open.discard(request)
            self._connections.release()


class FrontServer(BoundedConnections, ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = BACKLOG  # listen backlog: a burst of scrapers or pushes is queued, not refused

    def __init__(self, address: tuple[str, int], handler: type[Handler], *,
                 tls: ssl.SSLContext | Callable[[], ssl.SSLContext | None] | None = None,
                 max_head_bytes: int = MAX_HEAD_BYTES, head_timeout: float = HEAD_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT, body_timeout: float = BODY_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS, logger: logging.Logger | None = None) -> None:
        host, port = address
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_head_bytes = max_head_bytes
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        self.tls = tls
        self.logger = logger or log
        self.refused = 0  # connections refused over max_connections, since start
        self._connections = threading.BoundedSemaphore(max_connections)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._unwarned = 0
        self._warned_at = -_WARN_EVERY_S
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
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's getfqdn(), which may wait on DNS
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        ctx = self.tls() if callable(self.tls) else self.tls
        if ctx is not None:  # the handshake runs in the request's thread (Handler.setup)
            sock = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    # -- the connection bound ---------------------------------------------------------------------------

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self._connections.acquire(blocking=False):
            return True
        self._note_refusal()
        if not isinstance(request, ssl.SSLSocket):
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_BUSY)
        return False  # socketserver closes it

    def _note_refusal(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.refused += 1
            self._unwarned += 1
            if now - self._warned_at < _WARN_EVERY_S:
                return
            count, self._unwarned, self._warned_at = self._unwarned, 0, now
        self.logger.warning("%d open connections (the bound): refused %d new connection(s) since the last "
                            "warning", self.max_connections, count, extra={"reason": "max_connections"})


    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up, timing out or failing the TLS handshake is routine: one DEBUG line."""
        exc = sys.exc_info()[1]
        where = client_address[0] if client_address else "?"
        if isinstance(exc, OSError):  # ConnectionError, TimeoutError and ssl.SSLError are OSErrors
            self.logger.debug("%s: %s", where, type(exc).__name__)
        else:
            self.logger.exception("unexpected error on a connection from %s", where)

    def server_close(self) -> None:
        """Close the listening socket and every open connection (kept-alive ones would wait out
        ``idle_timeout`` otherwise)."""
        super().server_close()
        with self._lock:
            connections = list(self._open)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

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
