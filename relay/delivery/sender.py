"""Senders: drain a destination's durable queue, one thread per shard, with remote-write retries.

Its parts: relay.delivery.batch (one batch's send-and-classify loop, SenderSettings, SendResult),
relay.delivery.split (what a thread holds: too-old drops, bodies, 413 splits), this module (the
shard threads, the drain barrier, pause/resume for a change of the shard count).

Each shard is a FIFO read by exactly one thread, so per-series order holds (series are sharded by
hash before the queue) and a slow shard does not hold up the others. A thread batches consecutive
entries of its shard up to ``max_samples_per_send`` (concatenated RW1 payloads are one valid
WriteRequest), waiting at most ``batch_send_deadline`` for a batch to fill, and hands it to
``send_batch``: one retry loop with one deadline. The snappy body is built from the rows as the
queue stores them (relay.queue_codec.concat: compressed rows' elements copied under one header),
not decompressed and compressed again; a batch is decoded only to split it (a 413, or a row over
max_samples_per_send).

Retry classes (DESIGN.md; reference §1, §5, §6):
  2xx                              sent
  5xx, 429, 408, network error     retry: backoff min_backoff doubling to max_backoff, +-20% jitter,
                                   at least Retry-After (seconds or HTTP date; past date = no wait)
  403 whose body says "expired"    call auth_refresh, retry at once (once per batch)
  any other status                 drop the batch, count it as http_<status>
  oldest entry > max_sample_age    drop the batch, count it as too_old (so a 429 for a series
                                   limit cannot make us retry forever)
  413                              split the batch in halves by series and retry each, down to one
                                   series (then drop, counted as http_413)
Backoff sleeps are on an Event, so ``stop()`` interrupts them; an interrupted batch stays queued.
Entries are acked (deleted) once sent or dropped, zero-sample (metadata) entries too, so nothing
rejected stays at a shard's head. ``send_batch`` never raises.

Batches: a batch goes out as soon as it is full (its samples reach max_samples_per_send, or more
is queued than fits), else at batch_send_deadline after its oldest entry came in. No request
carries more than max_samples_per_send samples: an entry larger than that is split by series
(relay.rwsplit) without decoding samples. max_sample_age is measured from the samples' own
timestamps (what the destination rejects as too old), not from when they were queued.

Failures are logged at WARNING at most once a minute per (destination, reason), with the HTTP
body's first line and a count of what was suppressed (relay.ratelog); ``last_success`` and
``last_error`` are plain attributes for the report and the status page. A 2xx (or a final 4xx)
whose RW 2.0 written-count headers say fewer samples were written counts only the rest as failed
(reason ``partial``).

Reload: ``stop()`` returns True only once no request of this sender is in flight and none can
start; a new sender on the same queue (``predecessor``) sends nothing until the old one's threads
are gone, even when one of its requests outlived stop()'s wait, so the same entries are never sent
by both; a new sender
built with ``drain_first=queue.last_id()`` after a ``max_shards`` change first ships every older
entry in id order (the barrier that keeps per-series order).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping

from relay.common.metrics import RelayMetrics
from relay.common.ratelog import RateLimitedLog
from relay.delivery.batch import SenderSettings, SendResult
from relay.delivery.health import ClockWatch, DestinationHealth
from relay.delivery.queue.durable import DurableQueue, Entry
from relay.delivery.send_policy import (
    EXPIRED_MARKERS,
    JITTER,
    RESERVED_HEADERS,
    backoff_delay,
    classify,
    failure_reason,
    first_line,
    parse_retry_after,
    request_headers,
    written_count,
)
from relay.delivery.split import ShippingSender
from relay.delivery.transport import Transport

__all__ = ["EXPIRED_MARKERS", "JITTER", "RESERVED_HEADERS", "SendResult", "Sender", "SenderSettings",
           "backoff_delay", "classify", "failure_reason", "first_line", "parse_retry_after",
           "request_headers", "written_count"]

log = logging.getLogger("relay.sender")

_POLL = 0.2  # how often idle threads look at the stop flag and for new shards
_MAX_ENTRIES = 1000  # entries in one batch at most


class Sender(ShippingSender):
    """Ships one destination's queue. ``start`` is idempotent (safe to call after every reload).

    ``drain_first``: entries with an id up to this one were sharded under another shard count;
    they are shipped first, in id order, before any shard thread starts (the barrier that keeps
    per-series order across a ``max_shards`` change; pass ``queue.last_id()`` taken before the
    new sender is built)."""

    def __init__(
        self,
        name: str,
        url: str,
        queue: DurableQueue,
        transport: Transport,
        settings: SenderSettings,
        metrics: RelayMetrics,
        headers: Mapping[str, str] | None = None,
        auth_refresh: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        user_agent: str = "gpu-relay/0.1.0",
        *,
        sleep: Callable[[float], bool] | None = None,
        rng: random.Random | None = None,
        drain_first: int | None = None,
        log_clock: Callable[[], float] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.queue = queue
        self.transport = transport
        self.settings = settings
        self.metrics = metrics
        self.headers = dict(headers or {})
        self.auth_refresh = auth_refresh
        self.clock = clock
        self.user_agent = user_agent
        self.drain_first = drain_first
        # the stopped sender this one replaces on the same queue: nothing is sent before its threads
        # are gone (a request of it that outlived stop() would otherwise be sent again by us)
        self.predecessor: Sender | None = None
        self.last_success: float | None = None  # unix time of the last 2xx
        self.last_error: tuple[float, str] | None = None  # (unix time, one-line reason)
        self.failures = RateLimitedLog(log, clock=log_clock or clock)
        self._stop = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop.wait
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._gate = threading.Condition()  # guards _in_flight; a request starts only if not stopped
        self._in_flight = 0
        self._supervisor: threading.Thread | None = None
        self._threads: dict[int, threading.Thread] = {}
        # a change of the shard count under way (relay.shardplan): shard threads finish their batch
        # and end, none starts until resume()
        self._paused = False
        self._drain_by_shard = False  # drain_first came from resume(): its entries share one count
        # the shard count to record in the queue file once the drain is done (it says "unknown" until
        # then: a stop or crash in the middle drains again, in id order, at the next start)
        self.record_after_drain: int | None = None
        # what the shard count is planned from (relay.shardplan.SendTotals), under _gate
        self._busy_s = 0.0
        self._sent_samples = 0
        self._failed_posts = 0
        self._posts = 0
        self._since: dict[int, float] = {}  # thread -> when its request in flight began (monotonic)
        # what the status page shows; wall-clock steps (only with the real wall clock, or an injected
        # one with its monotonic twin: a test's fake wall clock alone is no step)
        self.health = DestinationHealth(monotonic or time.monotonic)
        if monotonic is None and clock is time.time:
            monotonic = time.monotonic
        self.watch = None if monotonic is None else ClockWatch(clock, monotonic, self._clock_stepped)
        self._auth_warned = False
        metrics.queue_max_bytes.labels(name).set(queue.max_disk_bytes)
        report = queue.take_damage_report()
        if report is not None:  # logged by the queue at open; counted here, once
            metrics.queue_damaged_total.labels(name).inc()
            if report.lost_samples is not None and report.lost_cause:
                metrics.queue_lost_samples_total.labels(name, report.lost_cause).inc(report.lost_samples)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._supervisor is not None and self._supervisor.is_alive():
                return
            with self._gate:
                self._stop.clear()
            self._supervisor = threading.Thread(
                target=self._supervise, name=f"sender-{self.name}", daemon=True
            )
            self._supervisor.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop all threads; interrupts backoff sleeps. Returns True once no request of this sender
        is in flight and none can start any more (waits for one in flight up to ``timeout``,
        default the request timeout + 1 s); False if one was still in flight then."""
        with self._gate:
            self._stop.set()  # from here on no request starts (checked under _gate)
        limit = self.settings.timeout + 1.0 if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._gate:
            idle = self._gate.wait_for(lambda: self._in_flight == 0, limit)
        with self._lock:
            threads = [t for t in (self._supervisor, *self._threads.values()) if t is not None]
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._threads = {s: t for s, t in self._threads.items() if t.is_alive()}
            if self._supervisor is not None and not self._supervisor.is_alive():
                self._supervisor = None
        if not idle:
            log.warning("%s: a request was still in flight %.0fs after stop", self.name, limit,
                        extra={"destination": self.name, "reason": "stop_timeout"})
        return idle

    @property
    def in_flight(self) -> int:
        with self._gate:
            return self._in_flight

    def finished(self) -> bool:
        """True once no thread of this sender runs (after stop(): nothing it held can be acked later)."""
        with self._lock:
            threads = [t for t in (self._supervisor, *self._threads.values()) if t is not None]
        return not any(t.is_alive() for t in threads)

    # -- a change of the shard count (relay.shardplan) -------------------------------------------
    def totals(self) -> tuple[float, int, int, int]:
        """(seconds spent in requests, samples sent, requests that failed and are retried, requests)
        since the start: what the shard count is planned from."""
        with self._gate:
            return self._busy_s, self._sent_samples, self._failed_posts, self._posts

    def pause(self, timeout: float) -> bool:
        """Let every shard thread ship the batch it holds and end, and start none: nothing of the
        queue is being sent once this returns True. False (nothing paused) while a drain is under
        way, when stopping, or when a thread is still busy after ``timeout`` (a destination in
        backoff): then call :meth:`resume` with None."""
        with self._gate:  # a request in flight for long already (a slow destination, a backoff): not now
            if any(time.monotonic() - t > timeout / 2 for t in self._since.values()):
                return False
        with self._lock:
            if self.drain_first is not None or self._stop.is_set() or self.predecessor is not None:
                return False
            self._paused = True
            threads = list(self._threads.values())
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._threads = {s: t for s, t in self._threads.items() if t.is_alive()}
            return not self._threads

    def resume(self, barrier: int | None, *, by_shard: bool = True, record: int | None = None) -> None:
        """End a pause. ``barrier``: entries up to this id are shipped first, before any shard thread
        starts: ``by_shard``, each shard on a thread of its own (they were all sharded under one
        count: a pause waits for any earlier drain), else in id order. ``record``: the shard count
        to record in the queue file once they are all shipped."""
        with self._lock:
            if barrier is not None and self.drain_first is None:
                self.drain_first = barrier
                self._drain_by_shard = by_shard
                self.record_after_drain = record
            self._paused = False

    def _supervise(self) -> None:
        pred = self.predecessor
        if pred is not None:
            while not pred.finished():
                if self._stop.wait(_POLL):
                    return
            with self._lock:
                self.predecessor = None
        while not self._stop.is_set():
            self._now()  # a wall-clock step is seen even while nothing is sent
            with self._lock:
                paused, barrier, by_shard = self._paused, self.drain_first, self._drain_by_shard
            if paused:
                self._stop.wait(_POLL / 4)
                continue
            if barrier is not None:
                (self._drain_shards if by_shard else self._drain)(barrier)
                continue
            self.metrics.queue_max_bytes.labels(self.name).set(self.queue.max_disk_bytes)  # a reload may resize
            for shard in self.queue.shards():
                with self._lock:
                    if self._paused or self.drain_first is not None:  # (a pause and resume came in between)
                        break
                    t = self._threads.get(shard)
                    if t is None or not t.is_alive():
                        t = threading.Thread(
                            target=self._run_shard, args=(shard,), name=f"sender-{self.name}-{shard}",
                            daemon=True,
                        )
                        self._threads[shard] = t
                        t.start()
            self._stop.wait(_POLL)

    def _drain(self, barrier: int) -> None:
        """Ship every entry with id <= barrier, oldest first across shards, before the shard threads."""
        while not self._stop.is_set():
            try:
                entries = self.queue.peek_upto(barrier, self.settings.max_samples_per_send)
                if not entries:
                    self._drained(barrier)
                    return
                self._ship(entries)
            except Exception as e:
                self._unexpected(-1, e)

    def _drained(self, barrier: int) -> None:
        with self._lock:
            record, self.record_after_drain = self.record_after_drain, None
        if record is not None:
            try:
                self.queue.set_shard_count(record)
            except Exception as e:  # it stays "unknown": the next start drains in id order (safe)
                log.warning("%s: could not record the shard count %d in the queue file: %s", self.name, record,
                            str(e).splitlines()[0] if str(e) else type(e).__name__,
                            extra={"destination": self.name, "reason": "queue"})
        with self._lock:
            if self.drain_first == barrier:
                self.drain_first = None
                self._drain_by_shard = False

    def _drain_shards(self, barrier: int) -> None:
        """``_drain`` for entries that were all sharded under one count (a change of the count while
        running): each shard's entries up to the barrier on a thread of its own, as its shard thread
        would ship them, so a destination that needed more shards is not drained by one."""
        threads = []
        for shard in self.queue.shards():
            t = threading.Thread(target=self._drain_shard, args=(shard, barrier),
                                 name=f"sender-{self.name}-{shard}", daemon=True)
            with self._lock:
                self._threads[shard] = t
            t.start()
            threads.append(t)
        for t in threads:
            while t.is_alive() and not self._stop.is_set():
                t.join(_POLL)
        if not self._stop.is_set():
            self._drained(barrier)

    def _drain_shard(self, shard: int, barrier: int) -> None:
        s = self.settings
        while not self._stop.is_set():
            try:
                entries = self.queue.peek(shard, s.max_samples_per_send, _MAX_ENTRIES, upto=barrier)
                if not entries:
                    return
                self._ship(entries)
            except Exception as e:
                self._unexpected(shard, e)

    # -- one shard -------------------------------------------------------------------------------
    def _run_shard(self, shard: int) -> None:
        s = self.settings
        while not self._stop.is_set() and not self._paused:
            try:
                entries = self.queue.peek(shard, s.max_samples_per_send, _MAX_ENTRIES)
                if not entries:
                    if not self.queue.wait(shard, _POLL) and self.queue.closed:
                        self._stop.wait(_POLL)
                    continue
                while not self._full(shard, entries) and self._more_before_deadline(shard, entries[0]):
                    # new entries came in: add those that fit (the ones we hold are not read again)
                    entries += self.queue.peek(shard, s.max_samples_per_send - sum(e.samples for e in entries),
                                               _MAX_ENTRIES - len(entries), after=entries[-1].id)
                if self._stop.is_set():
                    break
                self._ship(entries)  # (paused meanwhile: what this thread holds goes out first)
            except Exception as e:
                self._unexpected(shard, e)

    def _unexpected(self, shard: int, e: Exception) -> None:
        self.failures.warning((self.name, "internal"), "%s shard %d: unexpected %s: %s; retrying",
                              self.name, shard, type(e).__name__, e,
                              extra={"destination": self.name, "reason": "internal"})
        self._stop.wait(1.0)

    def _full(self, shard: int, entries: list[Entry]) -> bool:
        """Send now: the batch reached max_samples_per_send, or more is queued than fits in it."""
        if sum(e.samples for e in entries) >= self.settings.max_samples_per_send:
            return True
        queued, _ = self.queue.backlog(shard)
        return queued > len(entries)

    def _more_before_deadline(self, shard: int, oldest: Entry) -> bool:
        """Wait, while the oldest entry is younger than batch_send_deadline, until the shard holds
        enough to fill the batch (puts that would not fill it do not wake us). True: new entries are
        queued, read them; False: nothing new by the deadline (or we are stopping), send what we have.
        At the deadline, what came in below the threshold still joins this batch."""
        s = self.settings
        while not self._stop.is_set() and not self._paused:
            remaining = s.batch_send_deadline - (self.clock() - oldest.enqueued_at)
            if remaining <= 0:
                return self.queue.wait(shard, 0)
            if self.queue.wait(shard, min(_POLL, remaining), s.max_samples_per_send, _MAX_ENTRIES):
                return True
            if self.queue.closed:
                return False
        return False
