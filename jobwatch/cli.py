"""``gpu-jobwatch``: wire settings, the API client, the watches, the state, the renderer and the
HTTP listeners (``/metrics`` + ``/health`` + ``/ready``; the push endpoint only with
``--push-listen``).

Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 cannot listen, 2 bad flag, env value or config
file, or no way to reach the API server.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from jobwatch import __version__
from jobwatch.config import Settings, SettingsError, load_settings
from jobwatch.health import Health
from jobwatch.metrics import CONTENT_TYPE, Renderer
from jobwatch.prices import ConfigError
from jobwatch.progress import MAX_PUSH_BYTES
from jobwatch.push import PushEndpoint, TokenReviewer, read_chunked
from jobwatch.state import State
from jobwatch.watch import DEFAULT_BACKOFF, NODES, PODS, TRAINJOBS, Backoff, Discovery, ResourceWatch
from telemetry_common import logs
from telemetry_common.httpfront import FrontServer, Handler, Reply, parse_listen, tls_context
from telemetry_common.kubeapi import KubeClient
from telemetry_common.kubeconfig import KubeConfigError, resolve

log = logging.getLogger("jobwatch")

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2
INDEX = (b"<html><head><title>gpu-jobwatch</title></head><body><h1>gpu-jobwatch</h1>"
         b'<p><a href="/metrics">Metrics</a></p><p><a href="/health">Health</a></p>'
         b'<p><a href="/ready">Ready</a></p></body></html>\n')


class App:
    """Everything gpu-jobwatch runs, started and stopped as one. Tests build it with a fake clock
    and short backoff; ``main`` with the defaults."""

    def __init__(self, settings: Settings, client: KubeClient, *, clock: Callable[[], float] = time.time,
                 backoff: Backoff = DEFAULT_BACKOFF, watch_timeout: int = 300, render_interval: float = 10.0,
                 render_min_gap: float = 2.0, page_size: int = 500) -> None:
        self.settings = settings
        self.client = client
        changed = threading.Event()
        self.health = Health()
        self.health.changed = changed
        f = settings.file
        self.state = State(health=self.health, prices=f.prices, allow=settings.metrics_allowlist,
                           metric_limit=f.metrics_limit, retention=f.retention_s, stall_after=f.stall_after_s,
                           clock=clock, changed=changed)
        self.renderer = Renderer(self.state, self.health, changed, interval=render_interval, min_gap=render_min_gap)

        def make(resource: Any, sink: Any) -> ResourceWatch:
            return ResourceWatch(client, resource, sink, self.health, page_size=page_size,
                                 watch_timeout=watch_timeout, backoff=backoff)

        self.pods = make(PODS, self.state.pods_sink)
        self.nodes = make(NODES, self.state.nodes_sink)
        self.discovery = Discovery(client, TRAINJOBS, lambda: make(TRAINJOBS, self.state.trainjobs_sink),
                                   self.state.forget_trainjobs, self.health, settings.discovery_interval_s)
        self.metrics_server = FrontServer(parse_listen(settings.listen), self._metrics_handler())
        self.push_server: FrontServer | None = None
        if settings.push_listen:
            reviewer = TokenReviewer(client, settings.push_audience, self.health)
            endpoint = PushEndpoint(self.state, reviewer, self.health)
            tls = tls_context(settings.push_tls_cert, settings.push_tls_key) \
                if settings.push_tls_cert and settings.push_tls_key else None
            self.push_server = FrontServer(parse_listen(settings.push_listen), _push_handler(endpoint), tls=tls)
        self._threads: list[threading.Thread] = []

    def _metrics_handler(self) -> type[Handler]:
        app = self

        class MetricsHandler(Handler):
            def answer(self, method: str) -> Reply:
                path = self.path.split("?", 1)[0]
                if method not in ("GET", "HEAD"):
                    return Reply(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"})
                if path == "/metrics":
                    return Reply(200, app.renderer.body, CONTENT_TYPE)
                if path == "/health":
                    ok = app.renderer.fresh(3 * app.renderer.interval + 10)
                    return Reply(200 if ok else 503, b"ok\n" if ok else b"the exposition is not being rendered\n")
                if path == "/ready":
                    ok = app.pods.synced.is_set()
                    return Reply(200 if ok else 503, b"ok\n" if ok else b"pods not listed yet\n")
                if path == "/":
                    return Reply(200, INDEX, "text/html; charset=utf-8")
                return Reply(404, b"404 page not found\n")

        return MetricsHandler

    @property
    def metrics_port(self) -> int:
        return self.metrics_server.port

    @property
    def push_port(self) -> int | None:
        return self.push_server.port if self.push_server is not None else None

    def start(self) -> None:
        self.renderer.render_now()
        self.pods.start()
        self.nodes.start()
        self.discovery.start()
        self.renderer.start()
        for server in (self.metrics_server, self.push_server):
            if server is not None:
                t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                                     name=f"http-{server.port}")
                t.start()
                self._threads.append(t)

    def stop(self) -> None:
        self.discovery.stop()
        self.pods.stop()
        self.nodes.stop()
        self.renderer.stop()
        for server in (self.metrics_server, self.push_server):
            if server is not None:
                server.shutdown()
                server.server_close()
        self.client.close()


def _push_handler(endpoint: PushEndpoint) -> type[Handler]:
    class PushHandler(Handler):
        def answer(self, method: str) -> Reply:
            headers = {k.title(): v for k, v in self.headers.items()}  # one spelling per name
            done = [False]

            def read(length: int | None) -> bytes:
                body = read_chunked(self.rfile, MAX_PUSH_BYTES) if length is None else self.read_body(length)
                done[0] = True
                return body

            reply = endpoint.handle(method, self.path, headers, read)
            has_body = "chunked" in headers.get("Transfer-Encoding", "").lower() or \
                headers.get("Content-Length", "0").strip() not in ("", "0")
            if has_body and not done[0]:  # answered without reading it all: the rest is not a next request
                self.close_connection = True
            return reply

    return PushHandler


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except (SettingsError, ConfigError) as exc:
        print(f"gpu-jobwatch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_format, settings.log_level)
    try:
        cluster = resolve(settings.kubeconfig, os.environ)
    except KubeConfigError as exc:
        log.error("cannot configure the Kubernetes API: %s", exc)
        return EXIT_USAGE
    client = KubeClient(cluster, user_agent=f"gpu-jobwatch/{__version__}")
    try:
        app = App(settings, client)
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return EXIT_RUNTIME
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    app.start()
    log.info("gpu-jobwatch %s: API %s, metrics on %s, push %s", __version__, cluster.server, settings.listen,
             settings.push_listen or "off", extra={"version": __version__})
    stop.wait()
    log.info("stopping")
    app.stop()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
