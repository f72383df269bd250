"""What relay.interpreter's settings (GC freeze and thresholds, GIL switch interval) save: gpu-relay's
CPU per sample with them (as `gpu-relay run` starts) and with CPython's defaults, side by side.

Same machinery and payload as bench/relay_bench.py (issue 9's shape by default: 250 nodes x 252 series,
32 rounds, 2,000 series per request, 4 connections, a real victoria-metrics receiver that must hold
exactly the expected samples). The two variants alternate run by run (defaults, tuned, defaults, ...)
so a noisy neighbour hits both alike; the table shows each variant's median run by CPU time. The
"defaults" relay is the same code started through a wrapper that replaces ``interpreter.tune`` with a
no-op, so nothing else differs.

    .venv/bin/python bench/interpreter_bench.py              # issue 9 shape, 3 runs each: ~3 min
    .venv/bin/python bench/interpreter_bench.py --quick      # 25 nodes x 8 rounds, 1 run each
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.receivers import VictoriaMetrics
from bench.relay_bench import check, median_run
from bench.relay_run import KEEP4_RULES, Proc, Result, _started, measure, relay_config
from bench.rw_payload import ISSUE9_OTHER_PER_NODE, KEEP, Payload, payload
from tests.helpers import free_port

UNTUNED = ("import sys; from relay.control import interpreter; interpreter.tune = interpreter.current; "
           "from relay.control.cli import main; sys.exit(main())")


def start(rules: str, work: Path, rx_url: str, tuned: bool) -> AbstractContextManager[Proc]:
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cfg = work / "relay.yaml"
    cfg.write_text(relay_config(port, work / "q", rx_url, rules))
    base = f"http://127.0.0.1:{port}"
    program = [str(Path(sys.executable).parent / "gpu-relay")] if tuned else [sys.executable, "-c", UNTUNED]
    return _started("gpu-relay", [*program, "run", "--config", str(cfg)], base + "/-/ready",
                    base + "/api/v1/write", work)


def one(rules: str, pl: Payload, expected: int, work: Path, tuned: bool) -> Result:
    rx = VictoriaMetrics(work / "rx")
    try:
        return measure(lambda url: start(rules, work, url, tuned), rx, pl, expected)
    finally:
        rx.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="25 nodes x 8 rounds, 1 run each")
    a = ap.parse_args(argv)
    if a.quick:
        a.nodes, a.rounds, a.repeat = 25, 8, 1
    pl = payload(a.nodes, a.rounds, other_per_node=ISSUE9_OTHER_PER_NODE)
    scenarios: list[tuple[str, str, list[str] | None]] = [("keep4", KEEP4_RULES, KEEP), ("passthrough", "", None)]
    print(f"{len(pl.series):,} series x {a.rounds} rounds = {pl.samples:,} samples in {len(pl.requests)} requests; "
          f"{a.repeat} run(s) per variant, alternating")
    print(f"{'scenario':<12} {'interpreter':<22} {'us/sample':>9} {'CPU s':>6} {'peak MiB':>8}  delivered")
    with tempfile.TemporaryDirectory(prefix="interp-bench-") as tmp:
        for name, rules, keep in scenarios:
            expected = pl.kept(keep) if keep else pl.samples
            runs: dict[bool, list[Result]] = {False: [], True: []}
            for i in range(a.repeat):
                for tuned in (False, True):
                    r = one(rules, pl, expected, Path(tmp) / f"{name}-{tuned}-{i}", tuned)
                    check(r, pl, keep, f"{name} ({'tuned' if tuned else 'defaults'})")
                    runs[tuned].append(r)
            figures = {}
            for tuned in (False, True):
                r = median_run(runs[tuned])
                figures[tuned] = r.cpu / pl.samples * 1e6
                label = "relay.interpreter" if tuned else "CPython defaults"
                print(f"{name if not tuned else '':<12} {label:<22} {figures[tuned]:>9.2f} {r.cpu:>6.2f} "
                      f"{r.rss_mb:>8.1f}  {r.delivered:,} exact")
            spread = {t: statistics.pstdev([r.cpu for r in rs]) / pl.samples * 1e6 for t, rs in runs.items()}
            print(f"{'':<12} {'ratio':<22} tuned CPU per sample = {figures[True] / figures[False]:.2f}x the defaults' "
                  f"(spread {spread[False]:.2f} / {spread[True]:.2f} us)")


if __name__ == "__main__":
    main()
