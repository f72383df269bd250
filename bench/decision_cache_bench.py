"""The decision cache's share of memory per active series, and the cost of a cached lookup: the
native DecisionTable (relay/native/cdcache.c) against the reference dict, side by side in one run.

Memory rows run bench/pipeline_memory_bench.py's measurement (a Pipeline with one dry-run
destination routes N distinct dcgm-like series of ~330 label bytes; RSS delta after the first round
over N) in a fresh subprocess each, with GPU_RELAY_NATIVE=1 (C) or 0 (Python) in its environment;
cache budgets: ``default`` (relay.pipeline.DEFAULT_CACHE_MAX_BYTES), ``none`` (0: the per-series
state alone), ``unbounded`` (every series cached). ``cache MiB`` is the cache's own count
(``DecisionCache.size()``: the table's ``nbytes()``, or the dict's estimate).

The lookup rows time ``get`` on a fresh key object per lookup (as the route loop slices one from the
request, so nothing caches its hash), hits only, for the decisions a real Pipeline made.

    .venv/bin/python bench/decision_cache_bench.py                      # 100k and 1M series
    .venv/bin/python bench/decision_cache_bench.py 100000 --quick       # fewer rows
    .venv/bin/python bench/decision_cache_bench.py 5000000 --rows pass-through:c:default
    .venv/bin/python bench/decision_cache_bench.py --table 5000000 c,py   # the cache alone, all cached
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.pipeline_memory_bench import CONFIGS, _series, rss_bytes  # noqa: E402

IMPLS = {"c": "1", "py": "0"}


def _pipeline(config_name: str, cache_max_bytes: int) -> Any:
    from prometheus_client import CollectorRegistry

    from relay.common.metrics import RelayMetrics
    from relay.config.config import parse_config
    from relay.state.cardinality import CardinalityMetrics, DestinationStats
    from relay.state.pipeline import Pipeline

    config = parse_config(
        "storage: {path: /nonexistent}\nexternal_labels: {cluster: prod}\n"
        "destinations:\n  - name: amp\n    url: http://127.0.0.1:1/api/v1/write\n    dry_run: true\n"
        + CONFIGS[config_name])
    registry = CollectorRegistry()
    cm = CardinalityMetrics(registry)
    stats = [DestinationStats("amp", metrics=cm)]
    return Pipeline(config, RelayMetrics(registry), stats, [None], cardinality=cm, cache_max_bytes=cache_max_bytes)


def measure(n: int, config_name: str, cache: str) -> dict[str, Any]:
    """Runs inside the child process: bench/pipeline_memory_bench.py's measure, plus the cache's size."""
    from bench import pipeline_memory_bench
    from relay.state import decision_cache

    r = pipeline_memory_bench.measure(n, config_name, cache, True)
    return {"rss_delta": r["rss_delta"], "first_us": r["first_us"], "known_us": r["known_us"],
            "cached": r["cache_entries"], "cache_bytes": r["cache_est"],
            "native": decision_cache.native_table()}


def lookups(n: int, config_name: str, repeat: int) -> dict[str, float]:
    """ns per ``get`` hit: dict vs DecisionTable holding the same decisions (child process)."""
    from bench.relay_bench import METRICS
    from relay.ingest import wire  # type: ignore[attr-defined]
    from relay.native import _cdcache

    p = _pipeline(config_name, 0)
    metrics = list(METRICS)
    keys = [wire.encode_labels(_series(i, metrics)) for i in range(n)]
    buf = b"".join(keys)
    spans: list[tuple[int, int]] = []
    pos = 0
    for k in keys:
        spans.append((pos, pos + len(k)))
        pos += len(k)
    d: dict[bytes, Any] = {}
    table = _cdcache.DecisionTable(len(p.stages) + 1)
    for k in keys:
        p._scratch.clear()
        dec = p.decide(k)
        d[k] = dec
        table[k] = dec
    del keys
    gc.collect()

    def run(get: Any) -> float:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            if get is None:
                for s, e in spans:
                    buf[s:e]
            else:
                for s, e in spans:
                    get(buf[s:e])
            best = min(best, time.perf_counter() - t0)
        return best / n * 1e9

    base = run(None)
    return {"slice_ns": base, "dict_ns": run(d.get) - base, "table_ns": run(table.get) - base,
            "dict_entry_bytes": sum(sys.getsizeof(v) for v in d.values()) / n,
            "table_bytes": table.nbytes() / n}


def table_only(n: int, config_name: str) -> dict[str, Any]:
    """The cache alone at n entries (child process, its implementation from GPU_RELAY_NATIVE): the
    decisions stage.decide makes for these series with ``external_labels {cluster: prod}``, computed
    here directly (no rules engine, so 5M entries take minutes, not hours); checked against the real
    Pipeline.decide on the first 2000."""
    import hashlib

    from bench.relay_bench import METRICS
    from relay.ingest import wire
    from relay.state.decision_cache import DecisionCache
    from relay.state.stage import CLAIM, POS_SHIFT, RULES

    metrics = list(METRICS)
    keep = set(CONFIGS[config_name].split("regex: '")[1].split("'")[0].split("|")) if "keep" in config_name else None
    ext = wire.encode_labels((("cluster", "prod"),))

    def sid(b: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")

    def decision(labels: tuple[tuple[str, str], ...], key: bytes) -> Any:
        metric = sys.intern(labels[[n for n, _ in labels].index("__name__")][1])
        inp = (key, hash(labels) & ((1 << 60) - 1), metric)
        if keep is not None:
            if metric not in keep:
                return (inp, RULES)
            out = tuple(sorted([x for x in labels if x[0] not in ("pod", "pci_bus_id")] + [("cluster", "prod")]))
            lb = wire.encode_labels(out)
            return (inp, (lb, sid(lb) | CLAIM, metric))
        at = len(wire.encode_labels(tuple(x for x in labels if x[0] < "cluster")))
        return (inp, (ext, sid(key[:at] + ext + key[at:]) | (at + 1) << POS_SHIFT, metric))

    p = _pipeline(config_name, 0)
    for i in range(2000):
        labels = _series(i, metrics)
        key = wire.encode_labels(labels)
        p._scratch.clear()
        if decision(labels, key) != p.decide(key):
            raise SystemExit(f"the computed decision of series {i} is not Pipeline.decide's")
    del p
    cache = DecisionCache(1 << 62)
    young = cache.young
    gc.collect()
    before = rss_bytes()
    t0 = time.process_time()
    for i in range(n):
        labels = _series(i, metrics)
        key = wire.encode_labels(labels)
        d = decision(labels, key)
        young[key] = cache.miss(key, lambda _k, d=d: d)  # as wire.route stores a miss
    fill_s = time.process_time() - t0
    gc.collect()
    return {"rss_delta": rss_bytes() - before, "cache_bytes": cache.size(), "entries": len(cache),
            "native": cache.native, "fill_us": fill_s / n * 1e6}


def child(kind: str, args: list[str], impl: str) -> dict[str, Any]:
    env = {**os.environ, "GPU_RELAY_NATIVE": IMPLS[impl]}
    out = subprocess.run([sys.executable, __file__, "--child", kind, *args], check=True, capture_output=True,
                         text=True, timeout=3600, env=env)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        if argv[1] == "memory":
            print(json.dumps(measure(int(argv[2]), argv[3], argv[4])))
        elif argv[1] == "table":
            print(json.dumps(table_only(int(argv[2]), argv[3])))
        else:
            print(json.dumps(lookups(int(argv[2]), argv[3], int(argv[4]))))
        return 0
    if "--table" in argv:  # the cache alone: .venv/bin/python bench/decision_cache_bench.py --table 5000000 c
        i = argv.index("--table")
        n, impls = int(argv[i + 1]), argv[i + 2].split(",")
        print("The decision cache alone, every series cached (RSS delta of filling it / entries; the keys")
        print("the dict keeps are in it, the table keeps none); nbytes: what the budget counts.")
        h3 = f"{'entries':>9}  {'rules':<12} {'impl':<4} {'B/entry':>7}  {'RSS delta':>9}  {'counted B/entry':>15}"
        print(h3)
        print("-" * len(h3))
        for config_name in CONFIGS:
            for impl in impls:
                r = child("table", [str(n), config_name], impl)
                print(f"{n:>9,}  {config_name:<12} {impl:<4} {r['rss_delta'] / n:>7.0f}  "
                      f"{r['rss_delta'] / 2**20:>5.0f} MiB  {r['cache_bytes'] / r['entries']:>15.0f}", flush=True)
        return 0
    quick = "--quick" in argv
    argv = [a for a in argv if a != "--quick"]
    rows = [(c, impl, k) for c in CONFIGS for k in ("default", "unbounded") for impl in IMPLS]
    rows += [(c, "c", "none") for c in CONFIGS]
    if quick:
        rows = [("pass-through", impl, k) for k in ("default", "none") for impl in IMPLS]
    if "--rows" in argv:
        i = argv.index("--rows")
        rows = [tuple(r.split(":")) for r in argv[i + 1].split(",")]  # type: ignore[misc]
        argv = argv[:i] + argv[i + 2:]
    lookup = "--no-lookups" not in argv
    argv = [a for a in argv if a != "--no-lookups"]
    sizes = [int(a) for a in argv] or [100_000, 1_000_000]
    header = (f"{'series':>9}  {'rules':<12} {'impl':<4} {'cache':<9} {'B/series':>8}  {'RSS delta':>9}  "
              f"{'cache MiB':>9}  {'cached':>9}  {'first':>8}  {'known':>8}")
    print("Memory per active series (RSS delta after one round over N distinct dcgm-like series / N) and")
    print("us per series on the first (uncached) and second (known) round; c = relay.native._cdcache, py = dict.")
    print(header)
    print("-" * len(header))
    for n in sizes:
        for config_name, impl, cache in rows:
            r = child("memory", [str(n), config_name, cache], impl)
            if impl == "c" and not r["native"]:
                raise SystemExit("relay.native._cdcache is not built: run `bash scripts/setup.sh`")
            print(f"{n:>9,}  {config_name:<12} {impl:<4} {cache:<9} {r['rss_delta'] / n:>8.0f}  "
                  f"{r['rss_delta'] / 2**20:>5.0f} MiB  {r['cache_bytes'] / 2**20:>9.1f}  {r['cached']:>9,}  "
                  f"{r['first_us']:>5.1f} us  {r['known_us']:>5.1f} us", flush=True)
    if lookup:
        print()
        print("Cached lookups: ns per get() hit on a fresh key object (slicing it off excluded), best of 5;")
        print("bytes per entry: the dict's decision tuples (sys.getsizeof, outer tuple only) vs the table's nbytes().")
        h2 = f"{'keys':>9}  {'rules':<12} {'dict get':>9}  {'table get':>9}  {'ratio':>5}  {'table B/entry':>13}"
        print(h2)
        print("-" * len(h2))
        for n in [s for s in sizes if s <= 1_000_000]:
            for config_name in CONFIGS:
                r = child("lookups", [str(n), config_name, "5"], "c")
                print(f"{n:>9,}  {config_name:<12} {r['dict_ns']:>6.0f} ns  {r['table_ns']:>6.0f} ns  "
                      f"{r['table_ns'] / r['dict_ns']:>5.2f}  {r['table_bytes']:>13.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
