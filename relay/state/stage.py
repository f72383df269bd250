"""One destination's half of the pipeline: its cold decision after the rules (``decide``) and its
per-series pass for every occurrence (``take``): collisions, aggregation, limits, accounting and
sharding into queue pieces. Plain data in (decisions, rest bytes, counts), pieces out: the loop a
native core can take over (issue 9). A request's metadata entries are read by ``relay.state.metadata``
(``metadata_entries``, importable from here too).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from relay import native
from relay.common.labels import METRIC_NAME, Labels
from relay.common.labels import get as label_get
from relay.common.metrics import RelayMetrics
from relay.common.protowire import encode_uvarint
from relay.config.config import DestinationConfig
from relay.delivery.queue.durable import DurableQueue, Piece
from relay.ingest import wire
from relay.rules import label_codec
from relay.rules.selector import parse_selector
from relay.state.aggregate import AggregateRule, Aggregator
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.limits import (
    AmpLimits,
    CollisionDetector,
    CollisionOwners,
    SeriesLimiter,
    amp_violation,
    amp_violation_named,
)
from relay.state.metadata import FAMILY_SUFFIXES, metadata_entries
from relay.state.series_tracker import CSeriesTracker

MASK64 = (1 << 64) - 1
CLAIM = 1 << 64  # set in a pass decision's id: the rules changed the series, its output is claimed
POS_SHIFT = 65  # above it in a pass decision's id: 1 + where the external labels go into the key
_cstage = native.load("cstage")  # take()'s loop in C (relay/native/cstage.c); None: the reference below
# Pipeline.route's fast path for requests of cached series (relay/native/cstage.c route_hits): it reads
# the request with relay.native._cwire's parser and the decisions in relay.native._cdcache's tables, so all three.
route_hits: Callable[..., Any] | None = (
    _cstage.route_hits if _cstage is not None and native.load("cwire") and native.load("cdcache") else None)

__all__ = ["CLAIM", "FAMILY_SUFFIXES", "MASK64", "POS_SHIFT", "RULES", "DestinationStage", "decode_labels",
           "decode_labels_canonical", "metadata_entries", "route_hits"]

_DROPS: dict[str, wire.DestDecision] = {}


def _drop(reason: str) -> wire.DestDecision:
    """A drop decision, shared by every series dropped for this reason (no memory per series)."""
    d = _DROPS.get(reason)
    if d is None:
        d = _DROPS[reason] = (b"", 0, reason)
    return d


RULES = _drop("rules")


def decode_labels(key: bytes) -> Labels:
    """``wire.decode_labels`` with a fast path for label sets as protobuf serialises them (every
    Label entry ``0x0a len 0x0a len name [0x12 len value]``, lengths under 128); anything else, and
    every error, goes through ``wire.decode_labels`` so results and messages are the same."""
    return decode_labels_canonical(key)[0]


def decode_labels_canonical(key: bytes) -> tuple[Labels, list[int] | None]:
    """``decode_labels``, and where ``key`` is exactly ``wire.encode_labels`` of the result (fast
    path, already sorted) the byte offset of each label's entry in it; else None. Label entries are
    memoised (``relay.label_codec``); every error is ``wire.decode_labels``'s."""
    labels, _, canonical = label_codec.decode_key(key)
    return labels, label_codec.offsets(key) if canonical else None


def _decoder(lb: bytes) -> Callable[[], Labels]:
    return lambda: wire.decode_labels(lb)


def _add_oldest(oldest: list[int], shard: int, ts: int) -> None:
    if ts and (not oldest[shard] or ts < oldest[shard]):
        oldest[shard] = ts


class DestinationStage:
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
               scratch: dict[bytes, Labels] | None = None, splice: int | None = None,
               names: tuple[str, ...] | None = None) -> wire.DestDecision:
        """Cold path for one destination, after its rules produced ``labels`` (whose names are
        ``names``, when the caller knows them); no side effect (``scratch`` only remembers the
        output's labels for the current request). ``splice``, for a canonical key: -1 when
        ``unchanged`` labels are the key's own, else where the external labels' bytes go into the
        key to make the ``unchanged`` output (None: encode it).

        Three kinds: a drop ``(b"", 0, reason)``; an aggregated series ``(group key, -(rule + 1),
        metric)``; a series sent ``(output label bytes, output id [| CLAIM] [| (pos + 1) << 65],
        metric)``. With a position, the output is the input key with the external labels' bytes
        (the shared first slot) inserted at ``pos``: the cache then keeps no copy of the output."""
        if names is None:
            names = tuple([p[0] for p in labels])
        ext = self.external
        aggregator = self.aggregator
        if splice == -1 and unchanged and aggregator is None:  # the key's own labels, sent as they are
            violation = amp_violation_named(labels, names, len(key) + len(ext), self.amp_limits)
            if violation is not None:
                return _drop(violation)
            try:
                return (key, label_codec.series_id(key), sys.intern(labels[names.index(METRIC_NAME)][1]))
            except ValueError:
                return (key, label_codec.series_id(key), "")
        spliced = unchanged and splice is not None
        lb = b""
        if spliced:
            size = len(key) + len(ext)  # at least the output's size: the key (and the external labels)
        elif aggregator is None:
            lb = label_codec.encode(labels)
            size = len(lb)
        else:
            size = len(label_codec.encode(labels))
        violation = amp_violation_named(labels, names, size, self.amp_limits)
        if violation is not None:
            return _drop(violation)
        try:
            metric = sys.intern(labels[names.index(METRIC_NAME)][1])
        except ValueError:
            metric = ""
        if aggregator is not None:
            routed = aggregator.route_metric(labels, metric)
            if routed is not None:
                rule, group = routed
                return (wire.encode_labels(group), -(rule + 1), metric)
        if unchanged and splice is not None:
            if splice < 0:
                return (key, label_codec.series_id(key), metric)
            full = key[:splice] + ext + key[splice:]
            if scratch is not None:
                scratch[full] = labels
            return (ext, label_codec.series_id(full) | (splice + 1) << POS_SHIFT, metric)
        if not lb:
            lb = label_codec.encode(labels)
        if lb == key:
            lb = key  # one bytes object for the cache key and the output
        if scratch is not None:
            scratch[lb] = labels
        sid = label_codec.series_id(lb) if unchanged else label_codec.series_id(lb) | CLAIM
        if ext and len(lb) == len(key) + len(ext):
            pos = lb.find(ext)
            if pos >= 0 and lb[:pos] == key[:pos] and lb[pos + len(ext):] == key[pos:]:
                return (ext, sid | (pos + 1) << POS_SHIFT, metric)
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
        seen for the first time in the window. Returns (queue pieces, samples kept, samples in).

        The loop runs in C (``relay.native._cstage.take``) where the native core is in use and the out
        tracker is its C twin; the C loop calls back ``_aggregate``, ``_admit`` and ``_collided``
        and the owners' ``claim``/``unchanged`` for the rare branches, and answers NotImplemented
        (before any effect) on an input of an unusual shape: then the reference runs."""
        tracker = self.stats.tracker_out
        if _cstage is not None and type(tracker) is CSeriesTracker:
            r = _cstage.take(self, entries, inputs, new_in, in_active, labels_of, tracker._t, tracker._gen())
            if r is not NotImplemented:
                pieces, kept, routed, drops = r
                self.record_drops(drops)
                return pieces, kept, routed
        return self.take_reference(entries, inputs, new_in, in_active, labels_of)

    def record_drops(self, drops: list[tuple[str, int, int]]) -> None:
        """The C loop's drops, (reason, samples, series new in the window) each, as the reference
        records its own."""
        for reason, n, series in drops:
            if n:
                self.metrics.samples_dropped_total.labels(self.name, reason).inc(n)
            self.stats.record_drop(reason, series=0 if reason == "rules" else series, samples=n)

    def hit_args(self, tracker_in: object) -> tuple[int, bool, dict[int, int], Any, int] | None:
        """What ``relay.native._cstage.route_hits`` needs of this stage, or None where it cannot run here
        (the out tracker is not the C one, or is the in tracker; ``take`` replaced on the instance)."""
        tracker = self.stats.tracker_out
        owners = self.owners.owners
        if (type(tracker) is not CSeriesTracker or tracker is tracker_in or type(owners) is not dict
                or "take" in vars(self)):
            return None
        return (self.shards, self.limiter is not None, owners, tracker._t, tracker._gen())

    def _aggregate(self, decision: wire.DestDecision, rest: bytes, n: int, in_id: int) -> tuple[int, int, int]:
        """An aggregated member's samples into the aggregator: (aggregated, too far in the future,
        histograms) sample counts."""
        assert self.aggregator is not None
        lb, sid, metric = decision
        samples = wire.decode_samples(rest)
        refused = self.aggregator.add(-sid - 1, lb, in_id, samples, self.is_counter(metric), _decoder(lb))
        floats = len(samples)
        return floats - refused, refused, n - floats

    def _admit(self, sid: int, metric: str, lb: bytes, labels_of: Callable[[bytes], Labels]) -> bool:
        assert self.limiter is not None
        return self.limiter.admit(sid, metric, lambda: labels_of(lb))

    def _collided(self, lb: bytes) -> None:
        self.collisions.collided(self.name, _decoder(lb), self.prune_hint)

    def take_reference(
        self,
        entries: list[tuple[wire.DestDecision, bytes, int, int]],
        inputs: list[tuple[wire.DestDecision, bytes, int, int]],
        new_in: set[int],
        in_active: Callable[[int], bool],
        labels_of: Callable[[bytes], Labels] = wire.decode_labels,
    ) -> tuple[list[Piece], int, int]:
        """``take`` in pure Python: the reference (and the fallback)."""
        shards = self.shards
        parts: list[list[bytes]] = [[] for _ in range(shards)]
        counts = [0] * shards
        oldest = [0] * shards
        drops: dict[str, int] = {}
        series_drops: dict[str, int] = {}
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
                aggregated, refused, histograms = self._aggregate(decision, rest, n, inputs[j][0][1])
                if aggregated:
                    drops["aggregated"] = drops.get("aggregated", 0) + aggregated
                if refused:
                    drops["too_far_in_future"] = drops.get("too_far_in_future", 0) + refused
                if histograms > 0:
                    drops["aggregate_histogram"] = drops.get("aggregate_histogram", 0) + histograms
                continue
            if sid > MASK64:
                high = sid >> 64
                sid &= MASK64
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
                self._collided(lb)
                continue
            if limiter is None or contains(sid):
                seen.append((sid, metric))
                seen_lb.append(lb)
            elif not self._admit(sid, metric, lb, labels_of):
                drops["series_limit"] = drops.get("series_limit", 0) + n
                continue
            shard = sid % shards
            size = len(lb) + len(rest)  # one WriteRequest field-1 entry: tag, length, labels, rest
            parts[shard] += (b"\n", prefix[size] if size < 0x4000 else encode_uvarint(size), lb, rest)
            counts[shard] += n
            if ts and (ts < oldest[shard] or not oldest[shard]):
                oldest[shard] = ts
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
        if not entries or not self.dest.send_metadata:
            return b""
        has = self.stats.tracker_out.active_for_metric
        return b"".join([raw for family, raw in entries
                         if any(has(family + suffix) for suffix in FAMILY_SUFFIXES)])

