"""How many shards a destination's sender runs: between queue.min_shards and queue.max_shards.

Prometheus's remote write does the same (``min_shards``, ``max_shards``), and so does this with its
formula: every ``UPDATE_S`` the shards needed are the time a sample takes to send (the seconds spent
in requests over the samples they carried) times the samples to send per second (what came in, plus
``BACKLOG_CATCHUP`` of the backlog, so that a backlog is caught up), both rates smoothed over the
intervals (``EWMA_WEIGHT``). Within ``TOLERANCE`` of the running count nothing changes, so the count
does not flap; nothing changes either while requests are retried (more connections to a failing
destination do not help it), while requests are too slow to pause for, or while nothing was sent
although samples wait. An idle destination goes back to its fewest, as its smoothed rate decays.

Why not always max_shards: each shard is a share of every request. A request's series go to
``shards`` queue rows (one per shard with series in it), each a row to compress, commit, read back
and acknowledge, and each shard a connection of its own to the destination with batches that
fill ``shards`` times more slowly; on one shard a request a destination takes whole is queued as
the snappy block it came in as (Pipeline.ingest). bench/relay_bench.py measures the default beside
4 fixed shards. A destination that needs more gets more, within a few ``UPDATE_S``.

A change (``change``, run by relay.service.Runtime._plan_shards) keeps per-series order: the
sender's shard threads ship the batches they hold and stop; new requests wait at the pipeline's
door while those already routed are written (Pipeline.hold_writes), the pipeline switches to the
new count and the newest id is the barrier; then requests go on under the new count. Everything
up to the barrier (all of it sharded under the old count) is shipped first, each old shard on a
thread of its own, and only then do the new shard threads start. The queue file says "unknown"
from the start of a change until that drain is done, so a stop or crash in the middle is followed
by a drain in id order at the next start.

``desired`` and ``Planner`` are pure (the clock and the totals are passed in); ``change`` carries a
change out on a running destination. A scale-up takes effect on what comes in after it: what was
queued before is drained by the old count's shards first.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relay.control.destinations import Destination
    from relay.state.pipeline import Pipeline

log = logging.getLogger("relay.shardplan")

UPDATE_S = 10.0  # Prometheus's shardUpdateDuration
TOLERANCE = 0.3  # Prometheus's shardToleranceFraction: no change within +-30% of the running count
BACKLOG_CATCHUP = 0.05  # of the backlog, per second, on top of what comes in (Prometheus's 5%)
EWMA_WEIGHT = 0.2  # Prometheus's ewmaWeight: rates are smoothed over intervals, so bursts do not flap
PAUSE_S = 5.0  # how long a change waits for the shard threads to ship what they hold (else: not now)
MAX_REQUEST_S = PAUSE_S / 2  # requests slower than this on average: a change would stall; none is tried
WRITTEN_S = 2.0  # how long new requests may wait for those in progress to be written (else: not now)


@dataclass(frozen=True, slots=True)
class SendTotals:
    """A sender's running totals and its queue's backlog at one moment."""

    at: float  # seconds (a monotonic clock)
    busy_s: float  # seconds spent in requests, all shards together
    sent: int  # samples in requests that succeeded
    failed: int  # requests that failed and are retried (5xx, 429, 408, network)
    posts: int  # requests
    backlog: int  # samples queued


def desired(current: int, lo: int, hi: int, want: float) -> int:
    """The shard count to run for ``want`` shards' worth of sending: ``current`` within
    ``TOLERANCE`` of it, else ``want`` rounded up; between ``lo`` and ``hi``."""
    lo, hi = max(1, lo), max(1, lo, hi)
    current = min(max(current, lo), hi)
    if current * (1 - TOLERANCE) <= want <= current * (1 + TOLERANCE):
        return current
    return min(max(math.ceil(want), lo), hi)


@dataclass(slots=True)
class _Rates:
    last: SendTotals
    per_sample: float | None = None  # smoothed seconds of request a sample takes
    rate_in: float | None = None  # smoothed samples a second to send
    backlog: float | None = None  # smoothed samples queued (a scrape's burst or none, by the moment)


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + EWMA_WEIGHT * (new - old)


class Planner:
    """Per destination: the totals last seen and the smoothed rates; ``plan`` answers at most once
    every ``update_s``."""

    def __init__(self, update_s: float = UPDATE_S) -> None:
        self.update_s = update_s
        self._state: dict[str, _Rates] = {}

    def plan(self, name: str, current: int, lo: int, hi: int, now: SendTotals) -> tuple[int, float | None] | None:
        """(the shard count to run, the shards sending needs or None where nothing was planned), or
        None: too soon since the last plan for ``name`` (the first call only remembers ``now``).
        Nothing changes while requests are retried (more connections do not help a failing
        destination), while requests take over ``MAX_REQUEST_S`` on average, or while nothing was
        sent although samples wait."""
        st = self._state.get(name)
        if st is None:
            self._state[name] = _Rates(now)
            return None
        before = st.last
        dt = now.at - before.at
        if dt < self.update_s:
            return None
        st.last = now
        lo, hi = max(1, lo), max(1, lo, hi)
        current = min(max(current, lo), hi)
        sent, posts = now.sent - before.sent, now.posts - before.posts
        busy = max(0.0, now.busy_s - before.busy_s)
        if lo == hi:
            return lo, None
        if now.failed != before.failed or (posts > 0 and busy / posts > MAX_REQUEST_S):
            return current, None
        if sent <= 0 and now.backlog > 0:
            return current, None  # stalled: as it is
        if sent > 0:
            st.per_sample = _ewma(st.per_sample, busy / sent)
        st.rate_in = _ewma(st.rate_in, max(0, sent + now.backlog - before.backlog) / dt)
        st.backlog = _ewma(st.backlog, now.backlog)
        want = (st.per_sample or 0.0) * (st.rate_in + BACKLOG_CATCHUP * st.backlog)
        return desired(current, lo, hi, want), want

    def forget(self, name: str) -> None:
        """Start over for ``name`` (a change was not possible now: measure again before retrying)."""
        self._state.pop(name, None)


def change(pipeline: Pipeline, dest: Destination, shards: int, *, pause_s: float = PAUSE_S,
           written_s: float = WRITTEN_S) -> bool:
    """Run ``dest`` on ``shards`` shards, keeping per-series order (the module text says how).
    False, with nothing changed, when its sender cannot pause now (a batch in flight for longer than
    ``pause_s``, a drain or a stop under way). The caller holds off reloads meanwhile."""
    sender, queue = dest.sender, dest.queue
    if sender is None or queue is None or shards == dest.shards:
        return False
    if not sender.pause(pause_s):
        sender.resume(None)
        return False
    barrier: int | None = None
    old = dest.shards
    try:
        queue.set_shard_count(0)  # unknown until the drain is done: a stop or crash before it drains at start
        with pipeline.hold_writes(written_s) as written:
            if written:
                pipeline.set_shards(dest.config.name, shards)
                dest.shards = shards
                # every entry up to here was sharded under the old count; none of the new is queued yet
                barrier = queue.last_id()
        if not written:  # a write still in progress: every request waited; give up for now
            queue.set_shard_count(old)
            sender.resume(None)
            return False
    except BaseException:
        # entries up to the newest one drain in id order (the count in the file stays unknown)
        sender.resume(queue.last_id(), by_shard=False)
        raise
    # what the old count sharded goes out first, each old shard on its own; the new count is
    # recorded once that is done (relay.sender)
    sender.resume(barrier, record=shards)
    return True
