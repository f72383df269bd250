"""`gpu-relay run`: wires config, pipeline, durable queues, senders, scrapers and the HTTP server.

A ``Runtime`` owns one configuration generation at a time. Reload (SIGHUP or POST /-/reload)
parses the new file first; a bad config is refused, logged and counted, and the old one keeps
running. Queues and senders are kept across reloads for destinations whose sending settings did
not change, so nothing queued is lost.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from relay import __version__, wire
from relay.cardinality import CardinalityMetrics, DestinationStats
from relay.config import Config, ConfigError, DestinationConfig, load_config
from relay.metrics import RelayMetrics
from relay.pipeline import Pipeline
from relay.queue import DurableQueue
from relay.sender import Sender, SenderSettings
from relay.server import RelayHTTPServer, Reply, json_reply, parse_listen
from relay.transport import RequestsTransport, Transport

log = logging.getLogger(__name__)


@dataclass
class _Destination:
    config: DestinationConfig
    stats: DestinationStats
    queue: DurableQueue | None
    sender: Sender | None


def _sender_key(d: DestinationConfig) -> tuple[Any, ...]:
    return (d.url, d.sigv4, tuple(sorted(d.headers.items())), d.queue, d.dry_run)


def sender_settings(d: DestinationConfig) -> SenderSettings:
    q = d.queue
    return SenderSettings(
        max_samples_per_send=q.max_samples_per_send,
        batch_send_deadline=q.batch_send_deadline,
        min_backoff=q.min_backoff,
        max_backoff=q.max_backoff,
        max_sample_age=q.max_sample_age,
        timeout=q.timeout,
    )


class Runtime:
    """Everything `gpu-relay run` keeps alive; implements relay.server.Endpoints."""

    def __init__(
        self,
        config_path: str | None,
        config: Config,
        registry: CollectorRegistry | None = None,
        transport_factory: Callable[[DestinationConfig], Transport] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config_path = config_path
        self.registry = registry or CollectorRegistry()
        self.rm = RelayMetrics(self.registry)
        self.cardinality_metrics = CardinalityMetrics(self.registry)
        self.clock = clock
        self.transport_factory = transport_factory or default_transport
        self.destinations: dict[str, _Destination] = {}
        self._reload_lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self.config = config
        self.pipeline = self._build(config)
        self.max_request_bytes = config.server.max_request_bytes
        self._ready = True

    # -- building --------------------------------------------------------------------------------
    def _build(self, config: Config, previous: Pipeline | None = None) -> Pipeline:
        storage = Path(config.storage_path)
        storage.mkdir(parents=True, exist_ok=True)
        new: dict[str, _Destination] = {}
        for d in config.destinations:
            old = self.destinations.get(d.name)
            if old is not None and _sender_key(old.config) == _sender_key(d):
                new[d.name] = _Destination(d, old.stats, old.queue, old.sender)
                continue
            if old is not None:
                self._stop_destination(old)
            stats = old.stats if old is not None else DestinationStats(
                d.name, window_s=d.limits.window, metrics=self.cardinality_metrics
            )
            queue: DurableQueue | None = None
            sender: Sender | None = None
            if not d.dry_run:
                queue = DurableQueue(storage / f"{d.name}.queue.db", d.queue.max_disk)
                transport = self.transport_factory(d)
                auth_refresh = getattr(transport, "refresh_credentials", None)
                sender = Sender(
                    d.name,
                    d.url,
                    queue,
                    transport,
                    sender_settings(d),
                    self.rm,
                    headers=d.headers,
                    auth_refresh=auth_refresh,
                    user_agent=f"gpu-relay/{__version__}",
                )
            new[d.name] = _Destination(d, stats, queue, sender)
        for name, old in self.destinations.items():
            if name not in new:
                self._stop_destination(old)
                self.cardinality_metrics.untrack(name)
                self.rm.forget_destination(name)  # its gpu_relay_* series left with it
        self.destinations = new
        dests = [new[d.name] for d in config.destinations]
        return Pipeline(
            config,
            self.rm,
            [x.stats for x in dests],
            [x.queue for x in dests],
            cardinality=self.cardinality_metrics,
            clock=self.clock,
            previous=previous,
        )

    @staticmethod
    def _stop_destination(d: _Destination) -> None:
        if d.sender is not None:
            d.sender.stop()
        if d.queue is not None:
            d.queue.close()

    def start(self) -> None:
        for d in self.destinations.values():
            if d.sender is not None:
                d.sender.start()
        self._flusher = threading.Thread(target=self._background, name="relay-background", daemon=True)
        self._flusher.start()

    def _background(self) -> None:
        last_expire = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                self.pipeline.flush_aggregates()
                self._update_gauges()
                if time.monotonic() - last_expire >= 60:
                    last_expire = time.monotonic()
                    self.pipeline.expire()
            except Exception:
                log.exception("background maintenance failed")

    def _update_gauges(self) -> None:
        now = self.clock()
        for name, d in self.destinations.items():
            if d.queue is None:
                continue
            samples, nbytes = d.queue.depth()
            self.rm.queue_samples.labels(name).set(samples)
            self.rm.queue_bytes.labels(name).set(nbytes)
            oldest = d.queue.oldest_enqueued_at()
            self.rm.oldest_queued_sample_age_seconds.labels(name).set(
                0.0 if oldest is None else max(0.0, now - oldest)
            )

    def stop(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        for d in self.destinations.values():
            self._stop_destination(d)

    # -- endpoints -------------------------------------------------------------------------------
    def write(self, headers: Mapping[str, str], body: bytes) -> Reply:
        try:
            version = wire.parse_content_type(headers.get("content-type"))
            encoding = headers.get("content-encoding", "snappy").strip().lower()
            if encoding != "snappy":
                raise wire.WireError(415, f"unsupported Content-Encoding {encoding!r}: expected snappy")
            raw = wire.decompress(body, self.max_request_bytes)
            counts = None
            if version == 2:
                raw, counts = wire.v2_to_v1(raw, self.max_request_bytes)
            self.pipeline.ingest(raw)
        except wire.WireError as e:
            self.rm.requests_received_total.labels(str(e.status)).inc()
            return Reply(e.status, (str(e).splitlines()[0] + "\n").encode())
        except Exception as e:  # queue write failed: tell the sender to retry later
            log.exception("could not queue a request")
            self.rm.requests_received_total.labels("503").inc()
            return Reply(503, f"could not store the request: {type(e).__name__}\n".encode())
        self.rm.requests_received_total.labels("204").inc()
        extra: dict[str, str] = {}
        if counts is not None:
            extra = {
                "X-Prometheus-Remote-Write-Samples-Written": str(counts.samples),
                "X-Prometheus-Remote-Write-Histograms-Written": str(counts.histograms),
                "X-Prometheus-Remote-Write-Exemplars-Written": str(counts.exemplars),
            }
        return Reply(204, b"", headers=extra)

    def metrics(self, accept: str) -> Reply:
        self._update_gauges()
        encoder, content_type = choose_encoder(accept)
        return Reply(200, encoder(self.registry), content_type)

    def healthy(self) -> Reply:
        return Reply(200, b"gpu-relay is Healthy.\n")

    def ready(self) -> Reply:
        if not self._ready:
            return Reply(503, b"not ready\n")
        return Reply(200, b"gpu-relay is Ready.\n")

    def reload(self) -> Reply:
        ok, message = self.reload_config()
        return Reply(200 if ok else 400, (message + "\n").encode())

    def reload_config(self) -> tuple[bool, str]:
        if self.config_path is None:
            return False, "no configuration file to reload"
        with self._reload_lock:
            try:
                config = load_config(self.config_path)
                if config.server != self.config.server:
                    log.warning("server settings changed in %s; they take effect on restart", self.config_path)
                pipeline = self._build(config, previous=self.pipeline)
            except ConfigError as e:
                self.rm.config_reloads_total.labels("failure").inc()
                log.error("reload refused, keeping the running configuration:\n%s", e)
                return False, f"reload refused, keeping the running configuration:\n{e}"
            except Exception as e:
                self.rm.config_reloads_total.labels("failure").inc()
                log.exception("reload failed, keeping the running configuration")
                return False, f"reload failed: {e}"
            self.config = config
            self.pipeline = pipeline
            for d in self.destinations.values():
                if d.sender is not None:
                    d.sender.start()
            self.rm.config_reloads_total.labels("success").inc()
            log.info("configuration reloaded from %s", self.config_path)
            return True, "configuration reloaded"

    def cardinality(self, query: Mapping[str, list[str]]) -> Reply:
        names = [d.name for d in self.config.destinations]
        name = (query.get("destination") or [names[0]])[0]
        try:
            limit = int((query.get("limit") or ["10"])[0])
        except ValueError:
            return json_reply(400, {"status": "error", "error": "limit must be an integer"})
        d = self.destinations.get(name)
        if d is None:
            return json_reply(
                404, {"status": "error", "error": f"unknown destination {name!r}", "destinations": names}
            )
        snap = d.stats.snapshot(limit=limit)
        snap["dry_run"] = d.config.dry_run
        snap["all_destinations"] = names
        return json_reply(200, snap)


def default_transport(d: DestinationConfig) -> Transport:
    auth = None
    if d.sigv4 is not None:
        from relay.sigv4 import SigV4Auth

        auth = SigV4Auth(
            region=d.sigv4.region,
            service=d.sigv4.service,
            profile=d.sigv4.profile,
            role_arn=d.sigv4.role_arn,
            external_id=d.sigv4.external_id,
        )
    return RequestsTransport(auth=auth)


def run(config_path: str) -> int:
    try:
        config = load_config(config_path)
    except ConfigError as e:
        log.error("%s", e)
        print(str(e))
        return 1
    runtime = Runtime(config_path, config)
    scraper = None
    try:
        server = RelayHTTPServer(parse_listen(config.server.listen), runtime)
    except OSError as e:
        print(f"gpu-relay: cannot listen on {config.server.listen}: {e}")
        runtime.stop()
        return 1
    runtime.start()
    server.start()
    if config.scrape:
        scraper = start_scraper(config, runtime)
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=runtime.reload_config, name="reload", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_hup)
    dests = ", ".join(f"{d.name}{' (dry run)' if d.dry_run else ''}" for d in config.destinations)
    print(f"gpu-relay {__version__}: receiving remote-write on {server.url}/api/v1/write; destinations: {dests}")
    print(f"  self-metrics {server.url}/metrics · cardinality {server.url}/api/v1/cardinality", flush=True)
    # Wait with a timeout: the kernel may deliver SIGHUP/SIGTERM to any of our threads, and Python runs
    # the handler only when the main thread next executes bytecode, which an untimed wait never does.
    while not stop.wait(0.5):
        pass
    log.info("shutting down")
    if scraper is not None:
        scraper.stop()
    server.stop()
    runtime.stop()
    return 0


def start_scraper(config: Config, runtime: Runtime) -> Any:
    from relay.scrape import Scraper, ScrapeTarget

    targets = [
        ScrapeTarget(
            job=s.job_name,
            url=f"{s.scheme}://{t}{s.metrics_path}",
            interval_s=s.scrape_interval,
            timeout_s=s.scrape_timeout,
        )
        for s in config.scrape
        for t in s.targets
    ]

    def sink(v1: bytes) -> None:
        try:
            runtime.pipeline.ingest(v1)
        except Exception:
            log.exception("could not ingest scraped samples")

    scraper = Scraper(targets, sink)
    scraper.start()
    return scraper


__all__ = ["Runtime", "run"]
