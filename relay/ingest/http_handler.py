"""One HTTP/1.1 connection of the relay's front: framing, deadlines, routing to ``Endpoints``.

``Handler`` parses the request line (its own fast path for a well-formed one, http.server's checks
for any other) and the head (relay.common.http_head), guards the framing (a missing Content-Length on
a write 411; invalid, negative or duplicated 400; a short body 400, not processed; chunked 411),
bounds each request's reads by deadlines (the whole head within ``head_timeout``, a few seconds: a
connection that trickles its head is cut, so slow clients cannot hold the connection budget; head
and body within ``read_timeout``; idle keep-alive ``idle_timeout``),
answers Expect: 100-continue only when the body is about to be read, answers vmagent's protocol
probe on the write path, routes the path to the server's ``Endpoints`` and sends every reply in one
write. Nothing of the request line is logged above debug
(it may carry a token). The server (relay.ingest.server.RelayHTTPServer) owns the bounds it checks.
"""

from __future__ import annotations

import contextlib
import http
import io
import logging
import re
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from relay.common.http_head import HeadError, Headers, read_headers
from relay.ingest.http_conn import DeadlineReader, SocketWriter, blocking, response_head
from relay.ingest.http_reply import Reply, busy, text
from relay.ingest.request_body import VM_PROTO_VERSION

if TYPE_CHECKING:
    from relay.ingest.server import RelayHTTPServer

log = logging.getLogger("relay.server")

_LINGER_S = 1.0  # after refusing a body: how long its bytes are read and discarded before closing
_LINGER_BYTES = 1 << 20
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
# a request line this server parses itself; any other goes to http.server's own checks and errors
_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) ([\x21-\x7e]{1,65500}) HTTP/1\.([01])\r?\n")
_TELEMETRY_PATHS = frozenset({"/metrics", "/api/v1/cardinality", "/", "/-/reload"})


class Handler(BaseHTTPRequestHandler):
    server: RelayHTTPServer
    raw_requestline: bytes  # set by http.server's handle_one_request
    protocol_version = "HTTP/1.1"
    server_version = "gpu-relay"

    def setup(self) -> None:
        self.connection = self.request
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        blocking(self.connection)  # reads and writes timed by the kernel (http_conn.KernelTimeout)
        self._reader = DeadlineReader(self.connection)
        self._begin(time.monotonic())  # the first request
        self._buffered = io.BufferedReader(self._reader, 1 << 16)
        self.rfile = self._buffered
        self._writer = SocketWriter(self.connection, self.server.read_timeout)
        self.wfile = self._writer  # type: ignore[assignment]
        self._waiting = False  # the next request must wait for its first byte (keep-alive)
        self._body_pending = False  # the request's body, if any, was not read
        self._continue = False  # Expect: 100-continue, not answered yet

    def _begin(self, now: float) -> None:
        """A request starts: its head must arrive within ``head_timeout`` (the whole head, not each
        read), the head and body together within ``read_timeout``."""
        self._started = now
        self._reader.deadline = now + min(self.server.head_timeout, self.server.read_timeout)

    def handle_one_request(self) -> None:
        if self._waiting:
            self._reader.deadline = time.monotonic() + self.server.idle_timeout
            try:
                first = self._buffered.peek(1)
            except TimeoutError:
                log.debug("closing a keep-alive connection from %s idle for %.0f s", self.client_address[0],
                          self.server.idle_timeout)
                first = b""
            if not first:
                self.close_connection = True
                return
            self._begin(time.monotonic())
        self._waiting = True
        self._body_pending = False
        self._continue = False  # a 100 Continue is owed before the body is read
        self.command = ""
        super().handle_one_request()

    def parse_request(self) -> bool:
        """The request line and headers. A well-formed HTTP/1.0 or 1.1 request line (what every
        remote-write client sends) is parsed here and its headers by relay.http_head; any other goes
        to http.server, which answers it as it always has. True: the request may be served."""
        m = _REQUEST_LINE.fullmatch(self.raw_requestline)
        if m is None:
            return super().parse_request()
        self.request_version = "HTTP/1." + m[3].decode()
        self.requestline = self.raw_requestline.decode("iso-8859-1").rstrip("\r\n")
        self.command, self.path = m[1].decode(), m[2].decode("iso-8859-1")
        if self.path.startswith("//"):  # as http.server: "//host/x" must not read as a network path
            self.path = "/" + self.path.lstrip("/")
        self.close_connection = m[3] == b"0"
        head = read_headers(self.rfile)  # a head past its deadline: TimeoutError, and http.server closes
        if isinstance(head, HeadError):
            self.send_error(head.status, head.reason)
            return False
        self._reader.deadline = self._started + self.server.read_timeout  # the body's share of the request
        self.headers = head  # type: ignore[assignment]
        connection = head.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if head.get("Expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def handle_expect_100(self) -> bool:
        """Expect: 100-continue. The 100 goes out only when the body is about to be read (_read_exact):
        a request refused on its head alone (411, 413, 503, 404, ...) gets its final answer instead, so
        the client does not upload a body that would be thrown away (RFC 9110 10.1.1)."""
        self._continue = True
        return True

    def finish(self) -> None:
        if self._body_pending:  # read and drop what the client still sends, so that closing does not
            self._linger()  # reset the connection before it has read the reply
        self.rfile.close()

    def _linger(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self._reader.deadline = time.monotonic() + _LINGER_S
            left = _LINGER_BYTES
            while left > 0 and (chunk := self._buffered.read1(min(left, 1 << 16))):
                left -= len(chunk)
        except OSError:
            pass

    # -- logging: nothing of the request line (it may carry a token) above debug -----------------------

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s: %s", self.client_address[0], format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (bad request line, headers too long): one line, nothing echoed."""
        reason = (message or http.HTTPStatus(code).phrase).split(" (")[0]
        log.debug("%s: %d %s", self.client_address[0], code, reason)
        self._body_pending = True  # the request could not be framed
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._send(text(code, reason[:1].lower() + reason[1:]))

    def _send(self, reply: Reply) -> None:
        if self._body_pending:
            self.close_connection = True
        body = b"" if self.command == "HEAD" else reply.body
        head = response_head(reply.status, reply.content_type, reply.headers, len(reply.body), self.close_connection)
        self._writer.write(head + body)  # headers and body in one write, within read_timeout whatever the reads left

    # -- requests --------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        self._body_pending = "Transfer-Encoding" in self.headers or self.headers.get("Content-Length", "0") != "0"
        parts = urlsplit(self.path)
        try:
            reply = self._route(parts.path, parts.query)
        except _Gone as e:  # the client hung up or reset while its request was being read
            log.debug("%s hung up during %s %s: %s", self.client_address[0], self.command, parts.path, e.reason)
            self.close_connection = True
            return
        except Exception:  # a bug here must still answer, as a handler's does (see _call)
            log.exception("internal error handling %s %s", self.command, parts.path)
            reply = text(500, "internal error")
        try:
            self._send(reply)
        except OSError as e:
            log.debug("%s hung up before the reply to %s %s: %s", self.client_address[0], self.command,
                      parts.path, type(e).__name__)
            self.close_connection = True

    def _route(self, path: str, query: str) -> Reply:
        srv, ep, method = self.server, self.server.endpoints, self.command
        if path == "/api/v1/write":
            if not srv.serve_write:
                return text(404, "remote-write is not served on this listener (telemetry only); use server.listen")
            if parse_qs(query).get("get_vm_proto_version", [""])[0]:
                return self._vm_proto_probe()
            return self._write() if method == "POST" else text(405, "use POST", {"Allow": "POST"})
        if path == "/-/reload" and srv.serve_telemetry:
            if method not in ("POST", "PUT"):
                return text(405, "use POST", {"Allow": "POST, PUT"})
            if not srv.enable_lifecycle:
                return text(403, "lifecycle API is not enabled: set server.enable_lifecycle, or send SIGHUP")
            if "Content-Length" in self.headers and "Transfer-Encoding" not in self.headers:
                body = self._read_body(1 << 20)  # ignored, but read to keep the connection usable
                if isinstance(body, Reply):
                    return body
            return self._call(ep.reload)
        gets: dict[str, Any] = {"/-/healthy": ep.healthy, "/-/ready": ep.ready}
        if srv.serve_telemetry:
            q = parse_qs(query)
            accept = self.headers.get("Accept", "")
            gets |= {"/metrics": lambda: ep.metrics(accept), "/api/v1/cardinality": lambda: ep.cardinality(q),
                     "/": lambda: ep.status_page(q)}
        handler = gets.get(path)
        if handler is None and not srv.serve_telemetry and path in _TELEMETRY_PATHS:
            return text(404, "telemetry (/metrics, /api/v1/cardinality, the status page, /-/reload) is not "
                         "served on this listener: use the one of server.telemetry_listen")
        if handler is None:
            return text(404, "not found")
        if method not in ("GET", "HEAD"):
            return text(405, "use GET", {"Allow": "GET, HEAD"})
        return self._call(handler)

    def _call(self, fn: Any, *args: Any) -> Reply:
        try:
            reply: Reply = fn(*args)
        except Exception:  # never let one request take the server down; the message may hold secrets
            log.exception("internal error handling %s %s", self.command, urlsplit(self.path).path)
            return text(500, "internal error")
        return reply

    def _vm_proto_probe(self) -> Reply:
        """vmagent's handshake (``?get_vm_proto_version=1``, GET or POST): answered as VictoriaMetrics
        answers it (200, the version), whatever the method, so vmagent sends zstd; a body is read
        and ignored, within the write's limit, to keep the connection usable."""
        if "Content-Length" in self.headers and "Transfer-Encoding" not in self.headers:
            body = self._read_body(self._write_limit())
            if isinstance(body, Reply):
                return body
        return Reply(200, VM_PROTO_VERSION)

    def _write_limit(self) -> int:
        """A write's largest body: a snappy block is never larger than ~1.17x its content."""
        limit = self.server.endpoints.max_request_bytes
        return limit + limit // 5 + 64

    def _write(self) -> Reply:
        srv, ep = self.server, self.server.endpoints
        if "Transfer-Encoding" in self.headers:
            return text(411, "chunked transfer-encoding is not supported: send a Content-Length")
        if "Content-Length" not in self.headers:
            self._body_pending = True  # a write without a length: what follows cannot be framed
            return text(411, "Content-Length required")
        length = self._content_length(self._write_limit())  # the compressed body is bounded too
        if isinstance(length, Reply):
            return length
        if not srv.requests.acquire(blocking=False):  # before reading: a refused body costs nothing
            srv.overloaded("requests")
            return busy("requests")
        try:
            body = self._read_exact(length)
            if isinstance(body, Reply):
                return body
            headers = self.headers
            lowered = headers.lowered() if isinstance(headers, Headers) else {k.lower(): v for k, v in headers.items()}
            return self._call(ep.write, lowered, body)
        finally:
            srv.requests.release()

    def _read_body(self, limit: int) -> bytes | Reply:
        length = self._content_length(limit)
        return length if isinstance(length, Reply) else self._read_exact(length)

    def _content_length(self, limit: int) -> int | Reply:
        values = {v.strip() for v in self.headers.get_all("Content-Length", [])}
        if len(values) > 1:
            return text(400, "conflicting Content-Length headers")
        value = values.pop()
        if not _CONTENT_LENGTH.fullmatch(value):
            return text(400, f"invalid Content-Length {value[:24]!r}")
        length = int(value)
        if length > limit:
            return text(413, f"request body of {length} bytes is over the limit of {limit}")
        return length

    def _read_exact(self, length: int) -> bytes | Reply:
        """The body, once all of it arrived within the request's deadline; else the reply refusing it."""
        try:
            if self._continue:
                self._continue = False
                self._writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = self.rfile.read(length)
        except TimeoutError:
            return text(408, f"request not received within {self.server.read_timeout:g} s (server.read_timeout)")
        except OSError as e:
            raise _Gone(type(e).__name__) from None
        if len(body) < length:
            return text(400, f"request body shorter than its Content-Length: {len(body)} of {length} bytes")
        self._body_pending = False
        self._reader.deadline = None
        return body


class _Gone(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
