"""Senders: drain a destination's durable queue, one thread per shard, with remote-write retries.

Each shard is a FIFO read by exactly one thread, so per-series order holds (series are sharded by
hash before the queue) and a slow shard does not hold up the others. A thread batches consecutive
entries of its shard up to ``max_samples_per_send`` (concatenated RW1 payloads are one valid
WriteRequest), waiting at most ``batch_send_deadline`` for a batch to fill, snappy-compresses it,
and hands it to ``send_batch``: one retry loop with one deadline.

Retry classes (DESIGN.md; reference §1, §5, §6):
  2xx                              sent
  5xx, 429, 408, network error     retry: backoff min_backoff doubling to max_backoff, +-20% jitter,
                                   at least Retry-After (seconds or HTTP date; past date = no wait)
  403 whose body says "expired"    call auth_refresh, retry at once (once per batch)
  any other status                 drop the batch, count it as http_<status>
  oldest entry > max_sample_age    drop the batch, count it as too_old (so a 429 for a series
                                   limit cannot make us retry forever)
Backoff sleeps are on an Event, so ``stop()`` interrupts them; an interrupted batch stays queued.
Entries are acked (deleted) once sent or dropped. ``send_batch`` never raises.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import snappy

from relay.metrics import RelayMetrics
from relay.queue import DurableQueue, Entry
from relay.transport import Response, Transport

log = logging.getLogger(__name__)

REMOTE_WRITE_VERSION = "0.1.0"
RESERVED_HEADERS = frozenset(
    {"content-encoding", "content-type", "user-agent", "x-prometheus-remote-write-version", "retry-attempt"}
)
EXPIRED_MARKERS = ("expired", "expiredtoken")  # body checked lower-cased
JITTER = 0.2
_POLL = 0.2  # how often idle threads look at the stop flag and for new shards


@dataclass(frozen=True)
class SenderSettings:
    max_samples_per_send: int = 1000
    batch_send_deadline: float = 5.0
    min_backoff: float = 0.03
    max_backoff: float = 5.0
    max_sample_age: float = 3600.0
    timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    status: int  # last HTTP status, 0 for a network error
    reason: str  # "sent", "http_<code>", "too_old", "shutdown"
    retried: int  # attempts after the first
    dropped_samples: int  # samples given up on (0 when sent or interrupted)


def classify(status: int, body: bytes) -> str:
    """'ok', 'retry', 'refresh' (403 expired token) or 'drop'."""
    if 200 <= status < 300:
        return "ok"
    if status == 0 or status >= 500 or status in (408, 429):
        return "retry"
    if status == 403 and any(m in body.decode("utf-8", "replace").lower() for m in EXPIRED_MARKERS):
        return "refresh"
    return "drop"


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date); None if absent or bad."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def backoff_delay(backoff: float, max_backoff: float, rnd: float) -> float:
    """``backoff`` with +-JITTER jitter (rnd in [0, 1)), capped at max_backoff."""
    return min(max_backoff, backoff * (1.0 - JITTER + 2 * JITTER * rnd))


def request_headers(user: Mapping[str, str] | None, user_agent: str, attempt: int) -> dict[str, str]:
    """User headers, then the reserved remote-write headers that users may not override."""
    out = {k: v for k, v in (user or {}).items() if k.lower() not in RESERVED_HEADERS}
    out["Content-Encoding"] = "snappy"
    out["Content-Type"] = "application/x-protobuf"
    out["User-Agent"] = user_agent
    out["X-Prometheus-Remote-Write-Version"] = REMOTE_WRITE_VERSION
    if attempt > 0:
        out["Retry-Attempt"] = str(attempt)
    return out


class Sender:
    """Ships one destination's queue. ``start`` is idempotent (safe to call after every reload)."""

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
        self._stop = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop.wait
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None
        self._threads: dict[int, threading.Thread] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._supervisor is not None and self._supervisor.is_alive():
                return
            self._stop.clear()
            self._supervisor = threading.Thread(
                target=self._supervise, name=f"sender-{self.name}", daemon=True
            )
            self._supervisor.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop all threads; interrupts backoff sleeps. A request in flight finishes (or times out)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = [t for t in (self._supervisor, *self._threads.values()) if t is not None]
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._threads = {s: t for s, t in self._threads.items() if t.is_alive()}
            if self._supervisor is not None and not self._supervisor.is_alive():
                self._supervisor = None

    def _supervise(self) -> None:
        while not self._stop.is_set():
            for shard in self.queue.shards():
                with self._lock:
                    t = self._threads.get(shard)
                    if t is None or not t.is_alive():
                        t = threading.Thread(
                            target=self._run_shard, args=(shard,), name=f"sender-{self.name}-{shard}",
                            daemon=True,
                        )
                        self._threads[shard] = t
                        t.start()
            self._stop.wait(_POLL)

    # -- one shard -------------------------------------------------------------------------------
    def _run_shard(self, shard: int) -> None:
        s = self.settings
        while not self._stop.is_set():
            try:
                entries = self.queue.peek(shard, s.max_samples_per_send)
                if not entries:
                    if not self.queue.wait(shard, _POLL) and self.queue.closed:
                        self._stop.wait(_POLL)
                    continue
                samples = sum(e.samples for e in entries)
                if samples < s.max_samples_per_send and self._more_before_deadline(shard, entries[0]):
                    continue  # new entries came in: peek again for a fuller batch
                if self._stop.is_set():
                    break
                self._ship(entries)
            except Exception:
                log.exception("sender %s shard %d: unexpected error; retrying", self.name, shard)
                self._stop.wait(1.0)

    def _more_before_deadline(self, shard: int, oldest: Entry) -> bool:
        """Wait for more entries while the oldest is younger than batch_send_deadline. True: more came;
        False: the deadline passed (or we are stopping), send what we have."""
        while not self._stop.is_set():
            remaining = self.settings.batch_send_deadline - (self.clock() - oldest.enqueued_at)
            if remaining <= 0:
                return False
            if self.queue.wait(shard, min(_POLL, remaining)):
                return True
            if self.queue.closed:
                return False
        return False

    def _ship(self, entries: list[Entry]) -> None:
        body = snappy.compress(b"".join(e.payload for e in entries))
        samples = sum(e.samples for e in entries)
        result = self.send_batch(body, samples, entries[0].enqueued_at)
        if result.ok or result.dropped_samples:
            self.queue.ack([e.id for e in entries])

    # -- one batch -------------------------------------------------------------------------------
    def send_batch(self, body: bytes, samples: int, oldest: float) -> SendResult:
        """POST one snappy-compressed batch with retries; ``oldest`` is when its oldest entry came in."""
        s = self.settings
        dest = self.name
        deadline = oldest + s.max_sample_age
        backoff = s.min_backoff
        attempt = 0
        refreshed = False
        last_status = 0
        while True:
            if self.clock() > deadline:
                log.warning("%s: dropping %d samples older than max_sample_age", dest, samples)
                return self._fail(samples, last_status, "too_old", attempt)
            resp = self._post(body, attempt)
            last_status = resp.status
            kind = classify(resp.status, resp.body)
            if kind == "ok":
                self.metrics.samples_sent_total.labels(dest).inc(samples)
                return SendResult(True, resp.status, "sent", attempt, 0)
            if kind == "refresh" and not refreshed and self.auth_refresh is not None:
                refreshed = True
                log.warning("%s: 403 expired token; refreshing credentials and retrying", dest)
                try:
                    self.auth_refresh()
                except Exception as e:
                    log.warning("%s: credential refresh failed: %s", dest, type(e).__name__)
                attempt += 1
                self.metrics.samples_retried_total.labels(dest).inc(samples)
                continue
            if kind != "retry":
                log.warning("%s: HTTP %d, dropping %d samples: %s", dest, resp.status, samples,
                            _snippet(resp))
                return self._fail(samples, resp.status, f"http_{resp.status}", attempt)
            delay = backoff_delay(backoff, s.max_backoff, self._rng.random())
            retry_after = parse_retry_after(resp.headers.get("retry-after"), self.clock())
            if retry_after is not None:
                delay = max(delay, retry_after)
            delay = min(delay, max(0.0, deadline - self.clock()) + 0.001)
            log.debug("%s: HTTP %d (%s); retry %d in %.3fs", dest, resp.status, _snippet(resp),
                      attempt + 1, delay)
            if self._sleep(delay):
                return SendResult(False, resp.status, "shutdown", attempt, 0)
            backoff = min(backoff * 2, s.max_backoff)
            attempt += 1
            self.metrics.samples_retried_total.labels(dest).inc(samples)

    def _post(self, body: bytes, attempt: int) -> Response:
        headers = request_headers(self.headers, self.user_agent, attempt)
        started = time.perf_counter()
        try:
            resp = self.transport.post(self.url, body, headers, self.settings.timeout)
        except Exception as e:  # a transport must not raise; treat it as a network error if it does
            resp = Response(0, {}, f"{type(e).__name__}: {e}".encode(errors="replace"))
        self.metrics.send_duration_seconds.labels(self.name).observe(time.perf_counter() - started)
        return resp

    def _fail(self, samples: int, status: int, reason: str, attempt: int) -> SendResult:
        self.metrics.samples_failed_total.labels(self.name, reason).inc(samples)
        return SendResult(False, status, reason, attempt, samples)


def _snippet(resp: Response) -> str:
    return resp.body[:200].decode("utf-8", "replace").strip().replace("\n", " ")
