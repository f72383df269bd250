"""RW 1.0 entries to and from bytes: labels, samples, series entries and whole WriteRequests.

What the hot loop (relay.ingest.wire.route) and the stages need to build or read single entries as
protobuf serialises them: ``encode_label_pair``/``encode_labels`` (field-1 Label entries, empty
strings omitted), ``wrap_series`` (a WriteRequest field-1 entry), ``encode_sample`` (the value's bit
pattern kept, so stale-marker NaNs stay exact), ``decode_labels`` (validated: UTF-8, no empty or
duplicate names; WireError(400) otherwise) and ``decode_samples``. ``decode_write_request`` and
``encode_write_request`` handle whole requests for tests and tools; ``split_series`` is the general,
any-field-order split of one TimeSeries with every entry validated (relay.ingest.wire_entries).
``LEN_PREFIX`` holds the varint length prefixes up to 16 KiB, precomputed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from relay.common.labels import Labels
from relay.common.protowire import WireError, encode_int64, encode_uvarint, fields, int64, malformed, uvarint
from relay.ingest.wire_entries import check_exemplar, histogram_timestamp, sample_timestamp

_DOUBLE = struct.Struct("<d")
_ZERO8 = bytes(8)
# Varint length prefixes up to 16 KiB, precomputed: a series entry's prefix is one list lookup.
LEN_PREFIX: list[bytes] = [encode_uvarint(i) for i in range(1 << 14)]


# ---- labels and samples ----------------------------------------------------------------------


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(400, f"invalid UTF-8 in {what}") from None


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def decode_labels(label_key: bytes) -> Labels:
    """Labels of a series from its field-1 Label entries: validated, sorted, empty values removed."""
    names: set[str] = set()
    out: list[tuple[str, str]] = []
    for number, wire_type, _, start, end in fields(label_key, 0, len(label_key)):
        if number != 1 or wire_type != 2:
            raise malformed(f"field {number} in a label set")
        name_raw = value_raw = b""
        for n2, wt2, _, s2, e2 in fields(label_key, start, end):
            if n2 in (1, 2) and wt2 != 2:
                raise malformed(f"Label field {n2} with wire type {wt2}")
            if n2 == 1:
                name_raw = label_key[s2:e2]
            elif n2 == 2:
                value_raw = label_key[s2:e2]
        name = _text(name_raw, "a label name")
        if not name:
            raise WireError(400, "empty label name")
        value = _text(value_raw, f"the value of label {_short(name)}")
        if name in names:
            raise WireError(400, f"duplicate label name {_short(name)}")
        names.add(name)
        if value:
            out.append((name, value))
    out.sort()
    return tuple(out)


def _len_prefix(n: int) -> bytes:
    return LEN_PREFIX[n] if n < 0x4000 else encode_uvarint(n)


def encode_label_pair(name: bytes, value: bytes) -> bytes:
    """One field-1 Label entry as protobuf serialises it (empty strings omitted)."""
    inner = b""
    if name:
        inner = b"\x0a" + _len_prefix(len(name)) + name
    if value:
        inner += b"\x12" + _len_prefix(len(value)) + value
    return b"\x0a" + _len_prefix(len(inner)) + inner


def encode_labels(labels: Labels) -> bytes:
    """Concatenated field-1 Label entries, in the order given (pass sorted labels)."""
    return b"".join([encode_label_pair(n.encode(), v.encode()) for n, v in labels])


def wrap_series(label_bytes: bytes, rest: bytes) -> bytes:
    """One WriteRequest field-1 entry: tag, length, TimeSeries (labels then samples etc.)."""
    return b"\x0a" + _len_prefix(len(label_bytes) + len(rest)) + label_bytes + rest


def encode_sample(timestamp_ms: int, value: float) -> bytes:
    """One TimeSeries field-2 Sample entry; the value's bit pattern is kept as given."""
    bits = _DOUBLE.pack(value)
    inner = b"" if bits == _ZERO8 else b"\x09" + bits
    if timestamp_ms:
        inner += b"\x10" + encode_int64(timestamp_ms)
    return b"\x12" + _len_prefix(len(inner)) + inner


def decode_samples(rest: bytes) -> list[tuple[int, float]]:
    """(timestamp ms, value) of every field-2 Sample entry in ``rest``; other fields are skipped."""
    out: list[tuple[int, float]] = []
    for number, wire_type, _, start, end in fields(rest, 0, len(rest)):
        if number != 2 or wire_type != 2:
            continue
        value, ts = 0.0, 0
        for n2, wt2, _, s2, _e2 in fields(rest, start, end):
            if n2 == 1 and wt2 == 1:
                value = _DOUBLE.unpack_from(rest, s2)[0]
            elif n2 == 2 and wt2 == 0:
                ts = int64(uvarint(rest, s2)[0])
        out.append((ts, value))
    return out


# ---- whole requests (tests and tools) --------------------------------------------------------


def split_series(buf: bytes, start: int, end: int) -> tuple[bytes, bytes, int, int, int, int]:
    """General TimeSeries split, any field order, every entry validated:
    (label key, rest, samples, exemplars, histograms, oldest sample or histogram timestamp or 0).

    Unknown fields stay in ``rest`` so they reach the destination unchanged.
    """
    key: list[bytes] = []
    rest: list[bytes] = []
    ns = ne = nh = 0
    oldest: int | None = None
    for number, wire_type, tag_start, s, stop in fields(buf, start, end):
        if number in (1, 2, 3, 4) and wire_type != 2:
            raise malformed(f"TimeSeries field {number} with wire type {wire_type}")
        if number == 1:
            key.append(buf[tag_start:stop])
            continue
        rest.append(buf[tag_start:stop])
        if number == 3:
            ne += 1
            check_exemplar(buf, s, stop)
            continue
        if number == 2:
            ns += 1
            ts = sample_timestamp(buf, s, stop)
        elif number == 4:
            nh += 1
            ts = histogram_timestamp(buf, s, stop)
        else:
            continue
        if oldest is None or ts < oldest:
            oldest = ts
    return b"".join(key), b"".join(rest), ns, ne, nh, oldest or 0


def decode_write_request(raw: bytes) -> list[tuple[Labels, list[tuple[int, float]]]]:
    """Every series of an RW1 WriteRequest with its samples (histograms and exemplars ignored)."""
    out: list[tuple[Labels, list[tuple[int, float]]]] = []
    for number, wire_type, _, start, end in fields(raw, 0, len(raw)):
        if number == 1 and wire_type == 2:
            key, rest, *_ = split_series(raw, start, end)
            out.append((decode_labels(key), decode_samples(rest)))
    return out


def encode_write_request(
    series: Iterable[tuple[Labels, Sequence[tuple[int, float]]]], metadata: bytes = b""
) -> bytes:
    """RW1 WriteRequest bytes; ``metadata`` is raw, already tag-wrapped field-3 entries."""
    parts = [
        wrap_series(encode_labels(labels), b"".join([encode_sample(ts, v) for ts, v in samples]))
        for labels, samples in series
    ]
    parts.append(metadata)
    return b"".join(parts)
