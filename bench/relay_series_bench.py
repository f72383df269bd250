"""gpu-relay per-series costs end to end: the first sight of a series, and memory per active series.

First sight: a fresh gpu-relay (after a warm-up on other series) gets one round in which every
series is new, then the same series again (all known); (CPU of the new round - CPU of the known
round) / series is the relay CPU a new series costs end to end (rules, caches, accounting, queue and
send included), in us per new series. Both rounds are fed until the receiver holds every sample.

Memory: one fresh pass-through gpu-relay gets distinct dcgm-like series, one sample each, all kept
and forwarded, until it has seen each size in ``sizes``; at each size (after delivery and a settle)
its VmRSS is read. Bytes per active series = (RSS - RSS after a warm-up) / series: the relay process
as a whole, its decision cache and every other per-series structure included. The receiver
(victoria-metrics) must have created exactly that many series and stored exactly those samples.

    .venv/bin/python bench/relay_series_bench.py                 # first sight on 63,000 series; memory at 1M
    .venv/bin/python bench/relay_series_bench.py 1000000 2000000 5000000  # memory at 1M, 2M, 5M: ~14 min, 5 GiB
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.receivers import VictoriaMetrics
from bench.relay_run import KEEP4_RULES, _settled, feed, start_relay, status_kib
from bench.rw_payload import (
    ISSUE9_OTHER_PER_NODE,
    KEEP,
    PER_REQUEST,
    RW1_HEADERS,
    Series,
    build_requests,
    cluster_series,
    encode_v1,
    gpu_series,
)

WARM_NODE = 900_000  # warm-up series come from node numbers no measured series uses
MIN_AVAILABLE_MIB = 3072  # the memory run stops growing when the machine has less available than this


def available_mib() -> float:
    """MemAvailable of the machine, from /proc/meminfo."""
    for ln in Path("/proc/meminfo").read_text().splitlines():
        if ln.startswith("MemAvailable:"):
            return int(ln.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


@dataclass
class FirstSight:
    rules: str
    series: int
    new_us: float  # relay CPU per series of the all-new round
    known_us: float  # ... of the all-known round

    @property
    def first_sight_us(self) -> float:
        return self.new_us - self.known_us


def _kept(series: Sequence[Series], keep: Sequence[str] | None) -> int:
    return len(series) if keep is None else sum(1 for s in series if dict(s)["__name__"] in keep)


def first_sight(name: str, rules: str, keep: Sequence[str] | None, series: list[Series], work: Path) -> FirstSight:
    """One fresh relay: a warm-up on other series, then ``series`` new, then ``series`` known."""
    warm = cluster_series(2, ISSUE9_OTHER_PER_NODE, first_node=WARM_NODE)
    warm_reqs = build_requests(warm, 2)
    reqs = build_requests(series, 2)
    half = len(reqs) // 2
    kw, k = _kept(warm, keep) * 2, _kept(series, keep)
    rx = VictoriaMetrics(work / "rx")
    try:
        with start_relay(rules, work, rx.url) as proc:
            feed(proc, rx, warm_reqs, RW1_HEADERS, kw)
            _settled(rx, 1.2)  # the warm-up's last flush is over
            cpu_new, _ = feed(proc, rx, reqs[:half], RW1_HEADERS, kw + k)
            _settled(rx, 1.2)
            cpu_known, _ = feed(proc, rx, reqs[half:], RW1_HEADERS, kw + 2 * k)
            rows, _ = _settled(rx, 1.5)
            proc.alive()
        if rows != kw + 2 * k:
            raise RuntimeError(f"first sight {name}: receiver got {rows} samples, expected {kw + 2 * k}")
    finally:
        rx.close()
    return FirstSight(name, len(series), 1e6 * cpu_new / len(series), 1e6 * cpu_known / len(series))


def first_sight_table(rows: Sequence[FirstSight]) -> str:
    header = f"{'rules':<12} {'series':>8} {'new round':>10} {'known round':>12} {'first sight':>12}"
    lines = ["First sight of a series, gpu-relay CPU end to end (us per input series; first sight = new - known):",
             header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.rules:<12} {r.series:>8,} {r.new_us:>7.1f} us {r.known_us:>9.1f} us "
                     f"{r.first_sight_us:>9.1f} us")
    return "\n".join(lines) + "\n"


def distinct_requests(start: int, stop: int, ts: int) -> Iterator[bytes]:
    """RW 1.0 requests carrying dcgm-like series number ``start`` to ``stop`` (184 per node), one sample each."""
    chunk: list[Series] = []
    node, skip = divmod(start, 184)
    todo = stop - start
    while todo:
        for s in gpu_series(node):
            if skip:
                skip -= 1
                continue
            chunk.append(s)
            todo -= 1
            if len(chunk) == PER_REQUEST or not todo:
                yield encode_v1(chunk, ts, 0)
                chunk = []
            if not todo:
                break
        node += 1


@dataclass
class MemRow:
    series: int
    rss_mib: float
    delta_mib: float
    cpu_us: float  # relay CPU per new series while getting from the previous size to this one

    @property
    def bytes_per_series(self) -> float:
        return self.delta_mib * 2**20 / self.series


def memory(sizes: Sequence[int], work: Path) -> tuple[float, float, list[MemRow]]:
    """One pass-through relay grown through ``sizes`` distinct series; returns (RSS after warm-up in MiB,
    peak RSS in MiB, one row per size)."""
    warm = cluster_series(2, ISSUE9_OTHER_PER_NODE, first_node=WARM_NODE)
    warm_reqs = build_requests(warm, 3)
    rx = VictoriaMetrics(work / "rx")
    rows: list[MemRow] = []
    try:
        with start_relay("", work, rx.url) as proc:
            feed(proc, rx, warm_reqs, RW1_HEADERS, 3 * len(warm))
            _settled(rx, 1.5)
            base = status_kib(proc.pid, "VmRSS") / 1024
            have, ts = 0, int(time.time() * 1000)
            for size in sorted(sizes):
                # the relay and the receiver both grow about linearly: twice the relay's expected growth, plus a reserve
                need = MIN_AVAILABLE_MIB + (2 * rows[-1].rss_mib * (size / rows[-1].series - 1) if rows else 0)
                if available_mib() < need:
                    print(f"memory: stopped before {size:,} series: {available_mib():,.0f} MiB available on the "
                          "machine, not enough for the relay and the receiver to grow", flush=True)
                    break
                reqs = list(distinct_requests(have, size, ts))  # built while the relay idles
                cpu, _ = feed(proc, rx, reqs, RW1_HEADERS, 3 * len(warm) + size, timeout=3600)
                got, _ = _settled(rx, 1.5)
                created = int(rx.metric("vm_new_timeseries_created_total"))
                if got != 3 * len(warm) + size or created != len(warm) + size:
                    raise RuntimeError(f"memory at {size}: receiver stored {got} samples of {created} series, "
                                       f"expected {3 * len(warm) + size} of {len(warm) + size}")
                rss = status_kib(proc.pid, "VmRSS") / 1024
                rows.append(MemRow(size, rss, rss - base, 1e6 * cpu / (size - have)))
                have = size
            peak = status_kib(proc.pid, "VmHWM") / 1024
            proc.alive()
    finally:
        rx.close()
    return base, peak, rows


def memory_table(base: float, peak: float, rows: Sequence[MemRow]) -> str:
    header = f"{'series':>10} {'RSS':>10} {'growth':>10} {'B/series':>9} {'CPU/new series':>15}"
    lines = ["Memory per active series, gpu-relay process (pass-through, distinct dcgm-like series kept and",
             f"forwarded, one sample each; decision cache included). RSS after warm-up {base:.1f} MiB, "
             f"peak {peak:.1f} MiB.", header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.series:>10,} {r.rss_mib:>6.1f} MiB {r.delta_mib:>6.1f} MiB {r.bytes_per_series:>9,.0f} "
                     f"{r.cpu_us:>12.1f} us")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [1_000_000]
    series = cluster_series(250, ISSUE9_OTHER_PER_NODE)
    with tempfile.TemporaryDirectory() as td:
        fs = [first_sight("keep4", KEEP4_RULES, KEEP, series, Path(td) / "fs-keep4"),
              first_sight("passthrough", "", None, series, Path(td) / "fs-pass")]
        print(first_sight_table(fs), flush=True)
        print(memory_table(*memory(sizes, Path(td) / "mem")), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
