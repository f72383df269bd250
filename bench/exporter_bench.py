"""gpu-exporter benchmark: prints a table.

1. Collection: backend read time per GPU and the whole cycle (read + render both formats), for the
   simulated backend (8 and 64 GPUs) or, with ``--backend nvml``, the real GPUs.
2. Scrape: the real exporter process (simulated 8 and 64 GPUs) vs a minimal ``http.server`` child
   process serving a pre-rendered body of the same bytes. Same client, same connection mode
   (keep-alive by default, ``--fresh`` for a new connection per request); median and p99; goal:
   exporter median <= 3x the baseline's.
3. RSS of the exporter process after the scrapes (goal <= 60 MB).

Run: ``.venv/bin/python bench/exporter_bench.py [--backend nvml] [--requests 500] [--fresh]``
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exporter.collector import Collector  # noqa: E402
from exporter.counters_csv import load_counters  # noqa: E402
from exporter.fields import FIELDS  # noqa: E402
from tests.helpers import free_port, wait_until  # noqa: E402

BASELINE = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[2], "rb").read()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def make_backend(kind: str, n: int) -> Any:
    if kind == "nvml":
        from exporter.nvml.backend import NvmlBackend

        return NvmlBackend()
    from exporter.simulated import SimulatedBackend

    return SimulatedBackend(n_gpus=n)


def bench_collection(kind: str, n: int, cycles: int) -> tuple[int, float, float, int]:
    """(GPUs, median read ms per GPU, median cycle ms, body bytes)."""
    backend = make_backend(kind, n)
    try:
        ints = frozenset(name for name, f in FIELDS.items() if f.integer)
        c = Collector(backend, load_counters(None), "bench", 5.0, integer_fields=ints, backend_name=kind)
        c.collect_once()
        cycle_ms = []
        for _ in range(cycles):
            t0 = time.perf_counter()
            c.collect_once()
            cycle_ms.append((time.perf_counter() - t0) * 1000)
        gpus = len(backend.devices())
        fields = frozenset(f.field for f in load_counters(None))
        read_ms = []
        for _ in range(cycles):
            for g in range(gpus):
                t0 = time.perf_counter()
                backend.read(g, fields)
                read_ms.append((time.perf_counter() - t0) * 1000)
        return gpus, statistics.median(read_ms), statistics.median(cycle_ms), len(c.exposition.text)
    finally:
        backend.close()


def timed_requests(port: int, n: int, fresh: bool) -> list[float]:
    out: list[float] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(n):
        if fresh:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        out.append((time.perf_counter() - t0) * 1000)
        assert body
        if fresh:
            conn.close()
    conn.close()
    return out


def ready(port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            resp.read()
            conn.close()
            ok = resp.status == 200
            return ok
        except OSError:
            return False

    return check


def rss_mb(pid: int) -> tuple[float, float]:
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def bench_scrape(n_gpus: int, requests: int, fresh: bool) -> dict[str, float]:
    port, base_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "--backend", "simulated", "--simulate-gpus", str(n_gpus),
         "--listen", f"127.0.0.1:{port}", "--interval", "5s", "--log-level", "error"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
    )
    baseline: subprocess.Popen[bytes] | None = None
    try:
        if not wait_until(ready(port), timeout=30):
            raise RuntimeError("exporter did not come up")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        conn.close()
        with tempfile.NamedTemporaryFile(delete=False) as fh:
            fh.write(body)
        baseline = subprocess.Popen([sys.executable, "-c", BASELINE, str(base_port), fh.name])
        if not wait_until(ready(base_port), timeout=30):
            raise RuntimeError("baseline server did not come up")
        timed_requests(port, 20, fresh)  # warm both
        timed_requests(base_port, 20, fresh)
        ours, base = [], []
        for _ in range(5):  # interleave rounds so load drift hits both sides alike
            ours += timed_requests(port, requests // 5, fresh)
            base += timed_requests(base_port, requests // 5, fresh)
        rss, hwm = rss_mb(exporter.pid)
        os.unlink(fh.name)
        return {
            "bytes": len(body), "ours_med": statistics.median(ours), "ours_p99": pct(ours, 99),
            "base_med": statistics.median(base), "base_p99": pct(base, 99), "rss": rss, "hwm": hwm,
        }
    finally:
        for proc in (exporter, baseline):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--backend", choices=("simulated", "nvml"), default="simulated")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--fresh", action="store_true", help="a new TCP connection per request")
    args = ap.parse_args()

    print(f"== collection ({args.backend} backend, {args.cycles} cycles, default counters)")
    print(f"{'GPUs':>5} {'read/GPU ms':>12} {'cycle ms':>9} {'body bytes':>11}")
    sizes = [0] if args.backend == "nvml" else [8, 64]
    for n in sizes:
        gpus, read_ms, cycle_ms, size = bench_collection(args.backend, n, args.cycles)
        print(f"{gpus:>5} {read_ms:>12.3f} {cycle_ms:>9.2f} {size:>11}")

    mode = "fresh connection per request" if args.fresh else "keep-alive"
    print(f"\n== scrape ({args.requests} requests per side, {mode}; exporter process vs minimal http.server "
          "child serving the same bytes)")
    print(f"{'GPUs':>5} {'bytes':>8} {'ours med ms':>12} {'ours p99':>9} {'base med ms':>12} {'base p99':>9} "
          f"{'ratio':>6} {'goal':>5} {'RSS MB':>7} {'peak MB':>8}")
    worst = 0.0
    for n in (8, 64):
        r = bench_scrape(n, args.requests, args.fresh)
        ratio = r["ours_med"] / r["base_med"]
        worst = max(worst, ratio)
        print(f"{n:>5} {r['bytes']:>8.0f} {r['ours_med']:>12.3f} {r['ours_p99']:>9.3f} "
              f"{r['base_med']:>12.3f} {r['base_p99']:>9.3f} {ratio:>5.2f}x "
              f"{'ok' if ratio <= 3 else 'MISS':>5} {r['rss']:>7.1f} "
              f"{r['hwm']:>8.1f}")
    print("\ngoals: scrape median <= 3x baseline; exporter RSS <= 60 MB")
    return 0 if worst <= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
