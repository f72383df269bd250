"""The cached exposition and the two probe verdicts read from it.

``liveness_of``: the collection loop completes cycles (a restart is the cure only for a stale loop,
never for lost hardware). ``readiness_of``: also at least one selected GPU up. Both texts name each
down GPU and why: ``OK; gpu 1 (GPU-...) down: RESET_REQUIRED``.
"""

from __future__ import annotations

from dataclasses import dataclass

STALE_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class DownGpu:
    gpu: int
    uuid: str
    reason: str

    def describe(self) -> str:
        return f"gpu {self.gpu} ({self.uuid or 'no UUID'}) down: {self.reason}"


@dataclass(frozen=True, slots=True)
class Exposition:
    """What every scrape serves until the next cycle replaces it."""

    text: bytes
    openmetrics: bytes
    collected_at: float | None  # clock() when the cycle finished; None before the first
    devices_up: int
    devices_total: int
    problem: str  # "" when every GPU answered
    down: tuple[DownGpu, ...] = ()


EMPTY = Exposition(b"", b"# EOF\n", None, 0, 0, "no collection yet")


def _stale(exp: Exposition, now: float, interval_s: float) -> str:
    if exp.collected_at is None:
        return "no collection has finished yet"
    age = now - exp.collected_at
    if age >= STALE_INTERVALS * interval_s:
        return (
            f"collection loop stale: last cycle finished {age:.1f}s ago, "
            f"more than {STALE_INTERVALS} intervals of {interval_s:g}s"
        )
    return ""


def _detail(exp: Exposition) -> str:
    return "".join(f"; {d.describe()}" for d in exp.down)


def liveness_of(
    exp: Exposition, now: float, interval_s: float, started_at: float | None = None
) -> tuple[bool, str]:
    """Liveness: the collection loop completes cycles (the first within 3 intervals of
    ``started_at``). Down GPUs do not fail it (restarting the process cannot fix hardware); they
    are named in the text."""
    if exp.collected_at is None and started_at is not None and now - started_at < STALE_INTERVALS * interval_s:
        return True, "OK; no collection has finished yet"
    stale = _stale(exp, now, interval_s)
    if stale:
        return False, stale + _detail(exp)
    return True, "OK" + _detail(exp)


def readiness_of(exp: Exposition, now: float, interval_s: float) -> tuple[bool, str]:
    """Readiness: the loop is live and at least one selected GPU is up (or none is selected)."""
    stale = _stale(exp, now, interval_s)
    if stale:
        return False, stale + _detail(exp)
    if exp.devices_total > 0 and exp.devices_up == 0:
        return False, "no GPU is up" + _detail(exp)
    return True, "OK" + _detail(exp)
