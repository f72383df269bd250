"""The relay's per-series stateful pass, C against the pure-Python reference, side by side in one run.

us per series occurrence of ``Pipeline.route`` minus ``wire.route`` (the decode and the decision
cache lookups, measured inside the same calls and subtracted): what is left is the per-series state
(the in tracker, and per destination ``DestinationStage.take``: drops, owners, limits, the out
tracker, sharding into queue pieces). Issue 9's payload (bench/rw_payload.py: 250 nodes x 252 series,
2,000 series per request), rules "keep4" (keep 4 DCGM names, labeldrop 2 labels) and "passthrough"
as bench/relay_bench.py; one dry-run destination (no queue), external_labels {cluster}. Two
pipelines, one on relay.native._cstage and one on the reference, route every request in turn (CPU time,
``time.process_time``); the first round (every series new, every label set decided) is reported
apart from the later ones (series known).

    .venv/bin/python bench/stage_bench.py            # 250 nodes x 6 rounds
    .venv/bin/python bench/stage_bench.py --quick    # 25 nodes x 4 rounds

The timers wrap ``wire.route`` and the state calls, which turns Pipeline.route's cache-hit fast path
(relay.native._cstage.route_hits: the whole pass in one C call) off: this bench measures the path of separate
calls; bench/pipeline_route_bench.py measures route as the relay runs it, fast path included.

A second table times the two state calls directly, on one request of known series routed again and
again (the best of 30 tries of 5 calls, wall clock): on a shared machine the minimum is what the code
costs, the sums above include whatever the neighbours did to the caches.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import snappy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.relay_run import KEEP4_RULES
from bench.rw_payload import ISSUE9_OTHER_PER_NODE, payload
from relay import native
from relay.common.metrics import RelayMetrics
from relay.config.config import parse_config
from relay.ingest import wire
from relay.state import series_tracker
from relay.state.cardinality import CardinalityMetrics, DestinationStats
from relay.state.pipeline import Pipeline
from relay.state.series_tracker import CSeriesTracker

SCENARIOS = {"keep4": KEEP4_RULES, "passthrough": ""}


def build(rules: str, reference: bool) -> Pipeline:
    from prometheus_client import CollectorRegistry

    config = parse_config(
        "storage: {path: /nonexistent}\nexternal_labels: {cluster: prod}\n"
        "destinations:\n  - name: amp\n    url: http://127.0.0.1:1/api/v1/write\n    dry_run: true\n" + rules)
    saved = series_tracker._NATIVE
    if reference:
        series_tracker._NATIVE = None
    try:
        registry = CollectorRegistry()
        cm = CardinalityMetrics(registry)
        stats = [DestinationStats("amp", metrics=cm)]
        return Pipeline(config, RelayMetrics(registry), stats, [None], cardinality=cm)
    finally:
        series_tracker._NATIVE = saved


class Timer:
    """Wraps a function (``wire.route`` as the pipeline calls it, a tracker's or stage's method) and
    adds up its CPU time."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.seconds = 0.0
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        t0 = time.process_time()
        try:
            return self.fn(*args)
        finally:
            self.seconds += time.process_time() - t0


def time_state(p: Pipeline) -> list[Timer]:
    """Timers on the per-series state calls of ``p``: the in tracker's observe_inputs, each take."""
    timers = [Timer(p.tracker_in.observe_inputs)]
    p.tracker_in.observe_inputs = timers[0]  # type: ignore[method-assign,assignment]
    for stage in p.stages:
        timers.append(Timer(stage.take))
        stage.take = timers[-1]  # type: ignore[method-assign,assignment]
    return timers


def direct(bodies: list[bytes], tries: int = 30, calls: int = 5) -> None:
    """ns per series of observe_inputs and take called directly, C and Python, best of ``tries``."""
    print(f"direct calls on one request of known series, ns per series (best of {tries} x {calls} calls)")
    gc.collect()
    gc.freeze()
    header = f"{'rules':<12} {'call':<15} {'Python':>9} {'C':>8} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for name, rules in SCENARIOS.items():
        best: dict[str, list[float]] = {}
        for impl in ("Python", "C"):
            p = build(rules, impl == "Python")
            for body in bodies:
                p.route(body)
            cache = p.cache
            routed = wire.route(bodies[0], 2, cache.young, functools.partial(cache.miss, decide=p.decide))
            inputs, entries = routed.per_dest[0], routed.per_dest[1]
            stage, has = p.stages[0], p.tracker_in.has()
            b = best[impl] = [float("inf"), float("inf")]
            for _ in range(tries):
                t0 = time.perf_counter()
                for _ in range(calls):
                    p.tracker_in.observe_inputs(inputs, p._labels)
                t1 = time.perf_counter()
                for _ in range(calls):
                    stage.take(entries, inputs, set(), has, p._labels)
                t2 = time.perf_counter()
                b[0] = min(b[0], (t1 - t0) / calls / len(inputs) * 1e9)
                b[1] = min(b[1], (t2 - t1) / calls / len(inputs) * 1e9)
        for k, call in enumerate(("observe_inputs", "take")):
            py, c = best["Python"][k], best["C"][k]
            print(f"{name:<12} {call:<15} {py:>6.0f} ns {c:>5.0f} ns {py / c:>5.1f}x", flush=True)
    gc.unfreeze()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="25 nodes x 4 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds = 25, 4
    if native.load("cstage") is None:
        print("relay.native._cstage is not in use (GPU_RELAY_NATIVE=0 or not built): nothing to compare")
        return 1
    pl = payload(args.nodes, args.rounds, other_per_node=ISSUE9_OTHER_PER_NODE)
    bodies = [bytes(snappy.decompress(r)) for r in pl.requests]
    per_round = len(bodies) // args.rounds
    n_series = len(pl.series)
    print(f"per-series pass (Pipeline.route - wire.route), {pl.describe()}")
    print(f"wire.route here: {'C' if native.load('cwire') else 'Python'}; CPU time, us per series occurrence")
    print("state: the part of it in the in tracker's observe_inputs and DestinationStage.take (the rest:")
    print("the pipeline's own per-request work, freeing wire.route's output, the garbage collector)")
    header = (f"{'rules':<12} {'round':<7} {'Python':>8} {'C':>8} {'ratio':>6}   {'state: Python':>13} {'C':>8} "
              f"{'ratio':>6}   {'wire.route':>10}")
    print(header)
    print("-" * len(header))
    timer = Timer(wire.route)
    wire.route = timer  # type: ignore[assignment]
    try:
        for name, rules in SCENARIOS.items():
            pipes = {"C": build(rules, False), "Python": build(rules, True)}
            timers = {k: time_state(p) for k, p in pipes.items()}
            state = {k: [0.0, 0.0] for k in pipes}
            assert type(pipes["C"].tracker_in) is CSeriesTracker
            assert type(pipes["Python"].tracker_in) is not CSeriesTracker
            cost = {k: [0.0, 0.0] for k in pipes}  # [first round, later rounds]: route - wire.route
            wire_s = [0.0, 0.0]
            for i, body in enumerate(bodies):
                later = int(i >= per_round)
                for k, p in pipes.items():
                    timer.seconds = 0.0
                    for t in timers[k]:
                        t.seconds = 0.0
                    t0 = time.process_time()
                    p.route(body)
                    total = time.process_time() - t0
                    cost[k][later] += total - timer.seconds
                    state[k][later] += sum(t.seconds for t in timers[k])
                    wire_s[later] += timer.seconds / len(pipes)
            for later, label in ((0, "first"), (1, "later")):
                occurrences = n_series * (1 if later == 0 else args.rounds - 1)
                if not occurrences:
                    continue
                py, c = (cost[k][later] / occurrences * 1e6 for k in ("Python", "C"))
                spy, sc = (state[k][later] / occurrences * 1e6 for k in ("Python", "C"))
                print(f"{name:<12} {label:<7} {py:>5.2f} us {c:>5.2f} us {py / c:>5.1f}x   {spy:>10.2f} us "
                      f"{sc:>5.2f} us {spy / sc:>5.1f}x   {wire_s[later] / occurrences * 1e6:>7.2f} us", flush=True)
    finally:
        wire.route = timer.fn
    print()
    direct(bodies[:per_round])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
