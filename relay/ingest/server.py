"""The relay's HTTP front: remote-write in, self-metrics, health, reload, cardinality, status page.

The handler (relay.ingest.http_handler) only parses HTTP and maps results to status codes; everything
else is delegated to an ``Endpoints`` object (relay.ingest.http_reply; relay.control.service.Runtime
in production, fakes in tests). It guards the framing (a missing Content-Length on a write 411;
invalid, negative or duplicated 400; a short body 400, not processed; chunked 411, as a write is
bounded before it is read), slow clients (the whole head within ``head_timeout``, else the
connection is cut; head and body within ``read_timeout`` in total; idle keep-alive connections
closed after ``idle_timeout``) and load (``max_concurrent`` writes, ``max_connections``
connections; beyond, an immediate 503 with Retry-After and no body read). Replies go out in one
write with TCP_NODELAY and echo nothing of the request; a client that hangs up is a debug line.
``serve_write`` serves POST /api/v1/write (and answers vmagent's protocol probe there),
``serve_telemetry`` /metrics, /api/v1/cardinality, the status page at / and POST /-/reload (with
``enable_lifecycle``); both serve /-/healthy and /-/ready, for probes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any

from relay.ingest.http_conn import response_head
from relay.ingest.http_handler import Handler
from relay.ingest.http_reply import RETRY_AFTER_S, Endpoints, Reply, busy, json_reply
from telemetry_common.httpfront import BoundedConnections

__all__ = ["RETRY_AFTER_S", "Endpoints", "RelayHTTPServer", "Reply", "json_reply", "parse_listen"]

log = logging.getLogger("relay.server")

_WARN_EVERY_S = 60.0
HEAD_TIMEOUT_S = 5.0  # a request's whole head (request line and headers): what a client has to send it


_BUSY = busy("connections")
_BUSY_CONNECTIONS = response_head(503, _BUSY.content_type, _BUSY.headers, len(_BUSY.body), True) + _BUSY.body


class RelayHTTPServer(BoundedConnections, ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        endpoints: Endpoints,
        *,
        serve_write: bool = True,
        serve_telemetry: bool = True,
        max_concurrent: int = 64,
        read_timeout: float = 30.0,
        head_timeout: float = HEAD_TIMEOUT_S,
        idle_timeout: float = 120.0,
        enable_lifecycle: bool = False,
        max_connections: int | None = None,
    ) -> None:
        if not (serve_write or serve_telemetry):
            raise ValueError("a listener that serves neither writes nor telemetry serves nothing")
        host, port = address
        self._dual_stack = not host and socket.has_ipv6  # ":9202": IPv6 and IPv4, where the host has IPv6
        self.address_family = socket.AF_INET6 if ":" in host or self._dual_stack else socket.AF_INET
        self.endpoints = endpoints
        self.serve_write = serve_write
        self.serve_telemetry = serve_telemetry
        self.read_timeout = read_timeout
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.enable_lifecycle = enable_lifecycle
        self.requests = threading.BoundedSemaphore(max_concurrent)  # writes being read or processed
        self._connections = threading.BoundedSemaphore(max_connections or 4 * max_concurrent)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._refused: dict[str, int] = {}
        self._warned_at: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        try:
            super().__init__(("::", port) if self._dual_stack else address, Handler)
        except OSError:
            if not self._dual_stack:
                raise
            self._dual_stack, self.address_family = False, socket.AF_INET  # IPv6 disabled: IPv4 only
            super().__init__(("0.0.0.0", port), Handler)

    def server_bind(self) -> None:
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        TCPServer.server_bind(self)  # not HTTPServer's, whose getfqdn() may wait on DNS
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    # -- bounds -----------------------------------------------------------------------------------------

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self._connections.acquire(blocking=False):
            return True
        self.overloaded("connections")
        try:
            request.setblocking(False)
            request.send(_BUSY_CONNECTIONS)
        except OSError:
            pass
        return False


    def overloaded(self, what: str) -> None:
        """Count a 503 for load; one WARNING a minute at most, with the count since the last one."""
        now = time.monotonic()
        with self._lock:
            self._refused[what] = count = self._refused.get(what, 0) + 1
            if now - self._warned_at.get(what, -_WARN_EVERY_S) < _WARN_EVERY_S:
                return
            self._warned_at[what] = now
            self._refused[what] = 0
        log.warning("too many concurrent %s: answering 503 with Retry-After (%d since the last warning)", what,
                    count, extra={"reason": f"concurrent_{what}"})

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("%s hung up: %s", client_address[0] if client_address else "?", type(exc).__name__)
        else:
            log.exception("unexpected error on a connection from %s", client_address[0] if client_address else "?")

    # -- life -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="relay-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, close the listening socket and every open connection; idempotent."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()
        with self._lock:
            connections = list(self._open)
        for sock in connections:  # kept-alive connections would otherwise wait out idle_timeout
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def parse_listen(listen: str) -> tuple[str, int]:
    """``127.0.0.1:9201``, ``[::1]:9201``, ``:9201`` (all interfaces: host "", which RelayHTTPServer
    binds on IPv6 and IPv4 where the machine has IPv6, as Prometheus does; ``0.0.0.0:9201``: IPv4 only)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid listen address {listen!r}: expected host:port")
    return (host.strip("[]"), int(port))
