"""CPU per request: what one remote-write request costs gpu-relay and vmagent apart from its series.

Many small requests (default 4,600 of 4 series, 4 concurrent keep-alive senders, pass-through to a
real victoria-metrics) make the fixed cost per request visible: reading and parsing HTTP, the queue's
commit (one fsync per group commit: gpu-relay answers 2xx only once the request is on disk), the
reply, the wake-ups of the sender threads. Figures: CPU of the program (every thread, from the first
request until the receiver holds every sample) per request; every run checked for exactly the
expected samples.

``--compare DIR`` runs gpu-relay from another checkout too (its ``relay`` package first on
PYTHONPATH; build its C extensions first: ``.venv/bin/python setup.py -q build_ext --inplace`` there),
alternating the trees run by run, so the table shows what a change did, side by side:

    .venv/bin/python bench/request_bench.py                        # gpu-relay and vmagent, 3 runs each
    .venv/bin/python bench/request_bench.py --compare /tmp/base    # and another tree's gpu-relay
    .venv/bin/python bench/request_bench.py --series 2000 --nodes 250 --rounds 4   # big requests instead
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.receivers import VictoriaMetrics
from bench.relay_run import Proc, feed, start_relay, start_vmagent
from bench.rw_payload import Payload, payload


def run(start: Callable[[Path, str], AbstractContextManager[Proc]], pl: Payload, pythonpath: str | None) -> float:
    """CPU seconds of one fresh program over the whole payload (exact delivery checked by feed)."""
    with tempfile.TemporaryDirectory(prefix="request-bench-") as tmp:
        work = Path(tmp)
        rx = VictoriaMetrics(work / "rx")
        old = os.environ.get("PYTHONPATH")
        try:
            if pythonpath is not None:
                os.environ["PYTHONPATH"] = pythonpath
            with start(work / "prog", rx.url) as proc:
                cpu, _ = feed(proc, rx, pl.requests, pl.headers, pl.samples)
            if rx.rows() != pl.samples:
                raise RuntimeError(f"receiver holds {rx.rows()} samples, expected {pl.samples}")
            return cpu
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old
            rx.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4, help="nodes of 184 GPU series; default 4 (736 series)")
    ap.add_argument("--rounds", type=int, default=25, help="rounds; default 25")
    ap.add_argument("--series", type=int, default=4, help="series per request; default 4")
    ap.add_argument("--repeat", type=int, default=3, help="runs per program (median shown); default 3")
    ap.add_argument("--compare", default="", help="another checkout whose gpu-relay runs too, alternating")
    args = ap.parse_args(argv)
    if shutil.which("vmagent") is None:
        raise SystemExit("vmagent not found (Debian: apt-get install vmagent)")
    pl = payload(args.nodes, args.rounds, per_request=args.series)
    n = len(pl.requests)
    print(f"{pl.describe()}; 4 keep-alive senders, pass-through, victoria-metrics receiver")
    programs: list[tuple[str, Callable[[Path, str], AbstractContextManager[Proc]], str | None]] = [
        ("gpu-relay (this tree)", lambda w, u: start_relay("", w, u), None)]
    if args.compare:
        programs.append((f"gpu-relay ({args.compare})", lambda w, u: start_relay("", w, u),
                         str(Path(args.compare).resolve())))
    programs.append(("vmagent", lambda w, u: start_vmagent("", w, u), None))
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in programs}
    for r in range(args.repeat):
        for name, start, path in programs:
            cpu[name].append(run(start, pl, path))
        print(f"  run {r + 1}/{args.repeat}: " + ", ".join(f"{k} {v[-1] / n * 1e6:.0f} us" for k, v in cpu.items()),
              flush=True)
    print(f"{'program':<40} {'CPU s':>7} {'us/request':>11} {'vs vmagent':>11}")
    vm = statistics.median(cpu["vmagent"])
    for name, values in cpu.items():
        med = statistics.median(values)
        print(f"{name:<40} {med:>7.2f} {med / n * 1e6:>11.0f} {med / vm:>10.2f}x")
    print(f"median of {args.repeat} run(s) each, alternating; every run delivered exactly {pl.samples:,} samples")


if __name__ == "__main__":
    main()
