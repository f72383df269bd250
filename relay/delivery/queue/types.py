"""The queue's value types and errors (re-exported by relay.delivery.queue.durable, where callers
import them), and a put waiting in the group commit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay.delivery.queue import codec as queue_codec

Piece = tuple[int, bytes, int, int]  # (shard, RW1 WriteRequest bytes, samples, oldest sample ts ms or 0)

ENTRY_OVERHEAD_BYTES = 64  # row header, index entry and page slack per entry, for the payload bound



class QueueError(ValueError):
    """A queue problem; carries the offending value."""

    def __init__(self, message: str, value: object) -> None:
        super().__init__(f"{message}: {value!r}")
        self.value = value


class RequestTooLargeError(QueueError):
    """The pieces of one put alone exceed max_disk: the service answers 413."""


class StorageError(QueueError):
    """The write could not be made durable (disk full, I/O error): the service answers 503."""


class QueueOpenError(QueueError):
    """The queue file cannot be opened at all; the message names the destination and what to do."""


@dataclass(frozen=True, slots=True)
class Entry:
    """A queued row as stored: ``stored`` is the WriteRequest itself (``raw_len`` None) or a snappy
    block of ``raw_len`` bytes (relay.queue_codec), already checked against its checksum. The sender
    concatenates stored forms (queue_codec.concat); ``payload`` decodes, for what must look inside."""

    id: int
    shard: int
    stored: bytes
    samples: int
    enqueued_at: float
    oldest_ts_ms: int = 0
    raw_len: int | None = None

    @property
    def payload(self) -> bytes:
        """The entry's WriteRequest bytes (decompressed on each call when it is stored compressed)."""
        return self.stored if self.raw_len is None else queue_codec.unpack(self.stored, self.raw_len)

    @property
    def oldest_time(self) -> float:
        """Unix time of the entry's oldest sample (its enqueue time when it has none)."""
        return self.oldest_ts_ms / 1000.0 if self.oldest_ts_ms != 0 else self.enqueued_at


def check_pieces(pieces: Sequence[Sequence[object]]) -> list[Piece]:
    """Validated copies; a 3-tuple (before oldest_ts_ms existed) gets 0. A negative oldest_ts_ms is a
    real (pre-1970) timestamp, too old for any max_sample_age; 0 means the piece has no sample."""
    out: list[Piece] = []
    for p in pieces:
        shard, payload, samples = p[0], p[1], p[2]
        oldest = p[3] if len(p) > 3 else 0
        if (not isinstance(shard, int) or not isinstance(samples, int) or not isinstance(oldest, int)
                or shard < 0 or samples < 0
                or not isinstance(payload, bytes | bytearray | memoryview)):
            raise QueueError("bad queue piece (shard, payload, samples, oldest_ts_ms)",
                             (shard, type(payload), samples, oldest))
        out.append((shard, bytes(payload), samples, oldest))
    return out


class PendingPut:
    """One put waiting in the group commit (relay.delivery.queue.commit): its rows packed by the
    putting thread before it joins, and what the leader's commit answers it."""

    __slots__ = ("done", "dropped", "error", "rows")

    def __init__(self, pieces: list[Piece], blocks: Sequence[bytes | None] | None = None) -> None:
        # (shard, stored payload, raw_len or None, crc, raw size, samples, oldest_ts_ms)
        self.rows = [(shard, *_packed(payload, block), samples, oldest) for (shard, payload, samples, oldest), block
                     in zip(pieces, blocks or (None,) * len(pieces), strict=True)]
        self.done = False
        self.dropped = 0
        self.error: BaseException | None = None


def _packed(payload: bytes, block: bytes | None = None) -> tuple[bytes, int | None, int, int]:
    stored, raw_len = queue_codec.pack(payload, block)
    return stored, raw_len, queue_codec.checksum(stored, raw_len), len(payload)
