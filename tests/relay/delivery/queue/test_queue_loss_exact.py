"""Issue 20 point 14: the queue's loss log is written with every commit, so after a process killed
with -9 whose WAL is then lost, or whose file is emptied or damaged, the queue reports exactly the
samples it had acknowledged and no longer has: one ERROR line and
gpu_relay_queue_lost_samples_total{destination,cause}."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.delivery.queue import losslog
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import Sender, SenderSettings
from tests.helpers import REPO_ROOT
from tests.relay.delivery.queue.test_queue_faults import _entry, _index, _wal
from tests.relay.delivery.test_sender_faults import Recorder

# The child: puts ``n`` entries (entry i has i % 7 + 1 samples), acks every third of the first
# half, then prints what it holds (each put returned: acknowledged) and waits to be killed.
CHILD = r"""
import json, sys, time
from pathlib import Path
from relay.delivery.queue.durable import DurableQueue
from tests.relay.delivery.queue.test_queue_faults import _entry, _index
path, n = Path(sys.argv[1]), int(sys.argv[2])
q = DurableQueue(path, 1 << 30, durability="normal")
for i in range(n):
    q.put([(i % 2, _entry(i), i % 7 + 1, 0)])
held = [e for s in (0, 1) for e in q.peek(s, 1 << 30, 1 << 30)]
acked = [e for e in held if _index(e.payload) < n // 2 and _index(e.payload) % 3 == 0]
q.ack([e.id for e in acked])
q.put([(0, _entry(n), n % 7 + 1, 0)])  # a commit after the acks: they are on file (in the WAL)
live = sorted({_index(e.payload) for e in held} - {_index(e.payload) for e in acked} | {n})
print(json.dumps(live), flush=True)
time.sleep(600)
"""


def killed_queue(tmp_path: Path, n: int) -> tuple[Path, list[int]]:
    """A queue file as a kill -9 left it, and the entries it had acknowledged and still held."""
    path = tmp_path / "amp.queue.db"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(n)], stdout=subprocess.PIPE,
                             env=env, cwd=REPO_ROOT, text=True)
    try:
        assert child.stdout is not None
        live = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    return path, live


def samples_of(i: int) -> int:
    return i % 7 + 1


def reopen(path: Path, caplog: pytest.LogCaptureFixture) -> tuple[DurableQueue, RelayMetrics, list[int]]:
    with caplog.at_level(logging.INFO, logger="relay.queue"):
        q = DurableQueue(path, 1 << 30)
    metrics = RelayMetrics(CollectorRegistry())
    Sender("amp", "http://x/w", q, Recorder(), SenderSettings(), metrics)  # counts what the queue reports
    kept = [_index(e.payload) for s in q.shards() for e in q.peek(s, 1 << 30, 1 << 30)]
    return q, metrics, kept


def lost_counter(metrics: RelayMetrics, cause: str) -> float | None:
    return metrics.registry.get_sample_value("gpu_relay_queue_lost_samples_total",
                                             {"destination": "amp", "cause": cause})


def _emptied(p: Path) -> None:
    p.write_bytes(b"")
    _wal(p).unlink()


def _deleted(p: Path) -> None:
    p.unlink()
    _wal(p).unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "wal-deleted": lambda p: _wal(p).unlink(),
    "db-emptied-wal-deleted": _emptied,
    "db-deleted-wal-deleted": _deleted,
}


# n=1500 (rows of 2 KiB): SQLite checkpointed part of the WAL, so the file without it is an earlier
# state (wal_lost); n=50: never checkpointed, the file without its WAL is as empty as an emptied one
@pytest.mark.parametrize(("variant", "n", "cause"), [
    ("wal-deleted", 1500, "wal_lost"), ("wal-deleted", 50, "file_emptied"),
    ("db-emptied-wal-deleted", 1500, "file_emptied"), ("db-emptied-wal-deleted", 50, "file_emptied"),
    ("db-deleted-wal-deleted", 1500, "file_emptied"), ("db-deleted-wal-deleted", 50, "file_emptied"),
])
def test_after_a_kill_and_a_lost_wal_or_file_the_lost_samples_are_exactly_what_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, variant: str, n: int, cause: str
) -> None:
    path, live = killed_queue(tmp_path, n)
    DAMAGE[variant](path)
    q, metrics, kept = reopen(path, caplog)
    try:
        missing = set(live) - set(kept)
        true_lost = sum(samples_of(i) for i in missing)
        assert true_lost > 0
        assert (q.report.lost_entries, q.report.lost_samples, q.report.lost_cause) == (len(missing), true_lost, cause)
        assert lost_counter(metrics, cause) == true_lost
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and f"{len(missing)} entries ({true_lost} samples)" in errors[0].getMessage()
        assert getattr(errors[0], "lost_samples", None) == true_lost
        assert max(kept, default=-1) < n or n in kept  # nothing invented
    finally:
        q.close()


def test_a_clean_restart_after_a_kill_reports_no_loss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, live = killed_queue(tmp_path, 200)
    q, metrics, kept = reopen(path, caplog)
    try:
        assert sorted(kept) == live
        assert q.report.lost_samples is None and not q.report.problems
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert lost_counter(metrics, "wal_lost") is None
    finally:
        q.close()


def test_a_damaged_file_reports_what_salvage_could_not_bring_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, live = killed_queue(tmp_path, 300)
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with path.open("r+b") as f:  # garbage over pages in the middle
        f.seek(path.stat().st_size // 2)
        f.write(os.urandom(3 * 4096))
    q, metrics, kept = reopen(path, caplog)
    try:
        assert q.report.damaged
        true_lost = sum(samples_of(i) for i in set(live) - set(kept))
        assert q.report.lost_samples == true_lost and q.report.lost_cause == "damaged"
        assert lost_counter(metrics, "damaged") == true_lost
    finally:
        q.close()


def test_the_log_replays_stores_and_deletes_and_ignores_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    log = losslog.LossLog(path)
    log.restart(10, 3, 30)  # ids 8..10 queued at the base, 10 samples each
    log.commit([(11, 5), (12, 6)], [], 0)
    log.commit([], [8, 11], 15)  # a base row (10 samples) and one put since (5)
    log.commit([(13, 7)], [9], 10)
    log.close()
    with losslog.log_path(path).open("a") as f:
        f.write("+ 14 ")  # torn by a crash
    replay = losslog.read(path)
    assert replay is not None
    assert replay.queued() == (3, 10 + 6 + 7) and replay.max_id == 13
    assert replay.above(10) == (2, 13) and replay.above(12) == (1, 7)


def test_an_older_json_mark_is_read_as_a_base(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    losslog.log_path(path).write_text('{"last_id": 40, "entries": 4, "samples": 9}')
    replay = losslog.read(path)
    assert replay is not None and (replay.max_id, replay.queued()) == (40, (4, 9))


def test_the_log_starts_again_after_a_complete_checkpoint_so_it_stays_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(losslog, "RESTART_BYTES", 1024)
    path = tmp_path / "amp.queue.db"
    q = DurableQueue(path, 1 << 30)
    biggest = 0
    for i in range(600):
        q.put([(0, _entry(i), 2, 0)])
        if i % 2:
            q.ack([e.id for e in q.peek(0, 1 << 30, 1 << 30)])
        biggest = max(biggest, losslog.log_path(path).stat().st_size)
    queued = q.depth()[0]
    q.close()
    assert biggest < 3 * 1024  # without restarts: about 10 KB of puts and acks
    again, metrics, kept = reopen(path, caplog)
    try:
        assert again.report.lost_samples is None and 2 * len(kept) == queued
        assert lost_counter(metrics, "wal_lost") is None
        replay = losslog.read(path)
        assert replay is not None and replay.queued() == (len(kept), queued)
    finally:
        again.close()
