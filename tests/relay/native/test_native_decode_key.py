"""relay.native._cwire.decode_key against relay.label_codec's Python reference (py_decode_key): for every key
it either answers exactly the reference's (labels, names, True) or None (not strictly canonical: the
reference then decides), never anything else; it answers every strictly canonical key itself; and
label_codec.decode_key, which puts the two together, gives the reference's result or error for every
input. Its entry memo (direct-mapped, bounded) never changes a result, including when entries
replace each other in a slot. Runs whenever the module is built; skipped only with GPU_RELAY_NATIVE=0.

RELAY_FUZZ_EXAMPLES sets the examples per hypothesis test (default 300).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay import native
from relay.common.protowire import WireError, encode_len
from relay.ingest import wire
from relay.rules import label_codec

if native.disabled():
    pytest.skip("GPU_RELAY_NATIVE=0: the pure-Python reference only", allow_module_level=True)
cwire: Any = importlib.import_module("relay.native._cwire")  # not built: a failure (run scripts/setup.sh)

EXAMPLES = int(os.environ.get("RELAY_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))

NAMES = [b"__name__", b"job", b"instance", b"gpu", b"pod", b"a", b"b", b"\xc3\xa9t\xc3\xa9", b"\xff",
         b"\xed\xa0\x80", b"", b"n" * 127, b"n" * 128]
VALUES = [b"DCGM_FI_DEV_GPU_UTIL", b"0", b"1", b"10.0.0.1:9400", b"", b"x" * 120, b"x" * 121, b"x" * 200,
          b"\xe2\x82\xac", b"\xff", b"\xc3"]


def entry(name: bytes, value: bytes) -> bytes:
    """A Label entry as protobuf writes it (empty strings omitted)."""
    inner = (encode_len(1, name) if name else b"") + (encode_len(2, value) if value else b"")
    return encode_len(1, inner)


def odd_entry(draw: st.DrawFn) -> bytes:
    """Label entries of other framings: value first, explicit empty strings, extra fields, a 2-byte length."""
    name, value = draw(st.sampled_from(NAMES)), draw(st.sampled_from(VALUES))
    kind = draw(st.sampled_from(["value first", "explicit empty", "extra field", "long length", "other field"]))
    if kind == "value first":
        return encode_len(1, encode_len(2, value) + encode_len(1, name))
    if kind == "explicit empty":
        return encode_len(1, b"\x0a\x00" + encode_len(2, value))
    if kind == "extra field":
        return encode_len(1, encode_len(1, name) + encode_len(2, value) + b"\x18\x01")
    if kind == "long length":
        inner = encode_len(1, name) + encode_len(2, value)
        return b"\x0a" + bytes((len(inner) | 0x80, 0x00)) + inner if len(inner) < 128 else encode_len(1, inner)
    return encode_len(2, encode_len(1, name))


@st.composite
def keys(draw: st.DrawFn) -> bytes:
    """Label keys: mostly as the relay meets them, sorted or not, with odd entries and mutations."""
    pairs = draw(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=6))
    if draw(st.booleans()):
        pairs.sort()
    parts = [entry(n, v) for n, v in pairs]
    if draw(st.integers(0, 4)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), odd_entry(draw))
    key = b"".join(parts)
    kind = draw(st.sampled_from(["none", "none", "none", "truncate", "flip", "append"]))
    if kind != "none" and key:
        i = draw(st.integers(0, len(key) - 1))
        if kind == "truncate":
            key = key[:i]
        elif kind == "flip":
            key = key[:i] + bytes((draw(st.integers(0, 255)),)) + key[i + 1:]
        else:
            key += draw(st.binary(min_size=1, max_size=3))
    return key


def outcome(fn: Any, key: bytes) -> tuple[str, Any]:
    try:
        return "ok", fn(key)
    except WireError as e:
        return "error", (e.status, str(e))


def strictly_canonical(key: bytes) -> bool:
    """What the C decoder must take itself: the key is ``wire.encode_labels`` of its (sorted, unique,
    non-empty) labels and every length in it is under 128."""
    try:
        labels = wire.decode_labels(key)
    except WireError:
        return False
    if wire.encode_labels(labels) != key:
        return False
    return all(len(e) < 130 and len(n.encode()) < 128 and len(v.encode()) < 128
               for (n, v), e in zip(labels, [wire.encode_labels((p,)) for p in labels], strict=True))


def check(key: bytes) -> None:
    got = cwire.decode_key(key)
    want = outcome(label_codec.py_decode_key, key)
    if got is None:
        assert not strictly_canonical(key), key
    else:
        assert want == ("ok", got), key
        assert got[2] is True
        assert all(type(p) is tuple and type(p[0]) is str and type(p[1]) is str for p in got[0])
        assert all(sys.intern(n) is n for n in got[1])  # names interned, as the reference's
    assert outcome(label_codec.decode_key, key) == want, key


@SETTINGS
@given(st.lists(keys(), min_size=1, max_size=4))
def test_c_decode_key_is_the_reference_or_declines(ks: list[bytes]) -> None:
    for key in ks * 2:  # the second time from the memo
        check(key)


@SETTINGS
@given(st.binary(max_size=200))
def test_random_bytes_are_declined_or_decoded_as_the_reference(key: bytes) -> None:
    check(key)


def test_every_truncation_and_flipped_byte_of_a_dcgm_key_matches_the_reference() -> None:
    key = wire.encode_labels((("UUID", "GPU-0d4f"), ("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"),
                              ("instance", "10.0.0.1:9400"), ("job", "gpu-exporter")))
    assert cwire.decode_key(key) == label_codec.py_decode_key(key)
    for i in range(len(key)):
        check(key[:i])
        for b in (0x00, 0x0A, 0x12, 0x7F, 0x80, 0xFF, key[i] ^ 1):
            check(key[:i] + bytes((b,)) + key[i + 1:])


def test_strictly_canonical_edges_are_decoded_in_c() -> None:
    longest = wire.encode_labels((("n" * 61, "v" * 62),))  # entry length 127
    assert longest[1] == 127
    for key in (b"", wire.encode_labels((("a", "1"),)), longest,
                wire.encode_labels((("__name__", "m"), ("\u00e9t\u00e9", "\u20ac")))):
        assert cwire.decode_key(key) == label_codec.py_decode_key(key)
    too_long = wire.encode_labels((("n" * 62, "v" * 62),))  # entry length 128: a 2-byte varint
    assert too_long[1] == 0x80
    assert cwire.decode_key(too_long) is None
    assert label_codec.decode_key(too_long) == label_codec.py_decode_key(too_long)


def test_unsorted_duplicate_and_invalid_keys_are_left_to_the_reference() -> None:
    a, b = entry(b"a", b"1"), entry(b"b", b"2")
    for key in (b + a, a + a, a + entry(b"a", b"2"), entry(b"\xff", b"1"), entry(b"a", b"\xc3"),
                entry(b"a", b""), entry(b"", b"1"), a + b"\x0a", a + b"\x0a\x05\x0a\x01a\x12"):
        assert cwire.decode_key(key) is None, key
        assert outcome(label_codec.decode_key, key) == outcome(label_codec.py_decode_key, key)


def test_non_bytes_are_declined() -> None:
    key = wire.encode_labels((("a", "1"),))
    assert cwire.decode_key(bytearray(key)) is None
    assert cwire.decode_key(memoryview(key)) is None
    assert cwire.decode_key("a") is None


def test_entries_that_replace_each_other_in_the_memo_still_decode_exactly() -> None:
    slots = cwire.decode_key_memo(True)[0]
    ks = [wire.encode_labels((("__name__", "m"), ("pod", f"pod-{i}"))) for i in range(3 * slots)]
    want = [label_codec.py_decode_key(k) for k in ks]
    for _ in range(2):
        assert [cwire.decode_key(k) for k in ks] == want
    _, used, hits, misses, table = cwire.decode_key_memo()
    assert used <= slots  # bounded, whatever the number of distinct entries
    assert hits > 0 and misses > 3 * slots  # the metric name hit; pods collided and were replaced
    assert slots * 130 <= table <= slots * 160  # the slots hold the entries' bytes
    assert cwire.decode_key_memo(True)[1] == used and cwire.decode_key_memo()[1:4] == (0, 0, 0)
    assert label_codec.memo_bytes() >= table
    assert cwire.decode_key(ks[0]) == want[0]


def test_label_codec_decodes_canonical_keys_in_c_without_the_python_memo() -> None:
    label_codec.clear()
    cwire.decode_key_memo(True)
    key = wire.encode_labels((("__name__", "m"), ("job", "j")))
    assert label_codec.decode_key(key) == label_codec.py_decode_key(key)
    label_codec.clear()
    assert label_codec.decode_key(key)[2] is True
    assert not label_codec._PAIR and not label_codec._SORTED  # the C twin answered
    assert cwire.decode_key_memo()[2] >= 2  # both entries found in its memo


def test_label_codec_series_id_is_the_c_blake2b_64() -> None:
    import hashlib
    assert label_codec.series_id is cwire.series_id
    for n in (0, 1, 127, 128, 129, 255, 256, 257, 330, 1000):
        key = bytes(range(256)) * 4
        key = key[:n]
        assert label_codec.series_id(key) == label_codec._py_series_id(key) == \
            int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
