"""RW 2.0 -> 1.0 transcoding in process: the Python reference and relay.native._crw2 side by side, one run.

Issue 9's payload shape (bench/rw_payload.py: 250 nodes x 252 series = 63,000 series per round, 2,000
series per request), ``--rounds`` rounds as Remote-Write 2.0. For every request, alternately: the
reference ``relay.wire_v2.py_v2_to_v1`` and the C ``relay.native._crw2.v2_to_v1`` (the least CPU time of
``--repeat`` passes each), in us of CPU per series. Then what a request costs the relay in process up to its routed
series, both versions side by side: snappy + route of the RW 1.0 request, and snappy + v2_to_v1 (C)
+ route of the RW 2.0 one, with a warm decision cache (the steady state: every series known).
First it checks that every transcoded request is byte for byte the RW 1.0 request of the same
series (so the route loop's fast path and decision cache see the very same keys).

    .venv/bin/python bench/rw2_bench.py                 # 250 nodes, 2 rounds (~1 min on 2 cores)
    .venv/bin/python bench/rw2_bench.py --nodes 25 --rounds 1 --repeat 3
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import snappy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rw_payload import ISSUE9_OTHER_PER_NODE, PER_REQUEST, SCRAPE_MS, cluster_series, encode_v1, encode_v2
from relay import native
from relay.ingest import wire, wire_v2

T0 = 1_764_547_200_000  # 2025-12-01 00:00 UTC in ms


def keep_all(key: bytes) -> wire.Decision:
    return ((key, wire.series_id(key), ""),)


def best(fn: Callable[[], object], repeat: int) -> float:
    """Least CPU time of ``repeat`` calls, in seconds: CPU, not wall, since the machine is shared."""
    out = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        out = min(out, time.process_time() - t)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="passes per implementation (best shown)")
    args = ap.parse_args(argv)
    crw2 = native.load("crw2")
    if crw2 is None:
        sys.exit("relay.native._crw2 is not built (or GPU_RELAY_NATIVE=0): build it with `bash scripts/setup.sh`")
    series = cluster_series(args.nodes, ISSUE9_OTHER_PER_NODE)
    chunks = [series[i : i + PER_REQUEST] for i in range(0, len(series), PER_REQUEST)]
    stamps = [T0 + r * SCRAPE_MS for r in range(args.rounds)]  # as build_requests, on a fixed clock
    v2 = [encode_v2(c, ts, r) for r, ts in enumerate(stamps) for c in chunks]
    v1 = [encode_v1(c, ts, r) for r, ts in enumerate(stamps) for c in chunks]
    raw2 = [snappy.uncompress(r) for r in v2]
    n = len(series) * args.rounds
    print(f"payload: {len(series):,} series x {args.rounds} rounds = {n:,} series in {len(v2)} RW 2.0 requests "
          f"of {PER_REQUEST:,} series ({sum(map(len, raw2)) / 1e6:.1f} MB uncompressed, "
          f"{sum(map(len, v2)) / 1e6:.1f} MB snappy)")
    for a, b in zip(raw2, v1, strict=True):
        got = crw2.v2_to_v1(a, wire_v2.DEFAULT_MAX_BYTES)
        assert got == wire_v2.py_v2_to_v1(a), "C and Python transcodes differ"
        assert crw2.transcode(a, wire_v2.DEFAULT_MAX_BYTES) is not None, "the C code handed a bench request over"
        assert got[0] == snappy.uncompress(b), "the transcoded request is not the RW 1.0 request"
    print("check: every request transcodes (C == Python) to exactly the RW 1.0 request's bytes")

    def transcode(fn: Callable[[bytes, int], object]) -> Callable[[], None]:
        def run() -> None:
            for r in raw2:
                fn(r, wire_v2.DEFAULT_MAX_BYTES)
        return run

    py_s = best(transcode(wire_v2.py_v2_to_v1), args.repeat)
    c_s = best(transcode(crw2.v2_to_v1), args.repeat)
    print(f"v2_to_v1   Python {py_s / n * 1e6:7.3f} us/series   C {c_s / n * 1e6:7.3f} us/series   "
          f"C is {py_s / c_s:.0f}x faster")

    cache1: dict[bytes, wire.Decision] = {}
    cache2: dict[bytes, wire.Decision] = {}

    def route1() -> None:
        for r in v1:
            wire.route(snappy.uncompress(r), 1, cache1, keep_all)

    def route2() -> None:
        for r in v2:
            wire.route(crw2.v2_to_v1(snappy.uncompress(r), wire_v2.DEFAULT_MAX_BYTES)[0], 1, cache2, keep_all)

    route1()
    route2()  # warm caches: every series known
    r1 = best(route1, args.repeat)
    r2 = best(route2, args.repeat)
    print(f"in process, warm cache: RW 1.0 snappy+route {r1 / n * 1e6:.3f} us/series; RW 2.0 snappy+v2_to_v1(C)+route "
          f"{r2 / n * 1e6:.3f} us/series: {r2 / r1:.2f}x (the transcode is {c_s / r2:.0%} of the RW 2.0 figure)")


if __name__ == "__main__":
    main()
