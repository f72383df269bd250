"""Protobuf wire-format primitives for the hand-written remote-write codecs.

Only what ``relay.wire`` and ``relay.wire_v2`` need: varints, tags, skipping a field of any
wire type, and ``WireError``, the one error every codec raises. Reference: the protobuf
encoding guide (varint = 0, I64 = 1, LEN = 2, I32 = 5; groups 3/4 are rejected).
"""

from __future__ import annotations

import struct

_U64 = (1 << 64) - 1
MAX_FIELD_NUMBER = (1 << 29) - 1  # protobuf's parsers refuse larger ones; gogo reads them as negative
_DOUBLE = struct.Struct("<d")


class WireError(ValueError):
    """A request that can never succeed: ``status`` is the HTTP code, the message one line."""

    def __init__(self, status: int, message: str) -> None:
        one_line = " ".join(message.split())
        super().__init__(one_line)
        self.status = status
        self.message = one_line


def malformed(what: str) -> WireError:
    return WireError(400, f"malformed protobuf: {what}")


def uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned varint at ``pos``; at most 10 bytes."""
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise malformed("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result > _U64:
                raise malformed("varint overflows 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise malformed("varint longer than 10 bytes")


def int64(value: int) -> int:
    """A varint read as protobuf int64 (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_uvarint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_int64(value: int) -> bytes:
    return encode_uvarint(value & _U64)


def encode_len(field: int, payload: bytes) -> bytes:
    """One LEN field: tag, length, payload."""
    n = len(payload)
    if field < 16 and n < 0x80:
        return bytes((field << 3 | 2, n)) + payload
    return encode_uvarint(field << 3 | 2) + encode_uvarint(n) + payload


def read_len(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, end) of the LEN payload whose length varint is at ``pos``; must fit before ``end``."""
    ln, pos = uvarint(buf, pos)
    stop = pos + ln
    if stop > end:
        raise malformed("length past the end of the message")
    return pos, stop


def skip_value(buf: bytes, pos: int, wire_type: int, end: int) -> int:
    """Position after the value of a field of ``wire_type`` starting at ``pos``."""
    if wire_type == 0:
        _, pos = uvarint(buf, pos)
    elif wire_type == 1:
        pos += 8
    elif wire_type == 2:
        return read_len(buf, pos, end)[1]
    elif wire_type == 5:
        pos += 4
    else:
        raise malformed(f"unsupported wire type {wire_type}")
    if pos > end:
        raise malformed("field past the end of the message")
    return pos


def fields(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """Every field in ``buf[start:end]`` as (field number, wire type, tag start, value start, end).

    For LEN fields, value start/end bound the payload; for others they bound the raw value bytes.
    """
    out: list[tuple[int, int, int, int, int]] = []
    pos = start
    while pos < end:
        tag_start = pos
        tag, pos = uvarint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0 or number > MAX_FIELD_NUMBER:
            raise malformed(f"field number {number}")
        if wire_type == 2:
            vstart, pos = read_len(buf, pos, end)
        else:
            vstart = pos
            pos = skip_value(buf, pos, wire_type, end)
        out.append((number, wire_type, tag_start, vstart, pos))
    if pos != end:
        raise malformed("field past the end of the message")
    return out


def double(buf: bytes, pos: int) -> float:
    return float(_DOUBLE.unpack_from(buf, pos)[0])
