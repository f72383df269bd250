"""relay.native._cwire against its Python reference: route_loop must give wire._route_loop's results for
every input (per-destination entries, metadata, counts, the keys passed to decide and in which order,
the cache, every cache and list call) or raise the same error (type, status, message); series_id
must be hashlib's BLAKE2b-64. Runs whenever the module is built; skipped only with GPU_RELAY_NATIVE=0.

RELAY_FUZZ_EXAMPLES sets the examples per hypothesis test (default 300).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay import native
from relay.common.protowire import WireError, encode_int64, encode_len, encode_uvarint
from relay.ingest import wire
from relay.proto import remote_v1_pb2 as v1pb
from tests.relay.ingest.test_wire_fuzz import mutate

if native.disabled():
    pytest.skip("GPU_RELAY_NATIVE=0: the pure-Python reference only", allow_module_level=True)
cwire: Any = importlib.import_module("relay.native._cwire")  # not built: a failure (run scripts/setup.sh)

EXAMPLES = int(os.environ.get("RELAY_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
STALE_NAN = struct.pack("<Q", 0x7FF0000000000002)
Loop = Callable[..., Any]


# ---- requests, byte by byte ----------------------------------------------------------------------


def lenfield(tag: int, payload: bytes, pad: int = 0) -> bytes:
    """A LEN field; ``pad`` > 0 writes its length as a non-canonical varint of that many extra bytes."""
    n = encode_uvarint(len(payload))
    if pad:
        n = bytes(b | 0x80 for b in n) + b"\x80" * (pad - 1) + b"\x00"
    return bytes((tag,)) + n + payload


def label(name: bytes, value: bytes) -> bytes:
    return encode_len(1, encode_len(1, name) + encode_len(2, value))


NAMES = [b"__name__", b"job", b"instance", b"gpu", b"pod", b"a", b"\xc3\xa9t\xc3\xa9", b""]
VALUES = [b"DCGM_FI_DEV_GPU_UTIL", b"node_cpu_seconds_total", b"0", b"1", b"10.0.0.1:9400", b"", b"x" * 200,
          b"\xe2\x82\xac", b"\xff"]
TIMESTAMPS = [0, 1, 1_700_000_000_000, 1_700_000_015_000, -1, -1_700_000_000_000, 2**62, 2**63 - 1, -(2**63)]


@st.composite
def label_sets(draw: st.DrawFn) -> bytes:
    pairs = draw(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=5))
    return b"".join(label(n, v) for n, v in pairs)


@st.composite
def samples(draw: st.DrawFn) -> bytes:
    value = draw(st.sampled_from([bytes(8), STALE_NAN, struct.pack("<d", 1.5), b"\xff" * 8, struct.pack("<d", -0.0)]))
    ts = draw(st.sampled_from(TIMESTAMPS))
    shape = draw(st.sampled_from(["usual", "usual", "usual", "ts first", "no ts", "no value", "unknown field",
                                  "long ts", "ten-byte ts"]))
    if shape == "usual":
        return encode_len(2, b"\x09" + value + b"\x10" + encode_int64(ts))
    if shape == "ts first":
        return encode_len(2, b"\x10" + encode_int64(ts) + b"\x09" + value)
    if shape == "no ts":
        return encode_len(2, b"\x09" + value)
    if shape == "no value":
        return encode_len(2, b"\x10" + encode_int64(ts))
    if shape == "long ts":  # a non-canonical varint timestamp (protobuf reads it)
        return encode_len(2, b"\x09" + value + b"\x10" + bytes(b | 0x80 for b in encode_int64(ts)[:1]) + b"\x00")
    if shape == "ten-byte ts":  # the 10th byte may only be 0 or 1 (64 bits): 2 and up overflow, a 400
        return encode_len(2, b"\x09" + value + b"\x10" + b"\xff" * 9 + bytes((draw(st.sampled_from([0, 1, 2, 0x7F])),)))
    return encode_len(2, b"\x09" + value + b"\x10" + encode_int64(ts) + b"\x28\x07")


@st.composite
def exemplars(draw: st.DrawFn) -> bytes:
    ex = v1pb.Exemplar(value=draw(st.floats(allow_nan=True)), timestamp=draw(st.sampled_from(TIMESTAMPS)))
    for name in draw(st.lists(st.sampled_from(["trace_id", "span_id", "é"]), max_size=2)):
        ex.labels.add(name=name, value=draw(st.sampled_from(["abc", "", "ü"])))
    return encode_len(3, ex.SerializeToString())


@st.composite
def histograms(draw: st.DrawFn) -> bytes:
    h = v1pb.Histogram(schema=draw(st.integers(-4, 8)), sum=1.0, timestamp=draw(st.sampled_from(TIMESTAMPS)))
    is_float = draw(st.booleans())
    for sign in ("negative", "positive"):
        lengths = draw(st.lists(st.integers(0, 3), max_size=3))
        spans = getattr(h, f"{sign}_spans")
        for i, length in enumerate(lengths):
            spans.add(offset=draw(st.integers(-3 if i == 0 or draw(st.booleans()) else 0, 3)), length=length)
        n = sum(lengths) + draw(st.sampled_from([0, 0, 0, 0, 1]))  # sometimes one too many: a 400
        if is_float:
            getattr(h, f"{sign}_counts").extend([1.0] * n)
        else:
            getattr(h, f"{sign}_deltas").extend(draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n)))
    if is_float:
        h.count_float = 2.0
    else:
        h.count_int = 2
    return encode_len(4, h.SerializeToString())


@st.composite
def metadata_entries(draw: st.DrawFn) -> bytes:
    md = v1pb.MetricMetadata(type=draw(st.integers(0, 7)), metric_family_name=draw(st.sampled_from(["m", "é", ""])),
                             help=draw(st.sampled_from(["help text", ""])), unit=draw(st.sampled_from(["", "bytes"])))
    return encode_len(3, md.SerializeToString())


@st.composite
def series_entries(draw: st.DrawFn, plain: bool = False) -> bytes:
    """One TimeSeries entry; ``plain``: only the shape the C loop handles itself (labels first)."""
    labels = draw(label_sets())
    if not plain:
        parts = draw(st.lists(st.one_of(samples(), exemplars(), histograms()), max_size=4))
    else:
        parts = [encode_len(2, b"\x09" + draw(st.sampled_from([bytes(8), STALE_NAN, b"\x01" * 8]))
                            + b"\x10" + encode_int64(draw(st.sampled_from(TIMESTAMPS))))
                 for _ in range(draw(st.integers(0, 3)))]
        if draw(st.booleans()):
            parts.append(draw(exemplars()))
    body = labels + b"".join(parts)
    odd = "" if plain else draw(st.sampled_from(["", "", "", "", "labels last", "unknown field", "long length"]))
    if odd == "labels last":
        body = b"".join(parts) + labels
    elif odd == "unknown field":
        body += b"\x28\x05"
    return lenfield(0x0A, body, pad=2 if odd == "long length" else 0)


# Other WriteRequest fields: skipped when well formed; field 0 and groups are a 400.
OTHER_TOP_LEVEL = [b"\x10\x05", b"\x21" + bytes(8), encode_len(5, b"xyz"), b"\x2d\x00\x00\x00\x00", b"\x00", b"\x0b"]
MUTATIONS = ["truncate", "flip", "insert", "delete", "huge length", "bad varint", "wrong wire type"]


@st.composite
def requests(draw: st.DrawFn, plain: bool = False) -> bytes:
    """An RW 1.0 WriteRequest; series repeat (cache hits, the one-sample guess) with new samples."""
    pool = draw(st.lists(series_entries(plain), min_size=1, max_size=6))
    out = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["series", "series", "series", "metadata", "other"]))
        if kind == "series":
            out.append(draw(st.sampled_from(pool)))
        elif kind == "metadata":
            out.append(draw(metadata_entries()))
        elif not plain:
            out.append(draw(st.sampled_from(OTHER_TOP_LEVEL)))
    return b"".join(out)


@st.composite
def malformed(draw: st.DrawFn) -> bytes:
    raw: bytes = draw(requests())
    return mutate(draw, raw, MUTATIONS, length_tags=(b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x09"),
                  lengths=(200, 2**31, 2**63, 2**64 - 1), varint_ends=(b"", b"\x01", b"\x02"),
                  wire_tags=(0x0A, 0x12, 0x1A, 0x22, 0x09, 0x10, 0x08))


# ---- running both ---------------------------------------------------------------------------------


def make_decide(n_dest: int, calls: list[bytes], fail: str = "") -> Callable[[bytes], Any]:
    """A pipeline-like decide: validates the labels (WireError), sends to some destinations."""

    def decide(key: bytes) -> Any:
        calls.append(key)
        h = hashlib.sha1(key).digest()[0]
        if fail == "raise" and h % 5 == 0:
            raise WireError(422, f"decide refuses {key[:8]!r}")
        wire.decode_labels(key)
        if fail == "length" and h % 5 == 1:
            return (None,) * (n_dest + 1)
        sid = wire.series_id(key)
        decision = tuple(None if (h >> i) & 1 else (key, sid, f"d{i}") for i in range(n_dest))
        return list(decision) if fail == "list" else decision  # a list: zip's generic iteration

    return decide


class LoggingCache(dict[bytes, Any]):
    """Not an exact dict: the C loop must use the generic protocol, and call it the same way."""

    def __init__(self, log: list[Any], *args: Any) -> None:
        super().__init__(*args)
        self.log = log

    def get(self, key: bytes, default: Any = None) -> Any:  # type: ignore[override]
        self.log.append(("get", key))
        return super().get(key, default)

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.log.append(("set", key))
        super().__setitem__(key, value)


class LoggingList(list[Any]):
    def __init__(self, log: list[Any]) -> None:
        super().__init__()
        self.log = log

    def append(self, item: Any) -> None:
        self.log.append(("append", item))
        super().append(item)


def outcome(loop: Loop, bufs: list[bytes], n_dest: int, fail: str = "", generic: bool = False,
            cache: dict[bytes, Any] | None = None) -> Any:
    """Everything observable of routing ``bufs`` in turn through ``loop`` with one cache."""
    calls: list[bytes] = []
    log: list[Any] = []
    the_cache: dict[bytes, Any] = LoggingCache(log, cache or {}) if generic else dict(cache or {})
    decide = make_decide(n_dest, calls, fail)
    results = []
    for buf in bufs:
        per_dest: list[list[Any]] = [LoggingList(log) if generic else [] for _ in range(n_dest)]
        metadata: list[bytes] = LoggingList(log) if generic else []
        try:
            counts = loop(buf, the_cache, decide, per_dest, metadata)
            res: Any = ("ok", counts)
        except WireError as e:
            res = ("WireError", e.status, e.message, str(e))
        except Exception as e:
            res = (type(e).__name__, str(e))
        results.append((res, [list(d) for d in per_dest], list(metadata)))
    return results, calls, dict(the_cache), log


def assert_same(bufs: list[bytes], n_dest: int = 2, **kw: Any) -> Any:
    py = outcome(wire._route_loop, bufs, n_dest, **kw)
    c = outcome(cwire.route_loop, bufs, n_dest, **kw)
    assert c == py
    return py


# ---- differential tests ---------------------------------------------------------------------------


@SETTINGS
@given(st.lists(requests(), min_size=1, max_size=3), st.integers(1, 4))
def test_valid_and_odd_requests_give_the_reference_results(bufs: list[bytes], n_dest: int) -> None:
    assert_same(bufs, n_dest)


@SETTINGS
@given(st.lists(requests(plain=True), min_size=1, max_size=3), st.integers(1, 3))
def test_plain_requests_are_routed_in_c_without_the_reference(bufs: list[bytes], n_dest: int) -> None:
    before = cwire.fallbacks()
    assert_same(bufs, n_dest)
    assert cwire.fallbacks() == before  # the C loop handled every one itself


@SETTINGS
@given(st.lists(st.one_of(malformed(), requests()), min_size=1, max_size=3), st.integers(1, 3))
def test_malformed_requests_raise_the_reference_errors(bufs: list[bytes], n_dest: int) -> None:
    assert_same(bufs, n_dest)


@SETTINGS
@given(st.lists(requests(), min_size=1, max_size=3), st.sampled_from(["raise", "length", "list"]))
def test_failing_decide_leaves_the_reference_state(bufs: list[bytes], fail: str) -> None:
    assert_same(bufs, 2, fail=fail)


@SETTINGS
@given(st.lists(st.one_of(requests(), malformed()), min_size=1, max_size=3))
def test_a_cache_that_is_not_a_dict_sees_the_reference_calls(bufs: list[bytes]) -> None:
    assert_same(bufs, 2, generic=True)


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_give_the_reference_outcome(buf: bytes) -> None:
    assert_same([buf, buf], 2)


def rich_request() -> bytes:
    h = v1pb.Histogram(count_int=3, schema=1, timestamp=-5, positive_deltas=[1, 2],
                       positive_spans=[v1pb.BucketSpan(offset=-1, length=2)])
    ex = v1pb.Exemplar(labels=[v1pb.Label(name="trace_id", value="é")], value=1.0, timestamp=7)
    md = v1pb.MetricMetadata(type=1, metric_family_name="m", help="h", unit="u")
    labels = label(b"__name__", b"m") + label(b"job", b"j")
    one = encode_len(2, b"\x09" + STALE_NAN + b"\x10" + encode_int64(1_700_000_000_000))
    return (encode_len(1, labels + one) + encode_len(1, label(b"__name__", b"n") + one)
            + encode_len(1, labels + one + encode_len(3, ex.SerializeToString()) + encode_len(4, h.SerializeToString()))
            + encode_len(3, md.SerializeToString()) + encode_len(1, b"") + encode_len(1, labels + one + one))


def test_every_truncation_and_every_flipped_byte_gives_the_reference_outcome() -> None:
    raw = rich_request()
    assert_same([raw, raw])
    for i in range(len(raw)):
        assert_same([raw[:i]])
        for b in (0x00, 0x7F, 0x80, 0xFF, raw[i] ^ 0x08):
            assert_same([raw[:i] + bytes((b,)) + raw[i + 1 :]])


def test_the_one_sample_guess_on_a_warm_cache_matches() -> None:
    # A scrape's series share one timestamp: the second request takes the guessed path for each.
    one = encode_len(2, b"\x09" + bytes(8) + b"\x10" + encode_int64(1_700_000_000_000))
    raw = b"".join(encode_len(1, label(b"__name__", b"m") + label(b"i", str(i).encode()) + one) for i in range(50))
    before = cwire.fallbacks()
    (first, second), calls, cache, _ = assert_same([raw, raw.replace(bytes(8), STALE_NAN)], 3)
    assert cwire.fallbacks() == before
    assert first[0] == ("ok", (50, 50, 0, 0, 50)) and second[0] == ("ok", (50, 50, 0, 0, 0))
    assert len(calls) == 50 and len(cache) == 50


def test_decide_raising_wire_error_stops_after_the_same_series() -> None:
    raw = rich_request()

    def decide(key: bytes) -> Any:
        if b"job" in key:
            raise WireError(400, "invalid   label\nset")
        return ((key, 1, "m"),)

    for loop in (wire._route_loop, cwire.route_loop):
        per_dest: list[list[Any]] = [[]]
        with pytest.raises(WireError) as err:
            loop(raw, {}, decide, per_dest, [])
        assert (err.value.status, err.value.message) == (400, "invalid label set")
        assert len(per_dest[0]) == 0


def test_decide_with_the_wrong_number_of_decisions_is_the_reference_value_error() -> None:
    raw = rich_request()
    msgs = []
    for loop in (wire._route_loop, cwire.route_loop):
        with pytest.raises(ValueError, match="decide\\(\\) returned 3 decisions for 2 destinations") as err:
            loop(raw, {}, lambda key: (None, None, None), [[], []], [])
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]


def test_a_none_in_the_cache_is_a_miss_and_cached_decisions_are_the_same_objects() -> None:
    raw = rich_request()
    key = label(b"__name__", b"n")
    mine = ((b"out", 5, "n"),)
    for loop in (wire._route_loop, cwire.route_loop):
        cache: dict[bytes, Any] = {key: mine, label(b"__name__", b"m") + label(b"job", b"j"): None}
        per_dest: list[list[Any]] = [[]]
        counts = loop(raw, cache, lambda k: ((k, 0, "x"),), per_dest, [])
        assert counts == (5, 5, 1, 1, 2)
        assert per_dest[0][1][0] is mine[0]


def test_keywords_and_wrong_argument_counts_behave_as_the_reference() -> None:
    raw = rich_request()
    for loop in (wire._route_loop, cwire.route_loop):
        per_dest: list[list[Any]] = [[]]
        metadata: list[bytes] = []
        assert loop(raw, {}, lambda k: ((k, 1, "m"),), per_dest, metadata=metadata) == (5, 5, 1, 1, 3)
        assert len(per_dest[0]) == 5 and len(metadata) == 1
    errors = []
    for loop in (wire._route_loop, cwire.route_loop):
        with pytest.raises(TypeError) as err:
            loop(raw, {}, lambda k: (None,), [[]])
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "metadata" in errors[0]


def test_non_bytes_buffers_are_handed_to_the_reference() -> None:
    raw = rich_request()
    assert_same([bytearray(raw), memoryview(raw)])  # type: ignore[list-item]


@SETTINGS
@given(st.binary(max_size=600))
def test_series_id_is_blake2b_64_little_endian(data: bytes) -> None:
    want = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    assert cwire.series_id(data) == want == wire._py_series_id(data)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 129, 255, 256, 257, 1 << 16, (1 << 20) + 3])
def test_series_id_at_block_boundaries_and_long_inputs(size: int) -> None:
    data = bytes((i * 7 + 3) & 0xFF for i in range(size))
    assert cwire.series_id(data) == int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    assert cwire.series_id(bytearray(data)) == cwire.series_id(memoryview(data)) == cwire.series_id(data)


def test_series_id_refuses_what_hashlib_refuses() -> None:
    for bad in ("text", 5, None):
        with pytest.raises(TypeError) as c_err:
            cwire.series_id(bad)
        with pytest.raises(TypeError) as py_err:
            hashlib.blake2b(bad, digest_size=8)  # type: ignore[arg-type]
        assert str(c_err.value) == str(py_err.value)


def test_wire_uses_the_c_functions() -> None:
    assert wire.route_loop is cwire.route_loop
    assert wire.series_id is cwire.series_id


def test_route_bench_runs_and_prints_both_figures(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import route_bench

    assert route_bench.main(["--nodes", "1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "warm cache, us per series" in out and "first sight, us per new series" in out
    assert wire.route_loop is cwire.route_loop  # the bench put the module's loop back


def table_outcome(loop: Loop, bufs: list[bytes], n_dest: int) -> Any:
    """``outcome`` with relay.native._cdcache's DecisionTable as the cache (the pipeline's young generation):
    the C loop skips the reference's second lookup of a key that just missed there."""
    table: Any = importlib.import_module("relay.native._cdcache").DecisionTable(0)
    calls: list[bytes] = []
    decide = make_decide(n_dest, calls)
    results = []
    for buf in bufs:
        per_dest: list[list[Any]] = [[] for _ in range(n_dest)]
        metadata: list[bytes] = []
        try:
            res: Any = ("ok", loop(buf, table, decide, per_dest, metadata))
        except WireError as e:
            res = ("WireError", e.status, e.message, str(e))
        results.append((res, per_dest, metadata))
    return results, calls, len(table), [table.get(k) for k in calls]


@SETTINGS
@given(st.lists(st.one_of(requests(), requests(plain=True), malformed()), min_size=1, max_size=3),
       st.integers(1, 3))
def test_a_decision_table_cache_gives_the_reference_results(bufs: list[bytes], n_dest: int) -> None:
    bufs = bufs + bufs  # the second time every key is known
    assert table_outcome(cwire.route_loop, bufs, n_dest) == table_outcome(wire._route_loop, bufs, n_dest)


def test_new_series_of_the_guessed_shape_are_decided_once_each_with_a_decision_table() -> None:
    keys = [label(b"__name__", b"m") + label(b"pod", f"p{i}".encode()) for i in range(50)]
    buf = b"".join(lenfield(0x0A, k + lenfield(0x12, b"\x09" + bytes(8) + b"\x10" + encode_uvarint(1000)))
                   for k in keys)
    py, c = table_outcome(wire._route_loop, [buf], 2), table_outcome(cwire.route_loop, [buf], 2)
    assert c == py
    assert c[1] == keys and c[2] == 50 and c[0][0][0] == ("ok", (50, 50, 0, 0, 50))


# ---- entry_offset: a new series' splice point ----------------------------------------------------------

from relay.rules import label_codec  # noqa: E402

_KEY_LABELS = st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=40), max_size=10).map(
    lambda d: wire.encode_labels(sorted(d.items())))


@settings(max_examples=300, deadline=None)
@given(_KEY_LABELS, st.integers(0, 14))
def test_entry_offset_is_the_references_on_canonical_keys(key: bytes, i: int) -> None:
    assert cwire.entry_offset(key, i) == label_codec.py_entry_offset(key, i)


def test_entry_offset_refuses_what_the_reference_refuses() -> None:
    key = wire.encode_labels([("a", "1"), ("b", "2")])
    assert [cwire.entry_offset(key, i) for i in range(4)] == [0, len(key) // 2, len(key), len(key)]
    with pytest.raises(ValueError, match="entry index must be >= 0"):
        cwire.entry_offset(key, -1)
    with pytest.raises(ValueError, match="entry index must be >= 0"):
        label_codec.py_entry_offset(key, -1)
    with pytest.raises(TypeError):
        cwire.entry_offset(bytearray(key), 0)
    assert cwire.entry_offset(b"\x0a", 1) == 1  # a key cut inside an entry's head: its length, no read past


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 40))
def test_entry_offset_is_the_references_on_any_bytes(key: bytes, i: int) -> None:
    assert cwire.entry_offset(key, i) == label_codec.py_entry_offset(key, i)


@settings(max_examples=200, deadline=None)
@given(_KEY_LABELS, st.integers(0, 14))
def test_the_reference_entry_offset_is_offsets_on_canonical_keys(key: bytes, i: int) -> None:
    offs = label_codec.offsets(key)
    assert label_codec.py_entry_offset(key, i) == (offs[i] if i < len(offs) else len(key))
