"""relay.native._csnappy against its reference, python-snappy 0.7 over cramjam: ``wire.decompress`` (C) must
give ``wire.py_decompress``'s result for every body, or the same WireError (status and message), and
the C decoder itself must accept exactly the blocks cramjam accepts, with the same bytes. Runs
whenever the module is built; skipped only with GPU_RELAY_NATIVE=0.

RELAY_FUZZ_EXAMPLES sets the examples per hypothesis test (default 300).
"""

from __future__ import annotations

import importlib
import os
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import snappy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay import native
from relay.common.protowire import WireError, encode_uvarint
from relay.ingest import wire

if native.disabled():
    pytest.skip("GPU_RELAY_NATIVE=0: the pure-Python reference only", allow_module_level=True)
csnappy: Any = importlib.import_module("relay.native._csnappy")  # not built: a failure (run scripts/setup.sh)

EXAMPLES = int(os.environ.get("RELAY_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
DIRECT_MAX = 1 << 22  # the C decoder called directly: blocks announcing more are refused unallocated
MAX_BYTES = [0, 1, 5, 100, 1 << 16, 32 << 20]


# ---- what each side answers ----------------------------------------------------------------------


def through_wire(fn: Any, body: bytes, max_bytes: int) -> tuple[Any, ...]:
    try:
        out = fn(body, max_bytes)
    except WireError as e:
        return ("WireError", e.status, e.message)
    assert type(out) is bytes
    return ("ok", out)


def check(body: bytes) -> None:
    """C and the reference agree on ``body``: through wire.decompress for several limits, and the C
    decoder itself accepts it exactly when cramjam does, with the same bytes."""
    for max_bytes in [*MAX_BYTES, len(body) * 3]:
        assert through_wire(wire.decompress, body, max_bytes) == through_wire(wire.py_decompress, body, max_bytes)
    announced = header(body)
    if announced is None:  # no header wire.decompress would pass on: C declines, the reference decides
        assert csnappy.uncompress(body, 1 << 40) is None
        return
    if announced > DIRECT_MAX:
        with pytest.raises(ValueError, match="exceeds max_bytes"):
            csnappy.uncompress(body, DIRECT_MAX)
        return
    got = csnappy.uncompress(body, DIRECT_MAX)
    try:
        want = bytes(snappy.uncompress(body))
    except Exception:  # the reference refuses: C must not accept
        assert got is None, f"C accepted {body[:64]!r} which cramjam refuses"
        return
    assert got is not None, f"C refused {body[:64]!r} which cramjam accepts"
    assert type(got) is bytes and got == want


def header(body: bytes) -> int | None:
    """The announced length where wire.snappy_uncompressed_length accepts it (1-10 varint bytes, the
    10th 0 or 1, a value under 2^32), else None."""
    value = 0
    for i, b in enumerate(body[:10]):
        if i == 9 and b > 1:
            return None
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return value if value <= 0xFFFFFFFF else None
    return None


# ---- blocks, element by element (format_description.txt) -----------------------------------------


def literal(data: bytes, extra: int = 0) -> bytes:
    """A literal element; ``extra`` 1-4 writes its length - 1 in that many bytes after the tag."""
    n = len(data) - 1
    if extra == 0:
        assert 0 <= n < 60
        return bytes((n << 2,)) + data
    return bytes(((59 + extra) << 2,)) + (n % (1 << (8 * extra))).to_bytes(extra, "little") + data


def copy1(offset: int, length: int) -> bytes:  # length 4..11, offset 0..2047
    return bytes((((offset >> 8) << 5) | ((length - 4) << 2) | 1, offset & 0xFF))


def copy2(offset: int, length: int) -> bytes:  # length 1..64, offset 0..65535
    return bytes((((length - 1) << 2) | 2,)) + offset.to_bytes(2, "little")


def copy4(offset: int, length: int) -> bytes:  # length 1..64, offset 0..2^32-1
    return bytes((((length - 1) << 2) | 3,)) + offset.to_bytes(4, "little")


def block(n: int, *elements: bytes) -> bytes:
    return encode_uvarint(n) + b"".join(elements)


@st.composite
def built_blocks(draw: st.DrawFn) -> bytes:
    """Blocks of every element kind with offsets and lengths near the edges, and a header that
    mostly tells the truth (sometimes padded to a longer varint, sometimes off by a little)."""
    out: list[bytes] = []
    written = 0
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["lit", "lit", "lit+", "copy1", "copy2", "copy4", "junk"]))
        if kind in ("lit", "lit+") or (written == 0 and draw(st.booleans())):
            data = draw(st.binary(min_size=1, max_size=80 if kind == "lit+" else 60))
            extra = draw(st.integers(1, 4)) if kind == "lit+" or len(data) > 60 else 0
            out.append(literal(data, extra))
            written += len(data)
            continue
        if kind == "junk":
            out.append(draw(st.binary(max_size=4)))
            continue
        offset = draw(st.one_of(st.integers(0, written + 2), st.sampled_from([1, 2, 3, 7, 8, 9, 16])))
        if kind == "copy1":
            length = draw(st.integers(4, 11))
            out.append(copy1(offset % 2048, length))
        else:
            length = draw(st.integers(1, 64))
            out.append(copy2(offset % 65536, length) if kind == "copy2" else copy4(offset, length))
        written += length
    n = draw(st.sampled_from([written] * 6 + [max(0, written - 1), written + 1, 0]))
    head = encode_uvarint(n)
    if draw(st.integers(0, 5)) == 0:  # non-canonical: padded with 0x80 bytes up to 10 in all
        pad = draw(st.integers(1, 11 - len(head)))
        head = bytes(b | 0x80 for b in head) + b"\x80" * (pad - 1) + b"\x00"
    return head + b"".join(out)


# ---- payloads that snappy compresses (so cramjam emits copies, overlapping ones too) -------------


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "pattern", "text", "mixed", "long"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "pattern":  # a short period repeated: copies whose offset is under their length
        return draw(st.binary(min_size=1, max_size=9)) * draw(st.integers(1, 400))
    words = [b"__name__", b"DCGM_FI_DEV_GPU_UTIL", b"gpu", b"0", b"1", b"instance", b"10.0.0.1:9400", b"\x00",
             b"\x0a\x12", b"x" * 70]
    if kind == "text":
        return b"".join(draw(st.lists(st.sampled_from(words), max_size=200)))
    if kind == "mixed":
        return b"".join(draw(st.lists(st.one_of(st.sampled_from(words), st.binary(max_size=20)), max_size=100)))
    # long: far copies (copy-2 offsets in the thousands), several 64 KiB compressor blocks
    unit = draw(st.binary(min_size=50, max_size=3000))
    return (unit + draw(st.binary(max_size=50))) * draw(st.integers(1, 60))


def mutations(draw: Callable[..., Any], body: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "append"]))
    if not body:
        fresh: bytes = draw(st.binary(max_size=8))
        return fresh
    i = draw(st.integers(0, len(body) - 1))
    if kind == "truncate":
        return body[:i]
    if kind == "flip":
        return body[:i] + bytes((draw(st.integers(0, 255)),)) + body[i + 1 :]
    if kind == "insert":
        extra: bytes = draw(st.binary(min_size=1, max_size=8))
        return body[:i] + extra + body[i:]
    if kind == "delete":
        return body[:i] + body[i + draw(st.integers(1, 8)) :]
    tail: bytes = draw(st.binary(min_size=1, max_size=4))
    return body + tail


@SETTINGS
@given(payloads())
def test_compressed_payloads_decode_to_the_same_bytes_as_cramjam(raw: bytes) -> None:
    body = bytes(snappy.compress(raw))
    check(body)
    assert wire.decompress(body, len(raw)) == raw
    assert csnappy.uncompress(body, len(raw)) == raw


@SETTINGS
@given(st.data())
def test_damaged_compressed_payloads_give_the_reference_result_or_error(data: st.DataObject) -> None:
    body = bytes(snappy.compress(data.draw(payloads())))
    for _ in range(data.draw(st.integers(1, 3))):
        body = mutations(data.draw, body)
    check(body)


@SETTINGS
@given(built_blocks())
def test_hand_built_blocks_of_every_element_kind_match_the_reference(body: bytes) -> None:
    check(body)


@SETTINGS
@given(st.binary(max_size=40))
def test_arbitrary_bytes_match_the_reference(body: bytes) -> None:
    check(body)


def test_the_generators_reach_every_element_kind_and_both_answers() -> None:
    """The hypothesis tests above are only worth something if their inputs reach the C decoder's
    every branch: check the hand-built kinds directly, valid and not."""
    seen: set[str] = set()
    for body in [block(3, literal(b"abc")), block(5, literal(b"ab", 1), copy2(2, 3))]:
        check(body)
        seen.add("ok" if csnappy.uncompress(body, 100) is not None else "err")
    check(block(3, literal(b"ab")))
    seen.add("ok" if csnappy.uncompress(block(3, literal(b"ab")), 100) is not None else "err")
    assert seen == {"ok", "err"}


# ---- every element kind and every refusal, by hand ---------------------------------------------


@pytest.mark.parametrize("extra", [0, 1, 2, 3, 4])
def test_a_literal_with_0_to_4_length_bytes_decodes(extra: int) -> None:
    data = bytes(range(50)) * (5 if extra else 1)
    body = block(len(data), literal(data, extra))
    check(body)
    assert csnappy.uncompress(body, len(data)) == data


@pytest.mark.parametrize("extra", [1, 2, 3, 4])
def test_a_literal_whose_length_bytes_are_cut_off_is_refused(extra: int) -> None:
    body = block(300, literal(bytes(300), extra))[: 2 + extra]
    check(body)
    assert csnappy.uncompress(body, 1000) is None


def test_a_literal_of_4_gib_announced_by_its_four_length_bytes_is_refused() -> None:
    body = block(10, bytes((63 << 2,)) + b"\xff\xff\xff\xff" + b"x" * 10)
    check(body)
    assert csnappy.uncompress(body, 100) is None


@pytest.mark.parametrize("name,body,want", [
    ("copy-1", block(9, literal(b"abc"), copy1(3, 6)), b"abcabcabc"),
    ("copy-1 long offset", block(2006, literal(bytes(range(200)) * 10, 2), copy1(2000, 6)), None),
    ("copy-2", block(8, literal(b"abcd"), copy2(4, 4)), b"abcdabcd"),
    ("copy-2 overlapping run", block(65, literal(b"z"), copy2(1, 64)), b"z" * 65),
    ("copy-4", block(7, literal(b"xyz"), copy4(2, 4)), b"xyzyzyz"),
    ("copy-4 far", block(70_154, literal(bytes(range(256)) * 274, 3), copy4(70_000, 10)), None),
    ("period 3 over 64", block(67, literal(b"abc"), copy2(3, 64)), (b"abc" * 23)[:67]),
])
def test_every_copy_kind_decodes_overlapping_or_not(name: str, body: bytes, want: bytes | None) -> None:
    check(body)
    got = csnappy.uncompress(body, 1 << 20)
    assert got == (want if want is not None else bytes(snappy.uncompress(body)))


@pytest.mark.parametrize("name,body", [
    ("offset 0, copy-1", block(7, literal(b"abc"), copy1(0, 4))),
    ("offset 0, copy-2", block(4, literal(b"abc"), copy2(0, 1))),
    ("offset 0, copy-4", block(4, literal(b"abc"), copy4(0, 1))),
    ("offset past the start", block(7, literal(b"abc"), copy1(4, 4))),
    ("copy first", block(4, copy2(1, 4))),
    ("offset 2^32-1", block(4, literal(b"abc"), copy4(2**32 - 1, 1))),
    ("copy past the announced end", block(5, literal(b"abc"), copy2(3, 3))),
    ("literal past the announced end", block(2, literal(b"abc"))),
    ("literal past the input", block(3, literal(b"abc"))[:-1]),
    ("copy-2 cut", block(4, literal(b"abc"), copy2(3, 1))[:-1]),
    ("copy-4 cut", block(4, literal(b"abc"), copy4(3, 1))[:-2]),
    ("copy-1 cut", block(7, literal(b"abc"), copy1(3, 4))[:-1]),
    ("output short of the header", block(4, literal(b"abc"))),
    ("trailing element", block(3, literal(b"abc"), literal(b"d"))),
    ("trailing byte", block(3, literal(b"abc")) + b"\x00"),
    ("trailing copy", block(3, literal(b"abc"), copy2(1, 1))),
    ("zero length, trailing", b"\x00\x00"),
    ("header only", b"\x05"),
])
def test_malformed_blocks_are_refused_as_the_reference_refuses_them(name: str, body: bytes) -> None:
    check(body)
    assert csnappy.uncompress(body, 1 << 20) is None
    with pytest.raises(WireError) as e:
        wire.decompress(body, 1 << 20)
    assert (e.value.status, e.value.message) == (400, "corrupt snappy body: UncompressError")


@pytest.mark.parametrize("body,want", [
    (b"\x00", b""),
    (b"\x80\x00", b""),
    (b"\x80\x80\x80\x80\x80\x00", b""),  # 6 bytes: cramjam reads up to 10
    (b"\x80" * 9 + b"\x00", b""),
    (b"\x83\x80\x80\x80\x00" + literal(b"abc"), b"abc"),
])
def test_zero_length_and_padded_headers_decode_as_cramjam_decodes_them(body: bytes, want: bytes) -> None:
    check(body)
    assert csnappy.uncompress(body, 10) == want
    assert wire.decompress(body, 10) == want


@pytest.mark.parametrize("body,message", [
    (b"", "corrupt snappy body: missing or bad length header"),
    (b"\x80", "corrupt snappy body: missing or bad length header"),
    (b"\x80" * 10 + b"\x00", "corrupt snappy body: missing or bad length header"),  # 11 bytes
    (b"\x80\x80\x80\x80\x10", "corrupt snappy body: length header over 32 bits"),  # 2^32
    (b"\xff\xff\xff\xff\xff\x01", "corrupt snappy body: length header over 32 bits"),
    (b"\x80" * 9 + b"\x01", "corrupt snappy body: length header over 32 bits"),  # 2^63
])
def test_bad_length_headers_give_the_reference_message(body: bytes, message: str) -> None:
    check(body)
    for fn in (wire.decompress, wire.py_decompress):
        assert through_wire(fn, body, 1 << 40) == ("WireError", 400, message)


def test_the_c_decoder_declines_headers_over_32_bits_or_10_bytes() -> None:
    assert csnappy.uncompress(b"\x80\x80\x80\x80\x10", 1 << 40) is None
    assert csnappy.uncompress(b"\x80" * 10 + b"\x00", 1 << 40) is None
    assert csnappy.uncompress(b"", 1 << 40) is None
    assert csnappy.uncompress(b"\x80" * 9 + b"\x02", 1 << 40) is None  # cramjam wraps it to 0: declined
    check(b"\x80" * 9 + b"\x02")


# ---- the size limit -------------------------------------------------------------------------------


class _Refuses:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} called for a body over max_bytes")


def test_a_body_over_max_bytes_is_a_413_before_anything_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    body = block(2**32 - 1, literal(b"abc"))
    monkeypatch.setattr(wire, "snappy", _Refuses())
    monkeypatch.setattr(wire, "_csnappy", _Refuses())
    for fn in (wire.decompress, wire.py_decompress):
        tracemalloc.start()
        try:
            with pytest.raises(WireError) as e:
                fn(body, 32 << 20)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert e.value.status == 413
        assert e.value.message == f"decompressed body of {2**32 - 1} bytes exceeds the limit of {32 << 20} bytes"
        assert peak < 1 << 20


def test_the_c_decoder_refuses_a_length_over_max_bytes_without_allocating_it() -> None:
    body = block(1 << 30, literal(b"abc"))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="exceeds max_bytes"):
            csnappy.uncompress(body, (1 << 30) - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert csnappy.uncompress(block(3, literal(b"abc")), 3) == b"abc"  # exactly max_bytes: fine


def test_a_negative_max_bytes_refuses_every_non_empty_block() -> None:
    with pytest.raises(ValueError):
        csnappy.uncompress(block(1, literal(b"a")), -1)


def test_the_c_decoder_takes_bytes_like_objects_and_nothing_else() -> None:
    body = block(3, literal(b"abc"))
    assert csnappy.uncompress(bytearray(body), 3) == b"abc"
    assert csnappy.uncompress(memoryview(body), 3) == b"abc"
    with pytest.raises(TypeError):
        csnappy.uncompress("abc", 3)


@pytest.mark.parametrize("max_bytes", [1 << 32, 1 << 63, 1 << 64, 10**30])
def test_a_limit_past_the_formats_4_gib_or_past_ssize_t_decodes_as_the_reference(max_bytes: int) -> None:
    # review 21:45: a server.max_request_bytes over 2^63 made the C path raise OverflowError (a 503)
    body = wire.compress(b"abc" * 1000)
    assert wire.decompress(body, max_bytes) == wire.py_decompress(body, max_bytes) == b"abc" * 1000


# ---- crc32: zlib.crc32's twin that keeps the GIL (the queue's row checksum) ---------------------


@SETTINGS
@given(data=st.binary(max_size=20000), value=st.integers(-(1 << 40), 1 << 40),
       kind=st.sampled_from([bytes, bytearray, memoryview]))
def test_crc32_is_zlibs_for_any_bytes_and_start_value(data: bytes, value: int, kind: Callable[[bytes], Any]) -> None:
    import zlib

    assert csnappy.crc32(kind(data), value) == zlib.crc32(data, value)


class Index:
    def __index__(self) -> int:
        return 7


def crc_outcome(fn: Callable[..., int], *args: object) -> tuple[str, object]:
    try:
        return "ok", fn(*args)
    except Exception as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("args", [
    (b"abc", -1), (b"abc", 1 << 70), (b"abc", -(1 << 70)), (memoryview(b"abcdef")[::2],), ("text",),
    (b"abc", 1.0), (b"abc", True), (b"abc", Index()), (), (b"a", 1, 2), (b"abc",), (bytearray(b"abc"), 5),
], ids=["neg", "big", "negbig", "strided", "str", "float", "bool", "index", "none", "three", "one", "bytearray"])
def test_crc32_gives_zlibs_result_or_error_for_odd_arguments(args: tuple[object, ...]) -> None:
    import zlib

    assert crc_outcome(csnappy.crc32, *args) == crc_outcome(zlib.crc32, *args)


def test_the_queue_checksum_uses_the_c_crc32(monkeypatch: pytest.MonkeyPatch) -> None:
    from relay.delivery.queue import codec as queue_codec

    assert queue_codec._crc32 is csnappy.crc32
    assert queue_codec.checksum(b"x" * 6000, 9) == queue_codec.checksum(b"x" * 6000, 9)
    import zlib

    crc = zlib.crc32((9).to_bytes(8, "little"), zlib.crc32(b"x" * 6000))
    assert queue_codec.checksum(b"x" * 6000, 9) == (crc - (1 << 32) if crc >= 1 << 31 else crc)


# ---- compress: any valid block of the same bytes (the queue's rows, the sender's batches) ---------

COMPRESS_SIZES = [0, 1, 4, 14, 15, 16, 17, 100, 65535, 65536, 65537, 2 * 65536 + 3]


def structured() -> st.SearchStrategy[bytes]:
    """Label-like text: runs, repeats at every distance (copies of every kind and length)."""
    piece = st.binary(min_size=1, max_size=40)
    return st.lists(st.tuples(piece, st.integers(1, 300)), max_size=12).map(
        lambda parts: b"".join(p * k for p, k in parts))


def check_round_trip(raw: bytes) -> bytes:
    z = csnappy.compress(raw)
    assert type(z) is bytes and len(z) <= 32 + len(raw) + len(raw) // 6  # snappy's MaxCompressedLength
    assert bytes(snappy.uncompress(z)) == raw  # the reference decodes it
    assert csnappy.uncompress(z, max(1, len(raw))) == raw
    return z


@SETTINGS
@given(raw=st.one_of(st.binary(max_size=5000), structured()))
def test_compress_round_trips_through_the_reference_decoder(raw: bytes) -> None:
    check_round_trip(raw)


@pytest.mark.parametrize("size", COMPRESS_SIZES)
def test_compress_round_trips_at_every_fragment_edge(size: int) -> None:
    for raw in (b"a" * size, os.urandom(size), (b"label=value," * (size // 12 + 1))[:size]):
        check_round_trip(raw)


def test_compress_is_as_small_as_the_reference_on_remote_write_payloads() -> None:
    from bench.rw_payload import ISSUE9_OTHER_PER_NODE, payload

    ours = ref = 0
    for body in payload(3, 1, other_per_node=ISSUE9_OTHER_PER_NODE).requests:
        raw = wire.decompress(body, 1 << 30)
        for piece in (raw, raw[: len(raw) // 4], raw[:3000]):
            ours += len(check_round_trip(piece))
            ref += len(snappy.compress(piece))
    assert ours <= ref * 1.02  # the same algorithm: within a few bytes of cramjam's blocks


def test_compress_takes_any_bytes_like_object_and_refuses_others() -> None:
    assert csnappy.compress(bytearray(b"abc" * 50)) == csnappy.compress(memoryview(b"abc" * 50)) == csnappy.compress(
        b"abc" * 50)
    with pytest.raises(TypeError):
        csnappy.compress("text")


def test_the_queue_compresses_with_the_c_compressor_and_falls_back_to_the_reference() -> None:
    from relay.delivery.queue import codec as queue_codec

    assert queue_codec.compress is queue_codec._c_compress
    stored, raw_len = queue_codec.pack(b"series-" * 100)
    assert raw_len == 700 and stored == csnappy.compress(b"series-" * 100)
    assert queue_codec.py_compress(b"x" * 300) == bytes(snappy.compress(b"x" * 300))
