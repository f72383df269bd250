"""DurableQueue fault paths of issue 8: disk full, unwritable acks, the files' size under max_disk,
damaged files at open (defects 17, 18, 20, 23) and start-up errors."""

from __future__ import annotations

import logging
import os
import random
import shutil
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.delivery.queue import durable as rq
from relay.delivery.queue.durable import DurableQueue, QueueOpenError, StorageError
from relay.delivery.queue.files import OpenReport
from relay.ingest.wire import decode_write_request, encode_write_request


class Faulty(sqlite3.Connection):
    """A real SQLite connection that fails statements matching ``fail`` (as a full disk would), and
    optionally its ROLLBACK too (SQLite may have rolled back by itself: "no transaction is active")."""

    fail: str | None = None
    fail_rollback = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if Faulty.fail is not None and Faulty.fail in sql:
            raise sqlite3.OperationalError("database or disk is full")
        if Faulty.fail_rollback and sql.startswith("ROLLBACK"):
            raise sqlite3.OperationalError("cannot rollback - no transaction is active")
        return super().execute(sql, *args)


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[DurableQueue]:
    Faulty.fail, Faulty.fail_rollback = None, False
    q = DurableQueue(tmp_path / "amp.queue.db", 1 << 20, connection_factory=Faulty)
    yield q
    Faulty.fail, Faulty.fail_rollback = None, False
    q.close()


# -- defect 17: disk full ----------------------------------------------------------------------
def test_a_put_that_cannot_be_made_durable_is_a_storage_error_not_masked_by_a_failing_rollback(
    faulty: DurableQueue, caplog: pytest.LogCaptureFixture
) -> None:
    faulty.put([(0, b"kept", 1, 0)])
    Faulty.fail, Faulty.fail_rollback = "INSERT", True
    with caplog.at_level(logging.DEBUG, logger="relay.queue"), pytest.raises(StorageError) as e:
        faulty.put([(0, b"lost", 1, 0)])
    assert "database or disk is full" in str(e.value) and "rollback" not in str(e.value)
    assert isinstance(e.value.__cause__, sqlite3.OperationalError) or e.value.__cause__ is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]  # the service logs it
    assert faulty.depth() == (1, 4)
    Faulty.fail, Faulty.fail_rollback = None, False
    assert faulty.put([(0, b"again", 1, 0)]) == 0  # recovers: no 503 forever
    assert [e.payload for e in faulty.peek(0, 10)] == [b"kept", b"again"]


def test_an_ack_that_cannot_be_written_is_never_handed_out_again_and_is_retried(
    faulty: DurableQueue, tmp_path: Path
) -> None:
    faulty.put([(0, b"a", 1, 0), (0, b"b", 1, 0), (0, b"c", 1, 0)])
    delivered = faulty.peek(0, 2)
    Faulty.fail = "DELETE"
    faulty.ack([e.id for e in delivered])  # does not raise
    assert [e.payload for e in faulty.peek(0, 10)] == [b"c"]  # not resent (was 184,860 extra copies)
    Faulty.fail = None
    faulty.put([(0, b"d", 1, 0)])  # the next write retries the delete
    assert faulty.depth() == (2, 2)
    faulty.close()
    again = DurableQueue(tmp_path / "amp.queue.db", 1 << 20)
    assert [e.payload for e in again.peek(0, 10)] == [b"c", b"d"]
    again.close()


def test_queue_full_may_delete_delivered_rows_whose_ack_was_not_written_without_counting_them(
    tmp_path: Path,
) -> None:
    Faulty.fail = None
    q = DurableQueue(tmp_path / "q.db", 2 * (100 + rq.ENTRY_OVERHEAD_BYTES), connection_factory=Faulty)
    try:
        q.put([(0, b"x" * 100, 5, 0), (0, b"y" * 100, 6, 0)])
        sent = q.peek(0, 5)
        Faulty.fail = "DELETE FROM entries WHERE id IN (?) RETURNING"
        q.ack([e.id for e in sent])
        Faulty.fail = None
        q.peek(0, 100)  # the consumer moved on (holds "y")
        assert q.put([(1, b"z" * 100, 7, 0)]) == 0  # "x" was delivered: not lost to queue_full
        assert q.depth() == (13, 200)
    finally:
        Faulty.fail = None
        q.close()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the injected-failure tests cover the logic")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_on_a_full_20mb_tmpfs_nothing_acknowledged_is_lost_and_puts_recover_once_space_is_freed(
    tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = DurableQueue(tmpfs / "amp.queue.db", 1 << 30)  # max_disk far above the volume
    blob = os.urandom(16 << 10)
    acked: list[int] = []
    failures = 0
    for i in range(2000):
        try:
            q.put([(i % 4, i.to_bytes(4, "big") + blob, 1, 0)])
            acked.append(i)
        except StorageError:
            failures += 1
            if failures >= 20:
                break
    assert failures >= 20 and len(acked) > 100  # the disk filled up
    stored = sorted(int.from_bytes(e.payload[:4], "big") for s in q.shards() for e in q.peek(s, 1 << 30, 1 << 30))
    assert stored == acked  # every acknowledged put is there, nothing else
    for s in q.shards():  # the sender delivers and frees space
        q.ack([e.id for e in q.peek(s, 1 << 30, 1 << 30)])
    ok = sum(1 for i in range(20) if _put_ok(q, [(0, b"again-%d" % i + blob, 1, 0)]))
    assert ok == 20
    assert not [r for r in caplog.records if r.exc_info]
    q.close()


def _put_ok(q: DurableQueue, pieces: list[rq.Piece]) -> bool:
    try:
        q.put(pieces)
        return True
    except StorageError:
        return False


# -- defect 20: max_disk bounds the files ------------------------------------------------------
def test_the_files_on_disk_never_exceed_max_disk_under_sustained_overflow(tmp_path: Path) -> None:
    max_disk = 8 << 20
    q = DurableQueue(tmp_path / "q.db", max_disk, durability="normal")
    rnd = random.Random(7)
    peak = 0
    dropped = 0
    try:
        for i in range(1200):  # ~23 MiB written into an 8 MiB bound
            pieces: list[rq.Piece] = [(rnd.randrange(4), rnd.randbytes(rnd.randrange(100, 40_000)), 3, 0)
                                      for _ in range(rnd.randrange(1, 3))]
            dropped += q.put(pieces)
            if i % 7 == 0:  # a slow sender takes a few entries now and then
                q.ack([e.id for e in q.peek(rnd.randrange(4), 20)])
            peak = max(peak, q.files_size())
        assert dropped > 0
        assert peak <= max_disk  # margin 0: db + WAL + shm, what the volume sees (was 1.4-1.8x)
        assert peak > max_disk // 2  # and the bound is not met by using a tiny part of it
    finally:
        q.close()


# -- defect 18/23: damaged or incomplete files at open -------------------------------------------
def _crash_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: int = 300) -> Path:
    """A queue's files as a kill -9 would leave them (db + WAL + loss log, copied while it is open)."""
    live = tmp_path / "live" / "amp.queue.db"
    q = DurableQueue(live, 1 << 30, durability="normal")
    for i in range(entries):
        q.put([(i % 2, _entry(i), 2, 0)])
    image = tmp_path / "image" / "amp.queue.db"
    image.parent.mkdir()
    for suffix in ("", "-wal", ".mark"):
        src = Path(f"{live}{suffix}")
        if src.exists():
            shutil.copy(src, Path(f"{image}{suffix}"))
    q.close()
    return image


def _entry(i: int) -> bytes:
    """A real WriteRequest (salvage keeps only payloads that still parse as one)."""
    labels = (("__name__", "m"), ("i", str(i)), ("pad", "p" * 2000))
    return encode_write_request([(labels, [(1_700_000_000_000 + i, 1.0), (1_700_000_000_001 + i, 2.0)])])


def _index(payload: bytes) -> int:
    [(labels, _)] = decode_write_request(payload)
    return int(dict(labels)["i"])


def _garble(path: Path, offset: int, length: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(random.Random(offset).randbytes(length))


def _zero(path: Path, offset: int, length: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(bytes(length))


def _checkpointed_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    image = _crash_image(tmp_path, monkeypatch)
    db = sqlite3.connect(image)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return image


def _wal(p: Path) -> Path:
    return Path(f"{p}-wal")


CORRUPTIONS = {
    "db-truncated-to-half": lambda p: os.truncate(p, p.stat().st_size // 2),
    "db-truncated-inside-header": lambda p: os.truncate(p, 60),
    "db-header-garbage": lambda p: _garble(p, 0, 100),
    "db-header-zeroed": lambda p: _zero(p, 0, 100),
    "db-garbage-pages-in-the-middle": lambda p: _garble(p, p.stat().st_size // 2, 3 * 4096),
    "db-all-garbage": lambda p: p.write_bytes(random.Random(1).randbytes(p.stat().st_size)),
    "db-emptied": lambda p: p.write_bytes(b""),
    "db-deleted": lambda p: p.unlink(),
    "wal-garbage": lambda p: _wal(p).write_bytes(random.Random(2).randbytes(64 << 10)),
    "wal-deleted": lambda p: _wal(p).unlink(),
    "wal-truncated": lambda p: os.truncate(_wal(p), _wal(p).stat().st_size // 3),
    "db-second-page-garbage": lambda p: _garble(p, 4096, 4096),
}
CHECKPOINTED = {"db-truncated-to-half", "db-truncated-inside-header", "db-header-garbage", "db-header-zeroed",
                "db-garbage-pages-in-the-middle", "db-all-garbage", "db-second-page-garbage"}


@pytest.mark.parametrize("variant", sorted(CORRUPTIONS))
def test_a_damaged_or_incomplete_queue_file_never_stops_the_relay_from_starting(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    image = (_checkpointed_image if variant in CHECKPOINTED else _crash_image)(tmp_path, monkeypatch)
    CORRUPTIONS[variant](image)
    seen: list[OpenReport] = []
    with caplog.at_level(logging.INFO, logger="relay.queue"):
        q = DurableQueue(image, 1 << 30, on_damaged=seen.append)
    try:
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and not errors[0].exc_info  # ONE line saying what was lost
        msg = errors[0].getMessage()
        assert msg.startswith("queue amp: ") and ("lost" in msg or "missing" in msg) and "\n" not in msg
        assert getattr(errors[0], "destination", None) == "amp"
        assert len(seen) == 1 and (seen[0].damaged or seen[0].problems)  # the service counts it
        if seen[0].damaged:
            assert seen[0].moved_to is not None and seen[0].moved_to.exists()
            assert ".damaged-" in seen[0].moved_to.name
        kept = [_index(e.payload) for s in q.shards() for e in q.peek(s, 1 << 30, 1 << 30)]
        assert len(set(kept)) == len(kept) and q.depth()[0] == 2 * len(kept)
        if variant in ("db-garbage-pages-in-the-middle", "db-truncated-to-half", "db-header-garbage",
                       "db-header-zeroed"):
            # what SQLite could still read was salvaged (of 300): at least the third of the rows that
            # lie in the lower half of the file (5 table pages of 20 rows since rows carry a crc)
            assert len(kept) >= 100
        assert q.put([(0, b"new", 1, 0)]) == 0
        assert q.peek(0, 1 << 30, 1 << 30)[-1].payload == b"new"
    finally:
        q.close()
    again = DurableQueue(image, 1 << 30)  # and the next start is clean
    assert again.report.damaged is None and not again.report.problems
    again.close()


def test_at_start_the_queue_logs_what_it_recovered(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    q = DurableQueue(tmp_path / "amp.queue.db", 1 << 20, clock=lambda: now[0])
    q.put([(0, b"a", 2, 0), (1, b"b", 4, 0)])
    q.close()
    now[0] = 1090.0
    with caplog.at_level(logging.INFO, logger="relay.queue"):
        q = DurableQueue(tmp_path / "amp.queue.db", 1 << 20, clock=lambda: now[0])
    q.close()
    [line] = [r for r in caplog.records if r.name == "relay.queue"]
    assert line.levelno == logging.INFO
    assert line.getMessage() == "queue amp: recovered 2 entries, 6 samples, oldest 90s old"
    assert (q.report.entries, q.report.samples, q.report.oldest_age_s) == (2, 6, 90.0)


def test_a_queue_that_cannot_be_opened_raises_one_line_naming_the_destination(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(QueueOpenError) as e:
        DurableQueue(blocker / "amp.queue.db", 1 << 20, name=f"amp-{uuid.uuid4().hex[:4]}")
    msg = str(e.value)
    assert msg.startswith("destination 'amp-") and "storage.path" in msg and "\n" not in msg


def test_the_disk_reserve_exists_only_where_max_disk_has_room_for_it_and_counts_against_it(tmp_path: Path) -> None:
    small = DurableQueue(tmp_path / "small.queue.db", 2048)
    big = DurableQueue(tmp_path / "big.queue.db", 8 << 20)
    try:
        assert not (tmp_path / "small.queue.db.reserve").exists()
        reserve = tmp_path / "big.queue.db.reserve"
        assert reserve.stat().st_size == big.plan.reserve_bytes > 0
        assert big.files_size() >= reserve.stat().st_size  # part of what max_disk bounds
    finally:
        small.close()
        big.close()


def test_under_concurrent_overflow_sent_plus_dropped_plus_queued_equals_what_was_put(tmp_path: Path) -> None:
    # issue 8 defect 20: 391,261 counted for 383,349 lost; here every sample is accounted exactly once
    q = DurableQueue(tmp_path / "q.db", 4 << 20, durability="normal")
    put = dropped = sent = 0
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        nonlocal put, dropped
        rnd = random.Random(w)
        for _ in range(150):
            d = q.put([(rnd.randrange(3), rnd.randbytes(rnd.randrange(1000, 30_000)), 7, 0)])
            with lock:
                put += 7
                dropped += d

    def sender(shard: int) -> None:
        nonlocal sent
        while not stop.is_set():
            batch = q.peek(shard, 14)  # two entries
            time.sleep(0.01)  # "in flight": a slow destination
            q.ack([e.id for e in batch])
            with lock:
                sent += sum(e.samples for e in batch)

    senders = [threading.Thread(target=sender, args=(s,)) for s in range(3)]
    writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in senders + writers:
        t.start()
    for t in writers:
        t.join(60)
    stop.set()
    for t in senders:
        t.join(10)
    try:
        assert dropped > 0
        assert sent + dropped + q.depth()[0] == put
        assert q.files_size() <= 4 << 20
    finally:
        q.close()


def test_salvaged_payloads_that_no_longer_parse_as_the_write_request_we_wrote_are_discarded() -> None:
    from relay.delivery.queue.opening import intact

    good = _entry(1)
    assert intact(good)
    assert intact(b"")  # an empty WriteRequest (e.g. nothing left after rules) is harmless
    assert not intact(good[: len(good) // 2])  # cut inside a message
    assert not intact(good + b"\xf8\x07\x01")  # an unknown field: garbage that happens to parse
    assert not intact(random.Random(5).randbytes(3000))
