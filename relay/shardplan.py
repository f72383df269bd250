"""How many shards a destination's sender runs: between queue.min_shards and queue.max_shards.

Prometheus's remote write does the same (``min_shards``, ``max_shards``), and so does this with its
formula: every ``UPDATE_S`` the shards needed are the time a sample takes to send (the seconds spent
in requests over the samples they carried) times the samples to send per second (what came in, plus
``BACKLOG_CATCHUP`` of the backlog, so that a backlog is caught up). Within ``TOLERANCE`` of the
running count nothing changes, so the count does not flap; nothing changes either while requests
fail (more connections to a failing destination do not help it) or while nothing was sent although
samples wait. An idle destination goes back to its fewest.

Why not always max_shards: each shard is a share of every request. A request's series go to
``shards`` queue rows (one per shard with series in it), each a row to compress, commit, read back
and acknowledge, and each shard a connection of its own to the destination with batches that
fill ``shards`` times more slowly. Issue 9's pass-through job costs about a sixth less CPU per
sample on one shard than on four (bench/README.md). A destination that needs more gets more, in
``UPDATE_S``.

A change keeps per-series order (relay.service.Runtime._reshard): the sender's shard threads ship
the batches they hold and stop; the pipeline shards new requests under the new count; once every
request routed under the old count is written, everything queued up to then is shipped first, in
id order (the sender's drain), and only then do the new shard threads start. The queue records the
count as unknown during the change, so a crash in the middle is followed by the same drain at the
next start.

``desired`` and ``Planner`` are pure (the clock and the totals are passed in); ``change`` carries a
change out on a running destination.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relay.destinations import Destination
    from relay.pipeline import Pipeline

log = logging.getLogger(__name__)

UPDATE_S = 10.0  # Prometheus's shardUpdateDuration
PAUSE_S = 5.0  # how long a change waits for the shard threads to ship what they hold (else: not now)
WRITTEN_S = 30.0  # how long it waits for requests routed under the old count to be written
TOLERANCE = 0.3  # Prometheus's shardToleranceFraction: no change within +-30% of the running count
BACKLOG_CATCHUP = 0.05  # of the backlog, per second, on top of what comes in (Prometheus's 5%)


@dataclass(frozen=True, slots=True)
class SendTotals:
    """A sender's running totals and its queue's backlog at one moment."""

    at: float  # seconds (a monotonic clock)
    busy_s: float  # seconds spent in requests, all shards together
    sent: int  # samples in requests that succeeded
    failed: int  # requests that did not succeed
    backlog: int  # samples queued


def desired(current: int, lo: int, hi: int, before: SendTotals, now: SendTotals) -> tuple[int, float | None]:
    """(the shard count to run, the shards the formula asked for or None where it did not apply),
    between ``lo`` and ``hi``, from the totals at the start and at the end of an interval."""
    lo, hi = max(1, lo), max(1, lo, hi)
    current = min(max(current, lo), hi)
    if lo == hi:
        return lo, None
    dt = now.at - before.at
    sent = now.sent - before.sent
    if dt <= 0 or now.failed != before.failed:
        return current, None  # failing: more connections will not help it
    if sent <= 0:
        return (lo if now.backlog == 0 else current), None  # idle: the fewest; stalled: as it is
    per_sample = max(0.0, now.busy_s - before.busy_s) / sent
    rate_in = max(0.0, sent + now.backlog - before.backlog) / dt
    want = per_sample * (rate_in + BACKLOG_CATCHUP * now.backlog)
    if current * (1 - TOLERANCE) <= want <= current * (1 + TOLERANCE):
        return current, want
    return min(max(math.ceil(want), lo), hi), want


class Planner:
    """The last totals seen per destination; ``plan`` answers a new count at most every ``UPDATE_S``."""

    def __init__(self, update_s: float = UPDATE_S) -> None:
        self.update_s = update_s
        self._last: dict[str, SendTotals] = {}

    def plan(self, name: str, current: int, lo: int, hi: int, now: SendTotals) -> tuple[int, float | None] | None:
        """None: too soon since the last plan for ``name`` (the first call only remembers ``now``)."""
        before = self._last.get(name)
        if before is not None and now.at - before.at < self.update_s:
            return None
        self._last[name] = now
        if before is None:
            return None
        return desired(current, lo, hi, before, now)

    def forget(self, name: str) -> None:
        """Start over for ``name`` (its sender was replaced, or its count just changed)."""
        self._last.pop(name, None)


def change(pipeline: Pipeline, dest: Destination, shards: int, *, pause_s: float = PAUSE_S,
           written_s: float = WRITTEN_S) -> bool:
    """Run ``dest`` on ``shards`` shards, keeping per-series order (the module text says how).
    False, with nothing changed, when its sender cannot pause now (a batch in backoff, a drain or a
    stop under way). The caller holds off reloads meanwhile."""
    sender, queue = dest.sender, dest.queue
    if sender is None or queue is None or shards == dest.shards:
        return False
    if not sender.pause(pause_s):
        sender.resume(None)
        return False
    try:
        queue.set_shard_count(0)  # unknown until the barrier is known: a crash meanwhile drains at start
        mark = pipeline.set_shards(dest.config.name, shards)
        old, dest.shards = dest.shards, shards
        if not pipeline.wait_written(mark, written_s):
            log.warning("destination %s: a request routed under %d shards was still being written after "
                        "%.0fs; per-series order across the change to %d is not guaranteed for it",
                        dest.config.name, old, written_s, shards,
                        extra={"destination": dest.config.name, "reason": "reshard_timeout"})
        queue.set_shard_count(shards)
    finally:
        # entries up to the newest one go out first, in id order, then the new shard threads start
        # (after a failure above too: an unknown count is drained the same way)
        sender.resume(queue.last_id())
    return True
