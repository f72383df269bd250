"""How a queue row stores its payload: raw, or as a snappy block when that is clearly smaller.

SQLite's cost per queued sample is mostly bytes: the WAL write and fsync at commit, the checkpoint
into the database file, the pages an ack frees, the pages a peek reads. Remote-write payloads are
label text that snappy shrinks several times (the relay bench's series: about 8x), so storing them
compressed cuts that cost by about as much, for one snappy call at put: the sender sends the
stored blocks as they are (``concat`` below), so that call is the wire's compression too.

A row's ``raw_len`` column says which: NULL, the payload is the WriteRequest itself (every row of a
file written before the column existed, rows set aside by a salvage, payloads snappy does not
shrink by an eighth); a number, the payload is a snappy block of that many bytes. The queue's
accounting (depth, the max_disk payload bound, queue_full) stays in raw bytes, what the sender
will send, so the bounds are what they were, and the pages on disk are fewer.

The sender does not decompress rows to send them (``concat``). A snappy block is the varint of
its uncompressed length, then literal and copy elements; a copy's offset counts back from the
current output position and never reaches before the block's own start. So the element streams of
several blocks, one after the other under one new varint of the summed lengths, decode to the
blocks' contents concatenated: each block's copies stay within its own output. Raw rows join as
literal elements; a run of consecutive raw rows of MIN_PACK_BYTES or more is compressed once,
together, where that is smaller (small rows stored raw would otherwise go out several times larger
than before). The outgoing body is so built by copying stored bytes; only a 413 or an oversized
row makes the sender decode.

Integrity: SQLite has no checksums, and a sender that does not decompress would no longer notice a
damaged block. ``checksum`` (CRC-32 of the stored bytes and the raw length, about 8x cheaper than
decompressing them) is written at put in the ``crc`` column and checked at peek; rows without one
(written before it existed) are still decompressed and checked the old way.

Downgrade: a relay from before this format would send a compressed row as it is (the destination
then refuses the batch); drain the queue (stop the ingest, wait for depth 0) before downgrading.
A relay from before ``crc`` reads these files as they are (it ignores the column).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable

import snappy

from relay import native

_csnappy = native.load("csnappy")
# zlib.crc32's twin that keeps the GIL (zlib's hands it off for every row over 5 KiB)
_crc32: Callable[[bytes, int], int] = _csnappy.crc32 if _csnappy is not None else zlib.crc32


def py_compress(data: bytes) -> bytes:
    """A raw snappy block of ``data``: python-snappy's (cramjam), the reference and the fallback."""
    return bytes(snappy.compress(data))


def _c_compress(data: bytes) -> bytes:
    """relay.native._csnappy's block (the GIL held, no buffer conversions; the same size within a few
    bytes); a block it declines (past 2^32 - 1 bytes) is the reference's to refuse."""
    z: bytes | None = _csnappy.compress(data)  # type: ignore[union-attr]
    return py_compress(data) if z is None else z


compress: Callable[[bytes], bytes] = _c_compress if _csnappy is not None else py_compress

MIN_PACK_BYTES = 256  # below this a snappy call costs more than the bytes it saves
MAX_BLOCK_BYTES = 0xFFFF_FFFF  # the format's uncompressed length is at most 2^32 - 1


class CodecError(ValueError):
    """A stored payload does not unpack to what its row says (a damaged row)."""


def pack(payload: bytes, block: bytes | None = None) -> tuple[bytes, int | None]:
    """(stored bytes, raw_len): compressed with the raw length when that saves an eighth, else the
    payload itself and None. ``block``: a raw snappy block the caller KNOWS decodes to exactly
    ``payload`` (the request body it came in as, already decompressed to it): stored as it is,
    without compressing again, when its length header is the canonical varint (``concat`` reads
    only that) and it saves an eighth; else ignored."""
    if len(payload) < MIN_PACK_BYTES:
        return payload, None
    if block is not None and len(block) * 8 <= len(payload) * 7 and block.startswith(varint(len(payload))):
        return block, len(payload)
    z = compress(payload)
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


def checksum(stored: bytes, raw_len: int | None) -> int:
    """CRC-32 of a row's stored bytes and its raw_len (a damaged raw_len changes the body too), as a
    signed 32-bit number (SQLite stores that in 4 bytes, an unsigned one above 2^31 in 6). CodecError
    for a raw_len no put writes (negative, or past 64 bits: a damaged row)."""
    if raw_len is not None and not 0 <= raw_len < 1 << 64:
        raise CodecError(f"stored raw_len {raw_len} is out of range")
    crc = _crc32(b"" if raw_len is None else raw_len.to_bytes(8, "little"), _crc32(stored, 0))
    return crc - (1 << 32) if crc >= 1 << 31 else crc


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _header(stored: bytes) -> tuple[int, int]:
    """(uncompressed length, where the elements start) of a snappy block; CodecError if none."""
    n = shift = 0
    for i in range(min(5, len(stored))):
        c = stored[i]
        n |= (c & 0x7F) << shift
        if c < 0x80:
            return n, i + 1
        shift += 7
    raise CodecError("stored block has no length header")


def literal(data: bytes) -> bytes:
    """``data`` as one literal element: the tag (length - 1 in its top 6 bits up to 60 bytes, else
    60..63 for 1..4 little-endian length bytes after it), then the bytes."""
    n = len(data) - 1
    if n < 0 or n > MAX_BLOCK_BYTES - 1:
        raise CodecError(f"a literal holds 1 to 2^32 - 1 bytes, not {len(data)}")
    if n < 60:
        return bytes((n << 2,)) + data
    size = (n.bit_length() + 7) // 8
    return bytes(((59 + size) << 2,)) + n.to_bytes(size, "little") + data


def _raw_run(run: list[bytes], n: int) -> bytes:
    """Raw rows as elements: compressed together when that is long enough to pay and smaller."""
    data = b"".join(run)
    if n >= MIN_PACK_BYTES:
        z = compress(data)
        _, start = _header(z)
        if len(z) - start < n:
            return z[start:]
    return literal(data)


def concat(rows: Iterable[tuple[bytes, int | None]]) -> bytes:
    """One snappy block of the rows' contents, in order, from their stored form ``(stored, raw_len)``
    (raw_len None: the row is raw) without decompressing any: compressed rows' elements are copied
    as they are under one header of the summed lengths. CodecError if a compressed row's header is
    not its raw_len, or the total exceeds the format's 2^32 - 1 bytes."""
    parts: list[bytes | memoryview] = [b""]
    total = 0
    run: list[bytes] = []
    run_n = 0
    for stored, raw_len in rows:
        if raw_len is None:
            if stored:
                run.append(stored)
                run_n += len(stored)
            continue
        n, start = _header(stored)
        if n != raw_len:
            raise CodecError(f"stored block says {n} bytes, its row says {raw_len}")
        if run:
            parts.append(_raw_run(run, run_n))
            total += run_n
            run, run_n = [], 0
        parts.append(memoryview(stored)[start:])
        total += n
    total += run_n
    if total > MAX_BLOCK_BYTES:
        raise CodecError(f"a batch of {total} bytes is over snappy's 4 GiB block")
    if run:
        parts.append(_raw_run(run, run_n))
    parts[0] = varint(total)
    return b"".join(parts)
