"""Enum values outside their proto's list that Prometheus's own receiver accepts pass through the
relay, in both cores, instead of being refused (issue 20 point 12, "Client errors are 4xx").

What Prometheus (storage/remote/write_handler.go, prompb/io/prometheus/write/v2/codec.go) does:
an RW 1.0 request's MetricMetadata entries are never read by its receiver (any ``type`` is fine);
an RW 2.0 ``Metadata.type`` outside 1-7 becomes ``MetricTypeUnknown`` in ``ToMetadata`` and the
samples are stored; a Histogram's ``reset_hint`` is cast to ``histogram.CounterResetHint`` without a
check, in both versions. So the relay forwards each value as protobuf reads it (an int32: a varint
past 32 bits keeps its low 32 bits, as gogo-protobuf reads it), and the only refusal stays the one
of commit d9a115e: an RW 2.0 metadata type read negative, a 400 naming TimeSeries.metadata.type.
"""

from __future__ import annotations

import pytest

from relay.common.protowire import WireError, encode_len, encode_uvarint
from relay.ingest import wire, wire_v2
from relay.proto import remote_v1_pb2 as v1pb

U64 = 1 << 64
V2_TRANSCODERS = [wire_v2.v2_to_v1, wire_v2.py_v2_to_v1]  # the C twin where built, and the reference
ROUTE_LOOPS = [wire.route_loop, wire._route_loop]
LABELS = encode_len(1, encode_len(1, b"__name__") + encode_len(2, b"m_bucket"))
HISTOGRAM = b"\x08\x01\x78\x05"  # count_int 1, timestamp 5


def v2_request(metadata: bytes = b"", histogram: bytes = b"") -> bytes:
    """symbols "", __name__, m_bucket, help; one series with a sample, or a histogram, and metadata."""
    symbols = b"".join(encode_len(4, s) for s in (b"", b"__name__", b"m_bucket", b"help"))
    body = encode_len(1, b"\x01\x02") + (encode_len(3, histogram) if histogram else encode_len(2, b"\x10\x05"))
    return symbols + encode_len(5, body + (encode_len(5, metadata) if metadata else b""))


@pytest.mark.parametrize(("sent", "type_out", "family"), [
    (8, 8, "m_bucket"),  # past STATESET: unknown to Prometheus, the samples stored
    (99, 99, "m_bucket"),
    (2**31 - 1, 2**31 - 1, "m_bucket"),  # the largest int32
    (2**32 + 3, 3, "m"),  # read as an int32 (low 32 bits): HISTOGRAM, so the _bucket family is m
])
@pytest.mark.parametrize("transcode", V2_TRANSCODERS)
def test_rw2_metadata_type_past_the_enum_passes_through(transcode: wire_v2.Transcoder, sent: int, type_out: int,
                                                        family: str) -> None:
    v1, counts = transcode(v2_request(metadata=b"\x08" + encode_uvarint(sent) + b"\x18\x03"))
    (md,) = v1pb.WriteRequest.FromString(v1).metadata
    assert (md.type, md.metric_family_name, md.help) == (type_out, family, "help")
    assert counts.samples == 1


@pytest.mark.parametrize("sent", [2**31, U64 - 1])
@pytest.mark.parametrize("transcode", V2_TRANSCODERS)
def test_rw2_metadata_type_read_negative_is_still_a_400_naming_the_field(transcode: wire_v2.Transcoder,
                                                                         sent: int) -> None:
    with pytest.raises(WireError) as e:
        transcode(v2_request(metadata=b"\x08" + encode_uvarint(sent) + b"\x18\x03"))
    assert e.value.status == 400 and "TimeSeries.metadata.type" in e.value.message


@pytest.mark.parametrize(("sent", "hint_out"), [(4, 4), (99, 99), (2**31, -(2**31)), (2**32 + 1, 1), (U64 - 1, -1)])
@pytest.mark.parametrize("transcode", V2_TRANSCODERS)
def test_rw2_histogram_reset_hint_out_of_range_passes_through(transcode: wire_v2.Transcoder, sent: int,
                                                              hint_out: int) -> None:
    v1, counts = transcode(v2_request(histogram=HISTOGRAM + b"\x70" + encode_uvarint(sent)))
    (h,) = v1pb.WriteRequest.FromString(v1).timeseries[0].histograms
    assert (h.reset_hint, h.count_int, h.timestamp) == (hint_out, 1, 5)
    assert counts.histograms == 1


def route(loop: object, v1: bytes) -> tuple[list[list[wire.RoutedEntry]], list[bytes]]:
    per_dest: list[list[wire.RoutedEntry]] = [[]]
    metadata: list[bytes] = []
    assert callable(loop)
    loop(v1, {}, lambda key: ((key, wire.series_id(key), ""),), per_dest, metadata)
    return per_dest, metadata


@pytest.mark.parametrize("sent", [8, 99, 2**31, 2**32 + 1, U64 - 1])
@pytest.mark.parametrize("loop", ROUTE_LOOPS)
def test_rw1_metadata_type_out_of_range_is_forwarded_byte_for_byte(loop: object, sent: int) -> None:
    entry = encode_len(3, b"\x08" + encode_uvarint(sent) + encode_len(2, b"m") + encode_len(4, b"help"))
    v1 = encode_len(1, LABELS + encode_len(2, b"\x10\x05")) + entry
    per_dest, metadata = route(loop, v1)
    assert metadata == [entry] and len(per_dest[0]) == 1


@pytest.mark.parametrize("sent", [4, 99, 2**31, U64 - 1])
@pytest.mark.parametrize("loop", ROUTE_LOOPS)
def test_rw1_histogram_reset_hint_out_of_range_is_forwarded_byte_for_byte(loop: object, sent: int) -> None:
    rest = encode_len(4, HISTOGRAM + b"\x70" + encode_uvarint(sent))
    per_dest, _ = route(loop, encode_len(1, LABELS + rest))
    ((_, forwarded, n, oldest),) = per_dest[0]
    assert (forwarded, n, oldest) == (rest, 1, 5)
