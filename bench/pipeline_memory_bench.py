"""Memory per active incoming series, every per-series structure of the pipeline included (the
decision cache too), and the cost of the first sight of a series (uncached: rules, prune, accounting).

Each row runs in a fresh subprocess: a Pipeline (real config text, one dry-run destination, so no
disk queue) routes N distinct dcgm-exporter-like series (bench/relay_bench.py's labels, ~330 bytes
of label bytes each) in 2000-series requests built on the fly; the RSS delta (``VmRSS``) after the
first round, over N, is the bytes per active series. The first round is timed (us per new series),
then a second round over the same series (us per known series); times are CPU time of the process.

    .venv/bin/python bench/pipeline_memory_bench.py                 # 100k and 1M series, every row
    .venv/bin/python bench/pipeline_memory_bench.py 100000          # other sizes
    .venv/bin/python bench/pipeline_memory_bench.py 1000000 --rows pass-through:default,pass-through:none
    .venv/bin/python bench/pipeline_memory_bench.py 5000000 --rows pass-through:default --first-only
``--first-only`` skips the second round (memory is measured after the first; "known" shows 0).

Cache budgets per row: ``default`` (relay.pipeline.DEFAULT_CACHE_MAX_BYTES), ``none`` (0: state only,
every occurrence re-decided), ``unbounded`` (every series cached, what a relay without a budget costs).

Columns ``tables`` (bytes of the trackers' C tables, relay.native._cstage, per series; "-" for the Python
reference) and ``cache est`` (the decision cache's own estimate of its bytes, per series) break the
RSS figure down. ``past 1st`` is the RSS delta from the end of the first request on, over the series
after it: B/series without what the first request leaves whatever N is (the decoder's scratch, the
bench's own request bytes, the first arenas: about 6 MiB, 20 B/series at 300k). The header says
whether the native core was in use (``GPU_RELAY_NATIVE=0``: the reference).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PER_REQUEST = 2000
CONFIGS = {
    "pass-through": "",
    "keep4+prune": (
        "    write_relabel_configs:\n"
        "      - {source_labels: [__name__], regex: 'DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL|"
        "DCGM_FI_DEV_FB_USED|DCGM_FI_PROF_PIPE_TENSOR_ACTIVE', action: keep}\n"
        "    prune_labels: [pod, pci_bus_id]\n"
    ),
}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _series(i: int, metrics: list[str]) -> tuple[tuple[str, str], ...]:
    """The i-th distinct series: node i // (8 * len(metrics)), gpu, metric."""
    m = len(metrics)
    node, rest = divmod(i, 8 * m)
    g, k = divmod(rest, m)
    labels = {
        "__name__": metrics[k], "gpu": str(g), "UUID": f"GPU-{node:06d}{g:02d}-0d4f-4a8e-9b1c-3f2d6e8a7b90",
        "pci_bus_id": f"00000000:{0x18 + g * 0x10:02X}:00.0", "device": f"nvidia{g}",
        "modelName": "NVIDIA H200", "Hostname": f"ip-10-{node // 62500}-{node // 250 % 250}-{node % 250}.ec2.internal",
        "DCGM_FI_DRIVER_VERSION": "580.159.04", "container": "trainer",
        "namespace": "ml-team-a", "pod": f"llm-pretrain-{node // 4}-worker-{node % 4}",
        "instance": f"10.{node // 62500}.{node // 250 % 250}.{node % 250}:9400", "job": "gpu-exporter",
    }
    return tuple(sorted(labels.items()))


def measure(n: int, config_name: str, cache: str, known_round: bool = True) -> dict[str, Any]:
    """Runs inside the child process."""
    sys.path.insert(0, str(ROOT))
    from prometheus_client import CollectorRegistry

    from bench.relay_bench import METRICS
    from relay.common.metrics import RelayMetrics
    from relay.config.config import parse_config
    from relay.ingest import wire
    from relay.state import pipeline
    from relay.state.cardinality import CardinalityMetrics, DestinationStats
    from relay.state.pipeline import Pipeline

    # (the bench also runs on code before the bounded cache: then only the "default" rows)
    default = getattr(pipeline, "DEFAULT_CACHE_MAX_BYTES", None)
    kw = {} if default is None else {"cache_max_bytes": {"default": default, "none": 0, "unbounded": 1 << 62}[cache]}
    config = parse_config(
        "storage: {path: /nonexistent}\nexternal_labels: {cluster: prod}\n"
        "destinations:\n  - name: amp\n    url: http://127.0.0.1:1/api/v1/write\n    dry_run: true\n"
        + CONFIGS[config_name])
    registry = CollectorRegistry()
    cm = CardinalityMetrics(registry)
    stats = [DestinationStats("amp", metrics=cm)]
    p = Pipeline(config, RelayMetrics(registry), stats, [None], cardinality=cm, **kw)
    metrics = list(METRICS)
    t_base = 1_700_000_000_000

    def request(start: int, ts: int) -> bytes:
        return wire.encode_write_request(
            [(_series(i, metrics), [(ts, 1.0)]) for i in range(start, min(n, start + PER_REQUEST))])

    gc.collect()
    before = rss_bytes()
    first_s = 0.0
    warm = 0
    for start in range(0, n, PER_REQUEST):
        body = request(start, t_base)
        t0 = time.process_time()
        p.route(body)
        first_s += time.process_time() - t0
        if not start:
            gc.collect()
            warm = rss_bytes()
    del body
    gc.collect()
    after = rss_bytes()
    known_s = 0.0
    for start in range(0, n if known_round else 0, PER_REQUEST):
        body = request(start, t_base + 15_000)
        t0 = time.process_time()
        p.route(body)
        known_s += time.process_time() - t0
    trackers = [p.tracker_in] + [s.stats.tracker_out for s in getattr(p, "stages", [])]
    tables = sum(t.table_bytes() for t in trackers if hasattr(t, "table_bytes"))
    cache_est = p.cache_bytes() if hasattr(p, "cache_bytes") else 0
    if hasattr(p, "state_sizes"):
        sizes = p.state_sizes()
        cached = p.cache_entries()
    else:
        sizes = {"in": stats[0].tracker_in.active(), "out:amp": stats[0].tracker_out.active(),
                 "collision_owners:amp": -1}
        cached = len(p.cache)
    return {
        "n": n, "config": config_name, "cache": cache, "rss_delta": after - before, "past_first": after - warm,
        "first_us": first_s / n * 1e6, "known_us": known_s / n * 1e6, "cache_entries": cached,
        "in": sizes["in"], "out": sizes["out:amp"], "owners": sizes["collision_owners:amp"],
        "tables": tables, "cache_est": cache_est,
    }


def run_child(n: int, config_name: str, cache: str, known_round: bool = True) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", str(n), config_name, cache,
                          "known" if known_round else "first"], check=True,
                         capture_output=True, text=True, timeout=3600)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _per(total: int, n: int) -> str:
    return f"{total / n:.0f}" if total else "-"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(int(argv[1]), argv[2], argv[3], argv[4:5] != ["first"])))
        return 0
    known_round = "--first-only" not in argv
    argv = [a for a in argv if a != "--first-only"]
    rows = [(c, k) for c in CONFIGS for k in ("default", "none", "unbounded")]
    if "--rows" in argv:
        i = argv.index("--rows")
        rows = [tuple(r.split(":", 1)) for r in argv[i + 1].split(",")]  # type: ignore[misc]
        argv = argv[:i] + argv[i + 2:]
    sizes = [int(a) for a in argv] or [100_000, 1_000_000]
    header = (f"{'series':>9}  {'rules':<12} {'cache':<9} {'B/series':>8}  {'RSS delta':>9}  {'past 1st':>8}  "
              f"{'first':>8}  {'known':>7}  {'cached':>9}  {'in':>9}  {'out':>9}  {'owners':>9}  {'tables':>6}  "
              f"{'cache est':>9}")
    sys.path.insert(0, str(ROOT))
    from relay import native

    core = "relay.native._cstage (C tables)" if native.load("cstage") is not None else "pure-Python reference"
    print("gpu-relay pipeline (route: decode, rules, accounting, limits, collisions; one dry-run destination,")
    print("external_labels {cluster}), dcgm-like series of ~330 label bytes. B/series: RSS delta after one round")
    print("over N distinct series / N (past 1st: from the end of the first request on). first / known: us per")
    print("series on the first / second round.")
    print(f"per-series state: {core}; tables, cache est: bytes per series of the C tables / the cache's estimate")
    print(header)
    print("-" * len(header))
    for n in sizes:
        for config_name, cache in rows:
            r = run_child(n, config_name, cache, known_round)
            past = r["past_first"] / (n - PER_REQUEST) if n > PER_REQUEST else 0.0
            print(f"{n:>9,}  {config_name:<12} {cache:<9} {r['rss_delta'] / n:>8.0f}  "
                  f"{r['rss_delta'] / 2**20:>5.0f} MiB  {past:>8.0f}  {r['first_us']:>5.1f} us  "
                  f"{r['known_us']:>4.1f} us  "
                  f"{r['cache_entries']:>9,}  {r['in']:>9,}  {r['out']:>9,}  {r['owners']:>9,}  "
                  f"{_per(r.get('tables', 0), n):>6}  {_per(r.get('cache_est', 0), n):>9}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
