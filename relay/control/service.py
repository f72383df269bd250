"""The relay's runtime: config generations, the write endpoint, telemetry endpoints, reload.

A ``Runtime`` owns one configuration generation at a time. Reload (SIGHUP, the config file
changing, or POST /-/reload when the lifecycle API is enabled) parses the new file, then builds
every new queue, transport, credential provider and sender (relay.destinations.prepare) and the new
pipeline before touching the running ones. Any failure is answered with its error and the old
generation keeps running as it was. On success the replaced senders are stopped (for good) before
their successors start, so two senders never ship the same queued entries. Queues are kept across
reloads (one object per file), so nothing queued is lost; aggregation windows in progress are kept
by the pipeline; scrape jobs are restarted when ``scrape:`` changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from relay.common.metrics import RelayMetrics
from relay.common.ratelog import RateLimitedLog
from relay.config import scrape as config_scrape
from relay.config.config import Config, ConfigError, load_config
from relay.control import shardplan, views
from relay.control.delivery_watch import DeliveryWatch
from relay.control.destinations import (
    Destination,
    Generation,
    QueueFactory,
    SetupError,
    TransportFactory,
    open_queue,
    prepare,
)
from relay.control.overview import destination_overview
from relay.delivery.queue.durable import QueueError, RequestTooLargeError, StorageError
from relay.delivery.transport import HttpTransport, Transport
from relay.ingest import wire, wire_errors
from relay.ingest.request_body import decode_body
from relay.ingest.scrape import Scraper, ScrapeTarget
from relay.ingest.server import Reply
from relay.state import memory_trim
from relay.state.cardinality import CardinalityMetrics
from relay.state.pipeline import Pipeline

log = logging.getLogger("relay.service")

STORAGE_RETRY_AFTER_S = 5  # what a 503 for a queue that cannot store asks the client to wait
QUIESCE_TIMEOUT_S = 30  # how long a reload waits for requests routed by the replaced pipeline


ScraperFactory = Callable[[list[ScrapeTarget], Callable[[bytes], None]], Scraper]


def scrape_targets(config: Config) -> list[ScrapeTarget]:
    return config_scrape.scrape_targets(config.scrape)


class Runtime:
    """Everything `gpu-relay run` keeps alive; implements relay.server.Endpoints.

    Raises :class:`relay.destinations.SetupError` when a destination's queue or credentials
    cannot be set up at start."""

    def __init__(
        self,
        config_path: str | None,
        config: Config,
        registry: CollectorRegistry | None = None,
        transport_factory: TransportFactory | None = None,
        clock: Callable[[], float] = time.time,
        *,
        queue_factory: QueueFactory = open_queue,
        scraper_factory: ScraperFactory = Scraper,
        shard_update_s: float = shardplan.UPDATE_S,
    ) -> None:
        self.config_path = config_path
        self.registry = registry or CollectorRegistry()
        self.rm = RelayMetrics(self.registry)
        self._storage_log = RateLimitedLog(log)  # a full disk fails every request: one line a minute
        self.cardinality_metrics = CardinalityMetrics(self.registry)
        self.watch = DeliveryWatch(self.rm)  # one across reloads, as the counters it reads
        self.clock = clock
        self.transport_factory = transport_factory or default_transport
        self.queue_factory = queue_factory
        self.scraper_factory = scraper_factory
        self._reload_lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._scraper: Scraper | None = None
        self._started = False
        self._shard_update_s = shard_update_s
        self._planner = shardplan.Planner(shard_update_s)
        gen = prepare(config, {}, self.rm, self.cardinality_metrics, self.transport_factory, queue_factory)
        self.destinations: dict[str, Destination] = gen.destinations
        self.pipeline = self._pipeline(config, gen, previous=None)
        # nothing to stop or close yet; records the shard counts (a drain where the queue was
        # sharded under another max_shards before a restart); the senders start in start()
        gen.commit(self.rm, self.cardinality_metrics, start=False)
        self.config = config
        self.max_request_bytes = config.server.max_request_bytes
        memory_trim.limit_arenas()  # the connections' threads share an arena, not one each
        memory_trim.map_large_blocks()  # a large body's blocks are unmapped when freed
        self._peak = memory_trim.PeakTrimmer()  # and what a peak of them leaves is trimmed after it
        self.rm.config_last_reload_successful.set(1)
        self.rm.config_last_reload_success_timestamp_seconds.set(clock())
        self._ready = True

    def _pipeline(self, config: Config, gen: Generation, previous: Pipeline | None) -> Pipeline:
        dests = [gen.destinations[d.name] for d in config.destinations]
        try:
            return Pipeline(
                config, self.rm, [x.stats for x in dests], [x.queue for x in dests],
                cardinality=self.cardinality_metrics, clock=self.clock, previous=previous,
                cache_max_bytes=config.server.decision_cache, shards=[x.shards for x in dests],
            )
        except BaseException:
            gen.abandon(self.cardinality_metrics)
            raise

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._started = True
        for d in self.destinations.values():
            if d.sender is not None:
                d.sender.start()
        self._flusher = threading.Thread(target=self._background, name="relay-background", daemon=True)
        self._flusher.start()
        self._restart_scraper(self.config)

    def _restart_scraper(self, config: Config) -> None:
        targets = scrape_targets(config)
        if self._scraper is not None:  # a reload: kept targets go on, a target that left is marked stale
            self._scraper.update(targets)
            return
        if targets:
            self._scraper = self.scraper_factory(targets, self._ingest_scraped)
            self._scraper.start()

    def _ingest_scraped(self, v1: bytes) -> None:
        try:
            self.pipeline.ingest(v1)
        except Exception as e:  # the queue could not store it: the next scrape brings fresh values
            # a full disk fails every scrape: one line a minute per kind of failure, with a count
            self._storage_log.warning(("scrape", type(e).__name__), "could not queue scraped samples: %s",
                                      _one_line(e), extra={"reason": type(e).__name__})

    def _background(self) -> None:
        last_expire = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                self.pipeline.flush_aggregates()
                self._plan_shards()
                self._update_gauges()
                self._watch()
                if time.monotonic() - last_expire >= 60:
                    last_expire = time.monotonic()
                    self.pipeline.expire()
            except Exception:
                log.exception("background maintenance failed")

    def _plan_shards(self) -> None:
        """Every ``shard_update_s``, each destination's shard count as sending keeps up
        (relay.shardplan); one log line a change. Not while a reload runs (it waits for the next)."""
        if self._stop.is_set() or not self._reload_lock.acquire(blocking=False):
            return
        try:
            for name, d in list(self.destinations.items()):
                q, sender = d.queue, d.sender
                if q is None or sender is None or self._stop.is_set():
                    continue
                lo, hi = d.config.queue.min_shards, d.config.queue.max_shards
                now = shardplan.SendTotals(time.monotonic(), *sender.totals(), q.depth()[0])
                planned = self._planner.plan(name, d.shards, lo, hi, now)
                if planned is None or planned[0] == d.shards:
                    continue
                old, want = d.shards, planned[1]
                try:
                    changed = shardplan.change(self.pipeline, d, planned[0])
                except Exception as e:  # e.g. a full disk recording the count: entries still drain in order
                    log.warning("destination %s: could not change %d -> %d shards: %s", name, old, planned[0],
                                _one_line(e), extra={"destination": name, "reason": "reshard"})
                    self._planner.forget(name)
                    continue
                if not changed:  # its sender could not pause now: measure afresh before trying again
                    self._planner.forget(name)
                else:
                    log.info("destination %s: %d -> %d shards (%s)", name, old, d.shards,
                             "idle" if want is None else f"sending needs {want:.2f}",
                             extra={"destination": name, "reason": "reshard"})
        finally:
            self._reload_lock.release()

    def _update_gauges(self) -> None:
        now = self.clock()
        for name, d in list(self.destinations.items()):
            if d.queue is None:
                continue
            self.rm.queue_shards.labels(name).set(d.shards)
            samples, nbytes = d.queue.depth()
            self.rm.queue_samples.labels(name).set(samples)
            self.rm.queue_bytes.labels(name).set(nbytes)
            oldest = d.queue.oldest_enqueued_at()
            self.rm.oldest_queued_sample_age_seconds.labels(name).set(
                0.0 if oldest is None else max(0.0, now - oldest)
            )

    def _watch(self) -> None:
        dests = dict(self.destinations)
        self.watch.tick(dests, lambda n: None if n not in dests or dests[n].queue is None
                        else dests[n].config.queue.max_disk)

    def flush_open_windows(self) -> None:
        """Queue every open aggregation window now (graceful stop); never raises."""
        try:
            self.pipeline.flush_all()
        except Exception as e:
            log.warning("could not flush open aggregation windows: %s", _one_line(e))

    def stop(self) -> None:
        """Graceful stop: scrapes end, open aggregation windows are queued, senders stop."""
        self._ready = False
        if self._scraper is not None:
            self._scraper.stop()
            self._scraper = None
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.flush_open_windows()
        for d in self.destinations.values():
            if d.sender is not None:
                d.sender.stop()
        for d in self.destinations.values():
            if d.queue is None:
                continue
            try:
                d.queue.close()
            except Exception as e:  # e.g. a full disk: what is queued stays in the file; close the others
                log.warning("could not close the queue of destination %s: %s", d.config.name, _one_line(e),
                            extra={"destination": d.config.name, "reason": "queue_close"})

    # -- the write endpoint ----------------------------------------------------------------------
    def write(self, headers: Mapping[str, str], body: bytes) -> Reply:
        with self._peak.request(len(body)) as peak:  # a large request (as sent or decoded): trimmed after
            return self._write(headers, body, peak)

    def _write(self, headers: Mapping[str, str], body: bytes, peak: memory_trim.PeakRequest) -> Reply:
        decoded = None
        try:
            decoded = decode_body(headers, body, self.max_request_bytes)  # type, snappy/zstd, RW 2.0 -> 1.0
            peak.saw(len(decoded.raw))
            self.pipeline.ingest(decoded.raw, decoded.stored)  # ``stored``: the body, when kept as it came
            counts = decoded.counts
        except wire.WireError as e:
            if decoded is not None:  # the route refused it (either core): the text names the series and field
                e = wire_errors.route_error(e, decoded.raw, 1 if decoded.counts is None else 2)
            return self._answer(e.status, str(e))
        except RequestTooLargeError as e:
            return self._answer(413, f"request too large for the queue: {_one_line(e)}")
        except StorageError as e:
            self._storage_log.warning("storage", "could not store a request, answered 503: %s", _one_line(e),
                                      extra={"reason": "storage"})
            return self._answer(503, f"could not store the request: {_one_line(e)}",
                                {"Retry-After": str(STORAGE_RETRY_AFTER_S)})
        except QueueError as e:  # e.g. a queue closed by a stop or reload under way: retry later
            self._storage_log.warning("queue", "could not queue a request, answered 503: %s", _one_line(e),
                                      extra={"reason": "queue"})
            return self._answer(503, f"could not store the request: {_one_line(e)}",
                                {"Retry-After": str(STORAGE_RETRY_AFTER_S)})
        except Exception as e:  # unexpected: tell the client to retry later, with the cause logged
            log.exception("could not queue a request")
            return self._answer(503, f"could not store the request: {type(e).__name__}",
                                {"Retry-After": str(STORAGE_RETRY_AFTER_S)})
        self.rm.requests_received_total.labels("204").inc()
        extra: dict[str, str] = {}
        if counts is not None:
            extra = {
                "X-Prometheus-Remote-Write-Samples-Written": str(counts.samples),
                "X-Prometheus-Remote-Write-Histograms-Written": str(counts.histograms),
                "X-Prometheus-Remote-Write-Exemplars-Written": str(counts.exemplars),
            }
        return Reply(204, b"", headers=extra)

    def _answer(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> Reply:
        self.rm.requests_received_total.labels(str(status)).inc()
        return Reply(status, (_one_line(message) + "\n").encode(), headers=dict(headers or {}))

    # -- telemetry endpoints ---------------------------------------------------------------------
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

    def overview(self, name: str, limit: int = 10) -> dict[str, Any]:
        """One destination's report (cardinality, sending state, AMP estimate); KeyError if unknown."""
        d = self.destinations[name]
        return destination_overview(d, self.rm, self.clock(), limit, lock=self.pipeline.lock, watch=self.watch)

    def names(self) -> list[str]:
        return [d.name for d in self.config.destinations]

    def cardinality(self, query: Mapping[str, list[str]]) -> Reply:
        return views.cardinality_reply(self.names(), self.overview, query)

    def status_page(self, query: Mapping[str, list[str]]) -> Reply:
        samples_in = self.registry.get_sample_value("gpu_relay_samples_received_total") or 0.0
        config_ok = self.registry.get_sample_value("gpu_relay_config_last_reload_successful") == 1.0
        return views.status_page_reply(self.names(), self.overview, samples_in=samples_in, now=self.clock(),
                                       config_ok=config_ok, write_listen=self.config.server.listen)

    # -- reload ----------------------------------------------------------------------------------
    def reload(self) -> Reply:
        ok, message = self.reload_config()
        return Reply(200 if ok else 400, (message + "\n").encode())

    def reload_config(self) -> tuple[bool, str]:
        """Apply the config file again; on any error keep everything running as it was."""
        if self.config_path is None:
            return False, "no configuration file to reload"
        with self._reload_lock:
            try:
                config = load_config(self.config_path)
                gen = prepare(config, self.destinations, self.rm, self.cardinality_metrics,
                              self.transport_factory, self.queue_factory)
                pipeline = self._pipeline(config, gen, previous=self.pipeline)
            except ConfigError as e:
                return self._refused(f"reload refused, keeping the running configuration:\n{e}")
            except SetupError as e:
                return self._refused(f"reload refused, keeping the running configuration: {e}")
            except Exception as e:
                log.debug("reload failed", exc_info=True)
                return self._refused(f"reload failed, keeping the running configuration: "
                                     f"{type(e).__name__}: {_one_line(e)}")
            if replace(config.server, decision_cache=0) != replace(self.config.server, decision_cache=0):
                log.warning("server settings changed in %s; they take effect on restart", self.config_path)
            for warning in config.warnings:
                log.warning("%s", warning)
            scrape_changed = config.scrape != self.config.scrape
            replaced = self.pipeline
            self.destinations = gen.destinations
            self.pipeline = pipeline
            self.config = config
            # a request routed by the old pipeline (old shard count) may still be writing: the
            # barrier of a max_shards change (taken in commit) must come after its last write
            if not replaced.quiesce(QUIESCE_TIMEOUT_S):
                log.warning("a request routed before the reload was still being written after %ds; "
                            "per-series order across the max_shards change is not guaranteed for it",
                            QUIESCE_TIMEOUT_S, extra={"reason": "reload_quiesce_timeout"})
            # the replaced senders stop for good before their successors start
            gen.commit(self.rm, self.cardinality_metrics, start=self._started)
            self._planner = shardplan.Planner(self._shard_update_s)  # new senders count from zero
            if scrape_changed and self._started:
                self._restart_scraper(config)
            self.rm.config_reloads_total.labels("success").inc()
            self.rm.config_last_reload_successful.set(1)
            self.rm.config_last_reload_success_timestamp_seconds.set(self.clock())
            log.info("configuration reloaded from %s", self.config_path)
            return True, "configuration reloaded"

    def _refused(self, message: str) -> tuple[bool, str]:
        self.rm.config_reloads_total.labels("failure").inc()
        self.rm.config_last_reload_successful.set(0)
        log.error("%s", message)  # one event: the formatter keeps a multi-line message on one line
        return False, message


def _one_line(e: object) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def default_transport(d: Any) -> Transport:
    auth = None
    if d.sigv4 is not None:
        from relay.delivery.sigv4 import from_config

        auth = from_config(d.name, d.sigv4)
    return HttpTransport(auth=auth)


__all__ = ["RequestTooLargeError", "Runtime", "SetupError", "StorageError", "default_transport"]
