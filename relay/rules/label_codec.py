"""Label bytes <-> label sets on the relay's uncached path, with a bounded memo of Label entries.

Label entries repeat across series (``job``, ``namespace``, a node's ``instance``, a metric name):
decoding one entry means two slices and two UTF-8 decodes, looking it up means one slice and one
dict probe. The memo maps the raw bytes of one entry exactly as protobuf serialises it
(``0a len 0a len name 12 len value``, every length under 128, name and value non-empty) to its
(name, value) pair, and the pair back to those bytes (for encoding an output label set).

A memo hit proves the entry valid: the stored bytes were checked when first decoded, and an entry's
second byte is its own length, so a truncated or differently framed slice cannot equal a stored
one. Anything the fast path does not handle (any other framing, a multi-byte length, an empty name
or value, unsorted or duplicate names, invalid UTF-8) goes to ``wire.decode_labels``, so results
and error messages are the reference's. The memo never changes a result, only its cost; it is
bounded (cleared when full), and shared by every pipeline (it holds nothing per series).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from typing import Any

from relay import native
from relay.common.labels import Labels
from relay.ingest import wire

Names = tuple[str, ...]
MAX_ENTRIES = 16_384  # memoised Label entries (beyond: cleared and refilled)
MAX_MEMO_ENTRY = 130  # bytes: the longest entry memoised (the decoder's own are at most 129)
MAX_NAME_SETS = 4_096  # memoised label-name tuples (sortedness)
MAX_NAMES = 100  # longer name tuples are not memoised
# Estimated bytes per memo entry (bench/relay_series_bench.py memo figure): the entry bytes object,
# the pair tuple and its value string, two dict slots. Names are interned (shared).
ENTRY_BYTES = 300  # measured (tracemalloc): ~270
NAME_SET_BYTES = 120
# relay.native._cwire.decode_key's memo: a direct-mapped table of slots (entry bytes inline, 144 B each),
# allocated at the first call, each holding a (name, value) pair: tuple and value string
C_MEMO_SLOTS = 16_384
C_MEMO_SLOT_BYTES = 144
C_MEMO_PAIR_BYTES = 150

_PAIR: dict[bytes, tuple[str, str]] = {}  # entry bytes -> (name, value)
_ENTRY: dict[tuple[str, str], bytes] = {}  # (name, value) -> entry bytes (only pairs decoded here)
_SORTED: dict[Names, bool] = {}  # names -> strictly increasing


def memo_bytes() -> int:
    """Estimated memory held by the memos now (bounded by MAX_ENTRIES and MAX_NAME_SETS, and the C
    decoder's table: C_MEMO_SLOTS slots, C_MEMO_PAIR_BYTES per pair it holds)."""
    c = 0
    if _cwire is not None:
        _, used, _, _, table = _cwire.decode_key_memo()
        c = table + used * C_MEMO_PAIR_BYTES
    return max(len(_PAIR), len(_ENTRY)) * ENTRY_BYTES + len(_SORTED) * (NAME_SET_BYTES + 8 * 16) + c


def clear() -> None:
    _PAIR.clear()
    _ENTRY.clear()
    _SORTED.clear()


def _entry(key: bytes, p: int, end: int) -> tuple[str, str] | None:
    """The pair of the canonical entry ``key[p:end]`` (its length byte says ``end``), or None."""
    n = len(key)
    if end > n or key[p] != 0x0A or p + 4 > end or key[p + 2] != 0x0A or key[p + 3] >= 0x80:
        return None
    ne = p + 4 + key[p + 3]
    if ne == p + 4 or ne + 2 > end or key[ne] != 0x12 or key[ne + 1] >= 0x80 or ne + 2 + key[ne + 1] != end \
            or ne + 2 == end:
        return None
    try:
        pair = (sys.intern(key[p + 4 : ne].decode()), key[ne + 2 : end].decode())
    except UnicodeDecodeError:
        return None
    if len(_PAIR) >= MAX_ENTRIES or len(_ENTRY) >= MAX_ENTRIES:
        _PAIR.clear()
        _ENTRY.clear()
    raw = key[p:end]
    _PAIR[raw] = pair
    _ENTRY[pair] = raw
    return pair


def _sorted(names: Names) -> bool:
    ok = all(names[i - 1] < names[i] for i in range(1, len(names)))
    if len(names) > MAX_NAMES:
        return ok  # not memoised: a large tuple
    if len(_SORTED) >= MAX_NAME_SETS:
        _SORTED.clear()
    _SORTED[names] = ok
    return ok


def decode_key(key: bytes) -> tuple[Labels, Names, bool]:
    """``(wire.decode_labels(key), its names, canonical)``; canonical: ``key`` is exactly
    ``wire.encode_labels`` of the result. Raises ``wire.WireError`` as ``wire.decode_labels`` does.
    The C twin (relay.native._cwire.decode_key, its own bounded entry memo) answers strictly canonical
    keys (every length under 128, names sorted); every other key, and every error, is the reference's."""
    if _c_decode is not None:
        r = _c_decode(key)
        if r is not None:
            return r
    return py_decode_key(key)


def py_decode_key(key: bytes) -> tuple[Labels, Names, bool]:
    """``decode_key`` in Python: the reference (and the fallback)."""
    out: list[tuple[str, str]] = []
    append = out.append
    get = _PAIR.get
    n = len(key)
    p = 0
    try:
        while p < n:
            end = p + 2 + key[p + 1]
            pair = get(key[p:end])
            if pair is None:
                pair = _entry(key, p, end)
                if pair is None:
                    break
            append(pair)
            p = end
    except IndexError:  # a last entry of one byte
        pass
    if p == n:
        labels = tuple(out)
        names = tuple([q[0] for q in labels])
        ok = _SORTED.get(names)
        if ok or (ok is None and _sorted(names)):
            return labels, names, True
    labels = wire.decode_labels(key)
    return labels, tuple([q[0] for q in labels]), False


_cwire = native.load("cwire")
_c_decode: Callable[[bytes], tuple[Labels, Names, bool] | None] | None = _cwire.decode_key if _cwire else None


def encode(labels: Labels) -> bytes:
    """``wire.encode_labels(labels)``, from memoised entries where it can."""
    try:
        return b"".join(map(_ENTRY.__getitem__, labels))
    except KeyError:
        get = _ENTRY.get
        return b"".join([get(p) or _encode_pair(p) for p in labels])


def _encode_pair(pair: tuple[str, str]) -> bytes:
    """``wire.encode_label_pair`` of a pair not memoised (a label the rules set): memoised now."""
    raw = wire.encode_label_pair(pair[0].encode(), pair[1].encode())
    if len(raw) <= MAX_MEMO_ENTRY:
        if len(_ENTRY) >= MAX_ENTRIES:
            _PAIR.clear()
            _ENTRY.clear()
        _ENTRY[pair] = raw
    return raw


def offsets(key: bytes) -> list[int]:
    """Where each entry of a canonical key (``decode_key`` said so) starts."""
    out: list[int] = []
    p, n = 0, len(key)
    while p < n:
        out.append(p)
        p += 2 + key[p + 1]
    return out


def py_entry_offset(key: bytes, i: int) -> int:
    """Where entry ``i`` (>= 0) of a canonical key starts, ``len(key)`` past its last (``offsets(key)[i]``
    for a canonical key): the reference. On any other bytes it walks the same entry heads as its C
    twin and stops as it does, at ``len(key)`` where a head is cut off."""
    if i < 0:
        raise ValueError(f"entry index must be >= 0, not {i}")
    p, n = 0, len(key)
    for _ in range(i):
        if p >= n:
            break
        if p + 1 >= n:
            return n
        p += 2 + key[p + 1]
    return p if p < n else n


def _py_series_id(label_bytes: bytes, _blake2b: Callable[..., Any] = hashlib.blake2b) -> int:
    """``wire.series_id`` (BLAKE2b-8 of the label bytes, little-endian), one lookup cheaper."""
    return int.from_bytes(_blake2b(label_bytes, digest_size=8).digest(), "little")


# relay.native._cwire's BLAKE2b-64 (about twice as fast as hashlib's for a label set) when built
series_id: Callable[[bytes], int] = _cwire.series_id if _cwire else _py_series_id
# relay.native._cwire.entry_offset walks the entry heads in C (a new series' splice point, once per series)
entry_offset: Callable[[bytes, int], int] = _cwire.entry_offset if _cwire else py_entry_offset
