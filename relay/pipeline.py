"""The relay's ingest pipeline: one request's RW1 bytes in, each destination's share durably queued.

Order of stages (DESIGN.md): decode -> external_labels -> global relabel -> per destination:
write_relabel_configs -> prune_labels -> aggregate -> limits -> durable queue.

The stateless stages run once per distinct input label set (``decide``), and the result is cached
by the series' raw label bytes, so a series seen again costs one dict lookup in ``wire.route``.
The stateful stages (active-series accounting, limits, aggregation) run per series per request in
``_DestinationStage.take`` on ids computed once. The cache is rebuilt every ``CACHE_REFRESH_S`` so
label statistics stay fresh and a collision owner that went quiet can be replaced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relay import wire
from relay.aggregate import AggregateRule, Aggregator
from relay.cardinality import CardinalityMetrics, DestinationStats, SeriesTracker
from relay.config import Config, DestinationConfig
from relay.labels import METRIC_NAME, Labels
from relay.labels import get as label_get
from relay.limits import AmpLimits, CollisionDetector, SeriesLimiter, amp_violation
from relay.metrics import RelayMetrics
from relay.proto import remote_v1_pb2
from relay.protowire import encode_uvarint
from relay.queue import DurableQueue
from relay.rules import Rules
from relay.selector import parse_selector

log = logging.getLogger(__name__)

MAX_CACHE_ENTRIES = 2_000_000
CACHE_REFRESH_S = 900.0
AGGREGATE_GRACE_MS = 10_000  # windows close this long after their end (late scrapes, batching)
_COUNTER = remote_v1_pb2.MetricMetadata.COUNTER

Piece = tuple[int, bytes, int]  # (shard, RW1 WriteRequest bytes, samples)


@dataclass(slots=True)
class IngestResult:
    series: int = 0
    samples: int = 0
    histograms: int = 0
    exemplars: int = 0
    dropped_samples: int = 0  # lost to queue overflow while storing this request
    kept: list[int] = field(default_factory=list)  # samples kept per destination


def _labels_of(lb: bytes) -> Callable[[], Labels]:
    return lambda: wire.decode_labels(lb)


def _const(labels: Labels) -> Callable[[], Labels]:
    return lambda: labels


class _DestinationStage:
    """The stateful per-destination stages after the cached rules: aggregate, limits, sharding."""

    def __init__(
        self,
        dest: DestinationConfig,
        stats: DestinationStats,
        metrics: RelayMetrics,
        cardinality: CardinalityMetrics | None,
        queue: DurableQueue | None,
        clock: Callable[[], float],
    ) -> None:
        self.name = dest.name
        self.dest = dest
        self.amp_limits = AmpLimits()  # the pipeline sets its own
        self.stats = stats
        self.metrics = metrics
        self.queue = queue
        self.shards = max(1, dest.queue.max_shards)
        self.prune_hint = (
            f"prune_labels {list(dest.prune_labels)}" if dest.prune_labels else "write_relabel_configs"
        )
        rules = [
            AggregateRule(
                match=parse_selector(a.match),
                interval_s=a.interval,
                outputs=tuple(a.outputs),
                without=tuple(a.without),
                by=tuple(a.by),
            )
            for a in dest.aggregate
        ]
        self.aggregator: Aggregator | None = Aggregator(rules, clock=clock) if rules else None
        # output series id -> (rule index, group labels) for series aggregated instead of sent
        self.aggregated: dict[int, tuple[int, Labels]] = {}
        self.counters: set[str] = set()  # metric families known to be counters (from metadata)
        self.limiter: SeriesLimiter | None = None
        count_limit = cardinality.on_limit_drop(dest.name) if cardinality is not None else None

        def on_limit(metric: str, limit: str) -> None:
            if count_limit is not None:
                count_limit(metric, limit)
            stats.record_drop(limit, series=1)

        if dest.limits.max_series is not None or dest.limits.max_series_per_metric is not None:
            self.limiter = SeriesLimiter(
                dest.name, dest.limits.max_series, dest.limits.max_series_per_metric, stats.tracker_out,
                on_drop=on_limit,
            )

    def is_counter(self, metric: str) -> bool:
        return metric.endswith("_total") or metric in self.counters

    def decide(self, key: bytes, labels: Labels, collisions: CollisionDetector,
               amp_limits: AmpLimits) -> wire.DestDecision | None:
        """Cold path for one destination, after its stateless rules produced ``labels``."""
        violation = amp_violation(labels, amp_limits)
        if violation is not None:
            self.stats.record_drop(violation, series=1)
            return (b"", 0, violation)
        metric = label_get(labels, METRIC_NAME)
        lb = wire.encode_labels(labels)
        sid = wire.series_id(lb)
        if self.aggregator is not None:
            routed = self.aggregator.route(labels, self.is_counter(metric))
            if routed is not None:
                self.aggregated[sid] = routed
                return (lb, sid, metric)
        if not collisions.check(self.name, sid, key, labels, self.prune_hint):
            self.stats.record_drop("collision", series=1)
            return (b"", 0, "collision")
        tracker = self.stats.tracker_out
        if self.limiter is None or tracker.contains(sid):
            tracker.observe(sid, metric, labels)  # refresh label statistics on cache misses
        return (lb, sid, metric)

    def take(self, entries: list[wire.RoutedEntry]) -> tuple[list[Piece], int, int]:
        """Filter one request's routed series through aggregation and limits, and shard them.
        Returns (queue pieces, samples kept, samples routed here)."""
        shards = self.shards
        parts: list[list[bytes]] = [[] for _ in range(shards)]
        counts = [0] * shards
        drops: dict[str, int] = {}
        aggregated = self.aggregated
        aggregator = self.aggregator
        limiter = self.limiter
        contains = self.stats.tracker_out.contains
        seen: list[tuple[int, str]] = []
        prefix = wire.LEN_PREFIX
        kept = routed = 0
        for decision, rest, n, _oldest in entries:
            routed += n
            lb, sid, metric = decision
            if not lb:  # a drop decided once for this series; metric slot holds the reason
                drops[metric] = drops.get(metric, 0) + n
                continue
            if aggregator is not None and sid in aggregated:
                rule, group = aggregated[sid]
                aggregator.add(rule, group, sid, wire.decode_samples(rest), self.is_counter(metric))
                drops["aggregated"] = drops.get("aggregated", 0) + n
                continue
            if limiter is None or contains(sid):
                seen.append((sid, metric))
            elif not limiter.admit(sid, metric, _labels_of(lb)):
                drops["series_limit"] = drops.get("series_limit", 0) + n
                continue
            shard = sid % shards
            size = len(lb) + len(rest)  # one WriteRequest field-1 entry: tag, length, labels, rest
            parts[shard] += (b"\n", prefix[size] if size < 0x4000 else encode_uvarint(size), lb, rest)
            counts[shard] += n
            kept += n
        self.stats.tracker_out.observe_many(seen)
        for reason, n in drops.items():
            if n:
                self.metrics.samples_dropped_total.labels(self.name, reason).inc(n)
                self.stats.record_drop(reason, series=0, samples=n)
        pieces = [(s, b"".join(parts[s]), counts[s]) for s in range(shards) if counts[s]]
        return pieces, kept, routed

    def flush_aggregates(self, now_ms: int) -> list[Piece]:
        if self.aggregator is None:
            return []
        out = self.aggregator.flush(now_ms - AGGREGATE_GRACE_MS)
        parts: list[list[bytes]] = [[] for _ in range(self.shards)]
        counts = [0] * self.shards
        drops: dict[str, int] = {}
        for labels, ts, value in out:
            # Aggregate outputs are series of this destination like any other: the same AMP
            # per-series checks and cardinality limits apply (DESIGN.md: aggregate -> limits).
            violation = amp_violation(labels, self.amp_limits)
            if violation is not None:
                drops[violation] = drops.get(violation, 0) + 1
                continue
            sid = wire.series_id(wire.encode_labels(labels))
            metric = label_get(labels, METRIC_NAME)
            if self.limiter is not None:
                if not self.limiter.admit(sid, metric, _const(labels)):
                    drops["series_limit"] = drops.get("series_limit", 0) + 1
                    continue
            else:
                self.stats.tracker_out.observe(sid, metric, labels)
            parts[sid % self.shards].append(wire.encode_write_request([(labels, [(ts, value)])]))
            counts[sid % self.shards] += 1
        for reason, n in drops.items():
            self.metrics.samples_dropped_total.labels(self.name, reason).inc(n)
            self.stats.record_drop(reason, series=0, samples=n)
        return [(s, b"".join(parts[s]), counts[s]) for s in range(self.shards) if counts[s]]


class Pipeline:
    """Routes requests for one configuration generation. Thread-safe: requests are routed under a
    lock (the state updates are cheap); the durable writes happen outside it."""

    def __init__(
        self,
        config: Config,
        metrics: RelayMetrics,
        stats: Sequence[DestinationStats],
        queues: Sequence[DurableQueue | None],
        cardinality: CardinalityMetrics | None = None,
        clock: Callable[[], float] = time.time,
        amp_limits: AmpLimits | None = None,
        previous: Pipeline | None = None,
    ) -> None:
        self.config = config
        self.rules = Rules(config)
        self.metrics = metrics
        self.clock = clock
        self.amp_limits = amp_limits or AmpLimits()
        self.stats = list(stats)
        # Arriving series are the same for every destination: one tracker, shared by their reports.
        self.tracker_in: SeriesTracker = self.stats[0].tracker_in
        for s in self.stats[1:]:
            s.tracker_in = self.tracker_in
        self.stages = [
            _DestinationStage(d, self.stats[i], metrics, cardinality, queues[i], clock)
            for i, d in enumerate(config.destinations)
        ]
        for stage in self.stages:
            stage.amp_limits = self.amp_limits
        by_name = {s.name: s for s in self.stages}
        self.collisions = CollisionDetector(
            active=lambda dest, sid: by_name[dest].stats.tracker_out.contains(sid)
        )
        self.cache: dict[bytes, wire.Decision] = {}
        self._cache_born = time.monotonic()
        self.lock = threading.Lock()
        if previous is not None:
            self._take_over(previous)

    def _take_over(self, previous: Pipeline) -> None:
        """On reload, keep aggregation windows in progress (and counters' running totals): a
        destination whose aggregate rules did not change keeps its aggregator. The lock is shared
        too, as a request that began before the swap may still be routed by ``previous``."""
        self.lock = previous.lock
        old = {s.name: s for s in previous.stages}
        for stage in self.stages:
            o = old.get(stage.name)
            if o is None:
                continue
            stage.counters |= o.counters
            if o.aggregator is not None and o.dest.aggregate == stage.dest.aggregate:
                stage.aggregator = o.aggregator

    # -- the cold path: once per distinct input label set ---------------------------------------
    def decide(self, key: bytes) -> wire.Decision:
        labels = wire.decode_labels(key)  # raises WireError(400) for an invalid label set
        metric_in = label_get(labels, METRIC_NAME)
        in_id = wire.series_id(key)
        self.tracker_in.observe(in_id, metric_in, labels)
        out: list[wire.DestDecision | None] = [(key, in_id, metric_in)]
        base = self.rules.apply_global(labels)
        for i, stage in enumerate(self.stages):
            result = None if base is None else self.rules.apply_destination(i, base)
            out.append(None if result is None else stage.decide(key, result, self.collisions, self.amp_limits))
        return tuple(out)

    # -- the hot path ----------------------------------------------------------------------------
    def route(self, v1: bytes) -> tuple[IngestResult, list[list[Piece]]]:
        with self.lock:
            if len(self.cache) > MAX_CACHE_ENTRIES or time.monotonic() - self._cache_born > CACHE_REFRESH_S:
                self.cache.clear()
                for stage in self.stages:
                    stage.aggregated.clear()
                self._cache_born = time.monotonic()
            routed = wire.route(v1, len(self.stages) + 1, self.cache, self.decide)
            result = IngestResult(
                series=routed.series_in,
                samples=routed.samples_in,
                histograms=routed.histograms_in,
                exemplars=routed.exemplars_in,
            )
            self.tracker_in.observe_many([(d[1], d[2]) for d, _rest, _n, _ts in routed.per_dest[0]])
            if routed.metadata:
                self._learn_counters(routed.metadata)
            pieces_per_dest: list[list[Piece]] = []
            for i, stage in enumerate(self.stages):
                pieces, kept, routed_here = stage.take(routed.per_dest[i + 1])
                by_rules = result.samples + result.histograms - routed_here  # n counts histograms too
                if by_rules:
                    self.metrics.samples_dropped_total.labels(stage.name, "rules").inc(by_rules)
                    stage.stats.record_drop("rules", series=0, samples=by_rules)
                if routed.metadata and (pieces or not routed.per_dest[0]):
                    # Metadata passes through to every destination (metadata-only requests too).
                    pieces.append((0, routed.metadata, 0))
                pieces_per_dest.append(pieces)
                result.kept.append(kept)
                stage.stats.record_samples(result.samples, kept)
            return result, pieces_per_dest

    def _learn_counters(self, metadata: bytes) -> None:
        req = remote_v1_pb2.WriteRequest()
        try:
            req.ParseFromString(metadata)
        except Exception:  # metadata is best effort; the samples were validated by route()
            return
        counters = {m.metric_family_name for m in req.metadata if m.type == _COUNTER}
        if counters:
            for stage in self.stages:
                stage.counters |= counters

    def ingest(self, v1: bytes) -> IngestResult:
        """Route and durably queue one request. Returns only when every destination's share is
        committed (or dropped by rules); storage errors propagate for the caller to answer 503."""
        result, pieces_per_dest = self.route(v1)
        m = self.metrics
        m.samples_received_total.inc(result.samples)
        for stage, pieces, kept in zip(self.stages, pieces_per_dest, result.kept, strict=True):
            if kept:
                m.samples_kept_total.labels(stage.name).inc(kept)
            if stage.queue is None or not pieces:
                continue
            dropped = stage.queue.put(pieces)
            if dropped:
                result.dropped_samples += dropped
                m.samples_dropped_total.labels(stage.name, "queue_full").inc(dropped)
                stage.stats.record_drop("queue_full", series=0, samples=dropped)
        return result

    def flush_aggregates(self, now: float | None = None) -> None:
        now_ms = int((self.clock() if now is None else now) * 1000)
        for stage in self.stages:
            if stage.aggregator is None:
                continue
            with self.lock:
                pieces = stage.flush_aggregates(now_ms)
            if pieces and stage.queue is not None:
                stage.queue.put(pieces)

    def expire(self) -> None:
        with self.lock:
            self.tracker_in.expire()
            for stage in self.stages:
                stage.stats.tracker_out.expire()
