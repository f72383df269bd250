"""Review of the native core (issue 9): hash flooding of the C tables by keys a client can choose.

The Python twins keep these keys in dicts (SipHash with a per-process key for str, and a
perturbed probe sequence for ints), so a client cannot make them slow; the C tables must not be
either. Each test times the same table filled with keys aimed at one bucket of the table's public
hash against keys that are not: side by side in one run, as a ratio.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import pytest

from relay import native
from relay.common.protowire import encode_len, encode_uvarint

_cstage = native.load("cstage")
_crw2 = native.load("crw2")
U64 = (1 << 64) - 1


def _best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ---- cstage: the series id table (uint64 id -> slot) ---------------------------------------------

_C1, _C2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53  # murmur3's fmix64, cstage.c mix64


def _inverse_fmix64(y: int) -> int:
    y ^= y >> 33
    y = y * pow(_C2, -1, 1 << 64) & U64
    y ^= y >> 33
    y = y * pow(_C1, -1, 1 << 64) & U64
    y ^= y >> 33
    return y


@pytest.mark.skipif(_cstage is None, reason="relay.native._cstage not in use (GPU_RELAY_NATIVE=0 or not built)")
def test_series_table_is_not_slowed_by_ids_aimed_at_one_bucket_of_fmix64() -> None:
    # ids whose fmix64 is tiny all have home bucket 0 with an unkeyed mix: one probe run of n
    # entries, n^2/2 probes to fill it. Series ids are BLAKE2b-64 of label bytes a client sends, so
    # ids with, say, the top 16 bits of fmix64 zero cost 2^16 hashes each, offline.
    assert _cstage is not None
    n = 20_000
    aimed = [_inverse_fmix64(i) for i in range(1, n + 1)]
    rng = random.Random(9)
    plain = [rng.getrandbits(64) | 1 for _ in range(n)]

    def fill(keys: Sequence[int]) -> Callable[[], object]:
        def run() -> object:
            t = _cstage.Table()
            for i, k in enumerate(keys):
                t.put(k, i)
            return [t.get(k) for k in keys]
        return run

    ratio = _best_of(3, fill(aimed)) / _best_of(3, fill(plain))
    assert ratio < 5, f"aimed ids took {ratio:.0f}x as long as random ones"


# ---- crw2: the request's metadata table (family name -> entry), FNV-1a ----------------------------

_FNV_P = 16777619
_BITS = 20  # aimed at the low 20 bits: one probe run for tables up to 2^20 slots
_MASK = (1 << _BITS) - 1
_PRINTABLE = range(0x21, 0x7F)


def _fnv_low(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h = ((h ^ b) * _FNV_P) & 0xFFFFFFFF
    return h & _MASK


def _aimed_names(n: int, target: int = 0) -> list[bytes]:
    """n distinct names whose FNV-1a has the same low 20 bits (they depend only on low bits)."""
    p_inv = pow(_FNV_P, -1, 1 << _BITS)
    back: dict[int, bytes] = {}  # state before the last two bytes -> those bytes
    for b2 in _PRINTABLE:
        x = ((target * p_inv) & _MASK) ^ b2
        for b1 in _PRINTABLE:
            back.setdefault(((x * p_inv) & _MASK) ^ b1, bytes((b1, b2)))
    out: list[bytes] = []
    i = 0
    while len(out) < n:
        prefix = b"m%d_" % i
        i += 1
        s = _fnv_low(prefix)
        for a1 in _PRINTABLE:
            s1 = ((s ^ a1) * _FNV_P) & _MASK
            for a2 in _PRINTABLE:
                tail = back.get(((s1 ^ a2) * _FNV_P) & _MASK)
                if tail is not None:
                    out.append(prefix + bytes((a1, a2)) + tail)
                    break
            else:
                continue
            break
    return out


def _v2_request(names: Sequence[bytes]) -> bytes:
    """One series per name, each with COUNTER metadata: one metadata entry per distinct family."""
    symbols = [b"", b"__name__", *names]
    body = [encode_len(4, s) for s in symbols]
    for i in range(len(names)):
        refs = encode_uvarint(1) + encode_uvarint(i + 2)
        series = encode_len(1, refs) + encode_len(5, b"\x08\x01")  # labels_refs, metadata type=1
        body.append(encode_len(5, series))
    return b"".join(body)


@pytest.mark.skipif(_crw2 is None, reason="relay.native._crw2 not in use (GPU_RELAY_NATIVE=0 or not built)")
def test_metadata_table_is_not_slowed_by_family_names_aimed_at_one_fnv_bucket() -> None:
    assert _crw2 is not None
    n = 12_000
    aimed = _aimed_names(n)
    assert len({_fnv_low(x) for x in aimed}) == 1 and len(set(aimed)) == n
    rng = random.Random(9)
    plain = [b"m%d_%s" % (i, bytes(rng.choice(_PRINTABLE) for _ in range(4))) for i in range(n)]
    raw_aimed, raw_plain = _v2_request(aimed), _v2_request(plain)
    limit = 64 << 20
    for raw in (raw_aimed, raw_plain):  # both handled by the C code, not handed to the reference
        got = _crw2.transcode(raw, limit)
        assert got is not None and got[1:] == (0, 0, 0)
        assert got[0].count(b"\x1a") >= n
    ratio = _best_of(3, lambda: _crw2.transcode(raw_aimed, limit)) / _best_of(
        3, lambda: _crw2.transcode(raw_plain, limit)
    )
    assert ratio < 5, f"aimed family names took {ratio:.0f}x as long as others"
