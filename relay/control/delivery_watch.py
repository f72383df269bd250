"""What each destination's delivery did lately, from the self-metrics: samples/s sent, drops by reason
in the last hour, and one rate-limited WARNING while its queue is full.

``DeliveryWatch`` lives as long as the Runtime (one across reloads, keyed by destination name, as
the counters are), so nothing it shows starts again at a reload. ``tick`` (the Runtime's background
loop, every second) samples the counters ``gpu_relay_samples_sent_total``,
``gpu_relay_samples_dropped_total`` and ``gpu_relay_samples_failed_total``; ``sent_rate`` is the
sent samples over the last ``RATE_WINDOW_S`` (what actually left, not what the rules kept),
``drops_last_hour`` the increase of each drop reason over the last hour (minute points; since the
start when that is less than an hour ago). A ``queue_full`` increase logs a WARNING on the
``relay.service`` logger, at most one a minute per destination, with the count since the last line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from relay.common.metrics import RelayMetrics
from relay.common.ratelog import RateLimitedLog

log = logging.getLogger("relay.service")

RATE_WINDOW_S = 60.0
HOUR_S = 3600.0
_POINT_S = 60.0  # the drop history keeps one point a minute


def reason_totals(rm: RelayMetrics, name: str) -> dict[str, float]:
    """Samples dropped or given up on for ``name``, by reason, since the start (both counters)."""
    out: dict[str, float] = {}
    for metric in (rm.samples_dropped_total, rm.samples_failed_total):
        for family in metric.collect():
            for s in family.samples:
                if s.name.endswith("_total") and s.labels.get("destination") == name:
                    reason = s.labels.get("reason", "")
                    out[reason] = out.get(reason, 0.0) + s.value
    return out


def sent_total(rm: RelayMetrics, name: str) -> float:
    total = 0.0
    for family in rm.samples_sent_total.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.labels.get("destination") == name:
                total += s.value
    return total


class _History:
    __slots__ = ("drops", "last_full", "sent")

    def __init__(self, now: float, sent: float, drops: dict[str, float]) -> None:
        self.sent: deque[tuple[float, float]] = deque([(now, sent)])
        self.drops: deque[tuple[float, dict[str, float]]] = deque([(now, drops)])
        self.last_full = drops.get("queue_full", 0.0)


class DeliveryWatch:
    """Thread-safe; ``clock`` is monotonic (seconds)."""

    def __init__(self, rm: RelayMetrics, clock: Callable[[], float] = time.monotonic,
                 ratelog: RateLimitedLog | None = None) -> None:
        self.rm = rm
        self.clock = clock
        self._log = ratelog or RateLimitedLog(log, clock=clock)
        self._lock = threading.Lock()
        self._hist: dict[str, _History] = {}

    def tick(self, names: Iterable[str], max_disk: Callable[[str], int | None] = lambda _: None) -> None:
        """Sample every destination's counters; forget the ones no longer configured."""
        now = self.clock()
        names = list(names)
        for name in names:
            sent, drops = sent_total(self.rm, name), reason_totals(self.rm, name)
            with self._lock:
                h = self._hist.get(name)
                if h is None:  # counted from zero: drops before the first tick are in the hour too
                    h = self._hist[name] = _History(now, 0.0, {})
                h.sent.append((now, sent))
                while len(h.sent) > 2 and h.sent[1][0] <= now - RATE_WINDOW_S:
                    h.sent.popleft()
                if now - h.drops[-1][0] >= _POINT_S:
                    h.drops.append((now, drops))
                while len(h.drops) > 2 and h.drops[1][0] <= now - HOUR_S:
                    h.drops.popleft()
                full = drops.get("queue_full", 0.0)
                new_full, h.last_full = full - h.last_full, full
            if new_full > 0:
                limit = max_disk(name)
                self._log.warning(("queue_full", name),
                                  "destination %s: queue full%s: dropped the %d oldest queued samples to make "
                                  "room (the destination does not keep up, or is down for longer than the "
                                  "queue holds)", name, "" if limit is None else f" (max_disk {limit} bytes)",
                                  new_full, extra={"destination": name, "reason": "queue_full"})
        with self._lock:
            for gone in set(self._hist) - set(names):
                del self._hist[gone]

    def sent_rate(self, name: str) -> float:
        """Samples sent per second over the last ``RATE_WINDOW_S`` (0 before two ticks)."""
        with self._lock:
            h = self._hist.get(name)
            if h is None or len(h.sent) < 2:
                return 0.0
            (t0, s0), (t1, s1) = h.sent[0], h.sent[-1]
        return max(0.0, s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def drops_last_hour(self, name: str) -> dict[str, int]:
        """Samples dropped in the last hour by reason (only reasons with drops), largest first."""
        current = reason_totals(self.rm, name)
        with self._lock:
            h = self._hist.get(name)
            base = h.drops[0][1] if h is not None else {}
        diff = {r: round(v - base.get(r, 0.0)) for r, v in current.items()}
        return dict(sorted(((r, n) for r, n in diff.items() if n > 0), key=lambda x: (-x[1], x[0])))
