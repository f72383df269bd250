"""Issue 9: the sender does no per-series work a batch does not need (halves only after a 413,
entries it already holds are not read again while it waits for a fuller batch)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay import rwsplit
from relay.transport import Response
from tests.helpers import wait_until
from tests.test_sender_faults import Rig, parse, rig, series


def counted_halves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """rwsplit.halves, recording the size of every payload it is asked to split."""
    calls: list[int] = []
    real = rwsplit.halves

    def halves(payload: bytes) -> tuple[rwsplit.Unit, rwsplit.Unit] | None:
        calls.append(len(payload))
        return real(payload)

    monkeypatch.setattr(rwsplit, "halves", halves)
    return calls


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for r in made:
        r.sender.stop(timeout=2)
        r.queue.close()


def test_an_accepted_batch_is_never_walked_series_by_series_for_halves(
    tmp_path: Path, rigs: list[Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counted_halves(monkeypatch)
    r = rig(tmp_path, rigs)
    r.queue.put([(0, b"".join(series(f"s{i}", [(1, float(i))]) for i in range(50)), 50, 1)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert len(parse(r.transport.bodies[0]).timeseries) == 50
    assert calls == []  # was: every batch, before it was sent


def test_halves_are_computed_once_a_413_came_and_the_halves_are_delivered(
    tmp_path: Path, rigs: list[Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counted_halves(monkeypatch)
    answers = [Response(413, {}, b"too big")]
    r = rig(tmp_path, rigs, answer=lambda _: answers.pop() if answers else Response(204))
    r.queue.put([(0, b"".join(series(f"s{i}", [(1, float(i))]) for i in range(4)), 4, 1)])
    r.sender.start()
    assert wait_until(lambda: r.queue.shards() == [], timeout=5)
    assert len(calls) == 1 and [len(parse(b).timeseries) for b in r.transport.bodies] == [4, 2, 2]
    assert r.value("samples_sent_total") == 4 and r.value("samples_failed_total", reason="http_413") == 0
