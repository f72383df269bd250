"""Torture: the real gpu-relay process against a real victoria-metrics, under continuous load.

Every scenario starts fresh processes, sends remote-write requests the way Prometheus does (retry
the same request until it is answered 2xx, give up on a 4xx) and counts, per sample, what was
acknowledged and what reached victoria-metrics (read back with its export API). A sample is
identified by its series (lane, s) and its timestamp, unique per lane, so loss and duplication are
exact. Scenarios and what each must show:

* ``kill``: N ``kill -9`` / restart cycles under load: acked, delivered, lost (must be 0),
  duplicated (harmless: same timestamp and value), time to ready after each restart.
* ``outage``: the receiver down for a while under load, then back: acked vs delivered (lost must
  be 0), queue depth and RSS over time, drain time.
* ``limits``: the same outage with a short ``max_sample_age`` and a small ``max_disk``: what was
  lost must equal, exactly, what the relay counted as dropped for those two reasons.
* ``diskfull``: the queue on a small tmpfs (when this machine lets us mount one; else a tiny
  ``max_disk``) while the receiver is down: no 2xx for what could not be stored (lost == counted
  drops), no crash, no traceback in the log, 2xx again once the sender frees space.
* ``corrupt``: the queue's SQLite files damaged between runs (truncated, garbage pages, zeroed
  header, WAL deleted/truncated/garbled, emptied): the relay starts, says what it found, keeps the
  rest and goes on delivering.
* ``fuzz``: mutated RW 1.0 / 2.0 bodies over HTTP (bad snappy, lying lengths, bad varints, wrong
  wire types, invalid UTF-8, duplicate/empty label names, bad RW 2.0 symbol refs, slow bodies):
  the status distribution; never a 5xx, never a hang, RSS bounded, every body answered 2xx parses
  with protobuf's own parser, and nothing the relay forwarded was refused by the receiver.

    .venv/bin/python bench/torture.py                 # the full run (~15 min on 2 cores)
    .venv/bin/python bench/torture.py --short         # CI's variant (~1-2 min)
    .venv/bin/python bench/torture.py --only kill,fuzz --cycles 5

Exit status 1 when any scenario's invariant fails (the table says which).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torture_fuzz import scenario_fuzz
from torture_procs import (
    Loader,
    Outcome,
    Relay,
    VictoriaMetrics,
    drain,
    tally,
    tally_rows,
    wait,
)


def scenario_kill(work: Path, cycles: int, period: float) -> Outcome:
    vm = VictoriaMetrics(work)
    vm.start()
    relay = Relay(work, vm.base + "/api/v1/write")
    loader = Loader(lambda: relay.write_url)
    try:
        relay.start()
        loader.start()
        for _ in range(cycles):
            time.sleep(period)
            relay.kill9()
            relay.start()
        time.sleep(period)
        loader.stop()
        drained = drain(relay, 120)
        t = tally(loader, vm)
    finally:
        loader.stop()
        relay.stop()
        vm.stop()
    ready = sorted(relay.ready_times[1:]) or [float("nan")]
    rows = [
        ("kill -9 cycles", str(cycles)),
        *tally_rows(t),
        ("ready after restart, median s", f"{ready[len(ready) // 2]:.2f}"),
        ("ready after restart, max s", f"{ready[-1]:.2f}"),
        ("final drain s", f"{drained:.1f}"),
    ]
    return Outcome("kill", t.lost == 0 and drained != float("inf") and ready[-1] != float("inf"), rows)


def scenario_outage(work: Path, outage_s: float, step_s: float) -> Outcome:
    vm = VictoriaMetrics(work)
    vm.start()
    relay = Relay(work, vm.base + "/api/v1/write")
    loader = Loader(lambda: relay.write_url)
    timeline: list[str] = []
    try:
        relay.start()
        loader.start()
        time.sleep(step_s)
        rss0 = relay.rss()
        vm.stop()
        t0 = time.monotonic()
        while time.monotonic() - t0 < outage_s:
            time.sleep(step_s)
            timeline.append(
                f"t+{time.monotonic() - t0:5.0f}s  queued {relay.queued():>9,.0f} samples  RSS {relay.rss():6.1f} MB"
            )
        vm.start()
        t1 = time.monotonic()
        # drained: the queue is back to what steady load keeps in flight (under one batch per shard)
        recovered = wait(lambda: relay.queued() < 4 * loader.series * loader.lanes, 600, 0.2)
        drain_s = time.monotonic() - t1 if recovered else float("inf")
        rss_peak = max([relay.rss()] + [float(x.split("RSS")[1].split()[0]) for x in timeline])
        loader.stop()
        drain(relay, 120)
        t = tally(loader, vm)
    finally:
        loader.stop()
        relay.stop()
        vm.stop()
    rows = [
        ("outage s", f"{outage_s:.0f}"),
        *tally_rows(t),
        ("drain after recovery s", f"{drain_s:.1f}"),
        ("RSS before / peak MB", f"{rss0:.1f} / {rss_peak:.1f}"),
    ]
    return Outcome("outage", t.lost == 0 and drain_s != float("inf"), rows, timeline)


def scenario_limits(work: Path, outage_s: float) -> Outcome:
    vm = VictoriaMetrics(work)
    vm.start()
    age = max(2.0, outage_s / 3)
    relay = Relay(work, vm.base + "/api/v1/write", max_sample_age=f"{age:.0f}s", max_disk="2MiB")
    loader = Loader(lambda: relay.write_url)
    try:
        relay.start()
        loader.start()
        time.sleep(1)
        vm.stop()
        time.sleep(outage_s)
        vm.start()
        time.sleep(2)
        loader.stop()
        drain(relay, 120)
        t = tally(loader, vm)
        losses = relay.counted_losses()
    finally:
        loader.stop()
        relay.stop()
        vm.stop()
    counted = int(sum(losses.values()))
    rows = [
        ("outage s", f"{outage_s:.0f}"),
        ("max_sample_age / max_disk", f"{age:.0f}s / 2MiB"),
        *tally_rows(t),
        ("counted by the relay", ", ".join(f"{k}: {v:,.0f}" for k, v in losses.items()) or "nothing"),
        ("lost - counted (must be 0)", f"{t.lost - counted:,}"),
    ]
    return Outcome("limits", t.lost == counted, rows)


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def scenario_diskfull(work: Path, hold_s: float) -> Outcome:
    qdir = work / "queue-fs"
    tmpfs = _mount_tmpfs(qdir, "20m")
    vm = VictoriaMetrics(work)
    vm.start()
    relay = Relay(work, vm.base + "/api/v1/write", queue_dir=qdir, max_disk="1GiB" if tmpfs else "4MiB")
    loader = Loader(lambda: relay.write_url, series=400)
    notes = [f"queue on a 20 MB tmpfs at {qdir}" if tmpfs else "no tmpfs mount permitted: max_disk 4MiB instead"]
    try:
        relay.start()
        loader.start()
        time.sleep(1)
        vm.stop()
        full = wait(lambda: loader.statuses[503] > 0 or bool(relay.counted_losses()), 300, 0.5)
        time.sleep(hold_s)
        alive_full = relay.alive()
        vm.start()
        before = loader.statuses[200] + loader.statuses[204]
        t_rec = time.monotonic()
        resumed = wait(lambda: loader.statuses[200] + loader.statuses[204] > before + 10, 120, 0.2)
        resume_s = time.monotonic() - t_rec
        time.sleep(2)
        loader.stop()
        drain(relay, 180)
        t = tally(loader, vm)
        losses = relay.counted_losses()
        dropped = sum(losses.values())
        alive_end = relay.alive()
    finally:
        loader.stop()
        relay.stop()
        vm.stop()
        if tmpfs:
            subprocess.run(["umount", str(qdir)], capture_output=True)
    log = relay.log_text()
    tracebacks = log.count("Traceback")
    rows = [
        *tally_rows(t),
        ("reached full", str(full)),
        ("503 answers", f"{loader.statuses[503]:,}"),
        ("counted by the relay", ", ".join(f"{k}: {v:,.0f}" for k, v in losses.items()) or "nothing"),
        ("lost - counted (must be 0)", f"{t.lost - int(dropped):,}"),
        ("alive while full / at end", f"{alive_full} / {alive_end}"),
        ("tracebacks in log", str(tracebacks)),
        ("log lines", str(len(log.splitlines()))),
        ("2xx again after recovery s", f"{resume_s:.1f}" if resumed else "never"),
    ]
    ok = full and alive_full and alive_end and resumed and tracebacks == 0 and t.lost == int(dropped)
    return Outcome("diskfull", ok, rows, notes)


def _corruptions() -> dict[str, Callable[[Path], None]]:
    def db(q: Path) -> Path:
        files = sorted(p for p in q.glob("*.db"))
        if not files:
            raise SystemExit(f"torture: no *.db queue file in {q}: {sorted(q.iterdir())}")
        return files[0]

    def truncate_half(q: Path) -> None:
        p = db(q)
        os.truncate(p, p.stat().st_size // 2)

    def garbage_pages(q: Path) -> None:
        p = db(q)
        size = p.stat().st_size
        with p.open("r+b") as f:
            for off in range(4096, max(size, 8192), max(4096, size // 5)):
                f.seek(off)
                f.write(random.Random(off).randbytes(4096))

    def zero_header(q: Path) -> None:
        with db(q).open("r+b") as f:
            f.write(bytes(100))

    def wal(q: Path) -> Path:
        return db(q).with_name(db(q).name + "-wal")

    def delete_wal(q: Path) -> None:
        wal(q).unlink(missing_ok=True)

    def truncate_wal(q: Path) -> None:
        w = wal(q)
        if w.exists():
            os.truncate(w, w.stat().st_size // 3)

    def garbage_wal(q: Path) -> None:
        w = wal(q)
        if w.exists() and w.stat().st_size > 64:
            with w.open("r+b") as f:
                f.seek(32)
                f.write(random.Random(7).randbytes(min(8192, w.stat().st_size - 32)))

    def emptied(q: Path) -> None:
        os.truncate(db(q), 0)
        delete_wal(q)

    def random_file(q: Path) -> None:
        db(q).write_bytes(random.Random(3).randbytes(64 * 1024))
        delete_wal(q)

    return {
        "truncated db": truncate_half,
        "garbage pages": garbage_pages,
        "zeroed header": zero_header,
        "WAL deleted": delete_wal,
        "WAL truncated": truncate_wal,
        "WAL garbled": garbage_wal,
        "db emptied": emptied,
        "db random bytes": random_file,
    }


def scenario_corrupt(work: Path, variants: int) -> Outcome:
    rows: list[tuple[str, str]] = []
    ok = True
    for i, (name, damage) in enumerate(list(_corruptions().items())[:variants]):
        w = work / f"corrupt-{i}"
        w.mkdir()
        vm = VictoriaMetrics(w)
        vm.start()
        relay = Relay(w, vm.base + "/api/v1/write")
        loader = Loader(lambda relay=relay: relay.write_url, lanes=2, series=200)
        try:
            relay.start()
            vm.stop()  # everything stays queued
            loader.start()
            time.sleep(2)
            loader.stop()
            # WAL damage needs a WAL: kill -9 leaves it; a graceful stop checkpoints it into the db
            if "WAL" in name:
                relay.kill9()
            else:
                relay.stop()
            damage(relay.queue_dir)
            log_before = len(relay.log_text())
            ready = relay.start(timeout=30)
            said = relay.log_text()[log_before:]
            errors = [
                ln for ln in said.splitlines() if " ERROR " in ln or '"level": "error"' in ln or "level=error" in ln
            ]
            vm.start()
            drain(relay, 60)
            t = tally(loader, vm)
        finally:
            loader.stop()
            relay.stop()
            vm.stop()
        started = ready != float("inf")
        ok &= started and "Traceback" not in said
        rows.append(
            (
                name,
                f"started {'yes' if started else 'NO'} in {ready:.2f}s; acked {t.acked:,}, "
                f"kept {t.delivered_acked:,}, lost {t.lost:,}; ERROR lines {len(errors)}"
                + (f": {errors[0][-110:]}" if errors else ""),
            )
        )
    return Outcome("corrupt", ok, rows)


# ---- main ---------------------------------------------------------------------------------------


def print_outcome(o: Outcome) -> None:
    print(f"\n== {o.name}: {'PASS' if o.ok else 'FAIL'}")
    width = max(len(k) for k, _ in o.rows)
    for k, v in o.rows:
        print(f"  {k:<{width}}  {v}")
    for n in o.notes:
        print(f"  {n}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--short", action="store_true", help="CI's short variant")
    p.add_argument("--only", default="kill,outage,limits,diskfull,corrupt,fuzz")
    p.add_argument("--cycles", type=int, default=None)
    p.add_argument("--outage", type=float, default=None, help="receiver outage, seconds")
    p.add_argument("--fuzz", type=int, default=None, help="fuzzed bodies")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args(argv)
    cycles = a.cycles or (3 if a.short else 20)
    outage = a.outage or (6.0 if a.short else 240.0)
    fuzz = a.fuzz or (2000 if a.short else 100_000)
    work = Path(tempfile.mkdtemp(prefix="gpu-relay-torture-"))
    print(f"torture: work directory {work}; {os.cpu_count()} CPUs")
    todo = [s.strip() for s in a.only.split(",") if s.strip()]
    runs: dict[str, Callable[[Path], Outcome]] = {
        "kill": lambda w: scenario_kill(w, cycles, 1.0 if a.short else 3.0),
        "outage": lambda w: scenario_outage(w, outage, 2.0 if a.short else 20.0),
        "limits": lambda w: scenario_limits(w, outage),
        "diskfull": lambda w: scenario_diskfull(w, 3.0 if a.short else 30.0),
        "corrupt": lambda w: scenario_corrupt(w, 3 if a.short else 8),
        "fuzz": lambda w: scenario_fuzz(w, fuzz),
    }
    unknown = [s for s in todo if s not in runs]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}: choose from {', '.join(runs)}")
    failed = []
    try:
        for name in todo:
            w = work / name
            w.mkdir()
            t0 = time.monotonic()
            outcome = runs[name](w)
            outcome.rows.append(("scenario wall time s", f"{time.monotonic() - t0:.0f}"))
            print_outcome(outcome)
            if not outcome.ok:
                failed.append(name)
    finally:
        if not a.keep and not failed:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"\ntorture: {len(todo) - len(failed)} of {len(todo)} scenarios passed"
        + (f"; FAILED: {', '.join(failed)} (logs kept in {work})" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
