"""Shipping what a shard's thread holds (relay.delivery.sender): too-old entries dropped, the rows
concatenated into one body (or decoded and cut to max_samples_per_send), each body sent, and a
413 answered by sending each half again, down to one series. Entries are acked once every part is
sent or given up on; a part interrupted by stop() leaves them queued.
"""

from __future__ import annotations

import snappy

from relay.common.protowire import WireError
from relay.delivery.batch import BatchSender, SendResult
from relay.delivery.queue import codec as queue_codec
from relay.delivery.queue.durable import Entry
from relay.ingest import rwsplit


class ShippingSender(BatchSender):
    def _ship(self, entries: list[Entry]) -> None:
        """Send entries (split to max_samples_per_send) and ack them once each part is sent or given
        up on; too-old entries are dropped (and acked) without sending."""
        s = self.settings
        cutoff = self.clock() - s.max_sample_age
        stale = [e for e in entries if e.oldest_time < cutoff]
        fresh = [e for e in entries if e.oldest_time >= cutoff]
        if stale:
            self._fail(sum(e.samples for e in stale), 0, "too_old", 0)
            self.queue.ack([e.id for e in stale])
        if not fresh:
            return
        samples = sum(e.samples for e in fresh)
        oldest = min(e.oldest_time for e in fresh)
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
        """send_batch of a snappy body; on a 413 send each half again, down to one series. Only then
        is the body decoded and its halves computed (walking every series of every batch just in
        case cost more than the rest of the send)."""
        split: list[tuple[rwsplit.Unit, rwsplit.Unit] | None] = []

        def can_split() -> bool:
            try:
                split.append(rwsplit.halves(bytes(snappy.uncompress(body))))
            except WireError:
                split.append(None)
            return split[-1] is not None

        result = self._send_batch(body, samples, oldest, can_split)
        halves = split[-1] if split else None
        if result.reason != "too_large" or halves is None:
            return result
        self._log_failure("http_413", f"{self.name}: HTTP 413 for {samples} samples; splitting the batch")
        for half, n in halves:
            r = self._send_splitting(snappy.compress(half), n, oldest)
            if not r.final:
                return r
        return SendResult(True, 413, "split", result.retried, 0)
