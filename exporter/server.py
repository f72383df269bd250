"""HTTP: ``/metrics`` serves the cached bytes, ``/health`` the collector's verdict, ``/`` an index.

A scrape does no rendering and no backend call: it picks the snapshot's bytes and writes them,
so it costs about what serving a static file costs. HTTP/1.1 keep-alive; access log at DEBUG.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from exporter.collector import Exposition
from exporter.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics

log = logging.getLogger(__name__)

INDEX = (
    b"<html><head><title>GPU Exporter</title></head><body><h1>GPU Exporter</h1>"
    b'<p><a href="/metrics">Metrics</a></p><p><a href="/health">Health</a></p></body></html>\n'
)


class ExpositionSource(Protocol):
    """What the server reads (``exporter.collector.Collector`` satisfies it)."""

    @property
    def exposition(self) -> Exposition: ...

    def health(self) -> tuple[bool, str]: ...


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "gpu-exporter"
    sys_version = ""
    timeout = 10.0  # like dcgm-exporter's read/write timeouts
    source: ExpositionSource  # set on the subclass made per server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            exp = self.source.exposition
            if wants_openmetrics(self.headers.get("Accept")):
                self._send(200, exp.openmetrics, OPENMETRICS_CONTENT_TYPE)
            else:
                self._send(200, exp.text, TEXT_CONTENT_TYPE)
        elif path == "/health":
            ok, reason = self.source.health()
            self._send(200 if ok else 503, reason.encode(), "text/plain; charset=utf-8")
        elif path == "/":
            self._send(200, INDEX, "text/html; charset=utf-8")
        else:
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        """Status, headers and body in one write (no Nagle/delayed-ACK stall between them)."""
        self.log_request(code)
        lines = [
            f"HTTP/1.1 {code} {self.responses[code][0]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "X-Content-Type-Options: nosniff",
            f"Date: {self.date_time_string()}",
        ]
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: object, client_address: object) -> None:
        """A scraper hanging up is routine: one DEBUG line, not a traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client %s: %s", client_address, exc)
        else:
            log.exception("error serving %s", client_address)


class _HTTP6Server(_HTTPServer):
    address_family = socket.AF_INET6


class Server:
    """Binds at construction (so a port in use fails early); ``start()`` serves on a thread."""

    def __init__(self, address: tuple[str, int], source: ExpositionSource) -> None:
        handler = type("Handler", (_Handler,), {"source": source})
        cls = _HTTP6Server if ":" in address[0] else _HTTPServer
        self._httpd = cls(address, handler)
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
        return f"http://{host}:{port}"

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
