"""Hypothesis strategies that build remote-write bodies field by field, with hostile values.

``v1_requests()`` builds ``prometheus.WriteRequest`` bytes and ``v2_requests()``
``io.prometheus.write.v2.Request`` bytes from their proto definitions (proto/remote_v1.proto,
proto/remote_v2.proto), one field at a time, so that every enum and integer field can be drawn
negative, oversized, non-minimal, longer than 10 bytes or past 64 bits; every double NaN (the stale
marker too), infinite or subnormal; every string invalid UTF-8; and every field can come with the
wrong wire type, twice, behind an unknown field, or with a length past the end of its message.
Most drawn values are ordinary (timestamps near now, refs in range, histograms whose spans agree
with their buckets), so that a good share of the bodies is accepted and goes on into the pipeline.
Used by tests/relay/ingest/test_wire_fuzz_fields.py; nothing here knows what the relay answers.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from relay.common.protowire import encode_uvarint

VARINT, I64, LEN, I32 = 0, 1, 2, 5
U64 = 1 << 64
NOW_MS = int(time.time() * 1000)
TIMESTAMPS = [NOW_MS, NOW_MS - 15_000, NOW_MS - 30_000]
HOSTILE_INTS = [-1, -2, -(2**31), 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 3, 2**63 - 1, -(2**63), 2**64 - 1, 8, 99]
HOSTILE_TIMESTAMPS = [0, 1, -1, 2**62, 2**63 - 1, -(2**63), NOW_MS + 86_400_000 * 365 * 100]
DOUBLE_BITS = [struct.unpack("<Q", struct.pack("<d", v))[0] for v in (1.5, 0.0, 42.0, 1e6)]
HOSTILE_DOUBLE_BITS = [0x7FF0000000000002, 0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000000,
                       0xFFF0000000000000, 0x8000000000000000, 0x0000000000000001, 0x7FEFFFFFFFFFFFFF]
METRICS = [b"DCGM_FI_DEV_GPU_UTIL", b"gpu_exporter_up", b"rpc_seconds_bucket", b"rpc_seconds_count", b"up"]
NAMES = [b"job", b"instance", b"gpu", b"le", b"a"]
VALUES = [b"dcgm", b"10.0.0.1:9400", b"0", b"1", b"+Inf", b"\xc3\xa9t\xc3\xa9"]
HOSTILE_STRINGS = [b"", b"\xff", b"a\xc3", b"\xed\xa0\x80", b"\xc0\x80", b"\x00", b"a-b", b"__name__", b"x" * 300]
# what a field of each wire type carries when it is sent under the wrong one (3, 4: groups; 6, 7: none)
WRONG_PAYLOAD = {0: b"\x01", 1: bytes(8), 2: b"\x01x", 3: b"", 4: b"", 5: bytes(4), 6: b"", 7: b""}
UNKNOWN_NUMBERS = [0, 6, 18, 99, (1 << 29) - 1]


@dataclass(frozen=True)
class Gen:
    """The draw function and how hostile this body is: each point that can go wrong does so with
    probability 1 / ``one_in`` (0: never, a body a correct sender could send)."""

    draw: st.DrawFn
    one_in: int

    def hostile(self) -> bool:
        return self.one_in > 0 and self.draw(st.integers(0, self.one_in - 1)) == 0


def key(number: int, wire_type: int) -> bytes:
    return encode_uvarint(number << 3 | wire_type)


def chance(g: Gen, one_in: int) -> bool:
    return g.draw(st.integers(0, one_in - 1)) == 0


def varint(g: Gen, normal: Sequence[int], hostile: Sequence[int] = HOSTILE_INTS) -> bytes:
    """A varint's bytes: mostly one of ``normal``, else hostile (values, and encodings protobuf
    reads or refuses: non-minimal, eleven bytes, past 64 bits, truncated)."""
    if not g.hostile():
        return encode_uvarint(g.draw(st.sampled_from(list(normal))) % U64)
    kind = g.draw(st.integers(0, 5))
    if kind < 3:
        return encode_uvarint(g.draw(st.sampled_from(list(hostile))) % U64)
    if kind == 3:
        v = encode_uvarint(g.draw(st.sampled_from(list(normal))) % U64)
        return bytes(b | 0x80 for b in v) + b"\x00"  # non-minimal: the same value, one byte longer
    return g.draw(st.sampled_from([b"\xff" * 10 + b"\x01", b"\xff" * 9 + b"\x7f", b"\xff\xff"]))


def enum(g: Gen, count: int) -> bytes:
    """An enum's varint: one of its ``count`` values or, in a hostile body one time in four, one
    outside them (negative, past the last, past 32 bits: what protobuf reads as an int32)."""
    if g.one_in and chance(g, 4):
        return encode_uvarint(g.draw(st.sampled_from(HOSTILE_INTS)) % U64)
    return varint(g, range(count))


def zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def double(g: Gen) -> bytes:
    bits = g.draw(st.sampled_from(HOSTILE_DOUBLE_BITS if chance(g, 4) else DOUBLE_BITS))
    return struct.pack("<Q", bits)


def string(g: Gen, normal: Sequence[bytes]) -> bytes:
    return g.draw(st.sampled_from(list(HOSTILE_STRINGS if g.hostile() else normal)))


def put(g: Gen, out: list[bytes], number: int, wire_type: int, payload: bytes) -> None:
    """Append one field (``payload``: a LEN field's contents, else its value bytes), now and then
    with the wrong wire type, twice, behind an unknown field, or with a length past the end."""
    kind = g.draw(st.integers(0, 3)) if g.hostile() else -1
    if kind == 0:
        other = g.draw(st.sampled_from([w for w in range(8) if w != wire_type]))
        out.append(key(number, other) + WRONG_PAYLOAD[other])
        return
    if kind == 1 and wire_type == LEN:
        extra = g.draw(st.sampled_from([1, 9, 2**31, U64 - 1 - len(payload)]))
        out.append(key(number, LEN) + encode_uvarint(len(payload) + extra) + payload)
        return
    if kind == 2:
        wt = g.draw(st.sampled_from([VARINT, I64, LEN, I32]))
        out.append(key(g.draw(st.sampled_from(UNKNOWN_NUMBERS)), wt) + WRONG_PAYLOAD[wt])
    field = key(number, wire_type) + (encode_uvarint(len(payload)) if wire_type == LEN else b"") + payload
    out.append(field)
    if kind == 3:
        out.append(field)  # twice: scalars, the last one wins; messages merge; repeated, two entries


def message(g: Gen, fields: list[bytes]) -> bytes:
    """The fields in the order built, or now and then in another (protobuf allows any order)."""
    if len(fields) > 1 and chance(g, 6):
        fields = g.draw(st.permutations(fields))
    return b"".join(fields)


def packed(g: Gen, out: list[bytes], number: int, items: Sequence[bytes], wire_type: int) -> None:
    """A repeated scalar field, packed (one LEN field) or, now and then, one field an item."""
    if items and chance(g, 5):
        for item in items:
            put(g, out, number, wire_type, item)
    elif items or chance(g, 8):  # an empty packed field too
        put(g, out, number, LEN, b"".join(items))


# ---- shared: samples, histograms -------------------------------------------------------------------


def sample(g: Gen, v2: bool) -> bytes:
    out: list[bytes] = []
    if not chance(g, 10):
        put(g, out, 1, I64, double(g))
    if not chance(g, 10):
        put(g, out, 2, VARINT, varint(g, TIMESTAMPS, HOSTILE_TIMESTAMPS))
    if v2 and chance(g, 4):
        put(g, out, 3, VARINT, varint(g, [0, NOW_MS - 60_000], HOSTILE_TIMESTAMPS))
    return message(g, out)


def histogram(g: Gen, v2: bool) -> bytes:
    """A native histogram (integer or float) whose spans usually agree with its buckets."""
    out: list[bytes] = []
    is_float = g.draw(st.booleans())
    if is_float:
        put(g, out, 2, I64, double(g))
    else:
        put(g, out, 1, VARINT, varint(g, [0, 3, 10]))
    put(g, out, 3, I64, double(g))
    put(g, out, 4, VARINT, varint(g, [zigzag(s) for s in (0, 3, -4, 8)], [zigzag(s) for s in (-53, 9, -(2**31))]
                                     + HOSTILE_INTS))
    put(g, out, 5, I64, double(g))
    put(g, out, 7 if is_float else 6, I64 if is_float else VARINT,
        double(g) if is_float else varint(g, [0, 1]))
    for spans_at in (8, 11):  # negative, then positive: spans, deltas (int), counts (float)
        spans = g.draw(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 3)), max_size=3))
        buckets = sum(length for _, length in spans) + (g.draw(st.sampled_from([-1, 1])) if g.hostile() else 0)
        for i, (offset, length) in enumerate(spans):
            offset = offset if i == 0 or g.hostile() else abs(offset)
            span: list[bytes] = []
            if offset:
                put(g, span, 1, VARINT, varint(g, [zigzag(offset)]))
            if length:
                put(g, span, 2, VARINT, varint(g, [length]))
            put(g, out, spans_at, LEN, message(g, span))
        if is_float:
            packed(g, out, spans_at + 2, [double(g) for _ in range(max(0, buckets))], I64)
        else:
            packed(g, out, spans_at + 1, [varint(g, [zigzag(d) for d in (1, -1, 2)]) for _ in range(max(0, buckets))],
                   VARINT)
    put(g, out, 14, VARINT, enum(g, 4))
    put(g, out, 15, VARINT, varint(g, TIMESTAMPS, HOSTILE_TIMESTAMPS))
    if chance(g, 6):
        packed(g, out, 16, [double(g) for _ in range(g.draw(st.integers(0, 3)))], I64)
    if v2 and chance(g, 4):
        put(g, out, 17, VARINT, varint(g, [NOW_MS - 60_000], HOSTILE_TIMESTAMPS))
    return message(g, out)


def extras(g: Gen, out: list[bytes], unknown: Sequence[int]) -> None:
    """Now and then an unknown (or reserved) field of any wire type."""
    if g.hostile():
        wt = g.draw(st.sampled_from([VARINT, I64, LEN, I32]))
        out.append(key(g.draw(st.sampled_from(list(unknown))), wt) + WRONG_PAYLOAD[wt])


# ---- RW 1.0 --------------------------------------------------------------------------------------


def v1_labels(g: Gen, with_name: bool) -> list[tuple[bytes, bytes]]:
    pairs = [(g.draw(st.sampled_from(NAMES)), string(g, VALUES)) for _ in range(g.draw(st.integers(0, 3)))]
    if with_name:
        pairs.append((b"__name__", string(g, METRICS)))
    if g.hostile():
        pairs.append((string(g, NAMES), string(g, VALUES)))  # a hostile name: empty, invalid, duplicate
    pairs = sorted(dict(pairs).items()) if not g.hostile() else pairs  # unsorted, duplicate names
    return pairs


def v1_label_fields(g: Gen, out: list[bytes], pairs: list[tuple[bytes, bytes]]) -> None:
    for name, value in pairs:
        label: list[bytes] = []
        put(g, label, 1, LEN, name)
        put(g, label, 2, LEN, value)
        put(g, out, 1, LEN, b"".join(label))


def v1_series(g: Gen) -> bytes:
    out: list[bytes] = []
    v1_label_fields(g, out, v1_labels(g, not g.hostile()))
    for _ in range(g.draw(st.integers(0, 2))):
        put(g, out, 2, LEN, sample(g, False))
    if chance(g, 4):
        exemplar: list[bytes] = []
        v1_label_fields(g, exemplar, v1_labels(g, False))
        put(g, exemplar, 2, I64, double(g))
        put(g, exemplar, 3, VARINT, varint(g, TIMESTAMPS, HOSTILE_TIMESTAMPS))
        put(g, out, 3, LEN, message(g, exemplar))
    if chance(g, 3):
        put(g, out, 4, LEN, histogram(g, False))
    extras(g, out, [5, 99])
    return b"".join(out)


def v1_metadata(g: Gen) -> bytes:
    out: list[bytes] = []
    put(g, out, 1, VARINT, enum(g, 8))
    put(g, out, 2, LEN, string(g, METRICS))
    put(g, out, 4, LEN, string(g, [b"help text", b""]))
    if chance(g, 3):
        put(g, out, 5, LEN, string(g, [b"seconds", b""]))
    return message(g, out)


def body_gen(draw: st.DrawFn) -> Gen:
    return Gen(draw, draw(st.sampled_from([0, 400, 100, 30, 8])))


@st.composite
def v1_requests(draw: st.DrawFn) -> bytes:
    g = body_gen(draw)
    out: list[bytes] = []
    for _ in range(g.draw(st.integers(0, 4))):
        put(g, out, 1, LEN, v1_series(g))
    for _ in range(g.draw(st.integers(0, 2))):
        put(g, out, 3, LEN, v1_metadata(g))
    extras(g, out, [2, 4, 99])
    return message(g, out)


# ---- RW 2.0 --------------------------------------------------------------------------------------


def v2_series(g: Gen, n_symbols: int, names: range, values: range) -> bytes:
    def ref(pool: range) -> bytes:
        return varint(g, pool, [0, n_symbols, 2**32 - 1, 2**32, 2**64 - 1])

    refs = [ref(range(1, 2)), ref(range(names.stop, values.stop))]  # __name__ first
    for name in g.draw(st.lists(st.sampled_from(names), unique=not g.hostile(), max_size=3)):
        refs += [ref(range(name, name + 1)), ref(values)]
    if g.hostile():
        refs.append(ref(names))  # an odd count
    out: list[bytes] = []
    packed(g, out, 1, refs, VARINT)
    for _ in range(g.draw(st.integers(0, 2))):
        put(g, out, 2, LEN, sample(g, True))
    if chance(g, 3):
        put(g, out, 3, LEN, histogram(g, True))
    if chance(g, 4):
        exemplar: list[bytes] = []
        packed(g, exemplar, 1, [ref(names), ref(values)] if g.draw(st.booleans()) else [], VARINT)
        put(g, exemplar, 2, I64, double(g))
        put(g, exemplar, 3, VARINT, varint(g, TIMESTAMPS, HOSTILE_TIMESTAMPS))
        put(g, out, 4, LEN, message(g, exemplar))
    if chance(g, 2):
        metadata: list[bytes] = []
        put(g, metadata, 1, VARINT, enum(g, 8))
        put(g, metadata, 3, VARINT, ref(range(n_symbols)))
        if chance(g, 3):
            put(g, metadata, 4, VARINT, ref(range(n_symbols)))
        put(g, out, 5, LEN, message(g, metadata))
    extras(g, out, [6, 7, 99])
    return message(g, out)


@st.composite
def v2_requests(draw: st.DrawFn) -> bytes:
    """Symbols "", "__name__", then label names, then metric names and label values (some hostile)."""
    g = body_gen(draw)
    names = g.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
    if g.hostile():
        names.append(g.draw(st.sampled_from(HOSTILE_STRINGS)))
    values = [string(g, METRICS) for _ in range(g.draw(st.integers(1, 2)))] + [
        string(g, VALUES) for _ in range(g.draw(st.integers(1, 3)))]
    symbols = [b"x" if g.hostile() else b"", b"__name__", *names, *values]
    out: list[bytes] = []
    for symbol in symbols:
        put(g, out, 4, LEN, symbol)
    n = len(symbols)
    for _ in range(g.draw(st.integers(0, 3))):
        put(g, out, 5, LEN, v2_series(g, n, range(2, 2 + len(names)), range(2 + len(names), n)))
    extras(g, out, [1, 2, 3, 99])
    return b"".join(out)  # in order: a shuffle would move symbols[0]

