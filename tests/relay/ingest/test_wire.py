"""Remote-write codecs and route(): tables for errors, hypothesis properties against protobuf."""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.common.labels import Labels
from relay.common.protowire import encode_len, encode_uvarint
from relay.ingest import wire
from relay.proto import remote_v1_pb2 as v1pb
from relay.proto import remote_v2_pb2 as v2pb

STALE_BITS = 0x7FF0000000000002
STALE = struct.unpack("<d", struct.pack("<Q", STALE_BITS))[0]


def bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


def v1_request(series: list[tuple[Labels, list[tuple[int, float]]]]) -> v1pb.WriteRequest:
    req = v1pb.WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for name, value in labels:
            ts.labels.add(name=name, value=value)
        for t, v in samples:
            ts.samples.add(timestamp=t, value=v)
    return req


def reserialize(raw: bytes) -> bytes:
    return bytes(v1pb.WriteRequest.FromString(raw).SerializeToString(deterministic=True))


# ---- strategies ----------------------------------------------------------------------------

names = st.text(st.sampled_from("abcxyz_AZ09é"), min_size=1, max_size=6)
values = st.text(min_size=1, max_size=8)
label_sets = st.dictionaries(names, values, min_size=1, max_size=5).map(lambda d: tuple(sorted(d.items())))
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0]),
    st.just(STALE),
)
timestamps = st.integers(-(2**63), 2**63 - 1)
sample_lists = st.lists(st.tuples(timestamps, floats), max_size=3)


# ---- content type, snappy ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "version"),
    [
        ("application/x-protobuf", 1),
        ("Application/X-Protobuf", 1),
        (" application/x-protobuf ; charset=utf-8", 1),
        ("application/x-protobuf;proto=prometheus.WriteRequest", 1),
        ("application/x-protobuf; proto=io.prometheus.write.v2.Request", 2),
        ('application/x-protobuf;PROTO="io.prometheus.write.v2.Request"', 2),
        (None, 1),
        ("", 1),
    ],
)
def test_parse_content_type_accepts_rw1_and_rw2(header: str | None, version: int) -> None:
    assert wire.parse_content_type(header) == version


@pytest.mark.parametrize(
    "header",
    ["application/json", "text/plain", "application/x-protobuf;proto=foo.Bar", "application/protobuf"],
)
def test_parse_content_type_rejects_others_with_415(header: str) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.parse_content_type(header)
    assert err.value.status == 415


def test_snappy_round_trip_and_length_header() -> None:
    raw = b"remote write " * 1000
    body = wire.compress(raw)
    assert wire.snappy_uncompressed_length(body) == len(raw)
    assert wire.decompress(body, len(raw)) == raw


def test_decompress_checks_the_header_length_before_decompressing() -> None:
    body = encode_uvarint(1 << 30) + b"not snappy at all"  # corrupt, but the limit is seen first
    with pytest.raises(wire.WireError) as err:
        wire.decompress(body, 32 << 20)
    assert err.value.status == 413
    assert "1073741824" in str(err.value)


@pytest.mark.parametrize("body", [b"", b"\xff\xff", b"\x20garbage", wire.compress(b"x" * 100)[:-3]])
def test_decompress_corrupt_snappy_is_400(body: bytes) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decompress(body, 1 << 20)
    assert err.value.status == 400


def test_wire_error_message_is_one_line() -> None:
    err = wire.WireError(400, "bad\nlabel\r\n value")
    assert str(err) == "bad label value" and err.status == 400


# ---- labels --------------------------------------------------------------------------------


def label_entry(name: bytes, value: bytes) -> bytes:
    return encode_len(1, encode_len(1, name) + encode_len(2, value))


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (label_entry(b"\xff", b"v"), "invalid UTF-8 in a label name"),
        (label_entry(b"job", b"\xc3\x28"), "invalid UTF-8 in the value of label 'job'"),
        (label_entry(b"", b"v"), "empty label name"),
        (encode_len(1, encode_len(2, b"v")), "empty label name"),
        (label_entry(b"a", b"1") + label_entry(b"a", b"2"), "duplicate label name 'a'"),
        (label_entry(b"a", b"1")[:-1], "malformed protobuf"),
        (b"\x12\x00", "malformed protobuf: field 2 in a label set"),
    ],
)
def test_decode_labels_rejects_invalid_label_sets(key: bytes, message: str) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decode_labels(key)
    assert err.value.status == 400
    assert message in str(err.value)


def test_decode_labels_sorts_and_removes_empty_values() -> None:
    key = label_entry(b"z", b"1") + label_entry(b"empty", b"") + label_entry(b"a", b"2")
    assert wire.decode_labels(key) == (("a", "2"), ("z", "1"))


@given(label_sets)
def test_encode_labels_matches_protobuf_and_round_trips(labels: Labels) -> None:
    ts = v1pb.TimeSeries(labels=[v1pb.Label(name=n, value=v) for n, v in labels])
    assert wire.encode_labels(labels) == ts.SerializeToString()
    assert wire.decode_labels(wire.encode_labels(labels)) == labels


# ---- whole requests ------------------------------------------------------------------------


@given(st.lists(st.tuples(label_sets, sample_lists), max_size=4))
def test_encode_write_request_matches_protobuf_bit_for_bit(
    series: list[tuple[Labels, list[tuple[int, float]]]],
) -> None:
    raw = wire.encode_write_request(series)
    assert raw == v1_request(series).SerializeToString()
    decoded = wire.decode_write_request(raw)
    assert [labels for labels, _ in decoded] == [labels for labels, _ in series]
    got = [[(t, bits(v)) for t, v in samples] for _, samples in decoded]
    assert got == [[(t, bits(v)) for t, v in samples] for _, samples in series]


def test_stale_marker_is_byte_exact_through_encode_and_decode() -> None:
    raw = wire.encode_write_request([((("__name__", "up"),), [(1000, STALE)])])
    assert struct.pack("<Q", STALE_BITS) in raw
    [(_, [(ts, value)])] = wire.decode_write_request(raw)
    assert ts == 1000 and bits(value) == STALE_BITS


def test_concatenated_write_requests_are_one_request() -> None:
    a = wire.encode_write_request([((("__name__", "a"),), [(1, 1.0)])], metadata=encode_len(3, b"\x08\x02"))
    b = wire.encode_write_request([((("__name__", "b"),), [(2, 2.0)])])
    merged = v1pb.WriteRequest.FromString(a + b)
    assert [ts.labels[0].value for ts in merged.timeseries] == ["a", "b"]
    assert len(merged.metadata) == 1
    routed = wire.route(a + b, 1, {}, lambda k: ((k, wire.series_id(k), ""),))
    assert routed.series_in == 2 and routed.metadata == encode_len(3, b"\x08\x02")


# ---- route ---------------------------------------------------------------------------------


def keep_all(key: bytes) -> wire.Decision:
    return ((key, wire.series_id(key), wire.decode_labels(key)[0][1]),)


def test_route_counts_and_caches_series() -> None:
    series = [((("__name__", f"m{i % 3}"),), [(1, 1.0), (2, 2.0)]) for i in range(6)]
    raw = wire.encode_write_request(series)
    cache: dict[bytes, wire.Decision] = {}
    first = wire.route(raw, 1, cache, keep_all)
    assert (first.series_in, first.samples_in, first.new_keys) == (6, 12, 3)
    second = wire.route(raw, 1, cache, keep_all)
    assert second.new_keys == 0
    assert wire.encode_routed(second.per_dest[0], b"") == raw


def test_route_passes_stale_markers_byte_exact() -> None:
    raw = wire.encode_write_request([((("__name__", "up"), ("job", "x")), [(5, STALE), (6, 1.0)])])
    routed = wire.route(raw, 1, {}, keep_all)
    assert wire.encode_routed(routed.per_dest[0], routed.metadata) == raw
    [(_, value), _] = wire.decode_samples(routed.per_dest[0][0][1])
    assert bits(value) == STALE_BITS


def test_route_surfaces_wire_error_from_decide() -> None:
    raw = encode_len(1, label_entry(b"a", b"1") + label_entry(b"a", b"2"))
    with pytest.raises(wire.WireError, match="duplicate label name"):
        wire.route(raw, 1, {}, keep_all)


def test_route_rejects_decisions_of_the_wrong_length() -> None:
    raw = wire.encode_write_request([((("__name__", "a"),), [(1, 1.0)])])
    with pytest.raises(ValueError, match="2 destinations"):
        wire.route(raw, 2, {}, keep_all)


GOOD_SERIES = encode_len(1, label_entry(b"__name__", b"a"))


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a",  # tag without length
        b"\x0a\x05\x0a\x03",  # series past the end
        b"\x0a\x04\x0a\x09ab",  # label past the end of its series
        b"\x0a\x02\x12\x05",  # sample past the end of its series
        b"\x0a\x02\x0b\x00",  # group wire type inside a series
        GOOD_SERIES + b"\x1b",  # group wire type at the top level
        b"\x08\x01",  # field 1 as a varint
        b"\x0a\x02\x10\xff",  # truncated varint inside a series
        b"\x0a\x01\x0a",  # label tag without length
    ],
)
def test_route_malformed_protobuf_is_400(raw: bytes) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.route(raw, 1, {}, keep_all)
    assert err.value.status == 400


def test_route_skips_unknown_top_level_fields_and_keeps_unknown_series_fields() -> None:
    unknown_in_series = b"\x28\x07"  # field 5 varint: copied through with the samples
    series = encode_len(1, label_entry(b"__name__", b"a") + unknown_in_series)
    routed = wire.route(b"\x10\x01" + series, 1, {}, keep_all)  # field 2 (Cortex source) skipped
    [(_, rest, n, oldest)] = routed.per_dest[0]
    assert rest == unknown_in_series and (n, oldest) == (0, 0)


def histogram(i: int) -> v1pb.Histogram:
    return v1pb.Histogram(
        count_int=i,
        sum=1.5,
        schema=3,
        positive_spans=[v1pb.BucketSpan(offset=0, length=1)],
        positive_deltas=[i],
        timestamp=i,
    )


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """Requests with repeated series, exemplars, histograms and, sometimes, interleaved fields."""
    pool = draw(st.lists(label_sets, min_size=1, max_size=4))
    parts: list[bytes] = []
    for _ in range(draw(st.integers(0, 8))):
        labels = draw(st.sampled_from(pool))
        samples = draw(sample_lists)
        ts = v1_request([(labels, samples)]).timeseries[0]
        for j in range(draw(st.integers(0, 2))):
            ts.exemplars.add(labels=[v1pb.Label(name="trace_id", value=str(j))], value=1.0, timestamp=j)
        for j in range(draw(st.integers(0, 1))):
            ts.histograms.append(histogram(j))
        entries = [f.SerializeToString() for f in [v1pb.TimeSeries(labels=[x]) for x in ts.labels]]
        others = [v1pb.TimeSeries(samples=[x]).SerializeToString() for x in ts.samples]
        others += [v1pb.TimeSeries(exemplars=[x]).SerializeToString() for x in ts.exemplars]
        others += [v1pb.TimeSeries(histograms=[x]).SerializeToString() for x in ts.histograms]
        if draw(st.booleans()) and others:  # a sender that puts a sample first
            body = others[0] + b"".join(entries) + b"".join(others[1:])
        else:
            body = b"".join(entries) + b"".join(others)
        parts.append(encode_len(1, body))
        if draw(st.booleans()):
            parts.append(
                encode_len(
                    3, v1pb.MetricMetadata(type=cast(Any, 2), metric_family_name="m").SerializeToString()
                )
            )
    return b"".join(parts)


def random_decide(n_dest: int, choice: Callable[[Labels, int], int]) -> Callable[[bytes], wire.Decision]:
    """keep (0), drop (1) or rename (2) per destination, chosen from the labels."""

    def decide(key: bytes) -> wire.Decision:
        labels = wire.decode_labels(key)
        out: list[wire.DestDecision | None] = []
        for dest in range(n_dest):
            action = choice(labels, dest)
            if action == 1:
                out.append(None)
                continue
            result = labels if action == 0 else tuple(sorted((*labels, ("renamed", str(dest)))))
            lb = wire.encode_labels(result)
            out.append((lb, wire.series_id(lb), ""))
        return tuple(out)

    return decide


def naive_route(raw: bytes, decide: Callable[[bytes], wire.Decision], n_dest: int) -> list[bytes]:
    """Reference: decode with protobuf, decide per series, re-encode each destination's request."""
    req = v1pb.WriteRequest.FromString(raw)
    outs = [v1pb.WriteRequest() for _ in range(n_dest)]
    for ts in req.timeseries:
        key = b"".join(v1pb.TimeSeries(labels=[x]).SerializeToString() for x in ts.labels)
        for dest, d in enumerate(decide(key)):
            if d is not None:
                out = outs[dest].timeseries.add()
                out.CopyFrom(ts)
                del out.labels[:]
                out.MergeFromString(d[0])
    for out in outs:
        out.metadata.extend(req.metadata)
    return [out.SerializeToString(deterministic=True) for out in outs]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(raw_requests(), st.integers(1, 3), st.integers(0, 2**32))
def test_route_equals_naive_protobuf_relay(raw: bytes, n_dest: int, seed: int) -> None:
    decide = random_decide(n_dest, lambda labels, dest: hash((labels, dest, seed)) % 3)
    cache: dict[bytes, wire.Decision] = {}
    expected = naive_route(raw, decide, n_dest)
    req = v1pb.WriteRequest.FromString(raw)
    for attempt in range(2):  # the second pass is served from the cache
        routed = wire.route(raw, n_dest, cache, decide)
        got = [reserialize(wire.encode_routed(routed.per_dest[d], routed.metadata)) for d in range(n_dest)]
        assert got == expected
        assert routed.series_in == len(req.timeseries)
        assert routed.samples_in == sum(len(ts.samples) for ts in req.timeseries)
        assert routed.exemplars_in == sum(len(ts.exemplars) for ts in req.timeseries)
        assert routed.histograms_in == sum(len(ts.histograms) for ts in req.timeseries)
        for dest in routed.per_dest:
            for _, rest, n, oldest in dest:  # n and oldest count histograms as samples (interface 1)
                ts = v1pb.TimeSeries.FromString(rest)
                stamps = [s.timestamp for s in ts.samples] + [h.timestamp for h in ts.histograms]
                assert (n, oldest) == (len(stamps), min(stamps, default=0))
        if attempt:
            assert routed.new_keys == 0


def test_series_id_is_blake2b_64_little_endian() -> None:
    import hashlib

    key = wire.encode_labels((("__name__", "up"),))
    assert wire.series_id(key) == int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    assert 0 <= wire.series_id(b"") < 2**64


# ---- v2 ------------------------------------------------------------------------------------

v2_labels = st.tuples(label_sets, st.sampled_from(["m1", "m2"])).map(
    lambda x: tuple(sorted({**dict(x[0]), "__name__": x[1]}.items()))
)
v2_series = st.tuples(
    v2_labels,
    st.lists(st.tuples(timestamps, floats, timestamps), max_size=3),
    st.integers(0, 2),  # histograms
    st.integers(0, 2),  # exemplars
    st.integers(0, 5),  # metadata type
)


def build_v2(series: list[tuple[Labels, list[tuple[int, float, int]], int, int, int]]) -> tuple[bytes, bytes]:
    """A v2 Request and the v1 WriteRequest it should become, both built with protobuf."""
    symbols: dict[str, int] = {"": 0}

    def ref(s: str) -> int:
        return symbols.setdefault(s, len(symbols))

    req2 = v2pb.Request()
    req1 = v1pb.WriteRequest()
    seen: set[str] = set()
    for labels, samples, n_hist, n_ex, mtype in series:
        t2 = req2.timeseries.add()
        t1 = req1.timeseries.add()
        for name, value in reversed(labels):  # unsorted refs: the transcoder sorts
            t2.labels_refs.extend([ref(name), ref(value)])
        for name, value in labels:
            t1.labels.add(name=name, value=value)
        for ts, number, start in samples:
            t2.samples.add(timestamp=ts, value=number, start_timestamp=start)
            t1.samples.add(timestamp=ts, value=number)
        for i in range(n_ex):
            t2.exemplars.add(labels_refs=[ref("trace_id"), ref(str(i))], value=float(i), timestamp=i + 1)
            t1.exemplars.add(
                labels=[v1pb.Label(name="trace_id", value=str(i))], value=float(i), timestamp=i + 1
            )
        for i in range(n_hist):
            h2 = v2pb.Histogram(
                count_int=i,
                sum=2.0,
                schema=1,
                timestamp=i,
                start_timestamp=7,
                positive_spans=[v2pb.BucketSpan(offset=1, length=1)],
                positive_deltas=[i],
            )
            t2.histograms.append(h2)
            t1.histograms.add(
                count_int=i,
                sum=2.0,
                schema=1,
                timestamp=i,
                positive_spans=[v1pb.BucketSpan(offset=1, length=1)],
                positive_deltas=[i],
            )
        name = dict(labels).get("__name__", "")
        if mtype:
            t2.metadata.CopyFrom(
                v2pb.Metadata(type=cast(Any, mtype), help_ref=ref("help " + name), unit_ref=ref("s"))
            )
            if name and name not in seen:
                seen.add(name)
                req1.metadata.add(
                    type=cast(Any, mtype), metric_family_name=name, help="help " + name, unit="s"
                )
    req2.symbols.extend(symbols)
    return req2.SerializeToString(), req1.SerializeToString(deterministic=True)


@settings(max_examples=150)
@given(st.lists(v2_series, max_size=4))
def test_v2_to_v1_equals_protobuf_built_reference(
    series: list[tuple[Labels, list[tuple[int, float, int]], int, int, int]],
) -> None:
    raw2, expected = build_v2(series)
    v1, counts = wire.v2_to_v1(raw2)
    assert reserialize(v1) == expected
    assert counts == wire.V2Counts(
        samples=sum(len(s[1]) for s in series),
        histograms=sum(s[2] for s in series),
        exemplars=sum(s[3] for s in series),
    )


def test_v2_to_v1_keeps_stale_marker_bits() -> None:
    req = v2pb.Request(symbols=["", "__name__", "up"])
    req.timeseries.add(labels_refs=[1, 2]).samples.add(value=STALE, timestamp=9, start_timestamp=3)
    v1, counts = wire.v2_to_v1(req.SerializeToString())
    [(labels, [(ts, value)])] = wire.decode_write_request(v1)
    assert labels == (("__name__", "up"),) and ts == 9 and bits(value) == STALE_BITS
    assert struct.pack("<Q", STALE_BITS) in v1 and counts.samples == 1


@given(st.lists(st.tuples(timestamps, floats), min_size=1, max_size=5))
def test_v2_to_v1_keeps_every_sample_bit_pattern(samples: list[tuple[int, float]]) -> None:
    req = v2pb.Request(symbols=["", "__name__", "m"])
    series = req.timeseries.add(labels_refs=[1, 2])
    for ts, value in samples:
        series.samples.add(timestamp=ts, value=value)
    v1, _ = wire.v2_to_v1(req.SerializeToString())
    [(_, got)] = wire.decode_write_request(v1)
    assert [(ts, bits(v)) for ts, v in got] == [(ts, bits(v)) for ts, v in samples]


def test_v2_to_v1_invalid_utf8_symbol_is_400() -> None:
    raw = encode_len(4, b"") + encode_len(4, b"\xff") + encode_len(5, b"\x0a\x02\x01\x01")
    with pytest.raises(wire.WireError) as err:
        wire.v2_to_v1(raw)
    assert err.value.status == 400


def test_v2_metadata_uses_the_family_name_of_classic_histograms() -> None:
    req = v2pb.Request(symbols=["", "__name__", "lat_bucket", "lat_sum", "help"])
    for name_ref in (2, 3):
        req.timeseries.add(labels_refs=[1, name_ref], metadata=v2pb.Metadata(type=cast(Any, 3), help_ref=4))
    v1, _ = wire.v2_to_v1(req.SerializeToString())
    meta = v1pb.WriteRequest.FromString(v1).metadata
    assert [(m.metric_family_name, m.type, m.help) for m in meta] == [("lat", 3, "help")]


@pytest.mark.parametrize(
    ("symbols", "refs", "message"),
    [
        (["", "a"], [1, 5], "ref 5 out of range"),
        (["", "a"], [1], "odd count 1"),
        (["x", "a"], [1, 1], "symbols[0] must be the empty string"),
    ],
)
def test_v2_to_v1_rejects_invalid_refs(symbols: list[str], refs: list[int], message: str) -> None:
    req = v2pb.Request(symbols=symbols)
    req.timeseries.add(labels_refs=refs)
    with pytest.raises(wire.WireError) as err:
        wire.v2_to_v1(req.SerializeToString())
    assert err.value.status == 400 and message in str(err.value)


def test_v2_to_v1_rejects_out_of_range_exemplar_and_metadata_refs() -> None:
    req = v2pb.Request(symbols=["", "__name__", "a"])
    req.timeseries.add(labels_refs=[1, 2]).exemplars.add(labels_refs=[1, 9], timestamp=1)
    with pytest.raises(wire.WireError, match="exemplar"):
        wire.v2_to_v1(req.SerializeToString())
    req = v2pb.Request(symbols=["", "__name__", "a"])
    req.timeseries.add(labels_refs=[1, 2], metadata=v2pb.Metadata(type=cast(Any, 1), help_ref=9))
    with pytest.raises(wire.WireError, match="metadata"):
        wire.v2_to_v1(req.SerializeToString())


def test_v2_to_v1_malformed_protobuf_is_400() -> None:
    with pytest.raises(wire.WireError) as err:
        wire.v2_to_v1(b"\x2a\x09\x0a")
    assert err.value.status == 400


# ---- performance ---------------------------------------------------------------------------

DCGM_METRICS = [
    *(
        f"DCGM_FI_DEV_{m}"
        for m in (
            "SM_CLOCK",
            "MEM_CLOCK",
            "MEMORY_TEMP",
            "GPU_TEMP",
            "POWER_USAGE",
            "TOTAL_ENERGY_CONSUMPTION",
            "PCIE_REPLAY_COUNTER",
            "GPU_UTIL",
            "MEM_COPY_UTIL",
            "ENC_UTIL",
            "DEC_UTIL",
            "XID_ERRORS",
            "FB_FREE",
            "FB_USED",
            "FB_RESERVED",
            "NVLINK_BANDWIDTH_TOTAL",
            "UNCORRECTABLE_REMAPPED_ROWS",
            "CORRECTABLE_REMAPPED_ROWS",
            "ROW_REMAP_FAILURE",
        )
    ),
    *(
        f"DCGM_FI_PROF_{m}"
        for m in ("GR_ENGINE_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE", "PCIE_TX_BYTES", "PCIE_RX_BYTES")
    ),
]


def dcgm_payload(scrape_ms: int = 1_724_000_000_000) -> bytes:
    """One scrape of an 8-GPU node: 24 metrics x 8 GPUs, dcgm-exporter labels plus job/instance/pod."""
    series = []
    for metric in DCGM_METRICS:
        for gpu in range(8):
            labels = {
                "__name__": metric,
                "gpu": str(gpu),
                "UUID": f"GPU-{gpu:08x}-5d2e-4c4b-9a3e-0c1f2e3d4b5a",
                "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                "device": f"nvidia{gpu}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": "ip-10-0-1-23.ec2.internal",
                "DCGM_FI_DRIVER_VERSION": "550.54.15",
                "container": "trainer",
                "namespace": "ml",
                "pod": "llm-train-0",
                "instance": "10.0.1.23:9400",
                "job": "gpu-metrics",
            }
            series.append((tuple(sorted(labels.items())), [(scrape_ms, 40.0 + gpu)]))
    return wire.encode_write_request(series)


def test_route_cached_dcgm_scrape_is_copied_byte_identical() -> None:
    raw = dcgm_payload()
    cache: dict[bytes, wire.Decision] = {}
    for expected_new in (192, 0):
        routed = wire.route(raw, 1, cache, keep_all)
        assert (routed.series_in, routed.samples_in, routed.new_keys) == (192, 192, expected_new)
        assert wire.encode_routed(routed.per_dest[0], b"") == raw


def test_route_cached_series_with_more_samples_than_the_previous_one_counts_them_all() -> None:
    a, b = (("__name__", "a"),), (("__name__", "b"),)
    raw = wire.encode_write_request([(a, [(1, 1.0)]), (b, [(1, 1.0)]), (b, [(1, 1.0), (2, 2.0)])])
    cache: dict[bytes, wire.Decision] = {}
    for _ in range(2):
        routed = wire.route(raw, 1, cache, keep_all)
        assert routed.samples_in == 4
        assert [n for _, _, n, _ in routed.per_dest[0]] == [1, 1, 2]
        assert wire.encode_routed(routed.per_dest[0], b"") == raw


def test_route_cached_series_whose_rest_has_the_previous_length_but_an_exemplar_counts_it() -> None:
    labels = v1pb.TimeSeries(labels=[v1pb.Label(name="__name__", value="a")]).SerializeToString()
    first = v1pb.TimeSeries(samples=[v1pb.Sample(value=1.0, timestamp=1_724_000_000_000)]).SerializeToString()
    second = v1pb.TimeSeries(
        samples=[v1pb.Sample(value=0.0, timestamp=1)], exemplars=[v1pb.Exemplar(value=1.0, timestamp=200)]
    ).SerializeToString()
    assert len(first) == len(second)  # what makes the next series look like a one-sample series
    raw = encode_len(1, labels + first) + encode_len(1, labels + second)
    routed = wire.route(raw, 1, {}, keep_all)
    assert (routed.samples_in, routed.exemplars_in) == (2, 1)
    assert [n for _, _, n, _ in routed.per_dest[0]] == [1, 1]


def measure_route_us_per_sample(rounds: int = 300) -> float:
    raw = dcgm_payload()
    cache: dict[bytes, wire.Decision] = {}
    decide = random_decide(2, lambda labels, dest: dest % 2)
    samples = wire.route(raw, 2, cache, decide).samples_in
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(rounds):
            wire.route(raw, 2, cache, decide)
        best = min(best, (time.perf_counter() - started) / rounds / samples * 1e6)
    return best


def measure_decode_us_per_sample(rounds: int = 300) -> float:
    """The naive relay's cost on the same payload: decode every series and sample."""
    raw = dcgm_payload()
    samples = sum(len(s) for _, s in wire.decode_write_request(raw))
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(rounds):
            wire.decode_write_request(raw)
        best = min(best, (time.perf_counter() - started) / rounds / samples * 1e6)
    return best


def test_route_of_a_cached_payload_costs_less_than_decoding_it(capsys: pytest.CaptureFixture[str]) -> None:
    # Side by side in one run (a shared machine's noise hits both), not against a wall-clock bound.
    us = measure_route_us_per_sample(rounds=100)
    naive = measure_decode_us_per_sample(rounds=30)
    with capsys.disabled():
        print(f"\nroute(): {us:.2f} us/sample, 8-GPU dcgm payload, cached, 2 destinations; decoding it: {naive:.2f}")
    assert us < naive / 10


if __name__ == "__main__":
    print(
        f"route(): {measure_route_us_per_sample():.2f} us/sample (8-GPU dcgm payload, cached, 2 destinations)"
    )
