"""Memory under churn: does the relay's RSS follow its configuration (series limits, the decision
cache's budget) rather than the number of series it has ever seen?

Each row runs in a fresh subprocess: a Pipeline (real config text, one dry-run destination with
``limits: {max_series: LIMIT}``, ``server.decision_cache: CACHE``) on a fake clock routes SEEN
distinct dcgm-like series (bench/pipeline_memory_bench.py's labels) over one window (``window``
seconds, 15 s scrapes, each series in one scrape only), while STABLE series are scraped all along;
then the clock runs on for two more windows with only the stable series, ``expire()`` every 60 s as
the daemon does. RSS comes from /proc/self/statm: before the churn, its peak (sampled every scrape),
after the churn (the window still open) and after the window passed.

    .venv/bin/python bench/churn_memory_bench.py                      # 2M seen, limit 100k, 64 MiB cache
    .venv/bin/python bench/churn_memory_bench.py --seen 500000 --limit 20000 --cache 16
    .venv/bin/python bench/churn_memory_bench.py --child '{"seen": 20000, ...}'   # one row, JSON out

The bound the issue asks for: peak - before <= the limit's cost + the cache's budget + the in
tracker's (it counts every arriving series in the window, limits apply to what is sent) + a fixed
overhead; after the window: within 20 MB of before.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measure(seen: int, limit: int, cache_mib: int, stable: int = 100, window: float = 600.0,
            per_request: int = 2000, scrape_s: float = 15.0) -> dict[str, Any]:
    """Runs inside the child process."""
    sys.path.insert(0, str(ROOT))
    from prometheus_client import CollectorRegistry

    from bench.pipeline_memory_bench import _series
    from bench.relay_bench import METRICS
    from relay.common.metrics import RelayMetrics
    from relay.config.config import parse_config
    from relay.ingest import wire
    from relay.state.cardinality import CardinalityMetrics, DestinationStats
    from relay.state.pipeline import Pipeline

    now = [1_000_000.0]

    def clock() -> float:
        return now[0]

    config = parse_config(
        "storage: {path: /nonexistent}\nexternal_labels: {cluster: prod}\n"
        "destinations:\n  - name: amp\n    url: http://127.0.0.1:1/api/v1/write\n    dry_run: true\n"
        f"    limits: {{max_series: {limit}}}\n")
    registry = CollectorRegistry()
    cm = CardinalityMetrics(registry)
    stats = [DestinationStats("amp", window, clock, metrics=cm)]
    p = Pipeline(config, RelayMetrics(registry), stats, [None], cardinality=cm, clock=clock,
                 cache_max_bytes=cache_mib * MiB)
    metrics = list(METRICS)
    ts = [1_700_000_000_000]

    def send(ids: range) -> None:
        for start in range(ids.start, ids.stop, per_request):
            body = wire.encode_write_request(
                [(_series(i, metrics), [(ts[0], 1.0)]) for i in range(start, min(ids.stop, start + per_request))])
            p.route(body)

    def tick(seconds: float) -> None:
        before = now[0]
        now[0] += seconds
        ts[0] += int(seconds * 1000)
        if int(now[0] // 60) != int(before // 60):
            p.expire()

    churn = range(stable, stable + seen)
    scrapes = max(1, int(window // scrape_s))
    per_scrape = -(-seen // scrapes)
    send(range(stable))  # the stable series and the code's own first-use allocations
    p.expire()
    gc.collect()
    before = peak = rss()
    for k in range(scrapes):
        send(range(churn.start + k * per_scrape, min(churn.stop, churn.start + (k + 1) * per_scrape)))
        send(range(stable))
        peak = max(peak, rss())
        tick(scrape_s)
    gc.collect()
    sizes = p.state_sizes()
    end_churn = rss()
    cache_at_peak = p.cache_bytes()
    trackers = [p.tracker_in] + [st.stats.tracker_out for st in p.stages]
    tables = sum(t.table_bytes() for t in trackers if hasattr(t, "table_bytes"))
    for _ in range(int(2 * window // scrape_s) + 8):
        send(range(stable))
        tick(scrape_s)
    p.expire()
    gc.collect()
    after = rss()
    return {
        "seen": seen, "stable": stable, "limit": limit, "cache_mib": cache_mib, "window": window,
        "active_in": sizes["in"], "active_out": sizes["out:amp"], "cache_bytes": cache_at_peak,
        "tracker_tables": tables,
        "before": before, "peak": peak, "end_churn": end_churn, "after": after,
        "active_in_after": p.state_sizes()["in"], "cache_after": p.cache_bytes(),
    }


def run_child(**kw: Any) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(kw)],
                         check=True, capture_output=True, text=True, timeout=3600)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--seen", type=int, nargs="+", default=[2_000_000])
    ap.add_argument("--limit", type=int, default=100_000)
    ap.add_argument("--cache", type=int, nargs="+", default=[64], help="decision cache budgets, MiB")
    ap.add_argument("--window", type=float, default=600.0)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(**json.loads(a.child))))
        return 0
    sys.path.insert(0, str(ROOT))
    from relay import native

    core = "native core" if native.load("cstage") is not None else "pure-Python reference"
    print(f"gpu-relay under churn ({core}): distinct series over a {a.window:.0f} s window, max_series "
          f"{a.limit:,}, 100 stable series; RSS in MiB (/proc/self/statm)")
    header = (f"{'seen':>10}  {'cache':>6}  {'active in':>9}  {'active out':>10}  {'cache cost':>10}  "
              f"{'before':>7}  {'peak':>7}  {'end':>7}  {'after':>7}  {'peak-before':>11}  {'after-before':>12}")
    print(header)
    print("-" * len(header))
    for seen in a.seen:
        for cache in a.cache:
            r = run_child(seen=seen, limit=a.limit, cache_mib=cache, window=a.window)
            print(f"{seen:>10,}  {cache:>3} Mi  {r['active_in']:>9,}  {r['active_out']:>10,}  "
                  f"{r['cache_bytes'] / MiB:>7.1f} Mi  {r['before'] / MiB:>7.1f}  {r['peak'] / MiB:>7.1f}  "
                  f"{r['end_churn'] / MiB:>7.1f}  {r['after'] / MiB:>7.1f}  {(r['peak'] - r['before']) / MiB:>11.1f}  "
                  f"{(r['after'] - r['before']) / MiB:>12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
