"""Pipeline.route on issue 9's request shape, CPU us per series occurrence once every series is known.

The whole per-request pass as the relay's ingest runs it (the route loop, the decision cache, the in
tracker, each destination's take, the pieces), nothing else: no HTTP, no queue. Requests of
bench/rw_payload.py ``payload(nodes, rounds, other_per_node=ISSUE9_OTHER_PER_NODE)`` (2,000 series per
request), rules "keep4" (bench/relay_run.py KEEP4_RULES) and "passthrough", one dry-run destination,
external_labels {cluster}. The first round (every series new) warms the pipeline up and is not
timed; the later rounds are, in CPU time (``time.process_time``), best of ``--repeat``.

``--compare PATH`` runs the same measurement in the checkout at PATH too (its relay package, its built
extensions; e.g. ``git worktree add /tmp/base main`` and ``setup.py build_ext --inplace`` there), one
worker process per tree and repeat, the two trees interleaved, so the ratio is side by side in one run.

    .venv/bin/python bench/pipeline_route_bench.py [--quick] [--nodes 250] [--rounds 4] [--repeat 3]
    .venv/bin/python bench/pipeline_route_bench.py --compare /tmp/fuse-base
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def worker(nodes: int, rounds: int) -> dict[str, float]:
    """us per series occurrence of Pipeline.route over the rounds after the first, per scenario."""
    import gc

    import snappy
    from prometheus_client import CollectorRegistry

    from bench.relay_run import KEEP4_RULES
    from bench.rw_payload import ISSUE9_OTHER_PER_NODE, payload
    from relay.common.metrics import RelayMetrics
    from relay.config.config import parse_config
    from relay.state.cardinality import CardinalityMetrics, DestinationStats
    from relay.state.pipeline import Pipeline

    pl = payload(nodes, rounds, other_per_node=ISSUE9_OTHER_PER_NODE)
    bodies = [bytes(snappy.decompress(r)) for r in pl.requests]
    per_round = len(bodies) // rounds
    out: dict[str, float] = {}
    for name, rules in (("keep4", KEEP4_RULES), ("passthrough", "")):
        config = parse_config(
            "storage: {path: /nonexistent}\nexternal_labels: {cluster: prod}\n"
            "destinations:\n  - name: amp\n    url: http://127.0.0.1:1/api/v1/write\n    dry_run: true\n" + rules)
        registry = CollectorRegistry()
        cm = CardinalityMetrics(registry)
        p = Pipeline(config, RelayMetrics(registry), [DestinationStats("amp", metrics=cm)], [None], cardinality=cm)
        for body in bodies[:per_round]:
            p.route(body)
        gc.collect()
        t0 = time.process_time()
        for body in bodies[per_round:]:
            p.route(body)
        seconds = time.process_time() - t0
        out[name] = seconds / (len(pl.series) * (rounds - 1)) * 1e6
    return out


def run_worker(tree: Path, nodes: int, rounds: int) -> dict[str, float]:
    """worker() in a fresh process whose relay (and bench helpers) come from ``tree``."""
    code = (f"import json, sys; sys.path[:0] = [{str(tree)!r}, {str(HERE / 'bench')!r}]; import relay; "
            f"assert relay.__file__.startswith({str(tree)!r}), relay.__file__; "
            f"from pipeline_route_bench import worker; print(json.dumps(worker({nodes}, {rounds})))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tree), capture_output=True, text=True,
                       check=False)
    if r.returncode:
        raise RuntimeError(f"worker in {tree} failed:\n{r.stderr}")
    result: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=4, help="the first is the warm-up")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="50 nodes x 3 rounds, 2 repeats")
    ap.add_argument("--compare", type=Path, help="another checkout (built in place) to measure side by side")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds, args.repeat = 50, 3, 2
    trees = {"this": HERE}
    if args.compare is not None:
        trees = {"base": args.compare.resolve(), "this": HERE}
    best: dict[str, dict[str, float]] = {k: {} for k in trees}
    for _ in range(args.repeat):
        for label, tree in trees.items():
            for scenario, us in run_worker(tree, args.nodes, args.rounds).items():
                best[label][scenario] = min(best[label].get(scenario, us), us)
    print(f"Pipeline.route, {args.nodes} nodes x 252 series, {args.rounds - 1} timed rounds of known series, "
          f"2,000 series per request; CPU us per series occurrence, best of {args.repeat}")
    names = list(trees)
    print(f"{'rules':<12} " + " ".join(f"{n:>9}" for n in names) + ("   base/this" if len(names) == 2 else ""))
    for scenario in ("keep4", "passthrough"):
        row = f"{scenario:<12} " + " ".join(f"{best[n][scenario]:>6.3f} us" for n in names)
        if len(names) == 2:
            row += f"   {best['base'][scenario] / best['this'][scenario]:>8.2f}x"
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
