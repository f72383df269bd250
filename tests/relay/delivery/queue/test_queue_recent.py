"""Rows handed out from memory (relay.queue_recent): what a peek returns is the same as when every
row is read back from the file, and a shard is answered from memory only while memory holds all
of its rows (issue 9: the queue read back every row it had just written)."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.delivery.queue.durable import ENTRY_OVERHEAD_BYTES, DurableQueue, Entry, StorageError
from relay.delivery.queue.recent import ROW_OVERHEAD_BYTES, RecentRows


class Reads(sqlite3.Connection):
    """A real connection that records the statements reading entries back."""

    reads: list[str] = []

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if sql.startswith("SELECT payload"):
            Reads.reads.append(sql)
        return super().execute(sql, *args)


class FailingCommit(sqlite3.Connection):
    fail = False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if FailingCommit.fail and sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        return super().execute(sql, *args)


def key(e: Entry) -> tuple[object, ...]:
    return (e.id, e.shard, e.stored, e.raw_len, e.samples, e.enqueued_at, e.oldest_ts_ms)


@pytest.fixture(autouse=True)
def _reset() -> None:
    Reads.reads = []
    FailingCommit.fail = False


def test_a_peek_of_rows_this_queue_committed_reads_nothing_back_from_the_file(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Reads)
    q.put([(0, b"a" * 3000, 5, 7), (1, b"b", 1, 0)])
    got = q.peek(0, 100)
    assert Reads.reads == []
    assert [e.payload for e in got] == [b"a" * 3000] and got[0].raw_len == 3000  # as stored: compressed
    q.ack([e.id for e in got])
    assert q.peek(0, 100) == [] and Reads.reads == []
    q.close()
    reopened = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Reads)
    assert [e.payload for e in reopened.peek(1, 100)] == [b"b"]  # on file at open: read from it
    assert len(Reads.reads) == 1
    reopened.close()


def test_a_shard_read_from_the_file_at_open_is_answered_from_memory_once_it_drained(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    q.put([(0, b"old", 1, 0)])
    q.close()
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Reads)
    q.put([(0, b"new", 1, 0)])
    first = q.peek(0, 1)
    assert [e.payload for e in first] == [b"old"] and len(Reads.reads) == 1
    assert [e.payload for e in q.peek(0, 10, after=first[-1].id)] == [b"new"] and len(Reads.reads) == 2
    q.ack([e.id for e in q.peek(0, 10)])
    q.put([(0, b"next", 1, 0)])  # the file had no row of shard 0 left: memory holds them all again
    reads = len(Reads.reads)
    assert [e.payload for e in q.peek(0, 10)] == [b"next"] and len(Reads.reads) == reads
    q.close()


def test_a_shard_whose_rows_do_not_fit_in_memory_is_read_from_the_file_until_it_drains(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=Reads, memory_bytes=2 * ROW_OVERHEAD_BYTES + 90)
    q.put([(0, b"x" * 40, 1, 0), (1, b"y" * 40, 1, 0)])
    q.put([(0, b"z" * 40, 1, 0)])  # does not fit: shard 0 is read from the file; shard 1 stays in memory
    assert [e.payload for e in q.peek(0, 10)] == [b"x" * 40, b"z" * 40] and len(Reads.reads) == 1
    assert [e.payload for e in q.peek(1, 10)] == [b"y" * 40] and len(Reads.reads) == 1
    q.ack([e.id for e in q.peek(0, 10)])
    q.put([(0, b"w" * 40, 1, 0)])
    reads = len(Reads.reads)
    assert [e.payload for e in q.peek(0, 10)] == [b"w" * 40] and len(Reads.reads) == reads
    assert q._recent.nbytes <= q._recent.max_bytes
    q.close()


def test_a_put_whose_commit_failed_leaves_nothing_in_memory(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, connection_factory=FailingCommit)
    q.put([(0, b"kept", 1, 0)])
    FailingCommit.fail = True
    with pytest.raises(StorageError):
        q.put([(0, b"lost", 1, 0)])
    FailingCommit.fail = False
    assert [e.payload for e in q.peek(0, 10)] == [b"kept"]
    q.put([(0, b"again", 1, 0)])
    assert [e.payload for e in q.peek(0, 10)] == [b"kept", b"again"]
    q.close()


def test_rows_trimmed_for_queue_full_are_not_handed_out_from_memory(tmp_path: Path) -> None:
    entry = 100 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 2 * entry, connection_factory=Reads)
    q.put([(0, b"a" * 100, 3, 0), (0, b"b" * 100, 4, 0)])
    assert q.put([(0, b"c" * 100, 5, 0)]) == 3  # a is the oldest: deleted, counted lost
    assert [e.payload[:1] for e in q.peek(0, 100)] == [b"b", b"c"] and Reads.reads == []
    q.close()


def test_recent_rows_keeps_its_byte_count_and_forgets_unknown_ids() -> None:
    r = RecentRows(3 * ROW_OVERHEAD_BYTES + 10)
    r.add([Entry(1, 0, b"abc", 1, 0.0), Entry(2, 1, b"de", 1, 0.0)])
    assert r.nbytes == 2 * ROW_OVERHEAD_BYTES + 5
    r.remove([2, 99])
    assert r.nbytes == ROW_OVERHEAD_BYTES + 3 and r.rows(1) is not None and list(r.rows(1) or ()) == []
    r.add([Entry(3, 0, b"f" * 500, 1, 0.0)])  # does not fit: shard 0 is dropped, all of it
    assert r.rows(0) is None and r.nbytes == 0
    r.drained(0)
    assert list(r.rows(0) or ()) == []
    assert RecentRows(0).rows(0) is None  # disabled: every shard is read from the file


# -- differential: memory on vs every row read back from the file ---------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(st.integers(0, 2), st.integers(0, 900), st.integers(0, 9)),
                                       min_size=1, max_size=4)),
    st.tuples(st.just("peek"), st.integers(0, 2), st.integers(0, 30), st.integers(1, 5)),
    st.tuples(st.just("more"), st.integers(0, 2), st.integers(0, 30), st.integers(0, 5)),
    st.tuples(st.just("ack"), st.integers(0, 2), st.integers(0, 5)),
    st.tuples(st.just("reopen"),),
), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, max_disk=st.sampled_from([3000, 8000, 1 << 20]),
       memory=st.sampled_from([ROW_OVERHEAD_BYTES * 3, 4000, 1 << 20]))
def test_peeks_from_memory_equal_peeks_from_the_file(ops: list[tuple[Any, ...]], max_disk: int,
                                                      memory: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        def open_both() -> tuple[DurableQueue, DurableQueue]:
            return (DurableQueue(Path(d) / "m.db", max_disk, clock=lambda: 5.5, durability="normal",
                                 memory_bytes=memory),
                    DurableQueue(Path(d) / "f.db", max_disk, clock=lambda: 5.5, durability="normal",
                                 memory_bytes=0))
        qs = open_both()
        held: dict[int, list[Entry]] = {}
        n = 0
        for op in ops:
            if op[0] == "put":
                n += 1
                pieces = [(shard, bytes([65 + n % 26]) * size, samples, n) for shard, size, samples in op[1]]
                out = []
                for q in qs:
                    try:
                        out.append(q.put(pieces))
                    except StorageError as e:  # pragma: no cover - not expected on a healthy disk
                        out.append(repr(e))
                    except ValueError as e:  # too large for max_disk: both refuse
                        out.append(type(e).__name__)
                assert out[0] == out[1]
            elif op[0] in ("peek", "more"):
                _, shard, max_samples, max_entries = op
                after = held[shard][-1].id if op[0] == "more" and held.get(shard) else 0
                got = [q.peek(shard, max_samples, max_entries, after=after) for q in qs]
                assert [key(e) for e in got[0]] == [key(e) for e in got[1]]
                held[shard] = (held.get(shard, []) + got[0]) if after else got[0]
            elif op[0] == "ack":
                _, shard, k = op
                ids = [e.id for e in held.get(shard, [])[:k]]
                held[shard] = held.get(shard, [])[k:]
                for q in qs:
                    q.ack(ids)
            else:
                for q in qs:
                    q.close()
                qs, held = open_both(), {}
            assert qs[0].depth() == qs[1].depth()
            assert [qs[0].backlog(s) for s in range(3)] == [qs[1].backlog(s) for s in range(3)]
            assert qs[0]._recent.nbytes <= memory
        for s in range(3):  # and what is left reads the same
            assert [key(e) for e in qs[0].peek(s, 1 << 30)] == [key(e) for e in qs[1].peek(s, 1 << 30)]
        for q in qs:
            q.close()
