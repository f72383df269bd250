"""The relay's ingest pipeline: one request's RW1 bytes in, each destination's share durably queued.

Order of stages (DESIGN.md): decode -> external_labels -> global relabel -> per destination:
write_relabel_configs -> prune_labels -> aggregate -> limits -> durable queue.

Two halves, kept apart so that no result depends on when a series was decided:

- ``decide(key)`` (``relay.state.decide``, a mixin of the pipeline): the stateless half, once per
  distinct input label set (its raw label bytes):
  rules, prune, the AMP per-series checks, the aggregation rule match and the output series'
  identity. No side effect. Cached in a memory-bounded two-generation cache evicted incrementally
  (a hit in the old generation moves the entry to the young one; entries left in the old one are
  popped a few at a time), so there is never a stop-the-world clear.
- ``route``: the stateful half, for EVERY occurrence of every series, keyed by the input series'
  canonical identity (a hash of its sorted label set, so the same series with its labels in another
  order is the same series): active-series accounting (in and out), limits, collision ownership,
  aggregation membership. This is the per-series pass a native core can take over: plain tuples in
  (the decisions, the series' rest bytes, sample counts), queue pieces out.

Every per-series or per-name structure is bounded or expires with the series window: the trackers,
collision owners (expire with their owner), counter families learnt from metadata (expire after a
window unseen, capped), aggregation members (forgotten after the rule's staleness), and aggregation
windows (samples over ``MAX_FUTURE_S`` ahead open none).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from relay.common.labels import Labels
from relay.common.metrics import RelayMetrics
from relay.config.config import Config
from relay.delivery.queue.durable import DurableQueue, Piece
from relay.ingest import wire
from relay.state import memory_trim
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.decide import Decider
from relay.state.decision_cache import DecisionCache
from relay.state.limits import AmpLimits, CollisionDetector
from relay.state.metadata import metadata_entries
from relay.state.ruleset import Rules
from relay.state.series_tracker import CSeriesTracker, SeriesTracker
from relay.state.stage import DestinationStage
from relay.state.stage import route_hits as _route_hits

log = logging.getLogger("relay.pipeline")

# decision cache budget, as server.decision_cache's default: its real RSS (relay.state.decision_cache),
# 0.5-1M dcgm-like series in native tables, 45-90k in the dict fallback; fits a 512Mi sidecar
DEFAULT_CACHE_MAX_BYTES = 64 * 1024 * 1024
AGGREGATE_GRACE_MS = 10_000  # windows close this long after their end (late scrapes, batching)
MAX_COUNTER_FAMILIES = 100_000  # counter families learnt from metadata (beyond: only the _total suffix)
_WIRE_ROUTE = wire.route  # the fast path stands in for it (a bench or test that wraps it turns it off)

__all__ = ["AGGREGATE_GRACE_MS", "IngestResult", "Piece", "Pipeline"]


class _Scratch(dict[bytes, Labels]):
    """Labels decided during the current request, by label bytes; any other label bytes' labels are
    decoded on lookup (and not kept)."""

    __slots__ = ()

    def __missing__(self, lb: bytes) -> Labels:
        return wire.decode_labels(lb)


@dataclass(slots=True)
class IngestResult:
    series: int = 0
    samples: int = 0
    histograms: int = 0
    exemplars: int = 0
    dropped_samples: int = 0  # lost to queue overflow while storing this request
    kept: list[int] = field(default_factory=list)  # samples kept per destination


class Pipeline(Decider):
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
        *,
        cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
        shards: Sequence[int] | None = None,
    ) -> None:
        """``shards``: each destination's shard count to start with (the sender's, which changes it
        with :meth:`set_shards`); None: each one's max_shards."""
        self.config = config
        self.rules = Rules(config)
        self.metrics = metrics
        self.clock = clock
        self.amp_limits = amp_limits or AmpLimits()
        self.stats = list(stats)
        # The lock is shared with the previous generation (a request that began before a reload may
        # still be routed by it) and with the stats, so their snapshots are consistent.
        self.lock: threading.RLock = previous.lock if previous is not None else threading.RLock()
        # Arriving series are the same for every destination: one tracker, shared by their reports,
        # and handed from generation to generation (whatever the order of the destinations).
        self.tracker_in: SeriesTracker = previous.tracker_in if previous is not None else self.stats[0].tracker_in
        self.counters: dict[str, float] = previous.counters if previous is not None else {}
        self.collisions = CollisionDetector()
        for s in self.stats:
            s.tracker_in = self.tracker_in
            s.lock = self.lock
        self.stages = [
            DestinationStage(d, self.stats[i], metrics, cardinality, queues[i], clock, self.counters,
                              self.collisions)
            for i, d in enumerate(config.destinations)
        ]
        if shards is not None:
            for stage, n in zip(self.stages, shards, strict=True):
                stage.shards = max(1, n)
        self._external: Labels = tuple(sorted(config.external_labels))
        external = wire.encode_labels(self._external)
        for stage in self.stages:
            stage.amp_limits = self.amp_limits
            stage.external = external
        self.cache = DecisionCache(cache_max_bytes)
        self._scratch = _Scratch()  # labels decided during the current request
        # what the trackers and stages call for a series' labels: a C-level lookup, no Python frame
        # when the labels were decided in this request (else __missing__ decodes them)
        self._labels_of: Callable[[bytes], Labels] = self._scratch.__getitem__
        # (new stage, old stage) whose old aggregator's windows are still to be emitted (reload)
        self._orphans: list[tuple[DestinationStage, DestinationStage]] = []
        # requests (and flushes) between routing and their queue writes: a reload waits for them, and
        # a change of a shard count holds new ones back (hold_writes) until they are all written
        self._writers = 0
        self._held = 0  # hold_writes under way (a count: they may nest)
        self._idle = threading.Condition(threading.Lock())
        if previous is not None:
            self._take_over(previous)
        self._plan_decisions(external)

    def _take_over(self, previous: Pipeline) -> None:
        """On reload, keep per-series state: collision owners per destination, and aggregation windows
        in progress (with counters' running totals) where the aggregate rules did not change; where they
        changed, the old rules' open windows are emitted early by the next flush instead of being lost."""
        old = {s.name: s for s in previous.stages}
        self._orphans = previous._orphans
        for stage in self.stages:
            o = old.get(stage.name)
            if o is None:
                continue
            stage.owners = o.owners
            if o.aggregator is not None and o.dest.aggregate == stage.dest.aggregate:
                stage.aggregator = o.aggregator
            elif o.aggregator is not None and o.aggregator.windows():
                self._orphans.append((stage, o))

    def cache_bytes(self) -> int:
        return self.cache.size()

    def cache_entries(self) -> int:
        return len(self.cache)

    def set_cache_max_bytes(self, n: int) -> None:
        with self.lock:
            self.cache.max_bytes = n
            self.cache.evict()

    def _labels(self, lb: bytes) -> Labels:  # input or output label bytes: decided in this request, else decoded
        return self._scratch[lb]

    # -- the per-series pass: every occurrence ---------------------------------------------------------
    def route(self, v1: bytes) -> tuple[IngestResult, list[list[Piece]]]:
        with self.lock:
            self._scratch.clear()
            hits = self._route_hits(v1) if _route_hits is not None else None
            if hits is not None:
                return hits
            cache = self.cache
            miss = functools.partial(cache.miss, decide=self.decide)
            routed = wire.route(v1, len(self.stages) + 1, cache.young, miss)
            cache.evict()
            result = IngestResult(
                series=routed.series_in,
                samples=routed.samples_in,
                histograms=routed.histograms_in,
                exemplars=routed.exemplars_in,
            )
            inputs = routed.per_dest[0]
            if any(len(d) != len(inputs) for d in routed.per_dest):
                # decide() never answers None for a destination, so every list has every series
                raise ValueError("wire.route: per-destination entries do not line up with the inputs")
            new_in = set(self.tracker_in.observe_inputs(inputs, self._labels_of))
            in_active = self.tracker_in.has()
            family_entries = self._families(routed.metadata)
            pieces_per_dest: list[list[Piece]] = []
            for i, stage in enumerate(self.stages):
                pieces, kept, _ = stage.take(routed.per_dest[i + 1], inputs, new_in, in_active, self._labels_of)
                pieces_per_dest.append(self._taken(result, stage, pieces, kept, family_entries))
            self._scratch.clear()
            return result, pieces_per_dest

    def _route_hits(self, v1: bytes) -> tuple[IngestResult, list[list[Piece]]] | None:
        """``route`` for a request whose every series is in the young cache generation, in one C call
        without Python objects per series (relay/native/cstage.c route_hits); None, before any effect,
        where it does not apply (a miss, an aggregated series, an owner or limit to decide, the
        reference trackers in use): then ``route`` runs its usual path. The same results either way."""
        tracker_in = self.tracker_in
        if (type(v1) is not bytes or type(tracker_in) is not CSeriesTracker or not self.cache.native
                or "observe_inputs" in vars(tracker_in) or wire.route is not _WIRE_ROUTE):
            return None
        stages = []
        gen_in = tracker_in._gen()
        for stage in self.stages:
            args = stage.hit_args(tracker_in)
            if args is None:
                return None
            stages.append(args)
        assert _route_hits is not None
        try:
            r = _route_hits(v1, self.cache.young, tracker_in._t, gen_in, tuple(stages), self._labels_of)
        except BaseException:
            self.cache.evict()  # as the usual path, whose lookups come before its errors
            raise
        if r is NotImplemented:
            return None  # (nothing done: the usual path looks the keys up, then evicts)
        series, samples, histograms, exemplars, metadata, per_stage = r
        self.cache.evict()  # (hits change no size: as the usual path does after its lookups)
        result = IngestResult(series=series, samples=samples, histograms=histograms, exemplars=exemplars)
        family_entries = self._families(b"".join(metadata))
        pieces_per_dest: list[list[Piece]] = []
        for stage, (pieces, kept, _, drops) in zip(self.stages, per_stage, strict=True):
            stage.record_drops(drops)
            pieces_per_dest.append(self._taken(result, stage, pieces, kept, family_entries))
        return result, pieces_per_dest

    def _families(self, raw: bytes) -> list[tuple[str, bytes]]:
        """The request's metadata entries as (family, entry bytes); counters learned from them."""
        md = metadata_entries(raw) if raw else []
        if md:
            self._learn_counters(md)
        return [(family, entry) for family, entry, _ in md]

    @staticmethod
    def _taken(result: IngestResult, stage: DestinationStage, pieces: list[Piece], kept: int,
               family_entries: list[tuple[str, bytes]]) -> list[Piece]:
        """A destination's pieces with its share of the metadata; its kept samples counted."""
        meta = stage.metadata(family_entries)
        if meta:
            pieces.append((0, meta, 0, 0))
        result.kept.append(kept)
        stage.stats.record_samples(result.samples + result.histograms, kept)
        return pieces

    def _learn_counters(self, md: list[tuple[str, bytes, bool]]) -> None:
        now = self.clock()
        counters = self.counters
        for family, _, is_counter in md:
            if is_counter and (family in counters or len(counters) < MAX_COUNTER_FAMILIES):
                counters[family] = now

    def _begin_write(self) -> None:
        with self._idle:
            if self._held:
                self._idle.wait_for(lambda: not self._held)
            self._writers += 1

    def _end_write(self) -> None:
        with self._idle:
            self._writers -= 1
            self._idle.notify_all()

    def quiesce(self, timeout: float) -> bool:
        """Wait until no request or flush routed by this pipeline is still writing to a queue (a
        reload replaced it: the shard barrier must come after its last write). False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._writers == 0, timeout)

    @contextlib.contextmanager
    def hold_writes(self, timeout: float) -> Iterator[bool]:
        """While inside, no request or flush begins routing (they wait at the door), and on entry
        every one that had begun has written its pieces: yields True, or False when one was still
        writing after ``timeout``. A change of a destination's shard count happens inside, so that
        every entry queued before it was sharded under the old count, every later one under the new
        (no entry of the new count can be committed before the barrier is read)."""
        with self._idle:
            self._held += 1
        try:
            with self._idle:
                done = self._idle.wait_for(lambda: self._writers == 0, timeout)
            yield done
        finally:
            with self._idle:
                self._held -= 1
                self._idle.notify_all()

    def set_shards(self, name: str, shards: int) -> None:
        """Shard destination ``name``'s series under ``shards`` from the next routed request on (call
        it inside :meth:`hold_writes`). KeyError: no such destination."""
        stage = next((st for st in self.stages if st.name == name), None)
        if stage is None:
            raise KeyError(name)
        with self.lock:  # routes (and aggregation flushes) read stage.shards under it
            stage.shards = max(1, int(shards))

    def ingest(self, v1: bytes, block: bytes | None = None) -> IngestResult:
        """Route and durably queue one request. Returns only when every destination's share is
        committed (or dropped by rules); storage errors propagate for the caller to answer 503.
        ``block``: the snappy block ``v1`` came in as (it decoded to exactly ``v1``): a destination
        whose share is all of ``v1``, byte for byte, in one piece stores it without compressing."""
        self._begin_write()
        try:
            return self._ingest(v1, block)
        finally:
            self._end_write()

    def _ingest(self, v1: bytes, block: bytes | None = None) -> IngestResult:
        result, pieces_per_dest = self.route(v1)
        m = self.metrics
        m.samples_received_total.inc(result.samples)  # float samples (histograms: result.histograms)
        for stage, pieces, kept in zip(self.stages, pieces_per_dest, result.kept, strict=True):
            if kept:
                m.samples_kept_total.labels(stage.name).inc(kept)
            if stage.queue is None or not pieces:
                continue
            # the whole request unchanged, in one shard (pass-through on one shard): stored as it came
            same = block is not None and len(pieces) == 1 and len(pieces[0][1]) == len(v1) and pieces[0][1] == v1
            dropped = stage.queue.put(pieces, (block,)) if same else stage.queue.put(pieces)
            if dropped:
                result.dropped_samples += dropped
                m.samples_dropped_total.labels(stage.name, "queue_full").inc(dropped)
                stage.stats.record_drop("queue_full", series=0, samples=dropped)
        return result

    def flush_aggregates(self, now: float | None = None) -> None:
        """Queue the aggregation windows that ended ``AGGREGATE_GRACE_MS`` before ``now``."""
        now_ms = int((self.clock() if now is None else now) * 1000)
        self._flush(now_ms - AGGREGATE_GRACE_MS)

    def flush_all(self) -> None:
        """Queue every open aggregation window now (graceful stop)."""
        self._flush(None)

    def _flush(self, until_ms: int | None) -> None:
        self._begin_write()
        try:
            self._flush_windows(until_ms)
        finally:
            self._end_write()

    def _flush_windows(self, until_ms: int | None) -> None:
        with self.lock:
            orphans, self._orphans[:] = list(self._orphans), []
        for stage, old in orphans:
            with self.lock:
                old.shards = stage.shards  # its windows are queued now: under the count in force now
                pieces = old.flush_aggregates(None)
            if pieces and stage.queue is not None:
                stage.queue.put(pieces)
        for stage in self.stages:
            if stage.aggregator is None:
                continue
            with self.lock:
                pieces = stage.flush_aggregates(until_ms)
            if pieces and stage.queue is not None:
                stage.queue.put(pieces)

    def expire(self) -> None:
        """Forget what left the window (series, owners, counter families, decisions unused for about
        a window); then the heap's free memory goes back to the system, outside the lock."""
        with self.lock:
            self.tracker_in.expire()
            alive = self.tracker_in.has()
            for stage in self.stages:
                stage.stats.tracker_out.expire()
                stage.owners.expire(alive)
            now = self.clock()
            horizon = now - self.tracker_in.window_s
            for family in [f for f, t in self.counters.items() if t < horizon]:
                del self.counters[family]
            self.cache.age(now, self.tracker_in.window_s / 2)
        memory_trim.trim_arenas()  # the heap and the threads' arenas: malloc_trim alone leaves their tops

    def state_sizes(self) -> dict[str, int]:
        """Entries in each per-series or per-name structure (tests, bench, debugging)."""
        with self.lock:
            sizes = {"in": self.tracker_in.active(), "counter_families": len(self.counters)}
            for stage in self.stages:
                sizes[f"out:{stage.name}"] = stage.stats.tracker_out.active()
                sizes[f"collision_owners:{stage.name}"] = len(stage.owners)
                sizes[f"aggregate_groups:{stage.name}"] = 0 if stage.aggregator is None else stage.aggregator.groups()
            return sizes
