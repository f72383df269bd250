"""One job's progress over time: advances, resets, step times and its learned stall threshold.

Contract: :class:`JobTracker` is pure state. The clock is passed in (``now``, unix seconds, never
going backwards: an earlier ``now`` is read as the latest one seen), memory is bounded (the last
``window`` step intervals), nothing here raises on a valid :class:`~jobwatch.progress.Report`.

**Advance.** When a report has a step, only the step counts: it advanced when it is above the last
one; a report without a step after steps were seen changes no step state. A job whose source gives
only a ratio (no step ever) advances when the ratio rises. A ``lastUpdatedTime`` that moves while
the step does not never moves :attr:`JobTracker.last_advance`.

**When.** An advance is dated by the trainer's own clock for ``trainjob_status`` and ``push``
(``lastUpdatedTime``, which moves only when a step ends), clamped to ``[last_advance, now]``; for
``rhoai_annotation`` (the controller's poll time) by ``now``. So after a watcher restart an
upstream job that has been stuck for hours shows it at once; an RHOAI job starts its clock now,
which delays a stall alert and never invents one.

**Reset.** The step (or, ratio-only, the ratio) went backwards: a restart or a resume from a
checkpoint. It counts in :attr:`resets_total`, starts the 30-minute start-up floor again, and dates
``last_advance`` at the reset (the stall clock restarts with the new run; a crash loop shows in
:attr:`resets_without_progress`). Steps up to the highest one seen are then counted in
:attr:`redone_steps_total` as they are computed again (a crash before catching up counts only
what was redone). :attr:`resets_without_progress` is zeroed when the highest step (ratio) rises.

**Step time.** Between two advances, gap / steps advanced is one step time; the gap itself is a
pause the job recovered from. The first interval after a start or reset is warm-up (compilation,
the first batches): it counts as a step time (it can only make the threshold longer, and a job of
20-minute steps needs its first one learned before the 15-minute floor applies) but never as a
recovered pause. :attr:`step_duration_seconds` is the median of the last ``window`` step times.
A ratio-only job uses the median gap between advances in its place.

**Threshold** (:meth:`JobTracker.threshold_seconds`), the issue's rule: the longest of
10 x the step time, 1.5 x the longest recovered pause, and 15 minutes; at most 2 hours; at least
30 minutes during the first 30 minutes after a start (the first report seen, or ``started_at``) or a
reset; an override (the ``gpu-telemetry.io/stall-after`` annotation) replaces all of it.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median

from jobwatch.progress import Report

FLOOR_SECONDS = 15 * 60.0
CAP_SECONDS = 2 * 3600.0
STARTUP_SECONDS = 30 * 60.0
STEP_FACTOR = 10.0
PAUSE_FACTOR = 1.5
WINDOW = 64
CRASH_LOOP_RESETS = 3  # GPUJobNoProgressAcrossRestarts: this many resets without the highest step moving

_TRAINER_CLOCK = {"trainjob_status", "push"}


class JobTracker:
    """Progress state of one job; feed it every valid report with :meth:`observe`."""

    def __init__(self, started_at: float | None = None, window: int = WINDOW) -> None:
        self._started = started_at
        self._now = -math.inf
        self._step: int | None = None
        self._highest: int | None = None
        self._ratio: float | None = None
        self._highest_ratio: float | None = None
        self._ratio_only = True  # until a report with a step arrives
        self._total: int | None = None
        self._eta: float | None = None
        self._epoch: float | None = None
        self._source: str | None = None
        self._source_time: float | None = None
        self._last_report: float | None = None
        self._last_advance: float | None = None
        self._warm = True
        self._durations: deque[float] = deque(maxlen=window)
        self._gaps: deque[float] = deque(maxlen=window)
        self._longest_pause = 0.0
        self._resets = 0
        self._redone = 0
        self._resets_np = 0
        self._redo_upto: int | None = None
        self._bad = 0
        self._bad_reason: str | None = None

    # ---- input

    def observe(self, report: Report, now: float) -> list[str]:
        """Take one report; returns event names: first, advance, reset, stale, no_step, empty, crash_loop."""
        now = max(now, self._now)
        self._now = now
        if self._started is None:
            self._started = now
        at = report.reported_at
        last = self._source_time if report.source == self._source else None
        if at is not None and last is not None and at < last:
            return ["stale"]  # older than one already taken from the same source
        if report.source != self._source:
            self._source_time = None
        self._source = report.source
        if at is not None:
            self._source_time = at
        self._last_report = at if at is not None else now
        self._total, self._eta, self._epoch = report.total_steps, report.eta_seconds, report.epoch
        prev_ratio, self._ratio = self._ratio, report.ratio
        when = now
        if report.source in _TRAINER_CLOCK and at is not None:
            when = min(at, now)
        if self._last_advance is not None:
            when = max(when, self._last_advance)
        if report.step is not None:
            self._ratio_only = False
            events = self._on_step(report.step, when, now)
        elif not self._ratio_only:
            return ["no_step"]
        elif report.ratio is not None:
            events = self._on_ratio(report.ratio, prev_ratio, when, now)
        else:
            return ["empty"]
        if "reset" in events and self._resets_np == CRASH_LOOP_RESETS:
            events.append("crash_loop")
        return events

    def _advance(self, gap: float, steps: int | None) -> None:
        self._gaps.append(gap)
        if steps:
            self._durations.append(gap / steps)
        if not self._warm:
            self._longest_pause = max(self._longest_pause, gap)
        self._warm = False

    def _reset(self, when: float, now: float) -> list[str]:
        self._resets += 1
        self._resets_np += 1
        self._started = now
        self._warm = True
        self._last_advance = when
        return ["reset"]

    def _on_step(self, step: int, when: float, now: float) -> list[str]:
        prev = self._step
        if prev is None or self._last_advance is None:
            self._step = step
            self._highest = step if self._highest is None else max(self._highest, step)
            self._last_advance = when
            self._warm = True
            return ["first"]
        if step == prev:
            return []
        self._step = step
        if step < prev:
            self._redo_upto = self._highest
            return self._reset(when, now)
        self._advance(when - self._last_advance, step - prev)
        if self._redo_upto is not None:
            self._redone += max(0, min(step, self._redo_upto) - prev)
            if step >= self._redo_upto:
                self._redo_upto = None
        if self._highest is None or step > self._highest:
            self._highest = step
            self._resets_np = 0
        self._last_advance = when
        return ["advance"]

    def _on_ratio(self, ratio: float, prev: float | None, when: float, now: float) -> list[str]:
        if prev is None or self._last_advance is None:
            self._highest_ratio = ratio if self._highest_ratio is None else max(self._highest_ratio, ratio)
            self._last_advance = when
            self._warm = True
            return ["first"]
        if ratio == prev:
            return []
        if ratio < prev:
            return self._reset(when, now)
        self._advance(when - self._last_advance, None)
        if self._highest_ratio is None or ratio > self._highest_ratio:
            self._highest_ratio = ratio
            self._resets_np = 0
        self._last_advance = when
        return ["advance"]

    def note_bad(self, reason: str) -> bool:
        """Count a report that failed to parse; True only for the job's first one (log that one)."""
        self._bad += 1
        self._bad_reason = reason
        return self._bad == 1

    # ---- output

    def threshold_seconds(self, now: float, override: float | None = None) -> float:
        """Seconds without an advance after which the job counts as stalled (module docstring)."""
        if override is not None:
            return override
        unit = self.advance_interval_seconds if self._ratio_only else self.step_duration_seconds
        t = max(FLOOR_SECONDS, STEP_FACTOR * (unit or 0.0), PAUSE_FACTOR * self._longest_pause)
        t = min(t, CAP_SECONDS)
        if self._started is None or max(now, self._now) - self._started < STARTUP_SECONDS:
            t = max(t, STARTUP_SECONDS)
        return t

    @property
    def step(self) -> int | None:
        return self._step

    @property
    def highest_step(self) -> int | None:
        return self._highest

    @property
    def total_steps(self) -> int | None:
        return self._total

    @property
    def ratio(self) -> float | None:
        return self._ratio

    @property
    def eta_seconds(self) -> float | None:
        return self._eta

    @property
    def epoch(self) -> float | None:
        return self._epoch

    @property
    def source(self) -> str | None:
        return self._source

    @property
    def last_report(self) -> float | None:
        """The latest report's ``lastUpdatedTime`` as the source said it, else when it was observed."""
        return self._last_report

    @property
    def last_advance(self) -> float | None:
        """When the step (ratio) last rose, or a reset began; None before the first progress."""
        return self._last_advance

    @property
    def started_at(self) -> float | None:
        """The start (the first report seen, or ``started_at``) or the latest reset."""
        return self._started

    @property
    def step_duration_seconds(self) -> float | None:
        return median(self._durations) if self._durations else None

    @property
    def advance_interval_seconds(self) -> float | None:
        """Median seconds between recent advances (warm-up excluded)."""
        return median(self._gaps) if self._gaps else None

    @property
    def longest_recovered_pause_seconds(self) -> float:
        return self._longest_pause

    @property
    def resets_total(self) -> int:
        return self._resets

    @property
    def redone_steps_total(self) -> int:
        return self._redone

    @property
    def resets_without_progress(self) -> int:
        return self._resets_np

    @property
    def bad_reports_total(self) -> int:
        return self._bad

    @property
    def last_bad_reason(self) -> str | None:
        return self._bad_reason
