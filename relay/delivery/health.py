"""What a destination's delivery is doing, in one word, and what it dropped in the last hour; and the
watch that notices a step of the wall clock.

``DestinationHealth`` (one a Sender, shared by its shard threads) is told what each batch met and
answers ``state()``, one of ``STATES``:

  auth_blocked  a shard's batch is held after a 401/403 (``on_auth_error: hold``): nothing is
                dropped for it, the queue keeps filling up to its own bounds
  retrying      a shard's batch waits for a retry (5xx, 429, 408, network error): queueing
  rejecting     the destination refused samples with a final 4xx in the last ``REJECTING_FOR_S``
                (only those were dropped: the rest went out)
  sending       none of these
  dry_run       never from a Sender: a dry-run destination has none (relay.control.overview says so)

in that order of precedence, and ``drops_last_hour()``: samples dropped by reason (``http_400``,
``too_old``, ``queue_full``, ...) in the last hour, by minute buckets on the monotonic clock.
``auth_failed`` and ``settled`` say when the destination enters and leaves ``auth_blocked``, so the
sender logs one WARNING on entering and one INFO on leaving, not one line per retry.

``ClockWatch`` compares the wall clock with the monotonic one at each check: when they disagree by
more than ``STEP_S`` between two checks the wall clock stepped (NTP at boot, a VM resumed, a manual
``date``); that is logged once a step. A forward step is remembered so that ``corrected`` can move a
sample time taken before it forward by the step: max_sample_age then measures how long a sample
really waited, and a forward step does not turn fresh samples into ``too_old``. A backward step
makes samples look younger than they are: they are kept longer, never dropped early (logged too).
Across a restart there is no monotonic reference: a step while the relay was down is not seen.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

STATES = ("sending", "retrying", "auth_blocked", "rejecting", "dry_run")
REJECTING_FOR_S = 300.0  # a final 4xx drop keeps the state "rejecting" this long
WINDOW_S = 3600.0  # drops_last_hour's window
_BUCKET_S = 60.0
STEP_S = 60.0  # wall and monotonic clocks disagreeing by more than this between two checks: a step


class DropWindow:
    """Samples dropped by reason over the last WINDOW_S, in minute buckets. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: deque[tuple[float, dict[str, int]]] = deque()  # (bucket start, reason -> samples)

    def add(self, reason: str, samples: int) -> None:
        if samples <= 0:
            return
        now = self._clock()
        start = now - now % _BUCKET_S
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != start:
                self._buckets.append((start, {}))
                self._expire(now)
            bucket = self._buckets[-1][1]
            bucket[reason] = bucket.get(reason, 0) + samples

    def _expire(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] <= now - WINDOW_S:
            self._buckets.popleft()

    def counts(self) -> dict[str, int]:
        """Reason -> samples dropped in the last hour (to the minute)."""
        with self._lock:
            self._expire(self._clock())
            out: dict[str, int] = {}
            for _, bucket in self._buckets:
                for reason, n in bucket.items():
                    out[reason] = out.get(reason, 0) + n
            return out


class DestinationHealth:
    """Thread-safe; ``key``: whatever names a shard's batch (the sender uses its thread's ident)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._auth: set[Hashable] = set()
        self._retrying: set[Hashable] = set()
        self._rejected_at: float | None = None
        self._drops = DropWindow(clock)

    def auth_failed(self, key: Hashable) -> bool:
        """``key``'s batch is held after a 401/403. True when the destination enters auth_blocked."""
        with self._lock:
            self._retrying.discard(key)
            entered = not self._auth
            self._auth.add(key)
            return entered

    def retrying(self, key: Hashable) -> bool:
        """``key``'s batch waits for a retry. True when that ends the destination's auth_blocked."""
        with self._lock:
            self._retrying.add(key)
            return self._leave_auth(key)

    def settled(self, key: Hashable) -> bool:
        """``key``'s batch has its answer (sent or given up on, or interrupted). True when that ends
        the destination's auth_blocked."""
        with self._lock:
            self._retrying.discard(key)
            return self._leave_auth(key)

    def _leave_auth(self, key: Hashable) -> bool:
        if key not in self._auth:
            return False
        self._auth.discard(key)
        return not self._auth

    def dropped(self, reason: str, samples: int, *, rejected: bool = False) -> None:
        """``samples`` given up on for ``reason``; ``rejected``: a final 4xx of the destination."""
        if rejected:
            with self._lock:
                self._rejected_at = self._clock()
        self._drops.add(reason, samples)

    def drops_last_hour(self) -> dict[str, int]:
        """Samples dropped by reason in the last hour (to the minute)."""
        return self._drops.counts()

    def state(self) -> str:
        """One of STATES (never "dry_run")."""
        with self._lock:
            if self._auth:
                return "auth_blocked"
            if self._retrying:
                return "retrying"
            if self._rejected_at is not None and self._clock() - self._rejected_at < REJECTING_FOR_S:
                return "rejecting"
            return "sending"


class ClockWatch:
    """Wall-clock steps seen as a disagreement with the monotonic clock. Thread-safe."""

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float],
                 on_step: Callable[[float], None], threshold: float = STEP_S) -> None:
        self._wall = wall
        self._mono = monotonic
        self._on_step = on_step
        self._threshold = threshold
        self._lock = threading.Lock()
        self._last = (wall(), monotonic())
        self._steps: list[tuple[float, float]] = []  # (wall time at detection, seconds stepped forward)

    def check(self) -> float:
        """The wall time now, after noting a step since the last check (``on_step(seconds)``, once)."""
        with self._lock:
            w, m = self._wall(), self._mono()
            step = (w - self._last[0]) - (m - self._last[1])
            self._last = (w, m)
            stepped = abs(step) > self._threshold
            if stepped and step > 0:
                self._steps.append((w, step))
                del self._steps[:-64]  # a clock that keeps stepping: the newest are what matter
        if stepped:
            self._on_step(step)
        return w

    def corrected(self, t: float, taken_at: float) -> float:
        """``t`` (a wall time read at wall time ``taken_at``) moved forward by every forward step
        since: what it would read on today's wall clock."""
        with self._lock:
            return t + sum(step for at, step in self._steps if taken_at <= at - step)
