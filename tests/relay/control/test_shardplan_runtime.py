"""A running relay changes a destination's shard count as sending keeps up (relay.shardplan), between
queue.min_shards and queue.max_shards, and no series loses its order or a sample on the way."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import snappy

from relay.config.config import DestinationConfig, load_config, parse_config
from relay.control.destinations import start_shards
from relay.control.service import Runtime
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.transport import Response
from relay.ingest import wire
from tests.helpers import wait_until
from tests.relay.control.test_service import RW1_LOWER, S, now_ms


def config_text(tmp_path: Path, destinations: str) -> str:
    return f"storage: {{path: {tmp_path / 'queues'}}}\ndestinations:\n{destinations}"


class SlowTransport:
    """Every post takes ``delay_s`` (a destination far away); records (series name, timestamp) per
    post in the order the posts began, and the most posts seen in flight at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.points: list[tuple[str, int]] = []
        self.in_flight = 0
        self.most = 0

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        got = [(dict(lb)["i"], ts) for lb, ss in wire.decode_write_request(snappy.uncompress(body)) for ts, _ in ss]
        with self.lock:
            self.points.extend(got)
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        time.sleep(self.delay_s)
        with self.lock:
            self.in_flight -= 1
        return Response(204)


def shards(r: Runtime) -> float:
    v = r.registry.get_sample_value("gpu_relay_queue_shards", {"destination": "far"})
    return 0.0 if v is None else v


def test_a_lagging_destination_gets_more_shards_then_fewer_and_every_series_keeps_its_order(
    tmp_path: Path, runtimes: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relay.service")
    transport = SlowTransport(0.02)  # one shard: 50 samples / 20 ms = 2,500 samples a second at most
    path = tmp_path / "relay.yaml"
    path.write_text(config_text(tmp_path, "  - name: far\n    url: http://far/api/v1/write\n"
                                "    queue: {max_samples_per_send: 50, batch_send_deadline: 50ms, min_shards: 1, "
                                "max_shards: 4}\n"))
    r = Runtime(str(path), load_config(path), transport_factory=lambda d: transport, shard_update_s=0.3)
    runtimes.append(r)
    r.start()
    assert wait_until(lambda: shards(r) == 1, timeout=5)  # starts at its fewest
    t0 = now_ms()
    sent = 0
    rounds = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and (shards(r) < 3 or rounds < 150):
        # 100 series a request, every ~10 ms: about 10,000 samples a second, four shards' worth
        batch = [(S("m", i=f"{i:03d}"), [(t0 + rounds, float(rounds))]) for i in range(100)]
        assert r.write(RW1_LOWER, snappy.compress(wire.encode_write_request(batch))).status == 204
        sent += 100
        rounds += 1
        time.sleep(0.01)
    assert shards(r) >= 3, f"still {shards(r)} shards after {rounds} rounds"
    assert wait_until(lambda: len(transport.points) == sent, timeout=30)
    assert transport.most >= 3  # the shards did send side by side
    # idle now: back to min_shards
    assert wait_until(lambda: shards(r) == 1, timeout=5)
    time.sleep(0.2)
    with transport.lock:
        points = list(transport.points)
    assert len(points) == sent  # nothing lost, nothing sent twice
    for i in range(100):
        mine = [ts for name, ts in points if name == f"{i:03d}"]
        assert mine == sorted(mine) and len(mine) == rounds, f"series {i:03d} out of order: {mine[:20]}"
    changes = [rec.getMessage() for rec in caplog.records if "shards (" in rec.getMessage()]
    assert changes and changes[0].startswith("destination far: 1 -> ")
    assert " -> 1 shards (" in changes[-1]


def test_a_destination_whose_requests_are_retried_keeps_its_count(tmp_path: Path, runtimes: list[Runtime]) -> None:
    """Every other request answers 503: samples do go out, slowly, and a backlog waits, which alone
    would ask for more shards (5 ms a sample x 5% of 20,000 queued = 5); more connections do not help
    a destination that is failing, so the count stays."""
    calls = [0]

    class Flaky:
        def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
            time.sleep(0.05)
            calls[0] += 1
            return Response(503, {}, b"busy") if calls[0] % 2 else Response(204)

    path = tmp_path / "relay.yaml"
    path.write_text(config_text(tmp_path, "  - name: far\n    url: http://far/api/v1/write\n"
                                "    queue: {max_samples_per_send: 10, min_backoff: 1ms, max_backoff: 2ms, "
                                "max_shards: 8}\n"))
    r = Runtime(str(path), load_config(path), transport_factory=lambda d: Flaky(), shard_update_s=0.2)
    runtimes.append(r)
    r.start()
    t0 = now_ms()
    for k in range(400):
        batch = [(S("m", i=str(i)), [(t0 + k, 1.0)]) for i in range(50)]
        assert r.write(RW1_LOWER, snappy.compress(wire.encode_write_request(batch))).status == 204
    time.sleep(3.5)  # (the planner looks once a second: at least two plans)
    d = r.destinations["far"]
    assert d.sender is not None and d.sender.totals()[1] > 0  # some did go out
    assert shards(r) == 1  # neither more (failing) nor fewer


def test_a_reload_keeps_the_running_count_within_the_new_bounds(tmp_path: Path, runtimes: list[Runtime]) -> None:
    path = tmp_path / "relay.yaml"

    def write(lo: int, hi: int) -> None:
        path.write_text(config_text(tmp_path, "  - name: far\n    url: http://far/api/v1/write\n"
                                    f"    queue: {{min_shards: {lo}, max_shards: {hi}}}\n"))

    write(1, 8)
    r = Runtime(str(path), load_config(path), transport_factory=lambda d: SlowTransport(0))
    runtimes.append(r)
    d = r.destinations["far"]
    assert d.shards == 1 and r.pipeline.stages[0].shards == 1
    write(3, 8)  # the bounds moved above the running count: it comes up to the new fewest
    assert r.reload_config()[0]
    d = r.destinations["far"]
    assert d.shards == 3 and r.pipeline.stages[0].shards == 3
    assert d.queue is not None and d.queue.shard_count() == 3
    write(1, 2)  # below the new most: down to it
    assert r.reload_config()[0]
    assert r.destinations["far"].shards == 2 and r.pipeline.stages[0].shards == 2


def _dest(lo: int, hi: int) -> DestinationConfig:
    cfg = parse_config(f"storage: {{path: /tmp}}\ndestinations:\n  - name: far\n    url: http://far/w\n"
                       f"    queue: {{min_shards: {lo}, max_shards: {hi}}}\n")
    return cfg.destinations[0]


@pytest.mark.parametrize(("recorded", "queued", "running", "lo", "hi", "expected"), [
    (None, False, None, 1, 8, 1),  # a new queue: its fewest
    (4, True, None, 1, 8, 4),  # a restart with entries sharded under 4: 4, no drain needed
    (4, False, None, 1, 8, 1),  # ... and with nothing queued: its fewest
    (12, True, None, 1, 8, 8),  # recorded under more than max_shards allows now
    (None, True, None, 2, 8, 2),  # unknown (a crash during a change): the fewest, and a drain
    (4, True, 6, 1, 8, 6),  # a reload: the running count
    (4, True, 6, 1, 5, 5),  # ... within the new bounds
])
def test_start_shards(tmp_path: Path, recorded: int | None, queued: bool, running: int | None, lo: int, hi: int,
                      expected: int) -> None:
    q = DurableQueue(tmp_path / "far.queue.db", 64 << 20)
    try:
        if recorded is not None:
            q.set_shard_count(recorded)
        if queued:
            q.put([(0, b"x", 1, 1)])
        assert start_shards(q, _dest(lo, hi), running) == expected
    finally:
        q.close()


def test_min_shards_is_checked_against_max_shards() -> None:
    from relay.config.config import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_config("storage: {path: /tmp}\ndestinations:\n  - name: far\n    url: http://far/w\n"
                     "    queue: {min_shards: 9, max_shards: 4}\n")
    assert "destinations[0].queue.min_shards" in str(e.value) and "max_shards (4)" in str(e.value)
    assert ":5:" in str(e.value)  # its line
    assert _dest(2, 4).queue.min_shards == 2
    default = parse_config("storage: {path: /tmp}\ndestinations:\n  - name: far\n    url: http://far/w\n")
    assert default.destinations[0].queue.min_shards == 1
    # only min_shards, above the default max_shards (Prometheus's default most is 50): the most too
    only = parse_config("storage: {path: /tmp}\nremote_write:\n  - url: http://far/w\n"
                        "    queue_config: {min_shards: 10}\n")
    assert (only.destinations[0].queue.min_shards, only.destinations[0].queue.max_shards) == (10, 10)
