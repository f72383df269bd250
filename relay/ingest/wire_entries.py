"""Checks of the remote-write 1.0 entries that ``wire.route`` copies through as bytes.

route() never decodes a request into objects, so nothing else would notice a Sample, Exemplar,
Histogram or MetricMetadata entry that a receiver cannot parse; one such entry makes the receiver
refuse the whole batch, with other requests' samples in it. Each checker raises WireError(400) for
an entry protobuf's parser refuses, for a known field with the wrong wire type (gogo-protobuf, which
Prometheus and Cortex use, refuses those), and for a histogram whose spans and buckets disagree
(Prometheus' appender refuses those). Unknown fields are allowed, as protobuf allows them. Field
numbers: /work/shared/reference/remote-write-and-relays.md section 1.
"""

from __future__ import annotations

from relay.common.protowire import WireError, fields, int64, malformed, uvarint

# Histogram field -> its wire type; repeated scalars may also come packed (wire type 2).
_HISTOGRAM_WIRE_TYPES = {1: 0, 2: 1, 3: 1, 4: 0, 5: 1, 6: 0, 7: 1, 8: 2, 9: 0, 10: 1, 11: 2, 12: 0, 13: 1,
                         14: 0, 15: 0, 16: 1}
_PACKED_VARINTS = (9, 12)  # negative_deltas, positive_deltas (sint64)
_PACKED_DOUBLES = (10, 13, 16)  # negative_counts, positive_counts, custom_values
_METADATA_STRINGS = (2, 4, 5)  # metric_family_name, help, unit


def _wrong_type(message: str, number: int, wire_type: int) -> WireError:
    return malformed(f"{message} field {number} with wire type {wire_type}")


def _utf8(buf: bytes, start: int, end: int, what: str) -> None:
    try:
        buf[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(400, f"invalid UTF-8 in {what}") from None


def sample_timestamp(buf: bytes, start: int, end: int) -> int:
    """Timestamp (ms) of the Sample payload ``buf[start:end]``, which must parse as one."""
    ts = 0
    for number, wire_type, _, s, _e in fields(buf, start, end):
        if number == 1:
            if wire_type != 1:
                raise _wrong_type("Sample", 1, wire_type)
        elif number == 2:
            if wire_type != 0:
                raise _wrong_type("Sample", 2, wire_type)
            ts = uvarint(buf, s)[0]
    return int64(ts)


def check_label(buf: bytes, start: int, end: int, what: str) -> None:
    """A Label payload: name and value are strings (valid UTF-8); emptiness is the caller's rule."""
    for number, wire_type, _, s, e in fields(buf, start, end):
        if number in (1, 2):
            if wire_type != 2:
                raise _wrong_type("Label", number, wire_type)
            _utf8(buf, s, e, f"{what} label {'name' if number == 1 else 'value'}")


def check_exemplar(buf: bytes, start: int, end: int) -> None:
    for number, wire_type, _, s, e in fields(buf, start, end):
        if number == 1:
            if wire_type != 2:
                raise _wrong_type("Exemplar", 1, wire_type)
            check_label(buf, s, e, "an exemplar")
        elif number == 2 and wire_type != 1:
            raise _wrong_type("Exemplar", 2, wire_type)
        elif number == 3 and wire_type != 0:
            raise _wrong_type("Exemplar", 3, wire_type)


def check_metadata(buf: bytes, start: int, end: int) -> None:
    for number, wire_type, _, s, e in fields(buf, start, end):
        if number == 1:
            if wire_type != 0:
                raise _wrong_type("MetricMetadata", 1, wire_type)
        elif number in _METADATA_STRINGS:
            if wire_type != 2:
                raise _wrong_type("MetricMetadata", number, wire_type)
            _utf8(buf, s, e, f"MetricMetadata field {number}")


def _span_length(buf: bytes, start: int, end: int, index: int) -> int:
    """Length of a BucketSpan; after the first span of a sign, offsets must not be negative."""
    offset = length = 0
    for number, wire_type, _, s, _e in fields(buf, start, end):
        if number in (1, 2):
            if wire_type != 0:
                raise _wrong_type("BucketSpan", number, wire_type)
            value = uvarint(buf, s)[0]
            if number == 1:
                offset = (value >> 1) ^ -(value & 1)  # sint32 zigzag
            else:
                length = value & 0xFFFFFFFF
    if index and offset < 0:
        raise malformed(f"Histogram span {index} has a negative offset {offset}")
    return length


def _packed_varints(buf: bytes, start: int, end: int) -> int:
    if start < end and buf[end - 1] >= 0x80:
        raise malformed("truncated varint at the end of a Histogram packed field")
    count = 0
    pos = start
    while pos < end:
        pos = uvarint(buf, pos)[1]
        count += 1
    if pos != end:
        raise malformed("Histogram packed varints past the end of their field")
    return count


def histogram_timestamp(buf: bytes, start: int, end: int) -> int:
    """Timestamp (ms) of the Histogram payload ``buf[start:end]``, which must parse as one and whose
    spans must give as many buckets as it has deltas (integer histogram) or counts (float)."""
    ts = 0
    is_float = False
    span_buckets = [0, 0]  # negative, positive
    spans_seen = [0, 0]
    deltas = [0, 0]
    counts = [0, 0]
    for number, wire_type, _, s, e in fields(buf, start, end):
        expected = _HISTOGRAM_WIRE_TYPES.get(number)
        if expected is None:
            continue  # an unknown field
        positive = int(number >= 11)
        if wire_type == 2 and number in _PACKED_VARINTS:
            deltas[positive] += _packed_varints(buf, s, e)
            continue
        if wire_type == 2 and number in _PACKED_DOUBLES:
            if (e - s) % 8:
                raise malformed(f"Histogram field {number}: packed doubles of {e - s} bytes")
            if number != 16:
                counts[positive] += (e - s) // 8
            continue
        if wire_type != expected:
            raise _wrong_type("Histogram", number, wire_type)
        if number in (1, 2):  # oneof count: the last one read wins
            is_float = number == 2
        elif number in (8, 11):
            span_buckets[positive] += _span_length(buf, s, e, spans_seen[positive])
            spans_seen[positive] += 1
        elif number in _PACKED_VARINTS:
            deltas[positive] += 1
        elif number in (10, 13):
            counts[positive] += 1
        elif number == 15:
            ts = uvarint(buf, s)[0]
    buckets, kind = (counts, "counts") if is_float else (deltas, "deltas")
    for i, sign in enumerate(("negative", "positive")):
        if span_buckets[i] != buckets[i]:
            raise malformed(f"Histogram has {span_buckets[i]} {sign} buckets in spans but {buckets[i]} {kind}")
    return int64(ts)
