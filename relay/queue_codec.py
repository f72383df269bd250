"""How a queue row stores its payload: raw, or as a snappy block when that is clearly smaller.

SQLite's cost per queued sample is mostly bytes: the WAL write and fsync at commit, the checkpoint
into the database file, the pages an ack frees, the pages a peek reads. Remote-write payloads are
label text that snappy shrinks several times (the relay bench's series: about 8x), so storing them
compressed cuts that cost by about as much, for one snappy call at put and one at peek (the sender
compresses the whole batch again for the wire: snappy blocks cannot be concatenated).

A row's ``raw_len`` column says which: NULL, the payload is the WriteRequest itself (every row of a
file written before the column existed, rows set aside by a salvage, payloads snappy does not
shrink by an eighth); a number, the payload is a snappy block of that many bytes. The queue's
accounting (depth, the max_disk payload bound, queue_full) stays in raw bytes, what the sender
will send, so the bounds are what they were, and the pages on disk are fewer.

Downgrade: a relay from before this format would send a compressed row as it is (the destination
then refuses the batch); drain the queue (stop the ingest, wait for depth 0) before downgrading.
"""

from __future__ import annotations

import snappy

MIN_PACK_BYTES = 256  # below this a snappy call costs more than the bytes it saves


class CodecError(ValueError):
    """A stored payload does not unpack to what its row says (a damaged row)."""


def pack(payload: bytes) -> tuple[bytes, int | None]:
    """(stored bytes, raw_len): compressed with the raw length when that saves an eighth, else the
    payload itself and None."""
    if len(payload) < MIN_PACK_BYTES:
        return payload, None
    z = bytes(snappy.compress(payload))
    if len(z) * 8 > len(payload) * 7:
        return payload, None
    return z, len(payload)


def unpack(stored: bytes, raw_len: int | None) -> bytes:
    """The raw payload of a row; CodecError if it does not decompress to exactly raw_len bytes."""
    if raw_len is None:
        return stored
    try:
        raw = bytes(snappy.uncompress(stored))
    except Exception as e:  # snappy's UncompressError, or whatever a garbage block provokes
        raise CodecError(f"stored payload does not decompress ({type(e).__name__})") from None
    if len(raw) != raw_len:
        raise CodecError(f"stored payload decompresses to {len(raw)} bytes, its row says {raw_len}")
    return raw
