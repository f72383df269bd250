"""Issue 9: the sender builds the outgoing snappy body from the rows as stored (queue_codec.concat),
without decompressing and compressing again; it decodes only to look inside a batch (a 413 that
needs halves, a row over max_samples_per_send)."""

from __future__ import annotations

from pathlib import Path

import pytest
import snappy

from relay.delivery.queue import codec as queue_codec
from relay.delivery.transport import Response
from tests.helpers import wait_until
from tests.relay.delivery.queue.test_queue_codec import write_request
from tests.relay.delivery.test_sender_faults import Rig, parse, rig, series


def count_snappy(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """snappy.compress and snappy.uncompress, recording the size of every call (module-wide)."""
    calls: dict[str, list[int]] = {"compress": [], "uncompress": []}
    for name in calls:
        real = getattr(snappy, name)

        def spy(data: bytes, *a: object, _real: object = real, _name: str = name) -> bytes:
            calls[_name].append(len(data))
            return _real(data, *a)  # type: ignore[operator, no-any-return]

        monkeypatch.setattr(snappy, name, spy)
    return calls


def test_a_batch_of_compressed_rows_goes_out_as_their_stored_bytes_without_any_snappy_call(
    tmp_path: Path, rigs: list[Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = rig(tmp_path, rigs)
    payloads = [write_request(i) for i in range(5)]
    r.queue.put([(0, p, 1, 1) for p in payloads])
    stored = [queue_codec.pack(p) for p in payloads]
    assert all(n is not None for _, n in stored)
    calls = count_snappy(monkeypatch)
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert calls == {"compress": [], "uncompress": []}  # was: 5 uncompress at peek, 1 compress to send
    [body] = r.transport.bodies
    assert body == queue_codec.concat(stored)
    monkeypatch.undo()
    assert snappy.uncompress(body) == b"".join(payloads)
    assert r.value("samples_sent_total") == 5


def test_compressed_and_raw_rows_of_one_batch_arrive_in_order(tmp_path: Path, rigs: list[Rig]) -> None:
    r = rig(tmp_path, rigs)
    big = [write_request(i) for i in range(3)]
    small = [series(f"s{i}", [(1, float(i))]) for i in range(3)]
    assert all(len(s) < queue_codec.MIN_PACK_BYTES for s in small)
    order = [big[0], small[0], small[1], big[1], small[2], big[2]]
    r.queue.put([(0, p, 1, 1) for p in order])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    [body] = r.transport.bodies
    assert snappy.uncompress(body) == b"".join(order)
    assert len(parse(body).timeseries) == 6 and r.value("samples_sent_total") == 6


def test_a_413_decodes_the_batch_once_and_delivers_both_halves(
    tmp_path: Path, rigs: list[Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = [Response(413, {}, b"too big")]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop() if answers else Response(204))
    payloads = [write_request(i) for i in range(4)]
    r.queue.put([(0, p, 1, 1) for p in payloads])
    calls = count_snappy(monkeypatch)
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    monkeypatch.undo()
    first, *halves = r.transport.bodies
    assert snappy.uncompress(first) == b"".join(payloads)
    assert [snappy.uncompress(b) for b in halves] == [payloads[0] + payloads[1], payloads[2] + payloads[3]]
    assert calls["uncompress"] == [len(first)]  # the body once, for the halves; nothing for the first POST
    assert len(calls["compress"]) == 2  # the two halves
    assert r.value("samples_sent_total") == 4 and r.value("samples_failed_total", reason="http_413") == 0


def test_a_row_over_max_samples_per_send_is_still_split_by_series(tmp_path: Path, rigs: list[Rig]) -> None:
    r = rig(tmp_path, rigs, max_samples_per_send=2)
    payload = b"".join(write_request(i) for i in range(5))  # one compressed row of 5 series
    assert queue_codec.pack(payload)[1] is not None
    r.queue.put([(0, payload, 5, 1)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert [len(parse(b).timeseries) for b in r.transport.bodies] == [2, 2, 1]
    assert b"".join(snappy.uncompress(b) for b in r.transport.bodies) == payload
    assert r.value("samples_sent_total") == 5


def test_a_retried_batch_is_resent_as_the_same_bytes(tmp_path: Path, rigs: list[Rig]) -> None:
    answers = [Response(503, {}, b"busy"), Response(503, {}, b"busy")]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop() if answers else Response(204))
    r.queue.put([(0, write_request(i), 1, 1) for i in range(3)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert len(r.transport.bodies) == 3 and len(set(r.transport.bodies)) == 1
    assert r.value("samples_sent_total") == 3 and r.value("samples_retried_total", reason="http_503") == 6
