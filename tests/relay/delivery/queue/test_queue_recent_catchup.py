"""A shard read from the file (rows on file at open, or once it outgrew memory_bytes) is answered
from memory again once the rows memory lacks are gone, even while newer rows keep coming: memory keeps
a shard's newest rows meanwhile (relay.queue_recent counts the older ones on file). A sender under steady
load acks a batch while the next rows are already queued, so the shard never reaches zero rows."""

from __future__ import annotations

from pathlib import Path

from relay.delivery.queue.durable import DurableQueue
from relay.delivery.queue.recent import ROW_OVERHEAD_BYTES


def steady(q: DurableQueue, rounds: int) -> None:
    """A consumer that keeps up: each batch it acks was peeked before the next put came in."""
    for i in range(rounds):
        got = q.peek(0, 1000)
        q.put([(0, b"r%d" % i, 1, 0)])  # arrives while the batch is being sent
        q.ack([e.id for e in got])


def test_a_shard_with_rows_on_file_at_open_is_served_from_memory_again_under_steady_load(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    q.put([(0, b"backlog", 1, 0)])
    q.close()
    q = DurableQueue(tmp_path / "q.db", 1 << 30)
    steady(q, 50)
    assert q.backlog(0)[0] == 1  # the consumer keeps up: one row in flight
    assert q._recent.cached(0), "shard 0 is still read from the file after 50 batches that kept up"
    q.close()


def test_a_shard_that_outgrew_memory_is_served_from_memory_again_once_the_consumer_caught_up(
        tmp_path: Path) -> None:
    q = DurableQueue(tmp_path / "q.db", 1 << 30, memory_bytes=4 * (ROW_OVERHEAD_BYTES + 10))
    q.put([(0, b"%010d" % i, 1, 0) for i in range(8)])  # an outage: more than memory holds
    assert not q._recent.cached(0)
    steady(q, 50)
    assert q.backlog(0)[0] == 1
    assert q._recent.cached(0), "shard 0 is still read from the file after it caught up"
    q.close()


def test_a_shard_whose_consumer_is_down_never_pushes_a_shard_that_keeps_up_out_of_memory(tmp_path: Path) -> None:
    row = ROW_OVERHEAD_BYTES + 10
    q = DurableQueue(tmp_path / "q.db", 1 << 30, memory_bytes=6 * row)
    try:
        for i in range(200):  # shard 0's destination is down: never acked; shard 1 keeps up
            got = q.peek(1, 1000)
            q.put([(0, b"%010d" % i, 1, 0), (1, b"%010d" % i, 1, 0)])
            q.ack([e.id for e in got])
            assert q._recent.cached(1), f"shard 1 read from the file after put {i}"
            assert q._recent.nbytes <= 6 * row
        assert not q._recent.cached(0) and q.backlog(0) == (200, 200)
        assert [e.payload for e in q.peek(0, 1000)][:2] == [b"0000000000", b"0000000001"]  # from the file
    finally:
        q.close()
