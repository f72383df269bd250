"""Issue 20 point 13: a 400 from a destination splits the batch by halves down to the series it
refuses, bounded in requests, so that only those are dropped: counted by reason, with one
rate-limited WARNING naming an example series; a 413 takes the same path."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from relay.delivery.split import SPLIT_EXTRA_REQUESTS, split_budget
from relay.delivery.transport import Response
from relay.proto import remote_v1_pb2
from tests.helpers import wait_until
from tests.relay.delivery.test_sender_faults import Rig, parse, rig


def request(names: list[str], ts: int) -> bytes:
    wr = remote_v1_pb2.WriteRequest()
    for name in names:
        s = wr.timeseries.add()
        lb = s.labels.add()
        lb.name, lb.value = "__name__", name
        sample = s.samples.add()
        sample.timestamp, sample.value = ts, 1.0
    return bytes(wr.SerializeToString())


class PoisonReceiver:
    """Like a receiver validating each series: 400 for any request holding a poison series (nothing
    of it written), else 204 (all of it written)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.written: list[str] = []
        self.requests = 0

    def __call__(self, body: bytes) -> Response:
        names = [ts.labels[0].value for ts in parse(body).timeseries]
        with self.lock:
            self.requests += 1
            if any(n.startswith("poison") for n in names):
                return Response(400, {}, b"invalid sample: out of bounds")
            self.written.extend(names)
        return Response(204)


@pytest.mark.parametrize(("series", "every"), [(2000, 300), (1000, 97), (600, 1000)])
def test_with_one_shard_every_good_sample_arrives_and_only_the_poison_ones_are_dropped_and_counted(
    tmp_path: Path, rigs: list[Rig], caplog: pytest.LogCaptureFixture, series: int, every: int
) -> None:
    rx = PoisonReceiver()
    r = rig(tmp_path, rigs, answer=rx, max_samples_per_send=500)
    names = [f"poison_{i}" if i % every == every - 1 else f"good_{i}" for i in range(series)]
    for start in range(0, series, 50):  # requests of 50 series, as a Prometheus shard sends them
        r.queue.put([(0, request(names[start:start + 50], 1000), 50, 1000)])
    with caplog.at_level(logging.WARNING, logger="relay.sender"):
        r.sender.start()
        assert wait_until(lambda: r.queue.depth() == (0, 0), timeout=30)
    good = [n for n in names if n.startswith("good")]
    poison = len(names) - len(good)
    assert sorted(rx.written) == sorted(good)  # every good sample, each once
    assert r.value("samples_failed_total", reason="http_400") == poison
    assert r.value("samples_sent_total") == len(good)
    drops = [m.getMessage() for m in caplog.records if "dropping" in m.getMessage()]
    if poison:
        assert len(drops) == 1 and "poison_" in drops[0]  # one line a minute, naming an example
        assert r.sender.drops_last_hour() == {"http_400": poison}
    else:
        assert drops == [] and rx.requests == -(-series // 500)  # no split: one request a batch


def test_a_batch_of_nothing_but_refused_series_is_bounded_in_requests(tmp_path: Path, rigs: list[Rig]) -> None:
    """Isolating every one of 256 refused series would take 511 requests: the budget stops it at
    1 + 2*log2(256) + SPLIT_EXTRA_REQUESTS, and what is left unsplit is dropped (counted) whole."""
    rx = PoisonReceiver()
    r = rig(tmp_path, rigs, answer=rx, max_samples_per_send=256)
    r.queue.put([(0, request([f"poison_{i}" for i in range(256)], 1000), 256, 1000)])
    r.sender.start()
    assert wait_until(lambda: r.queue.depth() == (0, 0), timeout=30)
    assert rx.requests <= 1 + split_budget(256) == 1 + 16 + SPLIT_EXTRA_REQUESTS
    assert r.value("samples_failed_total", reason="http_400") == 256 and rx.written == []


@pytest.mark.parametrize(("series", "budget"), [(1, SPLIT_EXTRA_REQUESTS), (2, 2 + SPLIT_EXTRA_REQUESTS),
                                                (1000, 20 + SPLIT_EXTRA_REQUESTS),
                                                (1024, 20 + SPLIT_EXTRA_REQUESTS)])
def test_the_split_budget_is_twice_the_halvings_to_one_series_plus_a_fixed_extra(series: int, budget: int) -> None:
    assert split_budget(series) == budget


def test_a_413_halves_until_the_parts_fit_and_drops_nothing(tmp_path: Path, rigs: list[Rig]) -> None:
    written: list[str] = []

    def answer(body: bytes) -> Response:
        names = [ts.labels[0].value for ts in parse(body).timeseries]
        if len(names) > 3:
            return Response(413, {}, b"request too large")
        written.extend(names)
        return Response(204)

    r = rig(tmp_path, rigs, answer=answer)
    names = [f"m{i}" for i in range(40)]
    r.queue.put([(0, request(names, 1000), 40, 1000)])
    r.sender.start()
    assert wait_until(lambda: r.queue.depth() == (0, 0))
    assert sorted(written) == sorted(names)
    assert r.value("samples_failed_total", reason="http_413") == 0 and r.sender.state() == "sending"
