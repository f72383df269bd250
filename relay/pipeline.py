"""The relay's ingest pipeline: one request's RW1 bytes in, each destination's share durably queued.

Order of stages (DESIGN.md): decode -> external_labels -> global relabel -> per destination:
write_relabel_configs -> prune_labels -> aggregate -> limits -> durable queue.

Two halves, kept apart so that no result depends on when a series was decided:

- ``decide(key)``: the stateless half, once per distinct input label set (its raw label bytes):
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

import logging
import sys
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
from relay.limits import AmpLimits, CollisionDetector, CollisionOwners, SeriesLimiter, amp_violation
from relay.metrics import RelayMetrics
from relay.protowire import encode_uvarint, fields, uvarint
from relay.queue import DurableQueue, Piece
from relay.rules import Rules, add_external_labels
from relay.selector import parse_selector

log = logging.getLogger(__name__)

DEFAULT_CACHE_MAX_BYTES = 128 * 1024 * 1024  # decision cache budget (estimated bytes, see _entry_bytes)
AGGREGATE_GRACE_MS = 10_000  # windows close this long after their end (late scrapes, batching)
MAX_COUNTER_FAMILIES = 100_000  # counter families learnt from metadata (beyond: only the _total suffix)
FAMILY_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")  # metadata family -> its series' names
_MASK64 = (1 << 64) - 1
_ID_MASK = (1 << 60) - 1  # input ids: 60 bits, a 32-byte int (64 bits take 36)
_CLAIM = 1 << 64  # set in a pass decision's id: the rules changed the series, its output is claimed
_POS_SHIFT = 65  # above it in a pass decision's id: 1 + where the external labels go into the key
_COUNTER = 1  # MetricMetadata.MetricType COUNTER
_ENTRY_OVERHEAD = 260  # dict slot, key object, decision and input tuples, input id (measured, bench/)
_DEST_OVERHEAD = 120  # per destination that sends or aggregates: tuple, output bytes object, id

__all__ = ["AGGREGATE_GRACE_MS", "IngestResult", "Piece", "Pipeline"]


@dataclass(slots=True)
class IngestResult:
    series: int = 0
    samples: int = 0
    histograms: int = 0
    exemplars: int = 0
    dropped_samples: int = 0  # lost to queue overflow while storing this request
    kept: list[int] = field(default_factory=list)  # samples kept per destination


_DROPS: dict[str, wire.DestDecision] = {}


def _drop(reason: str) -> wire.DestDecision:
    """A drop decision, shared by every series dropped for this reason (no memory per series)."""
    d = _DROPS.get(reason)
    if d is None:
        d = _DROPS[reason] = (b"", 0, reason)
    return d


_RULES = _drop("rules")


def decode_labels(key: bytes) -> Labels:
    """``wire.decode_labels`` with a fast path for label sets as protobuf serialises them (every
    Label entry ``0x0a len 0x0a len name [0x12 len value]``, lengths under 128); anything else, and
    every error, goes through ``wire.decode_labels`` so results and messages are the same."""
    out: list[tuple[str, str]] = []
    n = len(key)
    p = 0
    try:
        while p < n:
            if key[p] != 0x0A or key[p + 1] >= 0x80 or key[p + 2] != 0x0A or key[p + 3] >= 0x80:
                return wire.decode_labels(key)
            end = p + 2 + key[p + 1]
            ne = p + 4 + key[p + 3]
            if ne == end:
                value = ""
            elif key[ne] == 0x12 and key[ne + 1] < 0x80 and ne + 2 + key[ne + 1] == end:
                value = key[ne + 2 : end].decode()
            else:
                return wire.decode_labels(key)
            if ne > end or end > n or ne == p + 4:  # truncated, or an empty name
                return wire.decode_labels(key)
            if value:
                out.append((key[p + 4 : ne].decode(), value))
            else:
                out.append(("", ""))  # an empty value: the slow path keeps the checks in one place
                return wire.decode_labels(key)
            p = end
    except (IndexError, UnicodeDecodeError):
        return wire.decode_labels(key)
    out.sort()
    for i in range(1, len(out)):
        if out[i][0] == out[i - 1][0]:
            return wire.decode_labels(key)  # a duplicate name: its error message
    return tuple(out)


def _decoder(lb: bytes) -> Callable[[], Labels]:
    return lambda: wire.decode_labels(lb)


def _add_oldest(oldest: list[int], shard: int, ts: int) -> None:
    if ts and (not oldest[shard] or ts < oldest[shard]):
        oldest[shard] = ts


class _DestinationStage:
    """One destination: its cold decision after the rules, and its per-series state."""

    def __init__(
        self,
        dest: DestinationConfig,
        stats: DestinationStats,
        metrics: RelayMetrics,
        cardinality: CardinalityMetrics | None,
        queue: DurableQueue | None,
        clock: Callable[[], float],
        counters: dict[str, float],
        collisions: CollisionDetector,
    ) -> None:
        self.name = dest.name
        self.dest = dest
        self.amp_limits = AmpLimits()  # the pipeline sets its own
        self.stats = stats
        self.metrics = metrics
        self.queue = queue
        self.shards = max(1, dest.queue.max_shards)
        self.counters = counters  # the pipeline's: metric family -> last seen as a counter
        self.collisions = collisions
        self.external = b""  # the external labels' bytes, set by the pipeline
        self.owners = CollisionOwners()
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

    # -- stateless ---------------------------------------------------------------------------------
    def decide(self, key: bytes, labels: Labels, unchanged: bool,
               scratch: dict[bytes, Labels] | None = None) -> wire.DestDecision:
        """Cold path for one destination, after its rules produced ``labels``; no side effect
        (``scratch`` only remembers the output's labels for the current request).

        Three kinds: a drop ``(b"", 0, reason)``; an aggregated series ``(group key, -(rule + 1),
        metric)``; a series sent ``(output label bytes, output id [| _CLAIM] [| (pos + 1) << 65],
        metric)``. With a position, the output is the input key with the external labels' bytes
        (the shared first slot) inserted at ``pos``: the cache then keeps no copy of the output."""
        violation = amp_violation(labels, self.amp_limits)
        if violation is not None:
            return _drop(violation)
        metric = sys.intern(label_get(labels, METRIC_NAME))
        if self.aggregator is not None:
            routed = self.aggregator.route(labels)
            if routed is not None:
                rule, group = routed
                return (wire.encode_labels(group), -(rule + 1), metric)
        lb = wire.encode_labels(labels)
        if lb == key:
            lb = key  # one bytes object for the cache key and the output
        if scratch is not None:
            scratch[lb] = labels
        sid = wire.series_id(lb) if unchanged else wire.series_id(lb) | _CLAIM
        ext = self.external
        if ext and len(lb) == len(key) + len(ext):
            pos = lb.find(ext)
            if pos >= 0 and lb[:pos] == key[:pos] and lb[pos + len(ext):] == key[pos:]:
                return (ext, sid | (pos + 1) << _POS_SHIFT, metric)
        return (lb, sid, metric)

    # -- stateful, every occurrence ----------------------------------------------------------------
    def take(
        self,
        entries: list[tuple[wire.DestDecision, bytes, int, int]],
        inputs: list[tuple[wire.DestDecision, bytes, int, int]],
        new_in: set[int],
        in_active: Callable[[int], bool],
        labels_of: Callable[[bytes], Labels] = wire.decode_labels,
    ) -> tuple[list[Piece], int, int]:
        """One request's series for this destination (``entries[j]`` is input ``inputs[j]``):
        collisions, aggregation, limits, accounting, sharding. ``new_in``: indexes of input series
        seen for the first time in the window. Returns (queue pieces, samples kept, samples in)."""
        shards = self.shards
        parts: list[list[bytes]] = [[] for _ in range(shards)]
        counts = [0] * shards
        oldest = [0] * shards
        drops: dict[str, int] = {}
        series_drops: dict[str, int] = {}
        aggregator = self.aggregator
        limiter = self.limiter
        tracker = self.stats.tracker_out
        contains = tracker.contains
        owners = self.owners
        seen: list[tuple[int, str]] = []
        seen_lb: list[bytes] = []
        prefix = wire.LEN_PREFIX
        kept = routed = 0
        for j, (decision, rest, n, ts) in enumerate(entries):
            routed += n
            lb, sid, metric = decision
            if not lb:  # dropped; the metric slot holds the reason
                drops[metric] = drops.get(metric, 0) + n
                if j in new_in:
                    series_drops[metric] = series_drops.get(metric, 0) + 1
                continue
            if sid < 0:  # aggregated: the member is the input series
                assert aggregator is not None
                samples = wire.decode_samples(rest)
                refused = aggregator.add(-sid - 1, lb, inputs[j][0][1], samples, self.is_counter(metric),
                                         _decoder(lb))
                floats = len(samples)
                if floats - refused:
                    drops["aggregated"] = drops.get("aggregated", 0) + floats - refused
                if refused:
                    drops["too_far_in_future"] = drops.get("too_far_in_future", 0) + refused
                if n > floats:
                    drops["aggregate_histogram"] = drops.get("aggregate_histogram", 0) + n - floats
                continue
            if sid > _MASK64:
                high = sid >> 64
                sid &= _MASK64
                if high > 1:  # the output is the input key with the external labels inserted
                    pos = (high >> 1) - 1
                    key = inputs[j][0][0]
                    lb = key[:pos] + lb + key[pos:]
                if high & 1:
                    ok = owners.claim(sid, inputs[j][0][1], in_active, contains)
                else:
                    ok = not owners.owners or owners.unchanged(sid, inputs[j][0][1], in_active)
            else:
                ok = not owners.owners or owners.unchanged(sid, inputs[j][0][1], in_active)
            if not ok:
                drops["collision"] = drops.get("collision", 0) + n
                if j in new_in:
                    series_drops["collision"] = series_drops.get("collision", 0) + 1
                self.collisions.collided(self.name, _decoder(lb), self.prune_hint)
                continue
            if limiter is None or contains(sid):
                seen.append((sid, metric))
                seen_lb.append(lb)
            elif not limiter.admit(sid, metric, lambda lb=lb: labels_of(lb)):  # type: ignore[misc]
                drops["series_limit"] = drops.get("series_limit", 0) + n
                continue
            shard = sid % shards
            size = len(lb) + len(rest)  # one WriteRequest field-1 entry: tag, length, labels, rest
            parts[shard] += (b"\n", prefix[size] if size < 0x4000 else encode_uvarint(size), lb, rest)
            counts[shard] += n
            _add_oldest(oldest, shard, ts)
            kept += n
        if seen:
            tracker.observe_batch(seen, lambda i: labels_of(seen_lb[i]))
        for reason, n in drops.items():
            if n:
                self.metrics.samples_dropped_total.labels(self.name, reason).inc(n)
            self.stats.record_drop(reason, series=0 if reason == "rules" else series_drops.get(reason, 0),
                                   samples=n)
        pieces = [(s, b"".join(parts[s]), counts[s], oldest[s]) for s in range(shards) if counts[s]]
        return pieces, kept, routed

    def flush_aggregates(self, now_ms: int | None) -> list[Piece]:
        """Queue pieces of the windows closed by ``now_ms`` (None: every open window)."""
        if self.aggregator is None:
            return []
        out = self.aggregator.flush(now_ms)
        parts: list[list[bytes]] = [[] for _ in range(self.shards)]
        counts = [0] * self.shards
        oldest = [0] * self.shards
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
                if not self.limiter.admit(sid, metric, lambda labels=labels: labels):  # type: ignore[misc]
                    drops["series_limit"] = drops.get("series_limit", 0) + 1
                    continue
            else:
                self.stats.tracker_out.observe(sid, metric, labels)
            shard = sid % self.shards
            parts[shard].append(wire.encode_write_request([(labels, [(ts, value)])]))
            counts[shard] += 1
            _add_oldest(oldest, shard, ts)
        for reason, n in drops.items():
            self.metrics.samples_dropped_total.labels(self.name, reason).inc(n)
            self.stats.record_drop(reason, series=0, samples=n)
        return [(s, b"".join(parts[s]), counts[s], oldest[s]) for s in range(self.shards) if counts[s]]

    def metadata(self, entries: list[tuple[str, bytes]]) -> bytes:
        """The raw metadata entries of families this destination keeps (their series are active in
        its out tracker); none when the destination does not send metadata."""
        if not entries or not getattr(self.dest, "send_metadata", True):
            return b""
        has = self.stats.tracker_out.active_for_metric
        return b"".join([raw for family, raw in entries
                         if any(has(family + suffix) for suffix in FAMILY_SUFFIXES)])


def _metadata_entries(metadata: bytes) -> list[tuple[str, bytes, bool]]:
    """(family name, raw tag-wrapped entry, is a counter) of each WriteRequest field-3 entry."""
    out: list[tuple[str, bytes, bool]] = []
    try:
        for number, wire_type, tag_start, start, end in fields(metadata, 0, len(metadata)):
            if number != 3 or wire_type != 2:
                continue
            family, kind = "", 0
            for n2, wt2, _, s2, e2 in fields(metadata, start, end):
                if n2 == 2 and wt2 == 2:
                    family = metadata[s2:e2].decode("utf-8", "replace")
                elif n2 == 1 and wt2 == 0:
                    kind = uvarint(metadata, s2)[0]
            out.append((family, metadata[tag_start:end], kind == _COUNTER))
    except wire.WireError:  # metadata is best effort; the samples were validated by route()
        return out
    return out


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
        *,
        cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
    ) -> None:
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
            _DestinationStage(d, self.stats[i], metrics, cardinality, queues[i], clock, self.counters,
                              self.collisions)
            for i, d in enumerate(config.destinations)
        ]
        external = wire.encode_labels(config.external_labels)
        for stage in self.stages:
            stage.amp_limits = self.amp_limits
            stage.external = external
        self._young: dict[bytes, wire.Decision] = {}
        self._old: dict[bytes, wire.Decision] = {}
        self._young_bytes = self._old_bytes = 0
        self._cache_max = cache_max_bytes
        self._scratch: dict[bytes, Labels] = {}  # labels decided during the current request
        # (new stage, old stage) whose old aggregator's windows are still to be emitted (reload)
        self._orphans: list[tuple[_DestinationStage, _DestinationStage]] = []
        if previous is not None:
            self._take_over(previous)

    def _take_over(self, previous: Pipeline) -> None:
        """On reload, keep per-series state: collision owners per destination, and aggregation
        windows in progress (with counters' running totals) where the aggregate rules did not change.
        Where they changed, the old rules' open windows are emitted (early, as they stand) by the
        next flush instead of being lost."""
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

    # -- the decision cache --------------------------------------------------------------------------
    def cache_bytes(self) -> int:
        return self._young_bytes + self._old_bytes

    def cache_entries(self) -> int:
        return len(self._young) + len(self._old)

    def set_cache_max_bytes(self, n: int) -> None:
        with self.lock:
            self._cache_max = n
            self._evict()

    @staticmethod
    def _entry_bytes(key: bytes, decision: wire.Decision) -> int:
        size = _ENTRY_OVERHEAD + len(key)
        for d in decision[1:]:
            if d is not None and d[0]:
                shared = d[0] is key or (d[1] > 0 and d[1] >> _POS_SHIFT)
                size += _DEST_OVERHEAD + (0 if shared else len(d[0]))
        return size

    def _decide_cached(self, key: bytes) -> wire.Decision:
        """Called by wire.route for a key not in the young generation (which stores the result)."""
        decision = self._old.pop(key, None)
        if decision is None:
            decision = self.decide(key)
        else:
            self._old_bytes -= self._entry_bytes(key, decision)
        self._young_bytes += self._entry_bytes(key, decision)
        return decision

    def _evict(self) -> None:
        """Incremental: pop old-generation entries until the budget holds; when the old generation
        is empty and the young one alone is over budget, the young one becomes the old one."""
        while self._young_bytes + self._old_bytes > self._cache_max:
            if not self._old:
                self._old, self._young = self._young, {}
                self._old_bytes, self._young_bytes = self._young_bytes, 0
                if not self._old:
                    break
            key, decision = self._old.popitem()
            self._old_bytes -= self._entry_bytes(key, decision)

    # -- the cold path: once per distinct input label set, no side effect ---------------------------
    def decide(self, key: bytes) -> wire.Decision:
        labels = decode_labels(key)  # raises WireError(400) for an invalid label set
        metric_in = sys.intern(label_get(labels, METRIC_NAME))
        # The input's identity: a 64-bit hash of its sorted label set (so the same series with its
        # labels in another order is the same series). In memory only, never on disk: Python's hash.
        in_id = hash(labels) & _ID_MASK
        self._scratch[key] = labels
        out: list[wire.DestDecision | None] = [(key, in_id, metric_in)]
        base = self.rules.apply_global(labels)
        plain = add_external_labels(labels, self.config.external_labels)
        for i, stage in enumerate(self.stages):
            result = None if base is None else self.rules.apply_destination(i, base)
            # every destination gets a decision (never None), so entries line up with the inputs
            out.append(_RULES if result is None else stage.decide(key, result, result == plain, self._scratch))
        return tuple(out)

    def _labels(self, lb: bytes) -> Labels:
        """Labels of input or output label bytes: decided in this request, else decoded."""
        labels = self._scratch.get(lb)
        return wire.decode_labels(lb) if labels is None else labels

    # -- the per-series pass: every occurrence ---------------------------------------------------------
    def route(self, v1: bytes) -> tuple[IngestResult, list[list[Piece]]]:
        with self.lock:
            self._scratch.clear()
            routed = wire.route(v1, len(self.stages) + 1, self._young, self._decide_cached)
            self._evict()
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
            new_in = set(self.tracker_in.observe_batch(
                [(e[0][1], e[0][2]) for e in inputs], lambda i: self._labels(inputs[i][0][0])))
            in_active = self.tracker_in.has()
            md = _metadata_entries(routed.metadata) if routed.metadata else []
            if md:
                self._learn_counters(md)
            family_entries = [(family, raw) for family, raw, _ in md]
            pieces_per_dest: list[list[Piece]] = []
            for i, stage in enumerate(self.stages):
                pieces, kept, _ = stage.take(routed.per_dest[i + 1], inputs, new_in, in_active, self._labels)
                metadata = stage.metadata(family_entries)
                if metadata:
                    pieces.append((0, metadata, 0, 0))
                pieces_per_dest.append(pieces)
                result.kept.append(kept)
                stage.stats.record_samples(result.samples + result.histograms, kept)
            self._scratch.clear()
            return result, pieces_per_dest

    def _learn_counters(self, md: list[tuple[str, bytes, bool]]) -> None:
        now = self.clock()
        counters = self.counters
        for family, _, is_counter in md:
            if is_counter and (family in counters or len(counters) < MAX_COUNTER_FAMILIES):
                counters[family] = now

    def ingest(self, v1: bytes) -> IngestResult:
        """Route and durably queue one request. Returns only when every destination's share is
        committed (or dropped by rules); storage errors propagate for the caller to answer 503."""
        result, pieces_per_dest = self.route(v1)
        m = self.metrics
        m.samples_received_total.inc(result.samples + result.histograms)  # what each destination's share counts
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
        """Queue the aggregation windows that ended ``AGGREGATE_GRACE_MS`` before ``now``."""
        now_ms = int((self.clock() if now is None else now) * 1000)
        self._flush(now_ms - AGGREGATE_GRACE_MS)

    def flush_all(self) -> None:
        """Queue every open aggregation window now (graceful stop)."""
        self._flush(None)

    def _flush(self, until_ms: int | None) -> None:
        with self.lock:
            orphans, self._orphans[:] = list(self._orphans), []
        for stage, old in orphans:
            with self.lock:
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
        with self.lock:
            self.tracker_in.expire()
            alive = self.tracker_in.has()
            for stage in self.stages:
                stage.stats.tracker_out.expire()
                stage.owners.expire(alive)
            horizon = self.clock() - self.tracker_in.window_s
            for family in [f for f, t in self.counters.items() if t < horizon]:
                del self.counters[family]

    def state_sizes(self) -> dict[str, int]:
        """Entries in each per-series or per-name structure (tests, bench, debugging)."""
        with self.lock:
            sizes = {"in": self.tracker_in.active(), "counter_families": len(self.counters)}
            for stage in self.stages:
                sizes[f"out:{stage.name}"] = stage.stats.tracker_out.active()
                sizes[f"collision_owners:{stage.name}"] = len(stage.owners)
                sizes[f"aggregate_groups:{stage.name}"] = 0 if stage.aggregator is None else stage.aggregator.groups()
            return sizes
