"""Shipping what a shard's thread holds (relay.delivery.sender): too-old entries dropped (and
logged), the rows concatenated into one body (or decoded and cut to max_samples_per_send), each
body sent, and a 400 or a 413 answered by sending each half again, down to the series the
destination refuses: only those are dropped. Entries are acked once every part is sent or given
up on; a part interrupted by stop() leaves them queued.
"""

from __future__ import annotations

import snappy

from relay.common import labels
from relay.common.protowire import WireError
from relay.delivery.batch import SPLIT_REASONS, BatchSender, SendResult
from relay.delivery.queue import codec as queue_codec
from relay.delivery.queue.durable import Entry
from relay.ingest import rwsplit
from relay.ingest.wire_codec import decode_write_request

# requests a batch's 400 splits may make beyond 2*ceil(log2(series)) (what isolating one refused
# series costs): room for about five refused series in a batch of 500; past it, what is left
# unsplit is dropped whole (and counted)
SPLIT_EXTRA_REQUESTS = 64


def split_budget(series: int) -> int:
    """Requests the 400 splits of a batch of ``series`` series may make."""
    return 2 * max(0, series - 1).bit_length() + SPLIT_EXTRA_REQUESTS


def example_series(raw: bytes) -> str:
    """The first series of a WriteRequest, for a log line (empty when there is none)."""
    try:
        found = decode_write_request(raw)
    except WireError:
        return ""
    return labels.canonical(found[0][0])[:300] if found else ""


class ShippingSender(BatchSender):
    def _ship(self, entries: list[Entry]) -> None:
        """Send entries (split to max_samples_per_send) and ack them once each part is sent or given
        up on; too-old entries are dropped (and acked) without sending. An entry's age is measured
        from its oldest sample as the wall clock reads now, moved past any forward step of the clock
        since the entry was queued (relay.delivery.health.ClockWatch)."""
        s = self.settings
        now = self._now()
        cutoff = now - s.max_sample_age
        oldest_of = {e.id: self._corrected(e.oldest_time, e.enqueued_at) for e in entries}
        stale = [e for e in entries if oldest_of[e.id] < cutoff]
        fresh = [e for e in entries if oldest_of[e.id] >= cutoff]
        if stale:
            n = sum(e.samples for e in stale)
            if n:
                self._log_failure("too_old", f"{self.name}: dropping {n} queued samples older than "
                                  f"max_sample_age ({s.max_sample_age:.0f}s; the oldest "
                                  f"{now - min(oldest_of[e.id] for e in stale):.0f}s old)")
            self._fail(n, 0, "too_old", 0)
            self.queue.ack([e.id for e in stale])
        if not fresh:
            return
        samples = sum(e.samples for e in fresh)
        oldest = min(oldest_of[e.id] for e in fresh)
        try:
            if samples <= s.max_samples_per_send:  # the rows as stored, under one snappy header
                bodies = [(queue_codec.concat([(e.stored, e.raw_len) for e in fresh]), samples)]
            else:  # a row too large for one request: decoded and split by series
                parts = rwsplit.chunks(b"".join(e.payload for e in fresh), s.max_samples_per_send)
                bodies = [(snappy.compress(part), n) for part, n in parts]
        except (WireError, queue_codec.CodecError) as e:
            self._log_failure("malformed", f"{self.name}: dropping {samples} queued samples that do "
                              f"not parse as a WriteRequest: {e}")
            self._fail(samples, 0, "malformed", 0)
            self.queue.ack([e.id for e in fresh])
            return
        for body, n in bodies:
            if not self._send_splitting(body, n, oldest).final:
                return  # stopping: the entries stay queued (parts already sent are resent: harmless)
        self.queue.ack([e.id for e in fresh])

    def _send_splitting(self, body: bytes, samples: int, oldest: float) -> SendResult:
        """send_batch of a snappy body; on a 400 or a 413 send each half again, down to the series the
        destination refuses, which alone are dropped (counted as http_<code>, one rate-limited
        WARNING naming an example). A 413 halves until the parts fit (at most 2n-2 requests for n
        series); a 400's halving is bounded by ``split_budget`` requests a batch, past which what is
        left is dropped whole. Only after such an answer is the body decoded (walking every series of
        every batch just in case cost more than the rest of the send)."""
        return self._send_part(body, samples, oldest, [-1])

    def _send_part(self, body: bytes, samples: int, oldest: float, budget: list[int]) -> SendResult:
        """``budget[0]``: requests the batch's 400 splits may still make (-1: no 400 yet)."""
        split: list[tuple[rwsplit.Unit, rwsplit.Unit] | None] = []
        raw: list[bytes] = []

        def decoded() -> bytes:
            if not raw:
                raw.append(bytes(snappy.uncompress(body)))
            return raw[0]

        def can_split(status: int) -> bool:
            try:
                halves = rwsplit.halves(decoded())
            except (WireError, snappy.UncompressError):
                halves = None
            if halves is not None and status == 400:
                if budget[0] < 0:
                    budget[0] = split_budget(len(rwsplit.units(decoded())))
                if budget[0] < 2:
                    halves = None  # the budget is spent: this part is dropped whole
                else:
                    budget[0] -= 2
            split.append(halves)
            return halves is not None

        def describe() -> str:
            try:
                return example_series(decoded())
            except snappy.UncompressError:
                return ""

        result = self._send_batch(body, samples, oldest, can_split, describe)
        halves = split[-1] if split else None
        if result.reason not in SPLIT_REASONS.values() or halves is None:
            return result
        self._log_failure(f"split_{result.status}", f"{self.name}: HTTP {result.status} for {samples} samples; "
                          "splitting the batch to send what the destination accepts")
        for half, n in halves:
            r = self._send_part(snappy.compress(half), n, oldest, budget)
            if not r.final:
                return r
        return SendResult(True, result.status, "split", result.retried, 0)
