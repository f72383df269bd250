"""Relay cost: samples per CPU-second through gpu-relay and through vmagent, same payload, same run.

Both receive the same pre-encoded remote-write requests (bench/rw_payload.py; by default issue 9's
shape: 250 nodes x 252 series = 63,000 series per round, 32 rounds = 2,016,000 samples, 2,000 series
per request, 4 concurrent senders), apply the same rules and forward to the same kind of receiver: a
fresh, real victoria-metrics per run (bench/receivers.py). The figure is input samples divided by the
CPU time (user+system of every thread, /proc/PID/stat) the program spent from its first request until
the receiver had every sample; peak RSS is the program's VmHWM. Each program runs ``--repeat`` times
(a fresh process each time, the two programs alternating); the table shows the run with the median
CPU time. Scenarios: "keep4" (keep 4 DCGM names + labeldrop of 2 labels) and "passthrough", each with
gpu-relay as configured by default (max_shards 4, min_shards 1: it runs the shards sending needs,
relay.shardplan), vmagent, and gpu-relay on 4 fixed shards (min_shards 4), alternating. After each
run the receiver is read back (/internal/force_flush, then /api/v1/export): exactly the expected
samples per metric name, the dropped labels gone, and nothing more arrived during a settle time, so a
rule that silently did nothing, a lost or a duplicated request cannot look fast.

Then, gpu-relay only: the same job sent as Remote-Write 2.0 (CPU per sample vs its RW 1.0 figure;
vmagent 1.79 is probed with one RW 2.0 request and the outcome printed), the first sight of a series
and memory per active series (bench/relay_series_bench.py).

Not the same work, and said so under the table: gpu-relay answers 2xx only after the request is
committed to its on-disk queue (SQLite WAL, fsync per group commit); vmagent 1.79 acknowledges once
the data is in its in-memory queue.

    .venv/bin/python bench/relay_bench.py            # issue 9 shape, memory at 1M series: ~10 min on 2 cores
    .venv/bin/python bench/relay_bench.py --quick    # 25 nodes x 8 rounds, memory at 50k series: ~1 min
    .venv/bin/python bench/relay_bench.py --small    # the earlier shape: 50 nodes of GPU series, 30 rounds, 3 runs
    .venv/bin/python bench/relay_bench.py --nodes 100 --rounds 10 --per-request 500 --repeat 3 --memory-series 0

Other benches reuse ``payload``, ``run_relay`` and ``METRICS`` (bench/cardinality_bench.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import snappy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import relay_series_bench as series_bench
from bench.receivers import VictoriaMetrics
from bench.relay_run import (
    FLUSH_S,
    KEEP4_RELABEL,
    KEEP4_RULES,
    SENDERS,
    Result,
    _settled,
    run_relay,
    run_vmagent,
    start_vmagent,
)
from bench.rw_payload import DROP_LABELS, ISSUE9_OTHER_PER_NODE, KEEP, METRICS, Payload, payload
from relay.ingest.wire_v2 import v2_to_v1

__all__ = ["METRICS", "Payload", "Result", "main", "payload", "run_relay"]

SCENARIOS = {"keep4": (KEEP4_RULES, KEEP4_RELABEL, KEEP), "passthrough": ("", "", None)}
FIXED_SHARDS = 4  # the third program of each scenario: gpu-relay with min_shards = max_shards = 4


def median_run(runs: list[Result]) -> Result:
    cpus = [r.cpu for r in runs]
    return runs[cpus.index(statistics.median_low(cpus))]


def expected_names(pl: Payload, keep: list[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in pl.series:
        name = dict(s)["__name__"]
        if keep is None or name in keep:
            out[name] = out.get(name, 0) + pl.rounds
    return out


def check(r: Result, pl: Payload, keep: list[str] | None, what: str) -> None:
    """The receiver stores exactly the expected samples per metric name; keep4's dropped labels are gone."""
    want = expected_names(pl, keep)
    if r.names != want:
        diff = {m: (r.names.get(m), want.get(m)) for m in set(r.names) | set(want) if r.names.get(m) != want.get(m)}
        raise RuntimeError(f"{what}: receiver stores other samples than expected (got, want): {diff}")
    if keep is not None and r.label_names & set(DROP_LABELS):
        raise RuntimeError(f"{what}: dropped labels still present: {r.label_names & set(DROP_LABELS)}")


def runs(run: Callable[[Path], Result], repeat: int, work: Path, pl: Payload, keep: list[str] | None,
         what: str) -> Result:
    return interleaved({what: run}, repeat, work, pl, keep)[what]


def interleaved(programs: dict[str, Callable[[Path], Result]], repeat: int, work: Path, pl: Payload,
                keep: list[str] | None, every: dict[str, list[Result]] | None = None) -> dict[str, Result]:
    """``repeat`` runs of every program, alternating (a, b, a, b, ...), so that a change of load on the
    shared machine meets both alike; each checked for exact delivery; the median run of each (and every
    run, in order, into ``every`` when given)."""
    out: dict[str, list[Result]] = {what: [] for what in programs}
    if every is not None:
        every.update(out)
    for i in range(repeat):
        for j, (what, run) in enumerate(programs.items()):
            r = run(work / f"{j}-{i}")
            check(r, pl, keep, what)
            out[what].append(r)
            print(f"  {what} run {i + 1}: {r.cpu:.2f} CPU s, peak RSS {r.rss_mb:.0f} MiB, delivered {r.delivered:,} "
                  "(exact)", flush=True)
    return {what: median_run(rs) for what, rs in out.items()}


def _relay(rules: str, pl: Payload, expected: int, min_shards: int | None = None) -> Callable[[Path], Result]:
    return lambda work: run_relay(rules, pl, expected, work, receiver="vm", min_shards=min_shards)


def _vmagent(relabel: str, pl: Payload, expected: int) -> Callable[[Path], Result]:
    return lambda work: run_vmagent(relabel, pl, expected, work, receiver="vm")


TICK_S = 0.01  # /proc CPU times come in clock ticks: a tiny run can measure 0, read as one tick


def _cpu(r: Result) -> float:
    return max(r.cpu, TICK_S)


def row(label: str, program: str, r: Result, samples: int, expected: int) -> str:
    ok = "exact" if r.delivered == expected else "WRONG"
    return (f"{label:<12} {program:<10} {samples / _cpu(r):>13,.0f} {1e6 * r.cpu / samples:>9.2f} {r.cpu:>7.2f} "
            f"{r.wall:>7.2f} {r.rss_mb:>8.1f} {r.delivered:>10,} {ok}")


HEADER = (f"{'scenario':<12} {'program':<10} {'samples/CPU-s':>13} {'us/sample':>9} {'CPU s':>7} {'wall s':>7} "
          f"{'peak MiB':>8} {'delivered':>10}")


def probe_vmagent_rw2(pl2: Payload, work: Path) -> str:
    """Post one RW 2.0 request to a fresh vmagent and say what it answered and what reached the receiver."""
    rx = VictoriaMetrics(work / "rx")
    try:
        with start_vmagent("", work, rx.url) as proc:
            req = urllib.request.Request(proc.write_url, data=pl2.requests[0], method="POST", headers=pl2.headers)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    answer = str(resp.status)
            except urllib.error.HTTPError as e:
                answer = f"{e.code} {e.read()[:120]!r}"
            time.sleep(2 * FLUSH_S)
            got, _ = _settled(rx, 1.0)
    finally:
        rx.close()
    sent = v2_to_v1(snappy.uncompress(pl2.requests[0]))[1].samples
    verdict = "accepts RW 2.0" if got == sent else "does NOT accept RW 2.0"
    return (f"vmagent {_version('victoria-metrics')} given one RW 2.0 request ({sent:,} samples): answered {answer}, "
            f"forwarded {got:,} samples: it {verdict}{', so no vmagent row for RW 2.0' if got != sent else ''}.")


def _version(pkg: str) -> str:
    """The Debian package's version (vmagent comes in package victoria-metrics)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "(version unknown)"
    except OSError:
        return "(version unknown)"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=250, help="nodes (8 GPUs x 23 metrics + other series); default 250")
    ap.add_argument("--other-per-node", type=int, default=ISSUE9_OTHER_PER_NODE,
                    help=f"non-GPU series per node; default {ISSUE9_OTHER_PER_NODE} (252 series per node in all)")
    ap.add_argument("--rounds", type=int, default=32, help="scrape rounds (the same series resent); default 32")
    ap.add_argument("--per-request", type=int, default=2000, help="series per request; default 2000")
    ap.add_argument("--repeat", type=int, default=1, help="runs per program and scenario (median shown); default 1")
    ap.add_argument("--memory-series", default="1000000",
                    help="comma-separated sizes for memory per active series; 0 skips it; default 1000000")
    ap.add_argument("--no-rw2", action="store_true", help="skip the Remote-Write 2.0 runs")
    ap.add_argument("--no-fixed", action="store_true", help="skip gpu-relay on 4 fixed shards")
    ap.add_argument("--no-series", action="store_true", help="skip first sight and memory per series")
    ap.add_argument("--quick", action="store_true", help="25 nodes x 8 rounds, memory at 50,000 series (~1 min)")
    ap.add_argument("--small", action="store_true", help="the earlier shape: 50 nodes, GPU series only, 30 rounds, "
                    "3 runs, no memory run")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.rounds, args.memory_series = 25, 8, "50000"
    if args.small:
        args.nodes, args.other_per_node, args.rounds, args.repeat, args.memory_series = 50, 0, 30, 3, "0"
    for binary in ("victoria-metrics", "vmagent"):
        if shutil.which(binary) is None:
            raise SystemExit(f"relay_bench: {binary} is not installed (Debian packages victoria-metrics, vmagent)")
    t_start = time.monotonic()
    shape = {"other_per_node": args.other_per_node, "per_request": args.per_request}
    pl = payload(args.nodes, args.rounds, **shape)
    print(f"payload: {pl.describe()}; {SENDERS} concurrent senders; {os.cpu_count()} CPUs; receiver: "
          f"victoria-metrics {_version('victoria-metrics')} (fresh per run)", flush=True)
    results: dict[tuple[str, str], Result] = {}
    every: dict[str, list[Result]] = {}
    with tempfile.TemporaryDirectory() as td:
        work = Path(td)
        for scenario, (rules, relabel, keep) in SCENARIOS.items():
            expected = pl.kept(keep) if keep else pl.samples
            programs = {f"{scenario} gpu-relay": _relay(rules, pl, expected),
                        f"{scenario} vmagent": _vmagent(relabel, pl, expected)}
            if not args.no_fixed:
                programs[f"{scenario} gpu-relay 4 fixed shards"] = _relay(rules, pl, expected, FIXED_SHARDS)
            both = interleaved(programs, args.repeat, work / scenario, pl, keep, every)
            results[scenario, "gpu-relay"] = both[f"{scenario} gpu-relay"]
            results[scenario, "vmagent"] = both[f"{scenario} vmagent"]
            if not args.no_fixed:
                results[scenario, "fixed"] = both[f"{scenario} gpu-relay 4 fixed shards"]
        pl2 = None
        if not args.no_rw2:
            pl2 = payload(args.nodes, args.rounds, version=2, **shape)
            print(f"payload: {pl2.describe()}", flush=True)
            for scenario, (rules, _relabel, keep) in SCENARIOS.items():
                expected = pl2.kept(keep) if keep else pl2.samples
                results[scenario, "rw2"] = runs(
                    _relay(rules, pl2, expected),
                    args.repeat, work / f"rw2-{scenario}", pl2, keep, f"{scenario} gpu-relay RW 2.0")
            probe = probe_vmagent_rw2(pl2, work / "probe")
        fs: list[series_bench.FirstSight] = []
        mem = None
        if not args.no_series:
            fs = [series_bench.first_sight(s, SCENARIOS[s][0], SCENARIOS[s][2], pl.series, work / f"fs-{s}")
                  for s in SCENARIOS]
            sizes = [int(x) for x in args.memory_series.split(",") if int(x) > 0]
            if sizes:
                mem = series_bench.memory(sizes, work / "mem")
    print(f"\n{pl.describe()}\n{HEADER}")
    for scenario, (_rules, _relabel, keep) in SCENARIOS.items():
        expected = pl.kept(keep) if keep else pl.samples
        g, v = results[scenario, "gpu-relay"], results[scenario, "vmagent"]
        print(row(scenario, "gpu-relay", g, pl.samples, expected))
        print(row("", "vmagent", v, pl.samples, expected))
        print(f"{'':<12} {'ratio':<10} gpu-relay CPU per sample = {_cpu(g) / _cpu(v):.2f}x vmagent's "
              f"({_cpu(v) / _cpu(g):.2f}x its samples per CPU-second); peak RSS {g.rss_mb / max(v.rss_mb, 0.1):.2f}x")
        if (scenario, "fixed") in results:
            f = results[scenario, "fixed"]
            print(row("", "4 fixed", f, pl.samples, expected))
            print(f"{'':<12} {'ratio':<10} gpu-relay on 4 fixed shards (min_shards: 4): CPU per sample "
                  f"{_cpu(f) / _cpu(v):.2f}x vmagent's, {_cpu(f) / _cpu(g):.2f}x the default's")
    print("\nEvery run, in the order they ran (gpu-relay's run i beside vmagent's run i):")
    print(f"{'scenario':<12} {'run':>3} {'gpu-relay us/sample':>19} {'vmagent us/sample':>17} {'CPU ratio':>9}")
    for scenario in SCENARIOS:
        pairs = zip(every[f"{scenario} gpu-relay"], every[f"{scenario} vmagent"], strict=True)
        for i, (g, v) in enumerate(pairs, 1):
            print(f"{scenario:<12} {i:>3} {1e6 * g.cpu / pl.samples:>19.2f} {1e6 * v.cpu / pl.samples:>17.2f} "
                  f"{_cpu(g) / _cpu(v):>8.2f}x")
    print("gpu-relay: max_shards 4 and the default min_shards 1 (it runs the shards sending needs, planned every "
          f"10 s: one on this job); 4 fixed: min_shards 4.\n"
          f"samples/CPU-s counts input samples; median of {args.repeat} run(s) by CPU time, the programs alternating; "
          "wall includes the "
          f"{FLUSH_S:g} s flush deadline.\ngpu-relay acknowledges after an fsynced disk commit; vmagent 1.79 after an "
          "in-memory enqueue. delivered: read back from victoria-metrics, exact = every expected sample, no more.")
    if pl2 is not None:
        print(f"\nRemote-Write 2.0 input, gpu-relay only ({pl2.describe()}):\n{HEADER}")
        for scenario, (_rules, _relabel, keep) in SCENARIOS.items():
            r2, r1 = results[scenario, "rw2"], results[scenario, "gpu-relay"]
            print(row(scenario, "RW 2.0", r2, pl2.samples, pl2.kept(keep) if keep else pl2.samples))
            print(f"{'':<12} {'vs RW 1.0':<10} {_cpu(r2) / _cpu(r1):.2f}x the RW 1.0 CPU per sample "
                  f"({1e6 * r2.cpu / pl2.samples:.2f} vs {1e6 * r1.cpu / pl.samples:.2f} us; goal <= 1.5x)")
        print(probe)
    if fs:
        print()
        print(series_bench.first_sight_table(fs), end="")
    if mem is not None:
        print()
        print(series_bench.memory_table(*mem), end="")
    print(f"\ntotal bench time {time.monotonic() - t_start:.0f} s")


if __name__ == "__main__":
    main()
