"""Memory and speed of active-series tracking at 1M and 5M series per destination.

Each size runs in a fresh subprocess so the RSS delta (``VmRSS`` from /proc/self/status) is that of
the tracker alone: series ids are random 64-bit ints (what the relay's label hash gives), spread over
25 metric names, kept only by the tracker. Prints a table.

    .venv/bin/python bench/cardinality_bench.py            # 1M and 5M (about a minute on 2 cores)
    .venv/bin/python bench/cardinality_bench.py 200000     # other sizes

The tracker alone (no labels, no decision cache); for the whole pipeline's memory per active series
(both trackers with label statistics, collision owners, the decision cache) and the cost of the
first sight of a series, see bench/pipeline_memory_bench.py.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
METRICS = [f"DCGM_FI_DEV_METRIC_{i}" for i in range(25)]
HIT_SAMPLE = 1_000_000


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def measure(n: int) -> dict[str, Any]:
    """Runs inside the child process."""
    sys.path.insert(0, str(ROOT))
    from relay.state.series_tracker import SeriesTracker

    clock = _Clock()
    tracker = SeriesTracker(3600.0, clock)
    metrics = METRICS
    m = len(metrics)
    rng = random.Random(1)
    bits = rng.getrandbits
    before = rss_bytes()
    t0 = time.perf_counter()
    observe = tracker.observe
    for i in range(n):
        observe(bits(64), metrics[i % m])
    insert_s = time.perf_counter() - t0
    after = rss_bytes()
    assert tracker.active() == n, "64-bit ids collided"
    clock.t = 120.0  # two slots later: a sample restamps its series (the once-a-minute path)
    k = min(n, HIT_SAMPLE)
    restamp_s = _observe_all(observe, n, k)
    rng = random.Random(1)
    bits = rng.getrandbits
    t0 = time.perf_counter()
    for i in range(k):
        observe(bits(64), metrics[i % m])
    hit_s = time.perf_counter() - t0
    clock.t = 3660.0  # the first minute's slots fall out of the window, but every series moved on
    t0 = time.perf_counter()
    none_expired = tracker.expire()
    scan_s = time.perf_counter() - t0
    clock.t = 180.0  # half the series seen again at 180 s, the other half last seen at 120 s
    rng = random.Random(1)
    bits = rng.getrandbits
    for i in range(n // 2):
        observe(bits(64), metrics[i % m])
    clock.t = 120.0 + 3600.0 + 61.0  # the 120 s slot is now out of the window, the 180 s one is not
    t0 = time.perf_counter()
    expired = tracker.expire()
    sweep_s = time.perf_counter() - t0
    return {
        "n": n,
        "rss_delta": after - before,
        "insert_ns": insert_s / n * 1e9,
        "restamp_ns": restamp_s / k * 1e9,
        "hit_ns": hit_s / k * 1e9,
        "scan_s": scan_s,
        "scan_expired": none_expired,
        "expire_s": sweep_s,
        "expired": expired,
        "rss_after_expire": rss_bytes() - before,
    }


def _observe_all(observe: Any, n: int, timed: int) -> float:
    """Observe the same n ids again; returns the seconds the first ``timed`` of them took."""
    rng = random.Random(1)
    bits = rng.getrandbits
    t0 = time.perf_counter()
    for i in range(timed):
        observe(bits(64), METRICS[i % len(METRICS)])
    elapsed = time.perf_counter() - t0
    for i in range(timed, n):
        observe(bits(64), METRICS[i % len(METRICS)])
    return elapsed


def run_child(n: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", str(n)], check=True, capture_output=True,
                         text=True, timeout=600)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


AGGREGATE_RULE = """    aggregate:
      - match: '{__name__=~"DCGM_FI_DEV_.*"}'
        without: [gpu, UUID, pci_bus_id, device]
        interval: 30s
        outputs: [avg, max]
"""
LIMITS = "    limits: {max_series: 2000000, max_series_per_metric: 100000}\n"
LIMITS_BINDING = "    limits: {max_series: 2000000, max_series_per_metric: 200}\n"


def relay_throughput_section(nodes: int = 50, rounds: int = 15, repeat: int = 3) -> str:
    """Input samples per CPU-second through the full relay (decode -> rules -> aggregate -> limits -> durable
    queue -> sender -> sink), with limits and one aggregate rule on and off, same payload (bench/relay_bench.py's
    GPU cluster: ``nodes`` x 8 GPUs x 23 metrics, ``rounds`` scrapes). Median of ``repeat`` fresh relays per
    configuration. Returns the table text."""
    sys.path.insert(0, str(ROOT))
    from bench.relay_bench import METRICS, payload, run_relay

    # The last round is stamped 60 s ago, so every 30 s aggregation window is past its end + 10 s grace and
    # is flushed (by the relay's 1 s background tick) without waiting for the wall clock.
    pl = payload(nodes, rounds, end_ago_s=60.0)
    per_metric = len(pl.series) // len(METRICS)
    direct = sum(1 for s in pl.series if not dict(s)["__name__"].startswith("DCGM_FI_DEV_")) * rounds
    configs: list[tuple[str, str, int | None, int]] = [  # (name, destination YAML, exact delivery, at least)
        ("off", "", pl.samples, 0),
        ("limits (not reached)", LIMITS, pl.samples, 0),
        ("limits (reached: 200/metric)", LIMITS_BINDING, len(METRICS) * min(200, per_metric) * rounds, 0),
        ("aggregate", AGGREGATE_RULE, None, direct),
        ("limits + aggregate", LIMITS + AGGREGATE_RULE, None, direct),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for i, (name, rules, expected, at_least) in enumerate(configs):
            settle = 2.5 if at_least else 1.5  # aggregates: > the 1 s flush tick + the 1 s send deadline
            runs = [run_relay(rules, pl, expected, Path(td) / f"{i}-{k}", settle_s=settle, at_least=at_least)
                    for k in range(repeat)]
            for r in runs:
                if at_least:  # the passed-through metrics exactly, plus both outputs of every aggregated one
                    got_direct = sum(n for m, n in r.names.items() if ":" not in m)
                    outputs = {m for m in r.names if ":" in m}
                    if got_direct != at_least or len(outputs) != 2 * (len(METRICS) - 5):
                        raise RuntimeError(f"{name}: {got_direct} of {at_least} direct samples, outputs {outputs}")
            runs.sort(key=lambda r: r.cpu)
            rows.append((name, runs[(len(runs) - 1) // 2]))
    base = rows[0][1].cpu
    header = f"{'relay config':<30} {'samples/CPU-s':>13} {'us/sample':>9} {'CPU s':>6} {'vs off':>7} {'delivered':>10}"
    lines = [
        "gpu-relay throughput, full pipeline (decode -> rules -> aggregate -> limits -> disk queue -> send),",
        f"one destination. Payload: {pl.describe()}.",
        f"Input samples per CPU-second of the relay process, median of {repeat} fresh relays per row.",
        f"limits: max_series 2M + max_series_per_metric 100k (or 200, while {per_metric} series/metric arrive).",
        "aggregate: DCGM_FI_DEV_* (18 of 23 metrics) without [gpu, UUID, pci_bus_id, device], 30s, [avg, max]:",
        "per-node outputs replace the per-GPU series (hence fewer delivered).",
        header,
        "-" * len(header),
    ]
    for name, r in rows:
        lines.append(f"{name:<30} {pl.samples / r.cpu:>13,.0f} {1e6 * r.cpu / pl.samples:>9.2f} {r.cpu:>6.2f} "
                     f"{(r.cpu / base - 1) * 100:>+6.0f}% {r.delivered:>10,}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(int(argv[1]))))
        return 0
    sizes = [int(a) for a in argv] or [1_000_000, 5_000_000]
    header = (f"{'series':>10}  {'RSS delta':>10}  {'B/series':>8}  {'insert':>9}  {'restamp':>9}  "
              f"{'hit':>9}  {'scan':>7}  {'expired':>9}  {'expire':>7}  {'RSS after':>9}")
    print("SeriesTracker, 1 h window, 60 slots, 25 metrics. Times per observe: insert (new series),")
    print("restamp (first sample in a new minute), hit (same minute). scan: expire() when no series is due")
    print("(the steady-state cost of a periodic call); expire: expire() removing the half not seen for the")
    print("window; RSS after: RSS delta after that sweep.")
    print(header)
    print("-" * len(header))
    for n in sizes:
        r = run_child(n)
        print(f"{n:>10,}  {r['rss_delta'] / 2**20:>7.1f} MiB  {r['rss_delta'] / n:>8.1f}  "
              f"{r['insert_ns']:>6.0f} ns  {r['restamp_ns']:>6.0f} ns  {r['hit_ns']:>6.0f} ns  "
              f"{r['scan_s']:>5.2f} s  {r['expired']:>9,}  {r['expire_s']:>5.2f} s  "
              f"{r['rss_after_expire'] / 2**20:>5.1f} MiB")
    print()
    print(relay_throughput_section(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
