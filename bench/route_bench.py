"""The per-series route loop, Python reference vs C (relay/native/cwire.c), side by side in one run.

Requests of the issue 9 shape (bench/rw_payload.py: dcgm-exporter series plus node-exporter-like
ones, 2,000 series per request, one sample each) go through ``wire.route`` with 2 destinations:
- warm: every series already in the decision cache (the steady state), us per series;
- first sight: an empty cache every time, ``decide`` a precomputed lookup; the figure excludes
  decide itself (its cost, measured alone, is subtracted): what the loop adds per new series.
Best of ``--repeat`` rounds per figure, Python and C interleaved, so the ratio holds on a busy machine.

    .venv/bin/python bench/route_bench.py [--quick] [--nodes 24] [--repeat 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snappy

from bench.rw_payload import ISSUE9_OTHER_PER_NODE, build_requests, cluster_series
from relay import native
from relay.ingest import wire

Loop = Callable[..., Any]


def decisions_for(raws: list[bytes]) -> tuple[dict[bytes, wire.Decision], list[bytes]]:
    """What a pipeline-like decide answers for every key (keep all in dest 0, every 4th in dest 1),
    and every key in the order a cold route of each request asks for them."""
    out: dict[bytes, wire.Decision] = {}
    asked: list[bytes] = []

    def record(key: bytes) -> wire.Decision:
        asked.append(key)
        sid = wire.series_id(key)
        d: wire.DestDecision = (key, sid, "m")
        out[key] = (d, d if sid % 4 == 0 else None)
        return out[key]

    for raw in raws:
        wire.route(raw, 2, {}, record)
    return out, asked


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=24, help="nodes of the issue 9 shape (252 series each)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="4 nodes, 3 repeats")
    args = ap.parse_args(argv)
    nodes, repeat = (4, 3) if args.quick else (args.nodes, args.repeat)
    c = native.load("cwire")
    if c is None:
        print("relay.native._cwire is not built or GPU_RELAY_NATIVE=0: nothing to compare", file=sys.stderr)
        return 1
    loops: dict[str, Loop] = {"python": wire._route_loop, "c": c.route_loop}
    series = cluster_series(nodes, ISSUE9_OTHER_PER_NODE)
    raws = [bytes(snappy.uncompress(r)) for r in build_requests(series, 2)]
    decided, asked = decisions_for(raws)
    n_series = len(asked)  # every series of a request is distinct
    print(f"{len(raws)} requests, {n_series:,} series ({nodes} nodes x 252, 2 rounds, 2,000 series per request), "
          f"2 destinations, best of {repeat}")

    def decide(key: bytes) -> wire.Decision:
        return decided[key]

    def warm(loop: Loop) -> Callable[[], None]:
        cache = dict(decided)

        def run() -> None:
            for raw in raws:
                wire.route(raw, 2, cache, decide)
        return run

    def first_sight() -> None:
        for raw in raws:
            wire.route(raw, 2, {}, decide)

    def decide_alone() -> None:
        for key in asked:
            decide(key)

    best: dict[tuple[str, str], float] = {}
    saved = wire.route_loop
    try:
        for _ in range(repeat):
            for name, loop in loops.items():
                wire.route_loop = loop
                for kind, fn in (("warm", warm(loop)), ("first", first_sight)):
                    s = timed(fn)
                    best[name, kind] = min(best.get((name, kind), s), s)
        alone = min(timed(decide_alone) for _ in range(repeat))
    finally:
        wire.route_loop = saved
    n_new = len(asked)
    print(f"{'':34} {'python':>10} {'c':>10} {'python/c':>9}")
    py, cc = (best["python", "warm"] / n_series * 1e6, best["c", "warm"] / n_series * 1e6)
    print(f"{'warm cache, us per series':34} {py:10.3f} {cc:10.3f} {py / cc:8.1f}x")
    py, cc = ((best[k, "first"] - alone) / n_new * 1e6 for k in ("python", "c"))
    print(f"{'first sight, us per new series':34} {py:10.3f} {cc:10.3f} {py / cc:8.1f}x"
          f"   (excluding decide: {alone / n_new * 1e6:.3f} us, subtracted)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
