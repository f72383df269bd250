"""Stream aggregation (vmagent-style): combine the series a rule makes collide, per interval.

A rule selects series, drops its ``without`` labels (or keeps only ``by``), and every group of series
that then share labels is reduced per window ``[k*interval, (k+1)*interval)`` of *sample time*.
Outputs are named the vmagent way, ``<metric>:<interval>_without_<labels>_<output>`` (labels sorted,
joined by ``_``; ``_by_`` with ``by``; neither part when both are empty) and stamped at the window end.

Outputs per window, over the samples the group received in it:
  sum           sum over series of each series' latest sample (so a 15 s scrape into a 30 s window
                does not count a series twice)
  avg, min, max over every sample
  count_series  distinct input series
  last          the sample with the greatest timestamp
  total         counters only: cumulative sum of increases, reset-aware (a drop in a series' value is a
                reset: the new value is the increase); a series' first sample counts in full, so
                ``total`` equals ``sum(counter)`` while no series resets. Never decreases.
A counter (``_total`` suffix or counter metadata) gets ``total`` (whether listed or not) and
``count_series`` if listed; sum/avg/min/max/last of raw cumulative values are not emitted for it.
``total`` is not emitted for gauges.

Members are the distinct INPUT series of a group (the caller's ``series_id``: two input series that
pruning made identical are two members). Each member's samples count once: a sample at or before
the member's last accepted timestamp is ignored, so a request Prometheus resends (after a 503 from
another destination) is not aggregated twice.

Windows close when ``flush(now_ms)`` passes their end (pass ``now_ms - lag`` for a grace period).
A sample for a window already flushed is late: it goes into the earliest open window, so outputs
never go back in time. A sample more than ``max_future_s`` ahead of the clock opens no window: it is
refused (``add`` returns how many), so a client cannot make windows pile up. Group state unseen for
``staleness_s`` (default 2 intervals, by the injected clock) is dropped once its windows are flushed,
and a member unseen for that long is forgotten.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from relay.common.labels import METRIC_NAME, Labels
from relay.rules.selector import Selector

OUTPUTS = ("sum", "avg", "min", "max", "count_series", "last", "total")
MAX_FUTURE_S = 600.0  # like Cortex/AMP's creation grace period: later samples are "too far in future"
MAX_CANDIDATE_NAMES = 8_192  # metric names memoised by Aggregator.route_metric
MAX_CANDIDATE_TEXT = 256  # longer metric names are not memoised
_COUNTER_OUTPUTS = frozenset({"total", "count_series"})


@dataclass(frozen=True)
class AggregateRule:
    match: Selector
    interval_s: float
    outputs: tuple[str, ...]
    without: tuple[str, ...] = ()
    by: tuple[str, ...] = ()
    staleness_s: float | None = None
    _without: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    _by: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            raise ValueError(f"aggregate interval must be positive, got {self.interval_s}")
        if self.without and self.by:
            raise ValueError("aggregate rule sets both 'without' and 'by'; use one")
        if not self.outputs:
            raise ValueError("aggregate rule has no outputs")
        unknown = [o for o in self.outputs if o not in OUTPUTS]
        if unknown:
            raise ValueError(f"unknown aggregate outputs {unknown} (valid: {', '.join(OUTPUTS)})")
        if METRIC_NAME in self.without:
            raise ValueError("aggregate 'without' cannot drop __name__")
        object.__setattr__(self, "_without", frozenset(self.without))
        object.__setattr__(self, "_by", frozenset(self.by) | {METRIC_NAME})

    def group(self, labels: Labels) -> Labels:
        if self.by:
            return tuple(p for p in labels if p[0] in self._by)
        if self.without:
            return tuple(p for p in labels if p[0] not in self._without)
        return labels

    def effective_outputs(self, is_counter: bool) -> tuple[str, ...]:
        if is_counter:
            rest = tuple(o for o in self.outputs if o in _COUNTER_OUTPUTS and o != "total")
            return ("total", *rest)
        return tuple(o for o in self.outputs if o != "total")


def format_interval(seconds: float) -> str:
    """Go-style duration as written in configs: ``30s``, ``1m``, ``1m30s``, ``1h``, ``500ms``."""
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    out = ""
    for unit, size in (("h", 3600), ("m", 60)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    if s or not out:
        out += f"{s}s"
    return out


def output_name(metric: str, rule: AggregateRule, output: str) -> str:
    name = f"{metric}:{format_interval(rule.interval_s)}"
    if rule.by:
        name += "_by_" + "_".join(sorted(set(rule.by) - {METRIC_NAME}))
    elif rule.without:
        name += "_without_" + "_".join(sorted(set(rule.without)))
    return f"{name}_{output}"


class _Window:
    __slots__ = ("count", "increase", "last_ts", "last_v", "max", "min", "per_series", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.last_ts = -(2**63)
        self.last_v = math.nan
        self.per_series: dict[int, tuple[int, float]] = {}  # series -> latest (ts, value)
        self.increase = 0.0


class _Group:
    __slots__ = ("closed_until", "counter", "cumulative", "labels", "metric", "rule", "seen", "series_last",
                 "windows")

    def __init__(self, rule: int, labels: Labels, counter: bool, seen: float) -> None:
        self.rule = rule
        self.labels = labels
        self.metric = next((v for n, v in labels if n == METRIC_NAME), "")
        self.counter = counter
        self.windows: dict[int, _Window] = {}  # window start (ms) -> state
        self.closed_until = -(2**63)  # windows starting before this are flushed
        self.cumulative = 0.0  # total so far (counters)
        self.series_last: dict[int, tuple[int, float]] = {}  # member -> last accepted (ts, value)
        self.seen = seen


class Aggregator:
    """One per destination. Not thread-safe: the caller serialises ``add`` and ``flush``."""

    def __init__(self, rules: Sequence[AggregateRule], clock: Callable[[], float] = time.time, *,
                 max_future_s: float = MAX_FUTURE_S) -> None:
        self.rules = tuple(rules)
        self._clock = clock
        self._max_future_ms = round(max_future_s * 1000)
        self._groups: dict[tuple[int, Hashable], _Group] = {}
        # metric name -> the rules whose __name__ matchers it passes (bounded memo; route_metric)
        self._candidates: dict[str, tuple[int, ...]] = {}
        self._name_matchers = tuple(tuple(m for m in r.match.matchers if m.name == METRIC_NAME)
                                    for r in self.rules)

    def route_metric(self, labels: Labels, metric: str) -> tuple[int, Labels] | None:
        """``route(labels)`` where ``metric`` is the first ``__name__`` value of ``labels`` ("" if
        none): the rules whose ``__name__`` matchers reject it are skipped without a look at the
        labels (matchers are AND-ed: such a rule cannot match)."""
        candidates = self._candidates.get(metric)
        if candidates is None:
            candidates = tuple(i for i, ms in enumerate(self._name_matchers)
                               if all(m.matches_value(metric) for m in ms))
            if len(metric) <= MAX_CANDIDATE_TEXT:
                if len(self._candidates) >= MAX_CANDIDATE_NAMES:
                    self._candidates.clear()
                self._candidates[metric] = candidates
        for i in candidates:
            rule = self.rules[i]
            if rule.match.matches(labels):
                return i, rule.group(labels)
        return None

    def route(self, labels: Labels, is_counter: bool = False) -> tuple[int, Labels] | None:
        """(rule index, group labels) for the first rule matching, or None (series passes through)."""
        del is_counter  # groups do not depend on the kind; outputs do (see ``add``)
        for i, rule in enumerate(self.rules):
            if rule.match.matches(labels):
                return i, rule.group(labels)
        return None

    def groups(self) -> int:
        return len(self._groups)

    def windows(self) -> int:
        """Open windows over all groups."""
        return sum(len(g.windows) for g in self._groups.values())

    def members(self) -> int:
        """Input series remembered over all groups (their last accepted sample)."""
        return sum(len(g.series_last) for g in self._groups.values())

    def add(self, rule: int, group: Hashable, series_id: int, samples: Sequence[tuple[int, float]],
            is_counter: bool, labels: Callable[[], Labels] | None = None) -> int:
        """Add one member's samples to a group. ``group`` is any key naming the group (its labels by
        default; ``labels()`` gives them when the group is new). Returns the samples refused for being
        too far in the future."""
        key = (rule, group)
        g = self._groups.get(key)
        now = self._clock()
        horizon = round(now * 1000) + self._max_future_ms
        if g is None:
            if all(ts > horizon for ts, _ in samples):
                return len(samples)  # opens no group either
            group_labels = labels() if labels is not None else group
            g = self._groups[key] = _Group(rule, group_labels, is_counter, now)  # type: ignore[arg-type]
        g.seen = now
        interval = round(self.rules[rule].interval_s * 1000)
        refused = 0
        members = g.series_last
        for ts, value in samples:
            if ts > horizon:
                refused += 1
                continue
            if math.isnan(value):
                continue  # staleness markers and NaNs carry no value to aggregate
            prev = members.get(series_id)
            if prev is not None and ts <= prev[0]:
                continue  # this member already gave this sample (a resend) or a later one
            if g.counter:
                w_increase = value if prev is None else (value - prev[1] if value >= prev[1] else value)
            members[series_id] = (ts, value)
            start = ts - ts % interval
            if start < g.closed_until:
                start = g.closed_until  # late: into the earliest open window
            w = g.windows.get(start)
            if w is None:
                w = g.windows[start] = _Window()
            if g.counter:
                w.increase += w_increase
            w.count += 1
            w.total += value
            if value < w.min:
                w.min = value
            if value > w.max:
                w.max = value
            if ts >= w.last_ts:
                w.last_ts, w.last_v = ts, value
            w.per_series[series_id] = (ts, value)
        return refused

    def flush(self, now_ms: int | None = None) -> list[tuple[Labels, int, float]]:
        """Outputs of every window that ended at or before ``now_ms`` (None: every open window, for a
        graceful stop), in time order per group."""
        out: list[tuple[Labels, int, float]] = []
        now = self._clock()
        if now_ms is None:
            now_ms = 2**62
        stale: list[tuple[int, Hashable]] = []
        for key, g in self._groups.items():
            rule = self.rules[g.rule]
            interval = round(rule.interval_s * 1000)
            if g.windows:
                for start in sorted(s for s in g.windows if s + interval <= now_ms):
                    w = g.windows.pop(start)
                    end = start + interval
                    g.closed_until = end
                    self._emit(out, g, rule, w, end)
            staleness = rule.staleness_s if rule.staleness_s is not None else 2 * rule.interval_s
            if g.series_last:  # forget members that stopped, so a group does not grow without bound
                horizon = g.closed_until - round(staleness * 1000)
                for sid in [s for s, (ts, _) in g.series_last.items() if ts < horizon]:
                    del g.series_last[sid]
            if not g.windows and now - g.seen > staleness:
                stale.append(key)
        for key in stale:
            del self._groups[key]
        return out

    def _emit(self, out: list[tuple[Labels, int, float]], g: _Group, rule: AggregateRule, w: _Window,
              end: int) -> None:
        if g.counter:
            g.cumulative += w.increase
        for output in rule.effective_outputs(g.counter):
            if output == "total":
                value = g.cumulative
            elif output == "count_series":
                value = float(len(w.per_series))
            elif output == "sum":
                value = math.fsum(v for _, v in w.per_series.values())
            elif output == "avg":
                value = w.total / w.count
            elif output == "min":
                value = w.min
            elif output == "max":
                value = w.max
            else:  # last
                value = w.last_v
            name = output_name(g.metric, rule, output)
            labels = tuple((n, name) if n == METRIC_NAME else (n, v) for n, v in g.labels)
            out.append((labels, end, value))
