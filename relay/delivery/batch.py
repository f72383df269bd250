"""One batch of a destination's sender: the send-and-classify loop (relay.delivery.sender).

``send_batch`` POSTs one snappy body with retries under one deadline (the batch's oldest sample
plus max_sample_age) and answers a ``SendResult``; it never raises. What each answer means is
relay.delivery.send_policy's (retry classes, Retry-After, backoff with jitter); here are the loop,
the counters (sent, retried, failed by reason) and the rate-limited failure log (one line a minute
per destination and reason). A 401/403 is held (``on_auth_error: hold``): retried with backoff up
to ``AUTH_MAX_BACKOFF``, credentials refreshed first, bounded only by max_sample_age and the queue.
What the loop meets feeds ``state()`` and ``drops_last_hour()`` (relay.delivery.health), what the
status page shows. ``BatchSender`` declares what the loop uses; Sender sets it all.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from relay.common.metrics import RelayMetrics
from relay.common.ratelog import RateLimitedLog
from relay.delivery.health import ClockWatch, DestinationHealth
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.send_policy import (
    backoff_delay,
    classify,
    failure_reason,
    first_line,
    parse_retry_after,
    request_headers,
    written_count,
)
from relay.delivery.transport import CREDENTIALS_PREFIX, Response, Transport

log = logging.getLogger("relay.sender")
# a clock step is seen by every destination's sender: logged once (the first to see it)
_CLOCK_LOG = RateLimitedLog(log, interval=300.0)


@dataclass(frozen=True)
class SenderSettings:
    max_samples_per_send: int = 1000
    batch_send_deadline: float = 5.0
    min_backoff: float = 0.03
    max_backoff: float = 5.0
    max_sample_age: float = 3600.0
    timeout: float = 30.0
    on_auth_error: Literal["hold", "drop"] = "hold"  # a 401/403: keep the batch queued and retry, or drop it


AUTH_STATUSES = (401, 403)
AUTH_MAX_BACKOFF = 30.0  # a held 401/403 is retried at least this often at the longest (not max_backoff's 5s)
SPLIT_STATUSES = (400, 413)
SPLIT_REASONS = {400: "refused", 413: "too_large"}  # a SendResult's reason: split me and send the halves


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    status: int  # last HTTP status, 0 for a network error
    reason: str  # "sent", "partial", "http_<code>", "too_old", "too_large"/"refused" (split me), "shutdown"
    retried: int  # attempts after the first
    dropped_samples: int  # samples given up on (0 when sent or interrupted)

    @property
    def final(self) -> bool:
        """Sent or given up on: its entries can be acked (False: interrupted, or to be split)."""
        return self.reason not in ("shutdown", *SPLIT_REASONS.values())



class BatchSender:
    """The send loop of one batch; relay.delivery.sender.Sender sets every attribute declared here."""

    name: str
    url: str
    queue: DurableQueue
    transport: Transport
    settings: SenderSettings
    metrics: RelayMetrics
    headers: dict[str, str]
    auth_refresh: Callable[[], None] | None
    clock: Callable[[], float]
    user_agent: str
    last_success: float | None  # unix time of the last 2xx
    last_error: tuple[float, str] | None  # (unix time, one-line reason)
    failures: RateLimitedLog
    _stop: threading.Event
    _sleep: Callable[[float], bool]
    _rng: random.Random
    _gate: threading.Condition  # guards _in_flight; a request starts only if not stopped
    _in_flight: int
    _busy_s: float
    _sent_samples: int
    _failed_posts: int
    _posts: int
    _since: dict[int, float]  # thread -> when its request in flight began (monotonic)
    health: DestinationHealth  # what the status page shows (relay.delivery.health)
    watch: ClockWatch | None  # wall-clock steps (None: an injected wall clock without its monotonic twin)
    _auth_warned: bool  # the WARNING of entering auth_blocked was logged: log the INFO of leaving it

    def send_batch(self, body: bytes, samples: int, oldest: float, *, splittable: bool = False) -> SendResult:
        """POST one snappy-compressed batch with retries; ``oldest`` is the unix time of its oldest
        sample. ``splittable``: a 413 returns reason "too_large", a 400 "refused" (nothing counted)
        for the caller to split."""
        return self._send_batch(body, samples, oldest, lambda _status: splittable)

    def _send_batch(self, body: bytes, samples: int, oldest: float, can_split: Callable[[int], bool],
                    describe: Callable[[], str] | None = None) -> SendResult:
        """send_batch; ``can_split(status)`` is asked only after a 400 or 413 (True: return "refused" or
        "too_large"); ``describe()``: the example series a final 4xx names in its log line."""
        key = threading.get_ident()
        try:
            return self._attempts(body, samples, oldest, can_split, describe, key)
        finally:
            self.health.settled(key)  # (interrupted or answered: not held any more)

    def _attempts(self, body: bytes, samples: int, oldest: float, can_split: Callable[[int], bool],
                  describe: Callable[[], str] | None, key: int) -> SendResult:
        s = self.settings
        dest = self.name
        started = self._now()
        deadline = oldest + s.max_sample_age
        backoff = auth_backoff = s.min_backoff
        hold = s.on_auth_error == "hold"
        attempt = 0
        refreshed = False
        last_status = 0
        while True:
            if self._now() > self._corrected(deadline, started):
                self._log_failure("too_old", f"{dest}: dropping {samples} samples older than max_sample_age "
                                  f"({s.max_sample_age:.0f}s)")
                return self._fail(samples, last_status, "too_old", attempt)
            resp = self._post(body, attempt)
            if resp is None:
                return SendResult(False, last_status, "shutdown", attempt, 0)
            last_status = resp.status
            kind = classify(resp.status, resp.body)
            held = hold and resp.status in AUTH_STATUSES and kind != "ok"
            if not held:
                self._auth_cleared(key, resp.status, retrying=kind == "retry")
            if kind == "ok":
                return self._sent(resp, samples, attempt)
            reason = failure_reason(resp.status, resp.body)
            self.last_error = (self.clock(), f"HTTP {resp.status}: {first_line(resp.body)}"
                               if resp.status else
                               f"{reason} error: {first_line(resp.body.removeprefix(CREDENTIALS_PREFIX))}")
            if resp.status in SPLIT_STATUSES and can_split(resp.status):
                return SendResult(False, resp.status, SPLIT_REASONS[resp.status], attempt, 0)
            if kind == "refresh" and not refreshed and self.auth_refresh is not None:
                refreshed = True
                self._log_failure("expired_token", f"{dest}: HTTP 403 expired token; refreshing credentials "
                                  f"and retrying: {first_line(resp.body)}")
                self._refresh()
                attempt += 1
                self.metrics.samples_retried_total.labels(dest, "expired_token").inc(samples)
                continue
            if held:  # kept in the queue: retried with capped backoff, credentials refreshed first
                self._auth_held(key, resp)
                cap = max(s.max_backoff, AUTH_MAX_BACKOFF)
                delay = backoff_delay(auth_backoff, cap, self._rng.random())
                delay = min(delay, max(0.0, self._corrected(deadline, started) - self._now()) + 0.001)
                if self._sleep(delay):
                    return SendResult(False, resp.status, "shutdown", attempt, 0)
                auth_backoff = min(auth_backoff * 2, cap)
                self._refresh()
                attempt += 1
                self.metrics.samples_retried_total.labels(dest, reason).inc(samples)
                continue
            if kind != "retry":
                return self._rejected(resp, samples, attempt, describe)
            self._log_failure(reason, f"{dest}: {self.last_error[1]}; retrying")
            delay = backoff_delay(backoff, s.max_backoff, self._rng.random())
            retry_after = parse_retry_after(resp.headers.get("retry-after"), self.clock())
            if retry_after is not None:
                delay = max(delay, retry_after)
            delay = min(delay, max(0.0, self._corrected(deadline, started) - self._now()) + 0.001)
            if self._sleep(delay):
                return SendResult(False, resp.status, "shutdown", attempt, 0)
            backoff = min(backoff * 2, s.max_backoff)
            attempt += 1
            self.metrics.samples_retried_total.labels(dest, reason).inc(samples)

    # -- what the status page and the report show (relay.delivery.health) -------------------------
    def state(self) -> str:
        """One of "sending", "retrying", "auth_blocked" (holding after a 401/403), "rejecting"
        (a final 4xx dropped samples in the last 5 minutes); a dry run has no Sender."""
        return self.health.state()

    def drops_last_hour(self) -> dict[str, int]:
        """Samples this sender gave up on by reason in the last hour (http_<code>, too_old, partial,
        malformed); the queue's queue_full drops are the pipeline's counter (relay.control's
        DeliveryWatch adds them up across reloads)."""
        return self.health.drops_last_hour()

    def _clock_stepped(self, step: float) -> None:
        if step > 0:
            text = (f"the wall clock stepped forward by {step:.0f}s (against the monotonic clock); samples "
                    "queued before the step are aged by the time they really waited, so max_sample_age "
                    "does not drop them as too_old")
        else:
            text = (f"the wall clock stepped back by {-step:.0f}s (against the monotonic clock); queued "
                    "samples look younger than they are and are kept longer, up to max_sample_age")
        _CLOCK_LOG.warning(("clock_step", round(step / 60)), "%s", text, extra={"reason": "clock_step"})

    # -- the clock and the credentials -------------------------------------------------------------
    def _now(self) -> float:
        """The wall clock, checked against the monotonic one (a step is logged once)."""
        return self.clock() if self.watch is None else self.watch.check()

    def _corrected(self, t: float, taken_at: float) -> float:
        """``t`` (read at wall time ``taken_at``) moved past every forward clock step since."""
        return t if self.watch is None else self.watch.corrected(t, taken_at)

    def _refresh(self) -> None:
        if self.auth_refresh is None:
            return
        try:
            self.auth_refresh()
        except Exception as e:
            self._log_failure("credentials", f"{self.name}: credential refresh failed: {type(e).__name__}")

    def _auth_held(self, key: int, resp: Response) -> None:
        """A 401/403 held: one WARNING when the destination enters auth_blocked (none per retry)."""
        if self.health.auth_failed(key) and self.failures.warning(
                (self.name, "auth_blocked"),
                "%s: HTTP %d: %s; holding the data in the queue (on_auth_error: hold) and retrying with "
                "backoff up to %.0fs, credentials refreshed first; check the credentials and the "
                "destination's access policy", self.name, resp.status, first_line(resp.body),
                max(self.settings.max_backoff, AUTH_MAX_BACKOFF),
                extra={"destination": self.name, "reason": "auth_blocked"}):
            self._auth_warned = True

    def _auth_cleared(self, key: int, status: int, *, retrying: bool) -> None:
        """An answer that is not a held 401/403: one INFO when that ends the destination's auth_blocked."""
        left = self.health.retrying(key) if retrying else self.health.settled(key)
        if left and self._auth_warned:
            self._auth_warned = False
            log.info("%s: the destination no longer refuses our credentials (HTTP %d); sending what the "
                     "queue held", self.name, status, extra={"destination": self.name, "reason": "auth_cleared"})

    def _sent(self, resp: Response, samples: int, attempt: int) -> SendResult:
        written = written_count(resp.headers)
        ok = samples if written is None else min(samples, written)
        with self._gate:
            self._sent_samples += samples
        self.metrics.samples_sent_total.labels(self.name).inc(ok)
        now = self.clock()
        self.last_success = now
        self.metrics.last_send_success_timestamp_seconds.labels(self.name).set(now)
        if ok < samples:
            self._log_failure("partial", f"{self.name}: HTTP {resp.status} but only {ok} of {samples} "
                              "samples written")
            self.metrics.samples_failed_total.labels(self.name, "partial").inc(samples - ok)
            self.health.dropped("partial", samples - ok)
            return SendResult(True, resp.status, "partial", attempt, samples - ok)
        return SendResult(True, resp.status, "sent", attempt, 0)

    def _rejected(self, resp: Response, samples: int, attempt: int,
                  describe: Callable[[], str] | None = None) -> SendResult:
        """A final 4xx: drop the batch; samples the reply says were written count as sent."""
        reason = failure_reason(resp.status)
        written = min(samples, written_count(resp.headers) or 0)
        if written:
            self.metrics.samples_sent_total.labels(self.name).inc(written)
        example = describe() if describe is not None else ""
        self._log_failure(reason, f"{self.name}: HTTP {resp.status}, dropping {samples - written} samples"
                          f"{f' (e.g. {example})' if example else ''}: {first_line(resp.body)}")
        return self._fail(samples - written, resp.status, reason, attempt, rejected=True)

    def _post(self, body: bytes, attempt: int) -> Response | None:
        """One request; None (nothing sent) once stop() was called."""
        with self._gate:
            if self._stop.is_set():
                return None
            self._in_flight += 1
            self._since[threading.get_ident()] = time.monotonic()
        headers = request_headers(self.headers, self.user_agent, attempt)
        started = time.perf_counter()
        resp: Response | None = None
        try:
            resp = self.transport.post(self.url, body, headers, self.settings.timeout)
        except Exception as e:  # a transport must not raise; treat it as a network error if it does
            resp = Response(0, {}, f"{type(e).__name__}: {e}".encode(errors="replace"))
        finally:
            took = time.perf_counter() - started
            with self._gate:
                self._in_flight -= 1
                self._since.pop(threading.get_ident(), None)
                if resp is not None:
                    self._busy_s += took
                    self._posts += 1
                    self._failed_posts += classify(resp.status, resp.body) == "retry"
                self._gate.notify_all()
        self.metrics.send_duration_seconds.labels(self.name).observe(took)
        return resp

    def _log_failure(self, reason: str, text: str) -> None:
        self.failures.warning((self.name, reason), "%s", text, extra={"destination": self.name, "reason": reason})

    def _fail(self, samples: int, status: int, reason: str, attempt: int, *, rejected: bool = False) -> SendResult:
        """Samples given up on, counted by reason (the caller logged why)."""
        if samples:
            self.metrics.samples_failed_total.labels(self.name, reason).inc(samples)
        self.health.dropped(reason, samples, rejected=rejected)
        return SendResult(False, status, reason, attempt, samples)
