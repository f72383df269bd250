"""Per-destination cardinality reports: what ``/api/v1/cardinality`` shows for a destination
(:class:`DestinationStats`: its in and out series trackers, sample rates over the last minute, drops
by reason, cost estimates) and the self-metrics of cardinality control (:class:`CardinalityMetrics`:
series refused by limits, series dropped by reason, ``gpu_relay_active_series``).

The trackers themselves (exact active-series counts over a sliding window, from hashes only; the C
twin) live in ``relay.state.series_tracker`` and are importable from here too.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relay.state.series_tracker import MAX_SLOTS, CSeriesTracker, PySeriesTracker, SeriesTracker

if TYPE_CHECKING:
    from relay.state.cost import PriceTable

__all__ = ["MAX_LIMIT_METRIC_LABELS", "MAX_SLOTS", "CSeriesTracker", "CardinalityMetrics", "DestinationStats",
           "PySeriesTracker", "SeriesTracker"]

# gpu_relay_series_limit_dropped_total{metric}: the first names refused keep their own label (a
# counter cannot move between labels), every later one counts under metric="other".
MAX_LIMIT_METRIC_LABELS = 50


class _RateWindow:
    """Counts over the last ``span_s`` seconds in one-second buckets."""

    def __init__(self, clock: Callable[[], float], span_s: int = 60) -> None:
        self._clock = clock
        self._span = span_s
        self._start = clock()
        self._buckets: collections.deque[tuple[int, int, int]] = collections.deque()

    def add(self, a: int, b: int) -> None:
        sec = int(self._clock())
        if self._buckets and self._buckets[-1][0] == sec:
            _, a0, b0 = self._buckets[-1]
            self._buckets[-1] = (sec, a0 + a, b0 + b)
        else:
            self._buckets.append((sec, a, b))
        self._trim(sec)

    def _trim(self, sec: int) -> None:
        while self._buckets and self._buckets[0][0] <= sec - self._span:
            self._buckets.popleft()

    def rates(self) -> tuple[float, float]:
        now = self._clock()
        self._trim(int(now))
        elapsed = min(float(self._span), max(now - self._start, 1.0))
        return (sum(x[1] for x in self._buckets) / elapsed, sum(x[2] for x in self._buckets) / elapsed)


class DestinationStats:
    """Everything ``/api/v1/cardinality`` reports for one destination.

    ``lock`` guards the trackers and drop counts: the pipeline replaces it with its own lock (held
    while it routes a request), so :meth:`snapshot` is a consistent view under concurrent ingest."""

    def __init__(self, name: str, window_s: float = 3600.0, clock: Callable[[], float] = time.monotonic,
                 *, metrics: CardinalityMetrics | None = None) -> None:
        self.name = name
        self.lock: threading.RLock | Any = threading.RLock()
        self.window_s = window_s
        self.tracker_in = SeriesTracker(window_s, clock)
        self.tracker_out = SeriesTracker(window_s, clock)
        self._rates = _RateWindow(clock)
        self._drops: dict[str, list[int]] = {}
        self._metrics = metrics
        if metrics is not None:
            metrics.track(self)

    def record_samples(self, samples_in: int, samples_out: int) -> None:
        self._rates.add(samples_in, samples_out)

    def record_drop(self, reason: str, series: int = 1, samples: int = 0) -> None:
        with self.lock:
            entry = self._drops.get(reason)
            if entry is None:
                entry = self._drops[reason] = [0, 0]
            entry[0] += series
            entry[1] += samples
        if self._metrics is not None:
            self._metrics.series_dropped.labels(self.name, reason).inc(series)

    def expire(self) -> int:
        with self.lock:
            return self.tracker_in.expire() + self.tracker_out.expire()

    def snapshot(self, limit: int = 10, price_table: PriceTable | None = None) -> dict[str, Any]:
        with self.lock:
            return self._snapshot(limit, price_table)

    def _snapshot(self, limit: int, price_table: PriceTable | None) -> dict[str, Any]:
        from relay.state.cost import DEFAULT_PRICES, estimate_monthly

        prices = price_table or DEFAULT_PRICES
        rate_in, rate_out = self._rates.rates()
        trackers = {"in": self.tracker_in, "out": self.tracker_out}
        return {
            "destination": self.name,
            "window_seconds": self.window_s,
            "active_series": {k: t.active() for k, t in trackers.items()},
            "top_metrics": {k: [{"metric": m, "series": c} for m, c in t.top_metrics(limit)]
                            for k, t in trackers.items()},
            "top_labels": {k: [{"label": n, "distinct_values": c} for n, c in t.top_labels(limit)]
                           for k, t in trackers.items()},
            "dropped": {r: {"series": v[0], "samples": v[1]} for r, v in sorted(self._drops.items())},
            "samples_per_second": {"in": rate_in, "out": rate_out},
            "estimated_cost": estimate_monthly(rate_out, self.tracker_out.active(), prices),
            "estimated_cost_without_rules": estimate_monthly(rate_in, self.tracker_in.active(), prices),
        }


class CardinalityMetrics:
    """Self-metrics for cardinality control, registered on an injected registry."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter

        self.series_limit_dropped = Counter(
            "gpu_relay_series_limit_dropped", "Series refused because a destination limit was reached.",
            ["destination", "metric", "limit"], registry=registry)
        self.series_dropped = Counter(
            "gpu_relay_series_dropped", "Series dropped before sending, by reason.",
            ["destination", "reason"], registry=registry)
        self._stats: dict[str, DestinationStats] = {}
        self._limit_metrics: dict[str, set[str]] = {}  # destination -> metric label values in use
        registry.register(_ActiveSeriesCollector(self._stats))

    def track(self, stats: DestinationStats) -> None:
        self._stats[stats.name] = stats

    def untrack(self, name: str) -> None:
        self._stats.pop(name, None)

    def on_limit_drop(self, destination: str) -> Callable[[str, str], None]:
        """An ``on_drop`` callback for :class:`relay.limits.SeriesLimiter` that counts the refusal.
        At most ``MAX_LIMIT_METRIC_LABELS`` metric names get their own label; the rest ``other``."""
        counter = self.series_limit_dropped
        names = self._limit_metrics.setdefault(destination, set())

        def on_drop(metric: str, limit: str) -> None:
            if metric not in names:
                if len(names) >= MAX_LIMIT_METRIC_LABELS:
                    metric = "other"
                else:
                    names.add(metric)
            counter.labels(destination, metric, limit).inc()

        return on_drop


class _ActiveSeriesCollector:
    def __init__(self, stats: dict[str, DestinationStats]) -> None:
        self._stats = stats

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("gpu_relay_active_series", "Series active in the window, per destination.",
                                   labels=["destination", "direction"])
        for name, s in sorted(self._stats.items()):
            family.add_metric([name, "in"], s.tracker_in.active())
            family.add_metric([name, "out"], s.tracker_out.active())
        yield family
