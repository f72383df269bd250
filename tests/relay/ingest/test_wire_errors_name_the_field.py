"""A malformed remote-write body is a 400 whose one line names the field (issue 20 point 12, "every
malformed field of RW 1.0/2.0 is a 400 naming the field"): ``malformed protobuf at
Request.timeseries[1].samples[0].timestamp (byte 57): truncated varint``.

Table rows post snappy bodies built by hand, field by field, through the write endpoint
(``relay.control.service.Runtime.write``): the status, the path and the reason. The locator
(relay.ingest.wire_locate) is checked against the parsers it speaks for, on bodies built by
tests/relay/ingest/wire_fields.py's strategies (valid and hostile) and on valid bodies cut short or
with one byte changed: it never raises, finds nothing in what the parser takes, names a path of the
schema, and for RW 2.0 finds something exactly where protobuf's parser refuses. Run in both core
modes (and with ``GPU_RELAY_NATIVE=0``): the C twins hand every refusal to the Python reference.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
import snappy
import zstandard
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.common.protowire import WireError, encode_int64, encode_len, encode_uvarint
from relay.config.config import load_config
from relay.control.service import Runtime
from relay.ingest import wire, wire_errors, wire_v2
from relay.ingest.wire_locate import LOCATE_MAX_BYTES, Location, locate_v1, schema_fields
from relay.ingest.wire_locate_v2 import locate_v2
from relay.proto import remote_v2_pb2 as v2pb
from tests.relay.ingest import wire_fields as wf

U64 = 1 << 64
TS = int(time.time() * 1000)
DOUBLE = struct.Struct("<d")
V1_TYPE = "application/x-protobuf"
V2_TYPE = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
SEMANTIC_V1 = ("empty label name", "duplicate label name", "malformed protobuf: Histogram has",
               "malformed protobuf: Histogram span")  # what the RW 1.0 route refuses beyond wire format
SLOW = settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """One destination, never started: what is accepted stays queued."""
    tmp = tmp_path_factory.mktemp("named")
    path = tmp / "relay.yaml"
    path.write_text(
        "server: {listen: '127.0.0.1:9201'}\n"
        f"storage: {{path: {tmp / 'queues'}}}\n"
        "destinations:\n  - name: all\n    url: http://127.0.0.1:1/api/v1/write\n"
    )
    rt = Runtime(str(path), load_config(path))
    yield rt
    rt.stop()


def post(rt: Runtime, version: int, raw: bytes, encoding: str = "snappy") -> tuple[int, str]:
    body = bytes(snappy.compress(raw)) if encoding == "snappy" else zstandard.ZstdCompressor().compress(raw)
    reply = rt.write({"content-type": V1_TYPE if version == 1 else V2_TYPE, "content-encoding": encoding}, body)
    text = reply.body.decode()
    assert text.count("\n") <= 1 and text.endswith("\n") == bool(text), text  # one line
    return reply.status, text.rstrip("\n")


# ---- RW 1.0 bodies --------------------------------------------------------------------------------


def label(name: bytes, value: bytes) -> bytes:
    return encode_len(1, encode_len(1, name) + encode_len(2, value))


def sample(value: float = 1.0, ts: int = TS) -> bytes:
    return encode_len(2, b"\x09" + DOUBLE.pack(value) + b"\x10" + encode_int64(ts))


def series(*entries: bytes) -> bytes:
    return encode_len(1, b"".join(entries))


NAME = label(b"__name__", b"DCGM_FI_DEV_GPU_UTIL")
GOOD = series(NAME, label(b"gpu", b"0"), sample())  # every body starts with it: the bad series is [1]
SPAN1 = encode_len(11, b"\x10\x01")  # a positive span of one bucket
HISTOGRAM = b"\x08\x01" + b"\x19" + DOUBLE.pack(2.0) + b"\x78" + encode_int64(TS)  # count 1, sum 2, timestamp


V1_CASES: list[tuple[str, bytes, str, str]] = [  # id, the body after GOOD, the path, the reason
    ("cut short", GOOD[:-3], "WriteRequest.timeseries[1]", "TimeSeries past the end of the request"),
    ("sample value as a varint", series(NAME, encode_len(2, b"\x08\x01")),
     "WriteRequest.timeseries[1].samples[0].value", "Sample field 1 with wire type 0"),
    ("sample timestamp as a double", series(NAME, encode_len(2, b"\x11" + DOUBLE.pack(1.0))),
     "WriteRequest.timeseries[1].samples[0].timestamp", "Sample field 2 with wire type 1"),
    ("second sample's timestamp varint cut", series(NAME, sample(), encode_len(2, b"\x09" + bytes(8) + b"\x10\xff")),
     "WriteRequest.timeseries[1].samples[1].timestamp", "truncated varint"),
    ("timestamp varint over 10 bytes", series(NAME, encode_len(2, b"\x10" + b"\xff" * 10 + b"\x01")),
     "WriteRequest.timeseries[1].samples[0].timestamp", "varint longer than 10 bytes"),
    ("timestamp varint over 64 bits", series(NAME, encode_len(2, b"\x10" + b"\xff" * 9 + b"\x02")),
     "WriteRequest.timeseries[1].samples[0].timestamp", "varint overflows 64 bits"),
    ("sample value cut", series(NAME, encode_len(2, b"\x09\x00\x00\x00"), sample()),
     "WriteRequest.timeseries[1].samples[0].value", "field past the end of the message"),
    ("sample longer than its series", series(NAME, b"\x12\x05\x09"),
     "WriteRequest.timeseries[1].samples[0]", "length past the end of the message"),
    ("field number 0 in a sample", series(NAME, encode_len(2, b"\x00\x01")),
     "WriteRequest.timeseries[1].samples[0].#0", "field number 0"),
    ("a group in a series", series(NAME, sample(), b"\x2b"),
     "WriteRequest.timeseries[1].#5", "unsupported wire type 3"),
    ("label value invalid UTF-8", series(NAME, label(b"gpu", b"\xc3\x28"), sample()),
     "WriteRequest.timeseries[1].labels[1].value", "invalid UTF-8 in the value of label 'gpu'"),
    ("label name invalid UTF-8", series(label(b"g\xff", b"0"), NAME, sample()),
     "WriteRequest.timeseries[1].labels[0].name", "invalid UTF-8 in a label name"),
    ("label name as a varint", series(NAME, encode_len(1, b"\x08\x01"), sample()),
     "WriteRequest.timeseries[1].labels[1].name", "Label field 1 with wire type 0"),
    ("label cut inside", series(NAME, encode_len(1, b"\x0a\x09gpu"), sample()),
     "WriteRequest.timeseries[1].labels[1].name", "length past the end of the message"),
    ("empty label name", series(NAME, label(b"", b"0"), sample()),
     "WriteRequest.timeseries[1].labels[1]", "empty label name"),
    ("duplicate label name", series(NAME, label(b"gpu", b"0"), label(b"gpu", b"1"), sample()),
     "WriteRequest.timeseries[1].labels", "duplicate label name 'gpu'"),
    ("exemplar label value invalid UTF-8",
     series(NAME, sample(), encode_len(3, encode_len(1, encode_len(1, b"trace_id") + encode_len(2, b"\xff")))),
     "WriteRequest.timeseries[1].exemplars[0].labels[0].value", "invalid UTF-8 in an exemplar label value"),
    ("exemplar timestamp as a double", series(NAME, encode_len(3, b"\x19" + DOUBLE.pack(1.0))),
     "WriteRequest.timeseries[1].exemplars[0].timestamp", "Exemplar field 3 with wire type 1"),
    ("histogram sum as a varint", series(NAME, encode_len(4, b"\x18\x01")),
     "WriteRequest.timeseries[1].histograms[0].sum", "Histogram field 3 with wire type 0"),
    ("histogram packed deltas cut", series(NAME, encode_len(4, HISTOGRAM + SPAN1 + encode_len(12, b"\x80"))),
     "WriteRequest.timeseries[1].histograms[0].positive_deltas",
     "truncated varint at the end of a Histogram packed field"),
    ("histogram packed counts of 7 bytes",
     series(NAME, encode_len(4, b"\x11" + DOUBLE.pack(1.0) + SPAN1 + encode_len(13, bytes(7)))),
     "WriteRequest.timeseries[1].histograms[0].positive_counts", "Histogram field 13: packed doubles of 7 bytes"),
    ("histogram span length as a double", series(NAME, encode_len(4, encode_len(11, b"\x11" + DOUBLE.pack(1.0)))),
     "WriteRequest.timeseries[1].histograms[0].positive_spans[0].length", "BucketSpan field 2 with wire type 1"),
    ("histogram spans for 1 bucket, no delta", series(NAME, encode_len(4, HISTOGRAM + SPAN1)),
     "WriteRequest.timeseries[1].histograms[0]", "Histogram has 1 positive buckets in spans but 0 deltas"),
    ("metadata help invalid UTF-8", encode_len(3, b"\x08\x01" + encode_len(2, b"m") + encode_len(4, b"\xff")),
     "WriteRequest.metadata[0].help", "invalid UTF-8 in MetricMetadata field 4"),
    ("metadata type as bytes", encode_len(3, encode_len(1, b"")),
     "WriteRequest.metadata[0].type", "MetricMetadata field 1 with wire type 2"),
    ("timeseries as a varint", b"\x08\x01", "WriteRequest.timeseries", "WriteRequest field 1 with wire type 0"),
    ("top-level field numbered past 2^29-1", encode_uvarint(1 << 32) + b"\x01",
     "WriteRequest.#536870912", "field number 536870912"),
]


@pytest.mark.parametrize(("bad", "path", "reason"), [c[1:] for c in V1_CASES], ids=[c[0] for c in V1_CASES])
def test_rw1_malformed_field_is_a_400_naming_it(runtime: Runtime, bad: bytes, path: str, reason: str) -> None:
    status, text = post(runtime, 1, GOOD + bad)
    assert status == 400
    assert f" at {path} (byte " in text and reason in text, text


def test_rw1_text_gives_path_byte_and_reason_in_one_line(runtime: Runtime) -> None:
    bad = series(NAME, sample(), encode_len(2, b"\x09" + bytes(8) + b"\x10\xff"))
    at = len(GOOD + bad) - 2  # the timestamp's tag, then its first byte, the body's last
    assert post(runtime, 1, GOOD + bad) == (
        400, f"malformed protobuf at WriteRequest.timeseries[1].samples[1].timestamp (byte {at}): truncated varint")
    assert post(runtime, 1, GOOD + series(NAME, label(b"gpu", b"0"), label(b"gpu", b"1")), "zstd") == (
        400, f"duplicate label name 'gpu' at WriteRequest.timeseries[1].labels (byte {len(GOOD) + 2})")


# ---- RW 2.0 bodies --------------------------------------------------------------------------------

SYMBOLS = ["", "__name__", "DCGM_FI_DEV_GPU_UTIL", "gpu", "0", "help"]
REFS = b"\x01\x02\x03\x04"


def v2_sample() -> bytes:
    return encode_len(2, b"\x09" + DOUBLE.pack(1.0) + b"\x10" + encode_int64(TS))


def v2_series(*entries: bytes, refs: bytes = REFS) -> bytes:
    return encode_len(5, encode_len(1, refs) + b"".join(entries))


def v2_body(*tail: bytes, symbols: list[bytes] | None = None) -> bytes:
    """The symbols, one good series (timeseries[0]), then ``tail``."""
    table = symbols if symbols is not None else [s.encode() for s in SYMBOLS]
    return b"".join(encode_len(4, s) for s in table) + v2_series(v2_sample()) + b"".join(tail)


V2_CASES: list[tuple[str, bytes, str, str]] = [  # id, the body, the path, the reason
    ("cut short", v2_body(v2_series(v2_sample())[:-2]), "Request.timeseries[1]", "length past the end of the message"),
    ("timestamp varint cut", v2_body(v2_series(encode_len(2, b"\x10\xff"))),
     "Request.timeseries[1].samples[0].timestamp", "truncated varint"),
    ("timestamp varint over 10 bytes", v2_body(v2_series(encode_len(2, b"\x10" + b"\xff" * 10 + b"\x01"))),
     "Request.timeseries[1].samples[0].timestamp", "varint longer than 10 bytes"),
    ("sample value cut", v2_body(v2_series(encode_len(2, b"\x09\x00\x00\x00"))),
     "Request.timeseries[1].samples[0].value", "truncated fixed64"),
    ("unknown fixed32 cut", v2_body(v2_series(v2_sample(), b"\x4d\x00\x00")),
     "Request.timeseries[1].#9", "truncated fixed32"),
    ("symbol invalid UTF-8", v2_body(symbols=[s.encode() for s in SYMBOLS] + [b"a\xc3"]),
     "Request.symbols[6]", "invalid UTF-8"),
    ("packed labels_refs cut", v2_body(v2_series(v2_sample(), refs=b"\x01\x02\x03\x84")),
     "Request.timeseries[1].labels_refs[3]", "truncated varint"),
    ("packed counts of 7 bytes",
     v2_body(v2_series(encode_len(3, b"\x11" + DOUBLE.pack(1.0) + encode_len(13, bytes(7))))),
     "Request.timeseries[1].histograms[0].positive_counts", "packed field of 7 bytes, not a multiple of 8"),
    ("field number 0", v2_body(b"\x00\x01"), "Request.#0", "field number 0"),
    ("tag over 32 bits", v2_body(b"\x80\x80\x80\x80\x10\x01"), "Request", "tag over 32 bits"),
    ("tag over 5 bytes", v2_body(b"\xc8\x80\x80\x80\x80\x00\x01"), "Request", "varint longer than 5 bytes"),
    ("wire type 6", v2_body(v2_series(v2_sample(), b"\x4e")), "Request.timeseries[1].#9", "invalid wire type 6"),
    ("end-group alone", v2_body(v2_series(v2_sample(), b"\x4c")), "Request.timeseries[1].#9",
     "end-group tag without a start-group tag"),
    ("group not closed", v2_body(v2_series(b"\x4b", v2_sample())), "Request.timeseries[1].#9",
     "group not closed before the end of its message"),
    ("groups 101 deep", v2_body(b"\x4b" * 101 + b"\x4c" * 101), "Request.#9", "groups nested deeper than 100 levels"),
    ("metadata type read negative", v2_body(v2_series(v2_sample(), encode_len(5, b"\x08" + encode_uvarint(U64 - 1)))),
     "Request.timeseries[1].metadata.type", "invalid metadata type -1: TimeSeries.metadata.type must be 0-7"),
    ("labels_refs out of range", v2_body(v2_series(v2_sample(), refs=b"\x01\x02\x03\x09")),
     "Request.timeseries[1].labels_refs", "invalid series labels_refs: ref 9 out of range (6 symbols)"),
    ("labels_refs of odd count", v2_body(v2_series(v2_sample(), refs=b"\x01\x02\x03")),
     "Request.timeseries[1].labels_refs", "odd count 3"),
    ("exemplar ref out of range",
     v2_body(v2_series(v2_sample(), encode_len(4, encode_len(1, b"\x03\x04")),
                       encode_len(4, encode_len(1, b"\x03\x07")))),
     "Request.timeseries[1].exemplars[1].labels_refs", "invalid exemplar labels_refs: ref 7"),
    ("metadata help_ref out of range", v2_body(v2_series(v2_sample(), encode_len(5, b"\x08\x02\x18\x63"))),
     "Request.timeseries[1].metadata.help_ref", "invalid metadata help_ref: ref 99"),
    ("duplicate label name", v2_body(v2_series(v2_sample(), refs=REFS + b"\x03\x04")),
     "Request.timeseries[1].labels_refs", "duplicate label name 'gpu'"),
    ("empty label name", v2_body(v2_series(v2_sample(), refs=b"\x01\x02\x00\x04")),
     "Request.timeseries[1].labels_refs", "empty label name"),
]


@pytest.mark.parametrize(("raw", "path", "reason"), [c[1:] for c in V2_CASES], ids=[c[0] for c in V2_CASES])
def test_rw2_malformed_field_is_a_400_naming_it(runtime: Runtime, raw: bytes, path: str, reason: str) -> None:
    status, text = post(runtime, 2, raw)
    assert status == 400
    assert (f" at {path} (byte " if text.startswith("malformed protobuf") else f" at {path}") in text, text
    assert reason in text, text
    assert outcome(lambda: wire_v2.v2_to_v1(raw)) == outcome(lambda: wire_v2.py_v2_to_v1(raw))  # C twin: same


def test_rw2_text_gives_path_byte_and_reason_in_one_line(runtime: Runtime) -> None:
    raw = v2_body(v2_series(encode_len(2, b"\x10\xff")))
    at = len(raw) - 2
    assert post(runtime, 2, raw) == (
        400, f"malformed protobuf at Request.timeseries[1].samples[0].timestamp (byte {at}): truncated varint")


@pytest.mark.parametrize("version", [1, 2])
def test_a_refused_body_over_the_locate_bound_is_not_walked_and_says_so(runtime: Runtime, version: int) -> None:
    """The walk that names the field costs a few times the parse: a body over LOCATE_MAX_BYTES keeps the
    parser's refusal and says why it names no field, so large malformed bodies cost no more than valid ones."""
    if version == 1:
        good = GOOD * (LOCATE_MAX_BYTES // len(GOOD) + 1)
        raw, bad = good + series(NAME, encode_len(2, b"\x10\xff")), "truncated varint"
    else:
        one = v2_series(v2_sample())
        raw = v2_body(one * (LOCATE_MAX_BYTES // len(one) + 1), v2_series(encode_len(2, b"\x10\xff")))
        bad = "not a valid io.prometheus.write.v2.Request"
    assert len(raw) > LOCATE_MAX_BYTES
    status, text = post(runtime, version, raw)
    assert status == 400
    assert bad in text and " at " not in text, text
    assert text.endswith(f"(not located: the body has {len(raw)} bytes, over {LOCATE_MAX_BYTES >> 20} MiB)"), text
    if version == 1:  # a body just under the bound, its last series cut short: located again
        n = (LOCATE_MAX_BYTES - len(GOOD)) // len(GOOD)
        status, text = post(runtime, 1, GOOD * n + GOOD[:-3])
        assert (status, f" at WriteRequest.timeseries[{n}] " in text) == (400, True), text


def outcome(fn: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn())
    except WireError as e:
        return (e.status, e.message)


@pytest.mark.parametrize("raw", [
    v2_body(b"\x4b" * 100 + b"\x4c" * 100),  # as deep as protobuf goes
    v2_body(v2_series(v2_sample(), b"\x28\x01")),  # metadata as a varint: an unknown field to protobuf
    v2_body(v2_series(v2_sample(), encode_len(5, b"\x08\x08\x18\x05"))),  # metadata type past the enum
    v2_body(v2_series(v2_sample(), encode_len(3, HISTOGRAM + b"\x70\x63"))),  # reset_hint 99
    v2_body(v2_series(encode_len(2, b"\x09" + DOUBLE.pack(1.0) + b"\x10" + b"\xff" * 9 + b"\x7f"))),  # bits past 64
], ids=["groups 100 deep", "known field, other wire type", "metadata type 8", "reset hint 99", "varint bits past 64"])
def test_rw2_what_protobuf_and_the_relay_accept_stays_accepted(runtime: Runtime, raw: bytes) -> None:
    assert locate_v2(raw) is None
    assert post(runtime, 2, raw)[0] == 204


def test_valid_bodies_answer_as_before_without_location_text(runtime: Runtime) -> None:
    for version, raw in ((1, GOOD + series(NAME, sample())), (2, v2_body(v2_series(v2_sample())))):
        assert post(runtime, version, raw) == (204, "")
    assert locate_v1(GOOD) is None and locate_v2(v2_body()) is None


# ---- the locator against the parsers ------------------------------------------------------------

SEGMENT = re.compile(r"(?:([a-z_]+)(?:\[(\d+)\])?|#(\d+))")


def assert_schema_path(version: int, location: Location) -> None:
    """Every name in the path is a field of the message before it; ``#N`` only last."""
    root, *parts = location.path.split(".")
    top = schema_fields(version, ())
    assert top is not None and root == top[0], location
    names: tuple[str, ...] = ()
    fields = top[1]
    for i, part in enumerate(parts):
        m = SEGMENT.fullmatch(part)
        assert m is not None, location
        if m[3] is not None or i == len(parts) - 1:
            assert m[3] is not None or m[1] in fields.values(), location
            return
        assert m[1] in fields.values(), location
        names = (*names, m[1])
        sub = schema_fields(version, names)
        assert sub is not None, location  # only a message field has more below it
        fields = sub[1]
    assert location.offset >= 0 and location.reason, location


def v1_route_error(raw: bytes) -> WireError | None:
    """The RW 1.0 reference route's refusal of ``raw`` (labels decoded as decide() decodes them)."""
    def decide(key: bytes) -> wire.Decision:
        wire.decode_labels(key)
        return ((key, 0, ""),)
    try:
        wire._route_loop(raw, {}, decide, [[]], [])
    except WireError as e:
        return e
    return None


def v1_refusal(raw: bytes) -> str | None:
    error = v1_route_error(raw)
    return None if error is None else error.message


def v2_refused(raw: bytes) -> bool:
    """protobuf's parser refuses ``raw``, or the relay refuses its metadata type (read negative)."""
    try:
        request = v2pb.Request.FromString(raw)
    except DecodeError:
        return True
    return any(ts.HasField("metadata") and ts.metadata.type < 0 for ts in request.timeseries)


def check_v1(raw: bytes) -> None:
    found = locate_v1(raw)
    refusal = v1_refusal(raw)
    if found is not None:
        assert_schema_path(1, found)
        assert refusal is not None, found  # never a spot the relay takes
    elif refusal is not None:
        assert refusal.startswith(SEMANTIC_V1), refusal  # every wire-format refusal is found


def check_v2(raw: bytes) -> None:
    found = locate_v2(raw)
    if found is not None:
        assert_schema_path(2, found)
    assert (found is not None) == v2_refused(raw), found  # exactly where protobuf (or the relay) refuses


@st.composite
def valid_v1(draw: st.DrawFn) -> bytes:
    """wire_fields' RW 1.0 bodies with nothing hostile: what a correct sender sends."""
    g = wf.Gen(draw, 0)
    out: list[bytes] = []
    for _ in range(draw(st.integers(1, 3))):
        wf.put(g, out, 1, wf.LEN, wf.v1_series(g))
    if draw(st.booleans()):
        wf.put(g, out, 3, wf.LEN, wf.v1_metadata(g))
    return wf.message(g, out)


@st.composite
def valid_v2(draw: st.DrawFn) -> bytes:
    g = wf.Gen(draw, 0)
    n = draw(st.integers(1, 3))
    symbols = [b"", b"__name__", b"job", b"gpu", *wf.METRICS[:2], *wf.VALUES[:3]]
    series_ = [wf.v2_series(g, len(symbols), range(2, 4), range(4, len(symbols))) for _ in range(n)]
    return b"".join(encode_len(4, s) for s in symbols) + b"".join(encode_len(5, s) for s in series_)


@st.composite
def damaged(draw: st.DrawFn, bodies: st.SearchStrategy[bytes]) -> bytes:
    """A valid body cut short or with one byte changed."""
    raw = draw(bodies)
    at = draw(st.integers(0, max(0, len(raw) - 1)))
    if draw(st.booleans()) or not raw:
        return raw[:at]
    return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]


@SLOW
@given(raw=valid_v1())
def test_locator_finds_nothing_in_valid_rw1_bodies(raw: bytes) -> None:
    assert locate_v1(raw) is None
    refusal = v1_refusal(raw)  # (wire_fields may order a histogram's spans so that one has a negative offset)
    assert refusal is None or refusal.startswith(SEMANTIC_V1), refusal


@SLOW
@given(raw=valid_v2())
def test_locator_finds_nothing_in_valid_rw2_bodies(raw: bytes) -> None:
    assert not v2_refused(raw) and locate_v2(raw) is None


@SLOW
@given(raw=damaged(valid_v1()))
def test_locator_on_a_damaged_rw1_body_agrees_with_the_route(raw: bytes) -> None:
    check_v1(raw)


@SLOW
@given(raw=damaged(valid_v2()))
def test_locator_on_a_damaged_rw2_body_agrees_with_protobuf(raw: bytes) -> None:
    check_v2(raw)


@SLOW
@given(raw=wf.v1_requests())
def test_locator_on_hostile_rw1_bodies_agrees_with_the_route(raw: bytes) -> None:
    check_v1(raw)


@SLOW
@given(raw=wf.v2_requests())
def test_locator_on_hostile_rw2_bodies_agrees_with_protobuf(raw: bytes) -> None:
    check_v2(raw)


WORDED = re.compile(r"malformed protobuf at (?P<p1>\S+) \(byte (?P<b1>\d+)\): (?P<reason>.+)"
                    r"|(?P<message>.+) at (?P<p2>\S+) \(byte (?P<b2>\d+)\)")


@SLOW
@given(raw=wf.v1_requests())
def test_a_refused_rw1_body_keeps_the_routes_reason_and_names_a_field_of_the_schema(raw: bytes) -> None:
    error = v1_route_error(raw)
    if error is None:
        return
    worded = wire_errors.route_error(error, raw, 1)
    m = WORDED.fullmatch(worded.message)
    assert worded.status == 400 and m is not None, worded.message
    if m["reason"] is not None:
        assert "malformed protobuf: " + m["reason"] == error.message  # the route's own words
    else:
        assert m["message"] == error.message
    path, at = m["p1"] or m["p2"], int(m["b1"] or m["b2"])
    assert_schema_path(1, Location(path, at, "-"))
    assert 0 <= at < len(raw)


def test_long_bodies_name_the_element_by_its_index(runtime: Runtime) -> None:
    """Past the runs the RW 2.0 locator hands to protobuf whole: indices still count from the start."""
    many = [f"v{i}".encode() for i in range(700)]
    symbols = [s.encode() for s in SYMBOLS] + many
    good = v2_series(v2_sample())
    bad_symbol = [*symbols[:600], b"\xc0\x80", *symbols[600:]]  # an overlong NUL
    status, text = post(runtime, 2, b"".join(encode_len(4, s) for s in bad_symbol) + good)
    assert status == 400 and " at Request.symbols[600] (byte " in text, text
    negative = v2_series(v2_sample(), encode_len(5, b"\x08" + encode_uvarint(U64 - 2)))
    body = v2_body(*[good] * 299, negative, *[good] * 400)
    assert locate_v2(body) == Location("Request.timeseries[300].metadata.type", body.index(negative) + 28,
                                       "negative enum value -2")
    status, text = post(runtime, 2, body)
    assert (status, text) == (
        400, "invalid metadata type -2: TimeSeries.metadata.type must be 0-7 at Request.timeseries[300].metadata.type")
    head = v2_body(*[good] * 299, negative, *[good] * 300)
    cut = head + v2_series(encode_len(2, b"\x10\xff")) + good * 10  # a wire error counts first
    assert locate_v2(cut) == Location("Request.timeseries[601].samples[0].timestamp", len(head) + 10,
                                      "truncated varint")
    v1 = GOOD * 300 + series(NAME, encode_len(2, b"\x08\x01")) + GOOD * 5
    status, text = post(runtime, 1, v1)
    assert (status, text) == (400, f"malformed protobuf at WriteRequest.timeseries[300].samples[0].value "
                                   f"(byte {len(GOOD) * 300 + 2 + len(NAME) + 2}): Sample field 1 with wire type 0")
    dup = series(NAME, label(b"gpu", b"0"), label(b"gpu", b"1"), sample())  # refused by decide(), after the C pass
    assert post(runtime, 1, GOOD * 300 + dup + GOOD) == (
        400, f"duplicate label name 'gpu' at WriteRequest.timeseries[300].labels (byte {len(GOOD) * 300 + 2})")
