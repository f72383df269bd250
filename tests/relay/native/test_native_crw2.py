"""relay.native._crw2 (RW 2.0 -> 1.0 in C) against its reference, relay.wire_v2.py_v2_to_v1.

Differential: random valid requests (symbols, label refs in any encoding, samples, native histograms,
exemplars, metadata, unknown fields at every level, any field order) and malformed ones (truncated,
flipped, inserted bytes, bad refs, long varints, wrong wire types, huge lengths, small max_bytes)
go to both; the results must be identical, errors included (type, status, message). The C code's
own answer (``transcode``) is checked too: when it does not hand a request to the reference, its
output is the reference's, and requests in the shape Prometheus sends are never handed over.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from typing import Any, cast

import pytest
import snappy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.rw_payload import cluster_series, encode_v2
from relay import native
from relay.common.protowire import WireError, encode_len, encode_uvarint
from relay.ingest import wire_v2
from relay.proto import remote_v1_pb2 as v1pb
from relay.proto import remote_v2_pb2 as v2pb
from tests.helpers import REPO_ROOT

_c = native.load("crw2")
pytestmark = pytest.mark.skipif(_c is None, reason="relay.native._crw2 not in use (GPU_RELAY_NATIVE=0 or not built)")
ROOT = REPO_ROOT
U64 = (1 << 64) - 1
DEFAULT = wire_v2.DEFAULT_MAX_BYTES

Outcome = tuple[Any, ...]


def outcome(fn: Any, raw: bytes, max_bytes: int) -> Outcome:
    try:
        v1, counts = fn(raw, max_bytes)
    except WireError as e:
        return ("WireError", e.status, e.message)
    except Exception as e:
        return (type(e).__name__, str(e))
    return ("ok", v1, counts)


def check_same(raw: bytes, max_bytes: int = DEFAULT) -> tuple[Outcome, Any]:
    """Both entry points agree; where the C code answers by itself, it agrees with the reference."""
    assert _c is not None
    want = outcome(wire_v2.py_v2_to_v1, raw, max_bytes)
    assert outcome(wire_v2.v2_to_v1, raw, max_bytes) == want
    own = _c.transcode(raw, max_bytes)
    if own is not None:
        assert want[0] == "ok"
        assert (own[0], wire_v2.V2Counts(*own[1:])) == want[1:]
    return want, own


# ---- building requests by hand (any field order, unknown fields, both refs encodings) ----------


def tag(number: int, wire_type: int) -> bytes:
    return encode_uvarint(number << 3 | wire_type)


def f_varint(number: int, value: int) -> bytes:
    return tag(number, 0) + encode_uvarint(value & U64)


def f_double(number: int, bits: int) -> bytes:
    return tag(number, 1) + struct.pack("<Q", bits)


def f_len(number: int, payload: bytes) -> bytes:
    return encode_len(number, payload)


unknown_fields = st.one_of(
    st.tuples(st.sampled_from([6, 7, 19, 100, 2**29 - 1]), st.integers(0, U64)).map(lambda t: f_varint(*t)),
    st.tuples(st.sampled_from([8, 20, 4000]), st.integers(0, U64)).map(lambda t: f_double(*t)),
    st.tuples(st.sampled_from([9, 21, 12345]), st.binary(max_size=6)).map(lambda t: f_len(*t)),
    st.tuples(st.sampled_from([10, 22]), st.binary(min_size=4, max_size=4)).map(lambda t: tag(t[0], 5) + t[1]),
)
bits64 = st.one_of(
    st.just(0), st.integers(0, U64),
    st.sampled_from([0x7FF0000000000002, 0x8000000000000000, 0x7FF8000000000001, 0x3FF0000000000000]),
)
int64s = st.one_of(st.just(0), st.integers(-(2**63), 2**63 - 1), st.integers(1, 2**41))
symbol_texts = st.one_of(
    st.sampled_from(["__name__", "job", "le", "lat_bucket", "lat_sum", "lat_count", "x_count", "_sum", "help", "s"]),
    st.text(max_size=8),
    st.text(st.sampled_from("ab\u00e9\u4e2d\U0001f600"), min_size=100, max_size=140),  # 2-byte lengths
)


@st.composite
def refs_fields(draw: st.DrawFn, pairs: list[int]) -> list[bytes]:
    """labels_refs (field 1) as protobuf writes it (packed), or unpacked, or split into chunks."""
    how = draw(st.sampled_from(["packed", "packed", "packed", "unpacked", "split"]))
    if not pairs:
        return []
    if how == "packed":
        return [f_len(1, b"".join(encode_uvarint(r) for r in pairs))]
    if how == "unpacked":
        return [f_varint(1, r) for r in pairs]
    cut = draw(st.integers(0, len(pairs)))
    return [f_len(1, b"".join(encode_uvarint(r) for r in pairs[:cut])),
            f_len(1, b"".join(encode_uvarint(r) for r in pairs[cut:]))]


@st.composite
def samples(draw: st.DrawFn, extras: bool) -> bytes:
    value, ts, start = draw(bits64), draw(int64s), draw(int64s)
    parts = [f_double(1, value) if value or draw(st.booleans()) else b"",
             f_varint(2, ts) if ts or draw(st.booleans()) else b"",
             f_varint(3, start) if start else b""]
    if extras:
        parts += draw(st.lists(st.one_of(unknown_fields, bits64.map(lambda b: f_double(1, b)),
                                         int64s.map(lambda t: f_varint(2, t))), max_size=2))
        parts = draw(st.permutations(parts))
    return f_len(2, b"".join(parts))


spans = st.lists(st.builds(v2pb.BucketSpan, offset=st.integers(-(2**31), 2**31 - 1), length=st.integers(0, 2**32 - 1)),
                 max_size=3)


@st.composite
def histograms(draw: st.DrawFn) -> v2pb.Histogram:
    h = v2pb.Histogram(
        sum=draw(st.floats(allow_nan=True) | st.just(-0.0)), schema=draw(st.integers(-(2**31), 2**31 - 1)),
        zero_threshold=draw(st.floats(allow_nan=False)), negative_spans=draw(spans), positive_spans=draw(spans),
        negative_deltas=draw(st.lists(int64s, max_size=3)), positive_deltas=draw(st.lists(int64s, max_size=3)),
        negative_counts=draw(st.lists(st.floats(), max_size=3)),
        positive_counts=draw(st.lists(st.floats(), max_size=3)),
        custom_values=draw(st.lists(st.floats(), max_size=2)), reset_hint=cast(Any, draw(st.integers(0, 3))),
        timestamp=draw(int64s), start_timestamp=draw(int64s),
    )
    count = draw(st.sampled_from(["int", "float", "none"]))
    if count == "int":
        h.count_int = draw(st.integers(0, U64))
    elif count == "float":
        h.count_float = draw(st.floats())
    zero = draw(st.sampled_from(["int", "float", "none"]))
    if zero == "int":
        h.zero_count_int = draw(st.integers(0, U64))
    elif zero == "float":
        h.zero_count_float = draw(st.floats())
    return h


@st.composite
def histogram_fields(draw: st.DrawFn, extras: bool) -> bytes:
    body = draw(histograms()).SerializeToString()
    if extras:  # shapes protobuf would not write (the C code hands them over), still valid
        body += draw(st.sampled_from([b"", f_double(3, 0), f_varint(14, 2**32 - 1), f_varint(4, 0), f_varint(1, 5),
                                      f_len(9, b""), f_varint(9, 3), f_varint(15, 0), f_varint(30, 1),
                                      f_len(11, b"\x10\x01\x08\x02"), f_varint(17, 9)]))
    return f_len(3, body)


def zigzag32(v: int) -> int:
    return ((v << 1) ^ (v >> 31)) & 0xFFFFFFFF


@st.composite
def ordered_histogram(draw: st.DrawFn) -> bytes:
    """Histogram bytes in field order by hand, default values sometimes written out (protobuf would
    not: the reference's re-serialisation drops them, so the C code must not copy them)."""
    opt = st.booleans()
    out = b""
    count = draw(st.sampled_from([0, 1, 2, 3]))  # 3: both members of the oneof (the last one wins)
    if count & 1:
        out += f_varint(1, draw(st.integers(0, U64)))
    if count & 2:
        out += f_double(2, draw(bits64))
    if draw(opt):
        out += f_double(3, draw(bits64))
    if draw(opt):
        out += f_varint(4, zigzag32(draw(st.integers(-3, 3) | st.integers(-(2**31), 2**31 - 1))))
    if draw(opt):
        out += f_double(5, draw(bits64))
    zero = draw(st.sampled_from([0, 1, 2, 3]))
    if zero & 1:
        out += f_varint(6, draw(st.integers(0, 9)))
    if zero & 2:
        out += f_double(7, draw(bits64))
    for spans_no in (8, 11):
        for _ in range(draw(st.integers(0, 2))):
            span = b""
            if draw(opt):
                span += f_varint(1, zigzag32(draw(st.integers(-2, 2))))
            if draw(opt):
                span += f_varint(2, draw(st.integers(0, 3) | st.integers(2**32 - 1, 2**32 + 1)))
            out += f_len(spans_no, span)
        if draw(opt):  # deltas, packed (perhaps empty)
            deltas = draw(st.lists(st.integers(0, U64), max_size=2))
            out += f_len(spans_no + 1, b"".join(encode_uvarint(v) for v in deltas))
        if draw(opt):  # counts
            out += f_len(spans_no + 2, b"".join(struct.pack("<Q", b) for b in draw(st.lists(bits64, max_size=2))))
    if draw(opt):
        out += f_varint(14, draw(st.integers(0, 3) | st.sampled_from([2**31 - 1, 2**31, 2**32 - 1, U64])))
    if draw(opt):
        out += f_varint(15, draw(int64s))
    if draw(opt):
        out += f_len(16, b"".join(struct.pack("<Q", b) for b in draw(st.lists(bits64, max_size=2))))
    if draw(opt):
        out += f_varint(17, draw(int64s))
    return out


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ordered_histogram(), min_size=1, max_size=3))
def test_histograms_with_default_values_written_out_give_the_references_bytes(hs: list[bytes]) -> None:
    raw = f_len(4, b"") + f_len(4, b"__name__") + f_len(4, b"h") + f_len(5, f_len(1, b"\x01\x02") + b"".join(
        f_len(3, h) for h in hs))
    want, _ = check_same(raw)
    assert want[0] == "ok"


@st.composite
def exemplars(draw: st.DrawFn, nsym: int, distinct: list[int], extras: bool) -> bytes:
    """An Exemplar field; ``distinct``: refs to distinct symbol texts (label names without duplicates)."""
    pairs = draw(st.lists(st.integers(0, nsym - 1), max_size=4)) if extras else []
    if not extras:
        names = draw(st.lists(st.sampled_from(distinct), unique=True, max_size=2))
        for n in names:
            pairs += [n, draw(st.integers(0, nsym - 1))]
    parts = [f_double(2, draw(bits64)), f_varint(3, draw(int64s))]
    if extras:
        parts += draw(st.lists(unknown_fields, max_size=1))
        parts = draw(st.permutations(parts))
    return f_len(4, interleave(draw, draw(refs_fields(pairs)), parts))


@st.composite
def metadata(draw: st.DrawFn, nsym: int, extras: bool) -> bytes:
    mtype = draw(st.integers(0, 7) | st.integers(0, 2**32 - 1) if extras else st.integers(0, 7))
    parts = [f_varint(1, mtype) if mtype else b"",
             f_varint(3, draw(st.integers(0, nsym - 1))), f_varint(4, draw(st.integers(0, nsym - 1)))]
    if extras:
        parts += draw(st.lists(unknown_fields, max_size=1))
        parts = draw(st.permutations(parts))
    return f_len(5, b"".join(parts))


@st.composite
def series(draw: st.DrawFn, symbols: list[str], extras: bool) -> bytes:
    """One TimeSeries field. Without ``extras``: distinct label names, as Prometheus sends."""
    nsym = len(symbols)
    by_text: dict[str, int] = {}
    for i, s in enumerate(symbols):
        by_text.setdefault(s, i)
    distinct = sorted(by_text.values())
    if extras:
        pairs = draw(st.lists(st.integers(0, nsym - 1), max_size=12))
    else:
        names = draw(st.lists(st.sampled_from(distinct), unique=True, max_size=8))
        pairs = [r for n in names for r in (n, draw(st.integers(0, nsym - 1)))]
        if draw(st.booleans()):
            pairs = [r for i in range(len(pairs) - 2, -1, -2) for r in pairs[i : i + 2]]  # unsorted
    refs = draw(refs_fields(pairs))
    parts = draw(st.lists(samples(extras), max_size=3))
    parts += draw(st.lists(exemplars(nsym, distinct, extras), max_size=2))
    parts += draw(st.lists(histogram_fields(extras), max_size=2))
    if draw(st.booleans()):
        parts.append(draw(metadata(nsym, extras)))
    if extras:
        parts += draw(st.lists(unknown_fields, max_size=2))
    return f_len(5, interleave(draw, refs, draw(st.permutations(parts))))


def interleave(draw: st.DrawFn, first: list[bytes], second: list[bytes]) -> bytes:
    """Both lists merged at random, each keeping its own order (repeated fields keep theirs)."""
    slots = draw(st.permutations([0] * len(first) + [1] * len(second)))
    it = [iter(first), iter(second)]
    return b"".join(next(it[k]) for k in slots)


@st.composite
def requests(draw: st.DrawFn, extras: bool | None = None) -> tuple[bytes, bool]:
    """(Request bytes, drawn without extras: the C code must answer it itself)."""
    if extras is None:
        extras = draw(st.booleans())
    symbols = ["", *draw(st.lists(symbol_texts, min_size=1, max_size=10))]
    syms = [f_len(4, s.encode()) for s in symbols]
    others = draw(st.lists(series(symbols, extras), max_size=5))
    if extras:
        others += draw(st.lists(unknown_fields, max_size=2))
        others = draw(st.permutations(others))
    return interleave(draw, syms, others), not extras


# ---- valid requests ----------------------------------------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests())
def test_random_valid_requests_give_the_references_bytes_counts_and_errors(req: tuple[bytes, bool]) -> None:
    raw, plain = req
    want, own = check_same(raw)
    if plain:  # the shape Prometheus sends: the C code answers by itself
        assert want[0] == "ok" and own is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(extras=False), st.data())
def test_max_bytes_around_the_output_size_gives_the_same_413_or_bytes(
        req: tuple[bytes, bool], data: st.DataObject) -> None:
    raw, _ = req
    full = wire_v2.py_v2_to_v1(raw)[0]
    limit = data.draw(st.integers(0, len(full) + 2) | st.sampled_from([len(full), max(len(full) - 1, 0)]))
    want, own = check_same(raw, limit)
    assert (want[0] == "ok") == (len(full) <= limit)
    if len(full) > limit:
        assert want[1] == 413 and own is None
    else:
        assert own is not None


def test_the_bench_payload_is_transcoded_in_c_byte_for_byte() -> None:
    raw = snappy.uncompress(encode_v2(cluster_series(8, 68)[:2000], 1_700_000_000_000, 3))
    want, own = check_same(raw)
    assert own is not None and want[2] == wire_v2.V2Counts(2000, 0, 0)


def test_prometheus_style_metadata_on_every_series_is_deduplicated_by_family_in_c() -> None:
    req = v2pb.Request(symbols=["", "__name__", "lat_bucket", "lat_sum", "lat_count", "le", "1", "help", "s", "up"])
    for name in (2, 2, 3, 4, 9):
        meta = v2pb.Metadata(type=cast(Any, 3), help_ref=7, unit_ref=8)
        ts = req.timeseries.add(labels_refs=[1, name, 5, 6], metadata=meta)
        ts.samples.add(value=1.0, timestamp=5)
    req.timeseries[4].metadata.type = 2
    want, own = check_same(req.SerializeToString())
    assert own is not None
    families = [(m.metric_family_name, m.type) for m in v1pb.WriteRequest.FromString(want[1]).metadata]
    assert families == [("lat", 3), ("up", 2)]


def test_native_histograms_as_protobuf_writes_them_are_copied_without_start_timestamp_in_c() -> None:
    h = v2pb.Histogram(count_int=0, sum=-0.0, schema=-3, zero_threshold=1e-128, zero_count_float=0.0,
                       positive_spans=[v2pb.BucketSpan(offset=-2, length=3), v2pb.BucketSpan()],
                       positive_deltas=[1, -1, 0], negative_counts=[0.0, 2.5], custom_values=[0.1],
                       reset_hint=cast(Any, 3), timestamp=-7, start_timestamp=99)
    req = v2pb.Request(symbols=["", "__name__", "h"])
    req.timeseries.add(labels_refs=[1, 2], histograms=[h, v2pb.Histogram()])
    want, own = check_same(req.SerializeToString())
    assert own is not None and want[2] == wire_v2.V2Counts(0, 2, 0)


# ---- malformed requests ------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_a_truncation_at_every_position_gives_the_references_error(req: tuple[bytes, bool]) -> None:
    raw, _ = req
    for cut in range(len(raw)):
        check_same(raw[:cut])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.data())
def test_flipped_inserted_and_deleted_bytes_give_the_references_result(
        req: tuple[bytes, bool], data: st.DataObject) -> None:
    raw = bytearray(req[0])
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw)))
        how = data.draw(st.sampled_from(["flip", "insert", "delete", "set"]))
        if how == "insert":
            raw[at:at] = data.draw(st.sampled_from([b"\xff" * 11, b"\x80", b"\x0b", b"\x0c", b"\x1c", b"\x00",
                                                    b"\x2a\xff\xff\xff\xff\x0f", b"\x22\x05"]) | st.binary(max_size=4))
        elif at < len(raw) and how == "delete":
            del raw[at : at + data.draw(st.integers(1, 4))]
        elif at < len(raw) and how == "flip":
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif at < len(raw):
            raw[at] = data.draw(st.integers(0, 255))
    check_same(bytes(raw), data.draw(st.sampled_from([DEFAULT, 300])))


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(1, b"\x01\x05")), 400, "ref 5 out of range"),
        (f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(1, b"\x01")), 400, "odd count 1"),
        (f_len(4, b"x") + f_len(5, f_len(1, b"\x00\x00")), 400, "symbols[0] must be the empty string"),
        (f_len(4, b"") + f_len(4, b"\xff") + f_len(5, b""), 400, "malformed protobuf"),  # invalid UTF-8
        (f_len(4, b"") + f_len(4, b"\xed\xa0\x80") + f_len(5, b""), 400, "malformed protobuf"),  # a surrogate
        (f_len(4, b"") + f_len(4, b"\xe0\x80\xaf") + f_len(5, b""), 400, "malformed protobuf"),  # overlong
        (f_len(4, b"") + f_len(4, b"\xf4\x90\x80\x80") + f_len(5, b""), 400, "malformed protobuf"),  # > U+10FFFF
        (f_len(4, b"") + f_len(4, b"a\xc3") + f_len(5, b""), 400, "malformed protobuf"),  # cut in a character
        (f_len(4, b"") + f_len(5, f_len(1, b"\x80" * 10 + b"\x01")), 400, "malformed protobuf"),  # 11-byte varint
        (f_len(4, b"") + tag(5, 2) + encode_uvarint(2**40), 400, "malformed protobuf"),  # huge declared length
        (f_len(4, b"") + tag(5, 3), 400, "malformed protobuf"),  # a group start, never closed
        (tag(0, 0) + b"\x01", 400, "malformed protobuf"),  # field number 0
        (f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(1, b"\x01\x01") + f_len(4, f_len(1, b"\x01\x07"))), 400,
         "invalid exemplar labels_refs: ref 7"),
        (f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(1, b"\x01\x01") + f_len(5, f_varint(3, 9))), 400,
         "invalid metadata help_ref: ref 9"),
    ],
)
def test_known_bad_requests_give_the_references_error(raw: bytes, status: int, message: str) -> None:
    want, own = check_same(raw)
    assert want[0] == "WireError" and want[1] == status and message in want[2]
    assert own is None


@pytest.mark.parametrize(
    "raw",
    [
        f_len(4, b"") + f_len(4, b"a") + tag(5, 0) + b"\x01",  # timeseries as a varint
        f_len(4, b"") + tag(4, 0) + b"\x01",  # a symbol as a varint
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(1, b"\x01\x01") + tag(2, 0) + b"\x05"),  # sample as varint
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(2, tag(1, 0) + b"\x05")),  # value as a varint
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(2, tag(2, 1) + bytes(8))),  # timestamp as I64
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(5, b"") + f_len(5, f_varint(1, 2))),  # metadata twice
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(1, b"\x81\x00\x01")),  # a non-minimal ref varint
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(1, b"\x80\x80\x80\x80\x10\x01")),  # a ref past 32 bits
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(5, f_varint(1, 2**40 + 3))),  # type past 32 bits
        f_len(4, b"") + f_len(4, b"a") + f_len(5, f_len(5, f_varint(1, 2**32 - 2) + f_varint(3, 1))),  # negative type
        f_len(4, b"") + tag(7, 3) + tag(7, 4) + f_len(5, b""),  # an unknown group
    ],
)
def test_unusual_but_parsable_shapes_are_left_to_the_reference(raw: bytes) -> None:
    check_same(raw)


def test_a_31kb_request_that_would_become_105mb_is_413_without_the_memory() -> None:
    code = (
        "import resource, sys\n"
        "from relay.ingest import wire_v2\n"
        "from relay.common.protowire import WireError, encode_len\n"
        "refs = b'\\x01\\x02' * 10_500\n"
        "raw = (encode_len(4, b'') + encode_len(4, b'n') + encode_len(4, b'v' * 10_000)\n"
        "       + encode_len(5, encode_len(1, refs)))\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    wire_v2.v2_to_v1(raw, 32 << 20)\n"
        "except WireError as e:\n"
        "    print(len(raw), e.status, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, native.ENV: "1"})
    size, status, grew_kib = map(int, out.stdout.split())
    assert size < 32_000 and status == 413
    assert grew_kib < 48 * 1024  # the output bound is 32 MiB; 10,500 x 10 KB labels would be 105 MB


_SCRATCH_RSS = """
import os, sys
from relay.native import _crw2

def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

small = b"\\x22\\x00" + b"\\x22\\x01n"  # symbols "" and "n": the scratch arrays' usual size
assert _crw2.transcode(small, 1 << 20) == (b"", 0, 0, 0)
raw = b"\\x22\\x00" * (16 << 20) + bytes.fromhex(sys.argv[1])  # 32 MiB of empty symbols, then the tail
before = rss()
out = _crw2.transcode(raw, 64 << 20)
after = rss()
print("accepted" if out is not None else "refused", after - before)
"""


@pytest.mark.parametrize("tail, outcome", [
    ("", "accepted"),  # symbols only: an empty RW 1.0 request
    ("2a05", "refused"),  # a TimeSeries field cut short: the reference decides (and raises)
    ("2a020a01", "refused"),  # one label ref, not a (name, value) pair
])
def test_the_scratch_memory_of_a_request_of_32_mib_of_empty_symbols_comes_back(tail: str, outcome: str) -> None:
    out = subprocess.run([sys.executable, "-c", _SCRATCH_RSS, tail], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, native.ENV: "1"})
    result, grew = out.stdout.split()
    assert result == outcome
    assert int(grew) < 10 << 20, f"RSS grew by {int(grew) >> 20} MiB"  # 384 MiB of symbol scratch kept before


def test_the_c_entry_point_is_picked_at_import_and_the_switch_keeps_the_reference() -> None:
    assert _c is not None and wire_v2.v2_to_v1 is _c.v2_to_v1
    code = "from relay.ingest import wire_v2; print(wire_v2.v2_to_v1 is wire_v2.py_v2_to_v1)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, native.ENV: "0"})
    assert out.stdout.strip() == "True"


def test_arguments_the_c_code_does_not_take_go_to_the_reference() -> None:
    raw = v2pb.Request(symbols=["", "a"]).SerializeToString()
    assert _c is not None
    assert _c.transcode(bytearray(raw), DEFAULT) is None and _c.transcode(raw, -1) is None
    assert wire_v2.v2_to_v1(raw) == wire_v2.py_v2_to_v1(raw)  # the default max_bytes
    assert outcome(wire_v2.v2_to_v1, raw, -1) == outcome(wire_v2.py_v2_to_v1, raw, -1)
    assert _c.transcode(raw, 2**80) == (b"", 0, 0, 0)


@settings(max_examples=30, deadline=None)
@given(st.permutations(range(1, 41)), st.booleans())
def test_long_label_sets_in_any_order_are_sorted_as_the_reference_does(order: list[int], duplicate: bool) -> None:
    """Past 32 labels the C code sorts with qsort (no quadratic insertion sort on hostile input)."""
    symbols = ["", *(f"n{i:02d}" for i in range(1, 41)), "v"]
    refs = [r for n in order for r in (n, 41)]
    if duplicate:
        refs += [order[0], 0]
    req = v2pb.Request(symbols=symbols)
    req.timeseries.add(labels_refs=refs).samples.add(value=1.0, timestamp=1)
    want, own = check_same(req.SerializeToString())
    assert want[0] == "ok" and (own is None) == duplicate


def test_a_hostile_label_set_of_100000_reversed_labels_takes_no_quadratic_time() -> None:
    symbols = ["", *(f"{i:06d}" for i in range(100_000))]
    req = v2pb.Request(symbols=symbols)
    req.timeseries.add(labels_refs=[r for i in range(100_000, 0, -1) for r in (i, i)])
    raw = req.SerializeToString()
    assert _c is not None
    t = time.perf_counter()
    own = _c.transcode(raw, DEFAULT)
    assert time.perf_counter() - t < 2.0  # insertion sort: 5e9 comparisons, minutes
    assert own is not None and own[0] == wire_v2.py_v2_to_v1(raw)[0]
