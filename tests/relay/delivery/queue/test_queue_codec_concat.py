"""queue_codec.concat: the element streams of stored rows (snappy blocks as they are, raw rows as
literals or one compressed run) under one header decode to the rows' contents, concatenated.

Every body is decoded three ways: python-snappy, cramjam's raw decoder, and ``reference_decode``
below (written from google/snappy's format_description.txt, strict: every length and offset is
checked). The Go decoders of real receivers are in tests/e2e/test_sender_receivers.py."""

from __future__ import annotations

import itertools
import random

import cramjam
import pytest
import snappy
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.delivery.queue import codec as queue_codec
from relay.delivery.queue.codec import CodecError, concat, literal, pack


class FormatError(ValueError):
    pass


def _varint(b: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        if i >= len(b) or shift > 28:
            raise FormatError("bad varint")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _take(b: bytes, i: int, n: int) -> int:
    if i + n > len(b):
        raise FormatError("element runs past the end")
    return int.from_bytes(b[i : i + n], "little")


def reference_decode(block: bytes) -> bytes:
    """A strict snappy block decoder: preamble varint, then literals and copies; a copy's offset is
    1 or more and never reaches before the start of the output; the output is exactly the preamble."""
    want, i = _varint(block, 0)
    out = bytearray()
    while i < len(block):
        tag = block[i]
        i += 1
        kind, m = tag & 3, tag >> 2
        if kind == 0:
            if m < 60:
                n = m + 1
            else:
                n = _take(block, i, m - 59) + 1
                i += m - 59
            if i + n > len(block):
                raise FormatError("literal runs past the end")
            out += block[i : i + n]
            i += n
        else:
            if kind == 1:
                n, offset = 4 + (m & 7), ((m >> 3) << 8) | _take(block, i, 1)
                i += 1
            elif kind == 2:
                n, offset = m + 1, _take(block, i, 2)
                i += 2
            else:
                n, offset = m + 1, _take(block, i, 4)
                i += 4
            if offset == 0 or offset > len(out):
                raise FormatError(f"copy offset {offset} with {len(out)} bytes out")
            start = len(out) - offset
            if offset >= n:
                out += out[start : start + n]
            else:
                for k in range(n):
                    out.append(out[start + k])
        if len(out) > want:
            raise FormatError("more output than the preamble says")
    if len(out) != want:
        raise FormatError(f"{len(out)} bytes out, the preamble says {want}")
    return bytes(out)


def decoded_everywhere(body: bytes) -> bytes:
    """The body decoded by all three decoders, which must agree."""
    a = bytes(snappy.uncompress(body))
    b = bytes(cramjam.snappy.decompress_raw(body))
    c = reference_decode(body)
    assert a == b == c
    return a


def python_snappy(data: bytes) -> tuple[bytes, int | None]:
    return bytes(snappy.compress(data)), len(data)


def cramjam_raw(data: bytes) -> tuple[bytes, int | None]:
    return bytes(cramjam.snappy.compress_raw(data)), len(data)


def raw(data: bytes) -> tuple[bytes, int | None]:
    return data, None


WORDS = [b"__name__", b"DCGM_FI_DEV_GPU_UTIL", b"gpu", b"0", b"\x0a\x12", b"ip-10-0-1-2.ec2.internal", b"\x00",
         b"x" * 70]
payloads = st.one_of(
    st.binary(max_size=3000),
    st.lists(st.sampled_from(WORDS), max_size=400).map(b"".join),  # repetitive: copies, long and short
)
rows = st.lists(st.tuples(payloads, st.sampled_from([python_snappy, cramjam_raw, raw, pack])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(rows)
def test_concatenated_rows_of_any_kind_decode_to_their_contents_in_order(spec: list[tuple[bytes, object]]) -> None:
    stored = [enc(data) for data, enc in spec]  # type: ignore[operator]
    assert decoded_everywhere(concat(stored)) == b"".join(data for data, _ in spec)


@settings(max_examples=200, deadline=None)
@given(payloads, st.lists(st.integers(0, 3000), max_size=10), st.booleans())
def test_any_split_of_a_payload_into_stored_rows_concatenates_back_to_it(
    payload: bytes, cuts: list[int], repeat: bool
) -> None:
    payload = payload * 3 if repeat else payload  # long enough that pack() compresses most rows
    edges = sorted({0, len(payload), *(c % (len(payload) + 1) for c in cuts)})
    parts = [payload[a:b] for a, b in itertools.pairwise(edges)]
    assert decoded_everywhere(concat([pack(p) for p in parts])) == payload


def test_nothing_and_empty_rows_concatenate_to_an_empty_block() -> None:
    assert concat([]) == b"\x00"
    assert concat([(b"", None), (b"", None), python_snappy(b"")]) == b"\x00"
    assert decoded_everywhere(concat([(b"", None), python_snappy(b"abc" * 100), (b"", None), (b"z", None)])) == (
        b"abc" * 100 + b"z")


BOUNDARIES = [1, 2, 59, 60, 61, 62, 255, 256, 257, 65535, 65536, 65537, (1 << 24) - 1, 1 << 24, (1 << 24) + 1]


@pytest.mark.parametrize("n", BOUNDARIES)
def test_a_literal_has_the_tag_size_of_its_length_and_decodes_everywhere(n: int) -> None:
    data = random.Random(n).randbytes(n)
    element = literal(data)
    tag_bytes = 1 if n <= 60 else 2 if n <= 256 else 3 if n <= 65536 else 4 if n <= 1 << 24 else 5
    assert len(element) == tag_bytes + n and element[tag_bytes:] == data
    assert element[0] & 3 == 0  # a literal
    assert element[0] >> 2 == (n - 1 if n <= 60 else 59 + tag_bytes - 1)
    if n > 60:
        assert int.from_bytes(element[1:tag_bytes], "little") == n - 1
    body = concat([(data, None)])  # random bytes do not compress: the raw row goes as one literal
    assert body.endswith(element)
    assert decoded_everywhere(body) == data


@pytest.mark.parametrize("n", [1, 60, 61, 256, 257, 65536, 65537])
def test_raw_rows_at_tag_size_boundaries_between_compressed_rows_decode_in_order(n: int) -> None:
    rng = random.Random(n)
    a, b = b"abcdefgh" * 100, b"tuvwxyz" * 90
    mid = rng.randbytes(n)
    assert decoded_everywhere(concat([pack(a), (mid, None), pack(b), (mid, None)])) == a + mid + b + mid


def test_a_literal_refuses_nothing_and_more_than_the_format_allows() -> None:
    with pytest.raises(ValueError):
        literal(b"")


def test_compressed_rows_go_into_the_body_byte_for_byte_after_one_new_header() -> None:
    a, b = pack(b"DCGM_FI_DEV_GPU_UTIL" * 40), pack(b"DCGM_FI_DEV_FB_USED" * 50)
    assert a[1] is not None and b[1] is not None
    body = concat([a, b])
    elements_a, elements_b = a[0][2:], b[0][2:]  # both lengths (800, 950) are 2-byte varints
    total = a[1] + b[1]
    assert body == bytes([total & 0x7F | 0x80, total >> 7]) + elements_a + elements_b


def test_a_run_of_small_raw_rows_is_compressed_together_not_sent_as_literals() -> None:
    small = [(b"\x0a\x40" + b"__name__DCGM_FI_DEV_GPU_UTIL gpu %d pod trainer" % i, None) for i in range(40)]
    assert all(len(s) < queue_codec.MIN_PACK_BYTES for s, _ in small)  # each alone is stored raw
    body = concat(small)
    content = b"".join(s for s, _ in small)
    assert decoded_everywhere(body) == content
    assert len(body) * 2 < len(content)


def test_a_compressed_row_whose_header_is_not_its_raw_len_is_refused() -> None:
    z, n = pack(b"abc" * 200)
    assert n == 600
    with pytest.raises(CodecError, match="600"):
        concat([(z, 601)])
    with pytest.raises(CodecError):
        concat([(b"\xff\xff", 600)])  # a varint that never ends
    with pytest.raises(CodecError):
        concat([(b"", 600)])


def test_a_batch_over_the_formats_4_gib_is_refused_before_anything_is_built() -> None:
    big = (b"\xff\xff\xff\xff\x0f", 0xFFFFFFFF)  # just a header: concat reads no element
    with pytest.raises(CodecError, match="4 GiB"):
        concat([big, (b"\x01", 1)])


def test_checksum_changes_with_any_byte_and_with_the_raw_len() -> None:
    z, n = pack(b"DCGM_FI_DEV_GPU_UTIL" * 40)
    base = queue_codec.checksum(z, n)
    for i in range(len(z)):
        for flip in (0x01, 0x80):
            damaged = bytearray(z)
            damaged[i] ^= flip
            assert queue_codec.checksum(bytes(damaged), n) != base
    assert queue_codec.checksum(z, None) != base and queue_codec.checksum(z, 0) != base
    assert queue_codec.checksum(z, n + 1) != base and queue_codec.checksum(z[:-1], n) != base
