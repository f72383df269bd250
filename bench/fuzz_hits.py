"""Fuzz Pipeline.route's cache-hit fast path (relay.native._cstage.route_hits) against the reference, with atheris.

An input is a request built by bench/fuzz_cwire.py's ``structured`` (valid parts, series repeated,
histograms, exemplars, metadata, sometimes damaged) or raw bytes. Two pipelines route it three times
in a row: one on the native core, whose route takes the fast path once every series is cached, and
one on the pure-Python trackers and take (never the fast path), with rules that rewrite labels
(labeldrop), add external labels and shard. Results or errors, counters and state sizes must match;
any difference raises, which atheris reports as a crash with the input saved. The pipelines are
rebuilt every 300 inputs (state from earlier inputs makes owners, hits and expiries meet); their
clock moves 20 s and they expire every 50 inputs.

    .venv/bin/pip install atheris        # not a project dependency
    .venv/bin/python bench/fuzz_hits.py -max_total_time=300 [corpus_dir]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

with atheris.instrument_imports():
    from relay.ingest import wire  # noqa: F401  (instrumented: coverage guides the fuzzer)

from bench.fuzz_cwire import seeds, structured
from relay import native
from relay.state import series_tracker
from relay.state.stage import route_hits

_c: Any = native.load("cstage")
CONFIG = """\
storage: {path: /nonexistent}
external_labels: {cluster: c}
destinations:
  - name: a
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
    send_metadata: true
    write_relabel_configs:
      - {regex: 'job', action: labeldrop}
    queue: {max_shards: 3}
  - name: b
    url: http://127.0.0.1:1/api/v1/write
    dry_run: true
"""
state: dict[str, Any] = {"inputs": 0, "pipes": None}
now = [1_700_000_000.0]  # the pipelines' clock: moved by the harness only (every 50 inputs, 20 s)


def clock() -> float:
    return now[0]


def build(reference: bool) -> Any:
    from prometheus_client import CollectorRegistry

    from relay.common.metrics import RelayMetrics
    from relay.config.config import parse_config
    from relay.state.cardinality import CardinalityMetrics, DestinationStats
    from relay.state.pipeline import Pipeline

    config = parse_config(CONFIG)
    saved = series_tracker._NATIVE
    if reference:
        series_tracker._NATIVE = None
    try:
        registry = CollectorRegistry()
        cm = CardinalityMetrics(registry)
        stats = [DestinationStats(d.name, window_s=120.0, clock=clock, metrics=cm) for d in config.destinations]
        return (Pipeline(config, RelayMetrics(registry), stats, [None, None], cardinality=cm, clock=clock),
                registry)
    finally:
        series_tracker._NATIVE = saved


def outcome(p: Any, buf: bytes) -> Any:
    try:
        return p.route(buf)
    except Exception as exc:  # the error itself is compared
        return type(exc).__name__, str(exc)


def observed(p: Any, registry: Any) -> Any:
    counters = sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in registry.collect()
                      for s in f.samples if s.name.startswith("gpu_relay_") and not s.name.endswith("_created"))
    return counters, p.state_sizes(), [s.stats.snapshot(limit=20) for s in p.stages]


def one_input(data: bytes) -> None:
    if len(data) < 1:
        return
    buf = data[1:] if data[0] & 0x80 else structured(atheris.FuzzedDataProvider(data[1:]))
    n = state["inputs"] = state["inputs"] + 1
    if state["pipes"] is None or n % 300 == 0:
        state["pipes"] = (build(False), build(True))
    (cp, creg), (pp, preg) = state["pipes"]
    for k in range(3):
        c, py = outcome(cp, buf), outcome(pp, buf)
        if c != py:
            raise AssertionError(f"fast path and reference differ on {buf!r} (route {k + 1}):\n C: {c!r}\n Py: {py!r}")
    oc, op = observed(cp, creg), observed(pp, preg)
    if oc != op:
        diff = [(a, b) for a, b in zip(oc, op, strict=True) if a != b]
        raise AssertionError(f"state differs after {buf!r}:\n{diff!r}")
    if n % 50 == 0:
        now[0] += 20.0
        cp.expire()
        pp.expire()
    if n & (n - 1) == 0 or n % 20_000 == 0:  # libFuzzer exits without atexit: report as it goes
        req, series = _c.hit_counts()
        print(f"fuzz_hits: {n:,} inputs compared; the fast path routed {req:,} requests, {series:,} series",
              file=sys.stderr, flush=True)


def main() -> None:
    if route_hits is None:
        sys.exit("the relay's native core is not built (bash scripts/setup.sh) or GPU_RELAY_NATIVE=0")
    args = list(sys.argv)
    corpus = [a for a in args[1:] if not a.startswith("-")]
    if corpus:
        Path(corpus[0]).mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(seeds()):
            (Path(corpus[0]) / f"seed-{i}").write_bytes(seed)
    else:
        for seed in seeds():
            one_input(seed)
    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
