"""The relay's own metrics (``gpu_relay_*``), registered on an injected CollectorRegistry.

One object per process, passed to the pipeline, the senders and the HTTP server. Other modules
may register more metrics on the same registry (the cardinality metrics live with their owner).
Gauges about queues are set by whoever owns the queue (the runtime) just before each scrape.
No ``_created`` series (a counter's or histogram's creation time, one extra series each, which
Prometheus's text parser stores as a sample of its own): constructing ``RelayMetrics`` turns them
off for the process (prometheus_client's ``disable_created_metrics``), in both exposition formats.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics

from relay import __version__, native

PREFIX = "gpu_relay_"
SEND_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RelayMetrics:
    """Every ``gpu_relay_*`` self-metric as an attribute named like the exposed series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # read at collect time, so this also covers families other modules register
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        p = PREFIX
        # ingest side
        self.samples_received_total = Counter(
            p + "samples_received", "Samples received on /api/v1/write (and from own scrapes).",
            registry=registry,
        )
        self.requests_received_total = Counter(
            p + "requests_received", "Remote-write requests received, by HTTP status answered.",
            ["code"], registry=registry,
        )
        self.config_reloads_total = Counter(
            p + "config_reloads", "Configuration reloads, by result (success|failure).",
            ["result"], registry=registry,
        )
        # the process and its configuration (service)
        self.build_info = Gauge(
            p + "build_info", "Always 1; the relay's version and whether its native per-series loop is used.",
            ["version", "native"], registry=registry,
        )
        self.build_info.labels(__version__, "true" if native.status()[0] else "false").set(1)
        self.config_last_reload_successful = Gauge(
            p + "config_last_reload_successful",
            "1 if the last configuration (re)load succeeded, 0 if it was refused.", registry=registry,
        )
        self.config_last_reload_success_timestamp_seconds = Gauge(
            p + "config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful configuration (re)load.", registry=registry,
        )
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        # per destination: rules and queue
        self.samples_kept_total = Counter(
            p + "samples_kept", "Samples kept by a destination's rules and queued for sending.",
            ["destination"], registry=registry,
        )
        self.samples_dropped_total = Counter(
            p + "samples_dropped", "Samples a destination dropped before sending, by reason "
            "(relabel, limits, queue_full, ...).",
            ["destination", "reason"], registry=registry,
        )
        self.queue_samples = Gauge(
            p + "queue_samples", "Samples waiting in a destination's durable queue.",
            ["destination"], registry=registry,
        )
        self.queue_bytes = Gauge(
            p + "queue_bytes", "Payload bytes waiting in a destination's durable queue.",
            ["destination"], registry=registry,
        )
        self.oldest_queued_sample_age_seconds = Gauge(
            p + "oldest_queued_sample_age_seconds",
            "Seconds since the oldest entry still queued for a destination was received (0 when empty).",
            ["destination"], registry=registry,
        )
        # per destination: sending
        self.samples_sent_total = Counter(
            p + "samples_sent", "Samples the destination accepted (2xx).",
            ["destination"], registry=registry,
        )
        self.samples_failed_total = Counter(
            p + "samples_failed", "Samples given up on while sending, by reason (http_<code>, too_old).",
            ["destination", "reason"], registry=registry,
        )
        self.samples_retried_total = Counter(
            p + "samples_retried", "Samples sent again after a retryable failure (counted per retry), "
            "by reason (http_<code>, network, expired_token).",
            ["destination", "reason"], registry=registry,
        )
        self.send_duration_seconds = Histogram(
            p + "send_duration_seconds", "Duration of one remote-write HTTP request, any outcome.",
            ["destination"], buckets=SEND_DURATION_BUCKETS, registry=registry,
        )

        # queue and sender (relay-queue helper's block)
        self.last_send_success_timestamp_seconds = Gauge(
            p + "last_send_success_timestamp_seconds", "Unix time of the last 2xx from a destination.",
            ["destination"], registry=registry,
        )
        self.queue_max_bytes = Gauge(
            p + "queue_max_bytes", "A destination's queue bound (max_disk): its files stay below it.",
            ["destination"], registry=registry,
        )
        self.queue_shards = Gauge(
            p + "queue_shards", "Shards a destination's sender runs now: between queue.min_shards and "
            "queue.max_shards, as sending keeps up (Prometheus's prometheus_remote_storage_shards).",
            ["destination"], registry=registry,
        )
        self.queue_damaged_total = Counter(
            p + "queue_damaged", "Queue files found damaged or missing entries at open (set aside, "
            "what SQLite could read salvaged; see the ERROR log line for what was lost).",
            ["destination"], registry=registry,
        )
        self.queue_lost_samples_total = Counter(
            p + "queue_lost_samples", "Samples a queue had stored (their sender told 2xx) that were missing "
            "from its file at open, by cause: wal_lost, file_emptied, file_replaced, damaged (from the "
            "queue's loss log; one ERROR line says the same).",
            ["destination", "cause"], registry=registry,
        )

    def forget_destination(self, destination: str) -> None:
        """Remove a destination's series (after it left the configuration)."""
        for metric in (
            self.samples_kept_total, self.queue_samples, self.queue_bytes,
            self.oldest_queued_sample_age_seconds, self.samples_sent_total,
            self.send_duration_seconds, self.last_send_success_timestamp_seconds, self.queue_max_bytes,
            self.queue_damaged_total, self.queue_shards,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(destination)
        for cause in ("wal_lost", "file_emptied", "file_replaced", "damaged"):
            with contextlib.suppress(KeyError):
                self.queue_lost_samples_total.remove(destination, cause)
        for metric in (self.samples_dropped_total, self.samples_failed_total, self.samples_retried_total):
            reasons = {
                sample.labels["reason"]
                for family in metric.collect()
                for sample in family.samples
                if sample.labels.get("destination") == destination
            }
            for reason in reasons:
                metric.remove(destination, reason)
