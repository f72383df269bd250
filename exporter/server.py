"""HTTP: ``/metrics`` the cached bytes, ``/health`` liveness, ``/ready`` readiness, ``/`` an index.

A scrape does no rendering and no backend call: it picks the snapshot's bytes and writes them,
so it costs about what serving a static file costs. HTTP/1.1 keep-alive; access log at DEBUG.

``/metrics`` is the classic text format whatever the scraper's Accept header offers, as
dcgm-exporter 4.8.2 does (DCGM counters lack ``_total``, so OpenMetrics would type them
``unknown``); with ``openmetrics=True`` (``--enable-openmetrics``) a scraper that asks gets it.
With a web config (``exporter.webconfig``) connections are TLS and/or need basic auth on every
path, probes included, as exporter-toolkit does (NVIDIA's chart then probes with ``tcpSocket``);
changed certificates or users apply without a restart (``exporter.webreload``).
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from exporter.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics
from exporter.webconfig import WebConfig
from exporter.webreload import Active, LiveWebConfig

log = logging.getLogger(__name__)

INDEX = (
    b"<html><head><title>GPU Exporter</title></head><body><h1>GPU Exporter</h1>"
    b'<p><a href="/metrics">Metrics</a></p><p><a href="/health">Health</a></p>'
    b'<p><a href="/ready">Ready</a></p></body></html>\n'
)
TEXT_PLAIN = "text/plain; charset=utf-8"


class Snapshot(Protocol):
    """The bytes a scrape serves (``exporter.collector.Exposition`` satisfies it)."""

    @property
    def text(self) -> bytes: ...

    @property
    def openmetrics(self) -> bytes: ...


class ExpositionSource(Protocol):
    """What the server reads (``exporter.collector.Collector`` satisfies it)."""

    @property
    def exposition(self) -> Snapshot: ...

    def health(self) -> tuple[bool, str]:
        """Liveness: False only when the collection loop itself is stuck."""
        ...

    def readiness(self) -> tuple[bool, str]:
        """Readiness: False when no GPU is up (or the loop is stuck)."""
        ...


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "gpu-exporter"
    sys_version = ""
    timeout = 10.0  # like dcgm-exporter's read/write timeouts
    # set on the subclass made per server:
    source: ExpositionSource
    openmetrics: bool = False
    _active: Active | None = None

    def setup(self) -> None:
        super().setup()  # applies the timeout, which then bounds the TLS handshake too
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def do_GET(self) -> None:
        self._active = self.server.live.current()  # type: ignore[attr-defined]
        if not self._active.auth.check(self.headers.get("Authorization")):
            self._send(401, b"Unauthorized\n", TEXT_PLAIN, (("WWW-Authenticate", 'Basic realm="gpu-exporter"'),))
            return
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            exp = self.source.exposition
            if self.openmetrics and wants_openmetrics(self.headers.get("Accept")):
                self._send(200, exp.openmetrics, OPENMETRICS_CONTENT_TYPE)
            else:
                self._send(200, exp.text, TEXT_CONTENT_TYPE)
        elif path in ("/health", "/ready"):
            ok, reason = self.source.health() if path == "/health" else self.source.readiness()
            self._send(200 if ok else 503, reason.encode(), TEXT_PLAIN)
        elif path == "/":
            self._send(200, INDEX, "text/html; charset=utf-8")
        else:
            self._send(404, b"404 page not found\n", TEXT_PLAIN)

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send(
        self, code: int, body: bytes, content_type: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """Status, headers and body in one write (no Nagle/delayed-ACK stall between them)."""
        self.log_request(code)
        extra = (self._active.headers if self._active is not None else ()) + headers
        lines = [
            f"HTTP/1.1 {code} {self.responses[code][0]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            f"Date: {self.date_time_string()}",
        ]
        if not any(k.lower() == "x-content-type-options" for k, _ in extra):
            lines.append("X-Content-Type-Options: nosniff")
        lines += [f"{k}: {v}" for k, v in extra]
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    live: LiveWebConfig

    def get_request(self) -> tuple[Any, Any]:
        """With TLS, wrap the accepted socket; the handshake runs on the connection's own thread
        (bounded by the handler's timeout), so a slow client never blocks accepting others."""
        sock, addr = self.socket.accept()
        ctx = self.live.current().ssl_context
        if ctx is None:
            return sock, addr
        return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request: object, client_address: object) -> None:
        """A scraper hanging up or failing the TLS handshake is routine: one DEBUG line."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError | ssl.SSLError):
            log.debug("client %s: %s", client_address, exc)
        else:
            log.exception("error serving %s", client_address)


class _HTTP6Server(_HTTPServer):
    address_family = socket.AF_INET6


class Server:
    """Binds at construction (so a port in use fails early); ``start()`` serves on a thread."""

    def __init__(
        self,
        address: tuple[str, int],
        source: ExpositionSource,
        web: WebConfig | None = None,
        *,
        openmetrics: bool = False,
        reload_check_s: float = 5.0,
    ) -> None:
        self.web = LiveWebConfig(web if web is not None else WebConfig(), check_s=reload_check_s)
        handler = type("Handler", (_Handler,), {"source": source, "openmetrics": openmetrics})
        cls = _HTTP6Server if ":" in address[0] else _HTTPServer
        self._httpd = cls(address, handler)
        self._httpd.live = self.web
        self._tls = self.web.tls
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return (str(host), int(port))

    @property
    def url(self) -> str:
        host, port = self.address
        if host in ("", "0.0.0.0", "::"):
            host = "0.0.0.0" if host != "::" else "[::]"
        elif ":" in host:
            host = f"[{host}]"
        return f"{'https' if self._tls else 'http'}://{host}:{port}"

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5.0)
            self._thread = None
        self._httpd.server_close()
