"""gpu-exporter HTTP front benchmark (issue 21 points 1 and 2): prints a table.

The real exporter (``--backend simulated``, 8 GPUs) in a child process, clients in this one:
1. RSS (``/proc/<pid>/statm``) idle, and its peak with 100 hostile connections (50 trickling a
   head a byte every 0.5 s, 50 sending 99 header lines of 65 kB; each reconnects when cut), with
   the median and worst of real scrapes meanwhile (goal: RSS < 64 MiB, scrape < 100 ms).
2. 50 simultaneous new connections, one GET /health each: worst latency (a backlog of 5 made
   most wait for a SYN retry, >= 1 s).
3. 200 keep-alive scrapers for 10 s: answers, failures, worst answer.

Run: ``.venv/bin/python bench/exporter_front_bench.py [--seconds 6]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.exporter.hostile import (  # noqa: E402
    Hostile,
    exporter_process,
    keepalive_scrapers,
    rss_mib,
    scrape_s,
    simultaneous,
)
from tests.helpers import wait_until  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6.0, help="how long the hostile phase lasts")
    ap.add_argument("--scrapers", type=int, default=200)
    args = ap.parse_args()
    rows: list[tuple[str, str, str]] = []
    with exporter_process() as (proc, port):
        idle = rss_mib(proc.pid)
        rows.append(("RSS idle", f"{idle:.1f} MiB", ""))
        slow, big = Hostile(port, 50, "slow").start(), Hostile(port, 50, "big").start()
        wait_until(lambda: slow.open + big.open >= 90, timeout=20)
        peak, lat = 0.0, []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(0.25)
            peak = max(peak, rss_mib(proc.pid))
            lat.append(scrape_s(port)[1])
        slow.stop()
        big.stop()
        rows.append(("RSS peak, 100 hostile connections", f"{peak:.1f} MiB", "ok" if peak < 64 else "MISS"))
        rows.append(("scrape during them: median / worst",
                     f"{statistics.median(lat) * 1000:.1f} / {max(lat) * 1000:.1f} ms",
                     "ok" if statistics.median(lat) < 0.1 else "MISS"))
        rows.append(("hostile reconnects (cut by cap/deadline)", f"{slow.connects + big.connects}", ""))
        worst = max(simultaneous(port, 50))
        rows.append(("50 simultaneous new connections: worst", f"{worst * 1000:.1f} ms",
                     "ok" if worst < 1.0 else "MISS"))
        answers, failures, worst_ka = keepalive_scrapers(port, args.scrapers, 10.0)
        rows.append((f"{args.scrapers} keep-alive scrapers, 10 s: answers / failures / worst",
                     f"{answers} / {failures} / {worst_ka * 1000:.0f} ms", "ok" if failures == 0 else "MISS"))
        rows.append(("RSS after", f"{rss_mib(proc.pid):.1f} MiB", ""))
    width = max(len(r[0]) for r in rows)
    for name, value, verdict in rows:
        print(f"{name:<{width}}  {value:>24}  {verdict}")


if __name__ == "__main__":
    main()
