"""The relay's HTTP front: remote-write in, self-metrics, health, reload, cardinality report.

The handler only parses HTTP and maps results to status codes; everything else is delegated to an
``Endpoints`` object (relay.service.Runtime in production, fakes in tests).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


class Endpoints(Protocol):
    max_request_bytes: int

    def write(self, headers: Mapping[str, str], body: bytes) -> Reply: ...

    def metrics(self, accept: str) -> Reply: ...

    def healthy(self) -> Reply: ...

    def ready(self) -> Reply: ...

    def reload(self) -> Reply: ...

    def cardinality(self, query: Mapping[str, list[str]]) -> Reply: ...


def json_reply(status: int, obj: Any) -> Reply:
    return Reply(status, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode(), "application/json")


class _Handler(BaseHTTPRequestHandler):
    server: RelayHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "gpu-relay"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def _read_body(self, limit: int) -> bytes | None:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self._send(Reply(411, b"Content-Length required\n"))
            self.close_connection = True
            return None
        try:
            length = int(length_header)
        except ValueError:
            self._send(Reply(400, b"invalid Content-Length\n"))
            self.close_connection = True
            return None
        if length > limit:
            self._send(Reply(413, f"request body of {length} bytes is over the limit of {limit}\n".encode()))
            self.close_connection = True
            return None
        return self.rfile.read(length)

    def do_POST(self) -> None:
        ep = self.server.endpoints
        path = urlsplit(self.path).path
        try:
            if path == "/api/v1/write":
                # A snappy block is never larger than ~1.17x its content: bound the compressed body too.
                body = self._read_body(ep.max_request_bytes + ep.max_request_bytes // 5 + 64)
                if body is None:
                    return
                self._send(ep.write({k.lower(): v for k, v in self.headers.items()}, body))
            elif path == "/-/reload":
                # The body is ignored, and `curl -X POST .../-/reload` sends no Content-Length: do not
                # require one (that answered 411 and then reloaded and answered a second time).
                if self.headers.get("Content-Length") is None:
                    self.close_connection = True  # a chunked body, if any, is not read
                elif self._read_body(1 << 20) is None:
                    return
                self._send(ep.reload())
            else:
                self._send(Reply(404, b"not found\n"))
        except Exception:  # never let one request take the server down
            log.exception("internal error handling POST %s", path)
            self._send(Reply(500, b"internal error\n"))

    def do_GET(self) -> None:
        ep = self.server.endpoints
        parts = urlsplit(self.path)
        try:
            if parts.path == "/metrics":
                self._send(ep.metrics(self.headers.get("Accept", "")))
            elif parts.path == "/-/healthy":
                self._send(ep.healthy())
            elif parts.path == "/-/ready":
                self._send(ep.ready())
            elif parts.path == "/api/v1/cardinality":
                self._send(ep.cardinality(parse_qs(parts.query)))
            elif parts.path == "/":
                page = getattr(ep, "status_page", None)  # the service's status page, when it has one
                index = Reply(200, _INDEX, "text/html; charset=utf-8")
                self._send(page(parse_qs(parts.query)) if callable(page) else index)
            else:
                self._send(Reply(404, b"not found\n"))
        except Exception:
            log.exception("internal error handling GET %s", parts.path)
            self._send(Reply(500, b"internal error\n"))

    do_HEAD = do_GET


_INDEX = b"""<html><head><title>gpu-relay</title></head><body><h1>gpu-relay</h1><ul>
<li>POST <code>/api/v1/write</code> (remote-write 1.0 and 2.0)</li>
<li><a href="/metrics">/metrics</a></li><li><a href="/-/healthy">/-/healthy</a></li>
<li><a href="/-/ready">/-/ready</a></li><li><a href="/api/v1/cardinality">/api/v1/cardinality</a></li>
</ul></body></html>
"""


class RelayHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        super().__init__(address, _Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[0], self.server_address[1]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="relay-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def parse_listen(listen: str) -> tuple[str, int]:
    """``127.0.0.1:9201``, ``:9201`` (all interfaces), ``[::1]:9201``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid listen address {listen!r}: expected host:port")
    host = host.strip("[]")
    return (host or "0.0.0.0", int(port))
