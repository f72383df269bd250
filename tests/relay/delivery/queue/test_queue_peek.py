"""DurableQueue.peek(after=...): a consumer waiting for a fuller batch adds only newer entries, and
everything it holds stays protected from queue_full trimming (issue 9: each entry read once)."""

from __future__ import annotations

from pathlib import Path

from relay.delivery.queue.durable import ENTRY_OVERHEAD_BYTES, DurableQueue


def test_peek_after_returns_only_newer_entries_of_the_shard_that_fit(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 20)
    q.put([(0, b"a", 3, 0), (1, b"x", 1, 0)])
    [a] = q.peek(0, 10)
    q.put([(0, b"b", 3, 0), (0, b"c", 3, 0), (0, b"d", 3, 0), (1, b"y", 1, 0)])
    assert [e.payload for e in q.peek(0, 6, after=a.id)] == [b"b", b"c"]  # 3 + 3 fit in 6, d does not
    assert q.peek(0, 2, after=a.id) == []  # unlike a first peek: nothing when the next one does not fit
    assert [e.payload for e in q.peek(0, 100, 1, after=a.id)] == [b"b"]  # max_entries more
    assert q.peek(0, 100, 0, after=a.id) == []
    q.close()


def test_entries_held_by_a_first_and_a_later_peek_are_all_protected_from_queue_full(tmp_path: Path) -> None:
    entry = 100 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 4 * entry)
    q.put([(0, b"h" * 100, 5, 0)])
    first = q.peek(0, 100)
    q.put([(0, b"i" * 100, 6, 0), (1, b"o" * 100, 7, 0)])
    more = q.peek(0, 100, after=first[-1].id)
    assert [e.payload[:1] for e in more] == [b"i"]
    # two more entries need room: only the unheld one (o) may go, though h and i are older
    assert q.put([(1, b"n" * 100, 1, 0), (1, b"m" * 100, 1, 0)]) == 7
    q.ack([e.id for e in first + more])
    assert q.depth() == (2, 200)
    q.close()


def test_a_fresh_peek_replaces_what_the_consumer_held(tmp_path: Path) -> None:
    entry = 100 + ENTRY_OVERHEAD_BYTES
    q = DurableQueue(tmp_path / "q.db", 3 * entry)
    q.put([(0, b"h" * 100, 5, 0), (0, b"i" * 100, 6, 0)])
    q.peek(0, 100)  # holds h and i
    assert [e.payload[:1] for e in q.peek(0, 5)] == [b"h"]  # now holds h only
    assert q.put([(1, b"n" * 100, 1, 0), (1, b"m" * 100, 1, 0)]) == 6  # i is no longer protected
    q.close()
