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

_cstage = native.load("cstage")
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


@pytest.mark.skipif(_cstage is None, reason="relay._cstage not in use (GPU_RELAY_NATIVE=0 or not built)")
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
