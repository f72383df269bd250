"""Series limits before sending: AMP's per-series validation, per-destination series budgets, and
detection of series that ``prune_labels`` made collide.

Reasons use the names AMP/Cortex report in CloudWatch ``DiscardedSamples`` (``label_value_too_long``,
``max_label_names_per_series``, ...), so a relay counter and an AMP graph line up.
"""

from __future__ import annotations

import collections
import itertools
import logging
import operator
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from relay.common.labels import METRIC_NAME, Labels, canonical
from relay.state.series_tracker import SeriesTracker

# AMP quotas (reference §5): 70 labels per series is documented; the name/value lengths come from a
# third-party table (unverified), so they are constants to override, not facts.
AMP_MAX_LABELS = 70
AMP_MAX_NAME_LEN = 128
AMP_MAX_VALUE_LEN = 2048
LOG_INTERVAL_S = 60.0
MAX_LOGGED_NAMES = 1000
_LOG = logging.getLogger("relay.limits")


@dataclass(frozen=True)
class AmpLimits:
    max_labels: int = AMP_MAX_LABELS
    max_name_len: int = AMP_MAX_NAME_LEN
    max_value_len: int = AMP_MAX_VALUE_LEN


def _too_long(text: str, limit: int) -> bool:
    # Go's len() counts bytes: only encode when the characters alone could exceed the limit.
    return len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit)


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _valid_name(name: str, colon: bool) -> bool:
    return (_METRIC_NAME if colon else _LABEL_NAME).fullmatch(name) is not None


_NAMES_OK = re.compile(r"(?:[a-zA-Z_][a-zA-Z0-9_]*\n)*")


def amp_violation(labels: Labels, limits: AmpLimits = AmpLimits()) -> str | None:
    """The reason AMP would reject this series, or None. Labels are sorted (``relay.labels``)."""
    if len(labels) > limits.max_labels:
        return "max_label_names_per_series"
    if _acceptable(labels, limits):
        return None
    return _violation(labels, limits)


def _acceptable(labels: Labels, limits: AmpLimits) -> bool:
    """Fast check that nothing is wrong (the common case): a few C-level passes, no per-label
    Python loop. False means: look closer (``_violation`` finds the reason, in label order)."""
    names = [n for n, _ in labels]
    if len(set(names)) != len(names) or METRIC_NAME not in names:
        return False
    metric = labels[names.index(METRIC_NAME)][1]
    others = [n for n in names if n != METRIC_NAME]
    if others and max(map(len, others)) > limits.max_name_len:
        return False
    if _NAMES_OK.fullmatch("\n".join(others) + "\n" if others else "") is None:
        return False
    longest = max(map(len, [v for _, v in labels]))
    if longest * 4 > limits.max_value_len:  # could exceed in UTF-8 bytes: the slow path measures
        return False
    return _valid_name(metric, colon=True)


MAX_MEMO = 4_096  # memoised label-name tuples per AmpLimits, and metric names (then: start over)
MAX_MEMO_NAMES = 100  # longer name tuples are not memoised
MAX_MEMO_TEXT = 256  # longer metric names are not memoised
_NAME_SETS: dict[int, dict[tuple[str, ...], bool]] = {}  # id(limits) -> names -> fine
_NAME_SETS_OF: dict[int, AmpLimits] = {}  # id(limits) -> limits (kept alive, so the id stays its own)
_METRIC_OK: dict[str, bool] = {}


def amp_violation_named(labels: Labels, names: tuple[str, ...], size: int, limits: AmpLimits) -> str | None:
    """``amp_violation(labels, limits)`` for a label set whose names are ``names`` and whose
    encoding takes ``size`` bytes (a bound on every value's UTF-8 length). The usual case (names
    known to be fine, everything shorter than the value limit, a known metric name) costs a few
    dict probes; anything else is ``amp_violation``'s to answer. Memos bounded by ``MAX_MEMO``."""
    memo = _NAME_SETS.get(id(limits))
    if memo is None or _NAME_SETS_OF[id(limits)] is not limits:  # (ids are reused once freed)
        if len(_NAME_SETS) >= 16:  # one per AmpLimits in use: a handful
            _NAME_SETS.clear()
            _NAME_SETS_OF.clear()
        memo = _NAME_SETS[id(limits)] = {}
        _NAME_SETS_OF[id(limits)] = limits
    ok = memo.get(names)
    if ok is None:
        if len(names) > limits.max_labels or len(names) > MAX_MEMO_NAMES:
            return amp_violation(labels, limits)  # (not memoised: a large tuple)
        ok = _names_ok(names, limits)
        if len(memo) >= MAX_MEMO:
            memo.clear()
        memo[names] = ok
    if ok and size <= limits.max_value_len:
        metric = labels[names.index(METRIC_NAME)][1]
        valid = _METRIC_OK.get(metric)
        if valid is None:
            valid = _valid_name(metric, colon=True)
            if len(metric) <= MAX_MEMO_TEXT:
                if len(_METRIC_OK) >= MAX_MEMO:
                    _METRIC_OK.clear()
                _METRIC_OK[metric] = valid
        if valid:
            return None
    return amp_violation(labels, limits)


def fits_named(names: tuple[str, ...], limits: AmpLimits) -> int:
    """The largest encoded size up to which ``amp_violation_named`` answers None for a label set
    with these names and a valid metric name (``metric_ok``), without looking at its values; -1
    where the names alone make it look closer."""
    if len(names) > limits.max_labels or len(names) > MAX_MEMO_NAMES or not _names_ok(names, limits):
        return -1
    return limits.max_value_len


def metric_ok(metric: str) -> bool:
    """The metric name is known valid (memoised by ``amp_violation_named``); False: not known so."""
    return _METRIC_OK.get(metric) is True


def _names_ok(names: tuple[str, ...], limits: AmpLimits) -> bool:
    """No label-name reason to reject: few enough, unique, a metric name, the others valid and short."""
    if len(names) > limits.max_labels or len(set(names)) != len(names) or METRIC_NAME not in names:
        return False
    return all(n == METRIC_NAME or (len(n) <= limits.max_name_len and _valid_name(n, colon=False))
               for n in names)


def _violation(labels: Labels, limits: AmpLimits) -> str | None:
    metric = ""
    previous = None
    for name, value in labels:
        if name == previous:
            return "duplicate_label_names"
        previous = name
        if name == METRIC_NAME:
            metric = value
            continue
        if _too_long(name, limits.max_name_len):
            return "label_name_too_long"
        if not _valid_name(name, colon=False):
            return "label_invalid"
        if _too_long(value, limits.max_value_len):
            return "label_value_too_long"
    if not metric:
        return "missing_metric_name"
    if not _valid_name(metric, colon=True):
        return "metric_name_invalid"
    if _too_long(metric, limits.max_value_len):
        return "label_value_too_long"
    return None


class SeriesLimiter:
    """Admits new series into a destination while it is under ``max_series`` / ``max_series_per_metric``.

    Admitted series keep flowing (the tracker refreshes them); a refused series is asked again on its
    next sample, so it gets in once expiry makes room. ``admit`` observes the tracker itself: callers
    with a limiter do not also call ``tracker.observe`` for the series.
    """

    def __init__(self, destination: str, max_series: int | None, max_series_per_metric: int | None,
                 tracker: SeriesTracker, on_drop: Callable[[str, str], None],
                 log: logging.Logger = _LOG,
                 clock: Callable[[], float] = time.monotonic, *,
                 log_interval_s: float = LOG_INTERVAL_S) -> None:
        for field, value in (("max_series", max_series), ("max_series_per_metric", max_series_per_metric)):
            if value is not None and value < 0:
                raise ValueError(f"{field} must be >= 0, got {value}")
        self.destination = destination
        self.max_series = max_series
        self.max_series_per_metric = max_series_per_metric
        self.tracker = tracker
        self._on_drop = on_drop
        self._log = log
        self._clock = clock
        self._log_interval = log_interval_s
        self._logged: dict[str, float] = {}  # metric -> last log time

    def admit(self, series_id: int, metric: str, labels: Callable[[], Labels]) -> bool:
        tracker = self.tracker
        if tracker.contains(series_id):
            tracker.observe(series_id, metric)
            return True
        limit = None
        if self.max_series is not None and tracker.active() >= self.max_series:
            limit = "max_series"
        elif (self.max_series_per_metric is not None
              and tracker.active_for_metric(metric) >= self.max_series_per_metric):
            limit = "max_series_per_metric"
        if limit is None:
            tracker.observe(series_id, metric, labels())
            return True
        self._on_drop(metric, limit)
        self._maybe_log(metric, limit)
        return False

    def _maybe_log(self, metric: str, limit: str) -> None:
        now = self._clock()
        last = self._logged.get(metric)
        if last is not None and now - last < self._log_interval:
            return
        if len(self._logged) >= MAX_LOGGED_NAMES:  # bounded: forget names not logged this interval
            self._logged = {m: t for m, t in self._logged.items() if now - t < self._log_interval}
            if len(self._logged) >= MAX_LOGGED_NAMES:
                return  # that many distinct names refused within one interval: enough said
        self._logged[metric] = now
        top = ", ".join(f"{n}={c}" for n, c in self.tracker.top_labels(5, metric)) or "none recorded"
        value = self.max_series if limit == "max_series" else self.max_series_per_metric
        self._log.warning(
            "destination %s: %s=%s reached (active %d, %s has %d): new %s series are dropped; "
            "its labels by distinct values: %s",
            self.destination, limit, value, self.tracker.active(), metric,
            self.tracker.active_for_metric(metric), metric, top)


class CollisionDetector:
    """Finds distinct input series that the rules map onto one output series (``prune_labels``).

    The first input key to claim an output series id owns it; another key mapping to the same id is
    a collision and must be dropped (two series would interleave samples and AMP would reject them as
    out of order or duplicates). Decisions are meant to be cached by the caller, so this runs only on
    cache misses. ``active(destination, out_id)``, when given, lets a claimant take over an output
    series whose owner has gone quiet (left the active window).
    """

    def __init__(self, active: Callable[[str, int], bool] | None = None,
                 on_collision: Callable[[str, str], None] | None = None,
                 log: logging.Logger = _LOG,
                 clock: Callable[[], float] = time.monotonic, *,
                 log_interval_s: float = LOG_INTERVAL_S) -> None:
        self._active = active
        self._on_collision = on_collision
        self._log = log
        self._clock = clock
        self._log_interval = log_interval_s
        self._owners: dict[str, dict[int, bytes]] = {}
        self._logged: dict[tuple[str, str], float] = {}
        self.collisions: dict[str, int] = {}  # destination -> count

    def check(self, destination: str, out_id: int, in_key: bytes, labels: Labels, rule_hint: str) -> bool:
        owners = self._owners.get(destination)
        if owners is None:
            owners = self._owners[destination] = {}
        owner = owners.get(out_id)
        if owner is None or owner == in_key:
            owners[out_id] = in_key
            return True
        if self._active is not None and not self._active(destination, out_id):
            owners[out_id] = in_key
            return True
        self.collided(destination, labels, rule_hint)
        return False

    def collided(self, destination: str, labels: Labels | Callable[[], Labels], rule_hint: str) -> None:
        """Count (and log, at most once an interval per destination and rule) one collision found
        by the caller; ``labels`` (of the output series) are only built when a line is logged."""
        self.collisions[destination] = self.collisions.get(destination, 0) + 1
        if self._on_collision is not None:
            self._on_collision(destination, rule_hint)
        self._maybe_log(destination, labels, rule_hint)

    def release(self, destination: str, out_id: int) -> None:
        self._owners.get(destination, {}).pop(out_id, None)

    def forget(self, destination: str) -> None:
        """Drop every claim of a destination (config reload, cache flush)."""
        self._owners.pop(destination, None)

    def _maybe_log(self, destination: str, labels: Labels | Callable[[], Labels], rule_hint: str) -> None:
        key = (destination, rule_hint)
        now = self._clock()
        last = self._logged.get(key)
        if last is not None and now - last < self._log_interval:
            return
        self._logged[key] = now
        if callable(labels):
            labels = labels()
        self._log.warning(
            "destination %s: %s maps distinct input series onto %s; keeping the first, dropping the others "
            "(%d so far). Add an aggregate rule (e.g. without: the pruned labels) to combine them instead.",
            destination, rule_hint, canonical(labels), self.collisions[destination])


class CollisionOwners:
    """Which input series owns each output series of one destination, keyed by 64-bit ids.

    Only outputs that the destination's rules changed are claimed explicitly (``claim``); a series
    the rules left as it was (only external labels added) is its output's implicit owner and costs
    no entry (``unchanged``). The first claimant wins; a claim passes to another input series once
    its owner is no longer active (``owner_active``). ``expire`` forgets claims of owners gone from
    the window, so the table is bounded by the active series."""

    def __init__(self) -> None:
        self.owners: dict[int, int] = {}

    def claim(self, out_id: int, in_id: int, owner_active: Callable[[int], bool],
              out_active: Callable[[int], bool]) -> bool:
        owner = self.owners.get(out_id)
        if owner == in_id:
            return True
        if owner is None:
            if out_active(out_id):
                return False  # an unchanged series emits this output already: it owns it
        elif owner_active(owner):
            return False
        self.owners[out_id] = in_id
        return True

    def unchanged(self, out_id: int, in_id: int, owner_active: Callable[[int], bool]) -> bool:
        owner = self.owners.get(out_id)
        if owner is None or owner == in_id:
            return True
        if owner_active(owner):
            return False
        del self.owners[out_id]
        return True

    def expire(self, alive: Callable[[int], bool]) -> int:
        owners = self.owners
        gone = list(itertools.compress(owners.keys(), map(operator.not_, map(alive, owners.values()))))
        collections.deque(map(owners.__delitem__, gone), maxlen=0)
        if gone and len(owners) < len(gone):  # dicts never shrink on delete: rebuild
            self.owners = dict(owners)
        return len(gone)

    def __len__(self) -> int:
        return len(self.owners)
