"""HTTP: ``/metrics`` the cached bytes, ``/health`` liveness, ``/ready`` readiness, ``/`` an index.

A scrape does no rendering and no backend call: it picks the snapshot's bytes and writes them,
so it costs about what serving a static file costs. HTTP/1.1 keep-alive; access log at DEBUG.

``/metrics`` is the classic text format whatever the scraper's Accept header offers, as
dcgm-exporter 4.8.2 does (DCGM counters lack ``_total``, so OpenMetrics would type them
``unknown``); with ``openmetrics=True`` (``--enable-openmetrics``) a scraper that asks gets it.
With a web config (``exporter.webconfig``) connections are TLS and/or need basic auth on every
path, probes included, as exporter-toolkit does (NVIDIA's chart then probes with ``tcpSocket``);
``rate_limit`` answers 429 before auth; ``client_allowed_sans`` closes a TLS connection whose client
certificate has none of the SANs. Changed certificates or users apply without a restart
(``exporter.webreload``).

The front is ``telemetry_common.httpfront`` (what a pod that reaches the node can do to it is
bounded): a request head is at most ``MAX_HEAD_BYTES`` (64 KiB, 431 over it; Go's server allows
1 MiB, this process's memory limit is tighter), all of it within ``HEAD_TIMEOUT`` (10 s, as
dcgm-exporter's read timeout, but for the whole head); an idle keep-alive connection is closed
after ``IDLE_TIMEOUT``; at most ``MAX_CONNECTIONS`` connections are open, one more is answered 503
(TLS: closed) at once; the listen backlog is 1,024.
"""

from __future__ import annotations

import logging
import ssl
import threading
from typing import Protocol

from exporter.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics
from exporter.webconfig import WebConfig
from exporter.webreload import LiveWebConfig
from exporter.webtls import sans_allowed
from telemetry_common.httpfront import FrontServer, Handler, Reply

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0
WRITE_TIMEOUT = 10.0  # dcgm-exporter's write timeout: a whole answer
MAX_CONNECTIONS = 256

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


class _Handler(Handler):
    server_version = "gpu-exporter"
    # set on the subclass made per server:
    source: ExpositionSource
    openmetrics: bool = False
    live: LiveWebConfig

    def accept_peer(self) -> bool:
        """exporter-toolkit's client_allowed_sans: a client certificate with an allowed SAN."""
        allowed = self.live.current().allowed_sans
        if allowed is None:
            return True
        assert isinstance(self.connection, ssl.SSLSocket)
        return sans_allowed(self.connection.getpeercert(), allowed)

    def answer(self, method: str) -> Reply:
        active = self.live.current()
        if active.limiter is not None and not active.limiter.allow():
            return Reply(429, b"Too Many Requests\n")  # as the toolkit: before auth and its headers
        headers = dict(active.headers)
        if not active.auth.check(self.headers.get("Authorization")):
            headers["WWW-Authenticate"] = 'Basic realm="gpu-exporter"'
            return Reply(401, b"Unauthorized\n", TEXT_PLAIN, headers)
        if method not in ("GET", "HEAD"):
            return Reply(405, b"method not allowed\n", TEXT_PLAIN, {**headers, "Allow": "GET, HEAD"})
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            exp = self.source.exposition
            if self.openmetrics and wants_openmetrics(self.headers.get("Accept")):
                return Reply(200, exp.openmetrics, OPENMETRICS_CONTENT_TYPE, headers)
            return Reply(200, exp.text, TEXT_CONTENT_TYPE, headers)
        if path in ("/health", "/ready"):
            ok, reason = self.source.health() if path == "/health" else self.source.readiness()
            return Reply(200 if ok else 503, reason.encode(), TEXT_PLAIN, headers)
        if path == "/":
            return Reply(200, INDEX, "text/html; charset=utf-8", headers)
        return Reply(404, b"404 page not found\n", TEXT_PLAIN, headers)


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
        max_connections: int = MAX_CONNECTIONS,
        max_head_bytes: int = MAX_HEAD_BYTES,
        head_timeout: float = HEAD_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.web = LiveWebConfig(web if web is not None else WebConfig(), check_s=reload_check_s)
        live = self.web
        handler = type("Handler", (_Handler,), {"source": source, "openmetrics": openmetrics, "live": live})
        self._tls = self.web.tls
        self._httpd = FrontServer(
            address, handler, tls=(lambda: live.current().ssl_context) if self._tls else None,
            max_head_bytes=max_head_bytes, head_timeout=head_timeout, idle_timeout=idle_timeout,
            body_timeout=WRITE_TIMEOUT, max_connections=max_connections, logger=log)
        self._thread: threading.Thread | None = None

    @property
    def front(self) -> FrontServer:
        """The HTTP front (its bounds, ``refused``, ``open_connections``)."""
        return self._httpd

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
