"""Reload (issue 8 defect 1, issue 10): a failed reload keeps the old generation fully running; a
successful one stops replaced senders before their successors send; scrape and limits.window
changes apply; the config file is watched; gpu_relay_config_last_reload_successful."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import snappy

from relay.config.config import DestinationConfig, load_config
from relay.control.configwatch import ConfigWatcher, file_signature
from relay.control.service import Runtime
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.transport import Response
from relay.ingest import wire
from relay.ingest.scrape import Scraper, ScrapeTarget
from tests.helpers import wait_until
from tests.relay.control.test_service import QUEUE, RW1_LOWER, S, Series, config_text, now_ms, receiver
from tests.rw_receiver import RecordingServer

SUCCESS = ("gpu_relay_config_reloads_total", {"result": "success"})
FAILURE = ("gpu_relay_config_reloads_total", {"result": "failure"})


def dest(name: str, url: str, extra: str = "") -> str:
    return f"  - name: {name}\n    url: {url}\n    queue: {QUEUE}\n{extra}"


@pytest.fixture
def rx() -> Iterator[RecordingServer]:
    with receiver() as srv:
        yield srv


@pytest.fixture
def aws_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An AWS environment with no profiles and no credentials (and no instance metadata lookups)."""
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(var, raising=False)


class Running:
    def __init__(self, path: Path, **kwargs: object) -> None:
        self.path = path
        self.runtime = Runtime(str(path), load_config(path), **kwargs)  # type: ignore[arg-type]
        self.runtime.start()

    def post(self, series: list[Series]) -> int:
        return self.runtime.write(RW1_LOWER, snappy.compress(wire.encode_write_request(series))).status

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        v = self.runtime.registry.get_sample_value(name, dict(labels or {}))
        return 0.0 if v is None else v

    def reload_successful(self) -> float:
        return self.metric("gpu_relay_config_last_reload_successful")


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        r.runtime.stop()


def start(running: list[Running], tmp_path: Path, destinations: str, head: str = "", **kwargs: object) -> Running:
    path = tmp_path / "relay.yaml"
    path.write_text(config_text(tmp_path, destinations, head))
    r = Running(path, **kwargs)
    running.append(r)
    return r


def test_reload_naming_a_missing_sigv4_profile_keeps_the_old_config_sending(
        running: list[Running], tmp_path: Path, rx: RecordingServer, aws_empty: None) -> None:
    r = start(running, tmp_path, dest("rx", rx.url))
    t = now_ms()
    assert r.post([(S("m", step="1"), [(t, 1.0)])]) == 204
    assert wait_until(lambda: len(rx.snapshot()) == 1)
    assert r.reload_successful() == 1.0
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url, "    sigv4: {region: us-east-1, profile: nope}\n")))
    ok, message = r.runtime.reload_config()
    assert not ok
    assert message.startswith("reload refused, keeping the running configuration")
    assert "nope" in message
    assert r.metric(*FAILURE) == 1 and r.metric(*SUCCESS) == 0
    assert r.reload_successful() == 0.0
    # the old generation is fully running: ready, accepting, delivering (today: 503 until restarted)
    assert r.runtime.ready().status == 200
    assert r.post([(S("m", step="2"), [(t + 1, 2.0)])]) == 204
    assert wait_until(lambda: len(rx.snapshot()) == 2), rx.snapshot()
    # and a good file afterwards reloads and flips the gauge back
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url)))
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    assert r.reload_successful() == 1.0


def test_reload_adding_a_destination_whose_queue_cannot_open_keeps_the_old_config(
        running: list[Running], tmp_path: Path, rx: RecordingServer) -> None:
    r = start(running, tmp_path, dest("rx", rx.url))
    (tmp_path / "queues" / "second.queue.db").mkdir(parents=True)  # a directory where the file goes
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url) + dest("second", rx.url)))
    ok, message = r.runtime.reload_config()
    assert not ok
    assert "destination second: cannot set up its queue" in message
    assert "storage.path" in message  # what to do
    assert list(r.runtime.destinations) == ["rx"]
    assert 'destination="second"' not in r.runtime.metrics("").body.decode()  # nothing left behind
    t = now_ms()
    assert r.post([(S("m"), [(t, 1.0)])]) == 204
    assert wait_until(lambda: len(rx.snapshot()) == 1)


def test_reload_with_a_pipeline_that_cannot_build_closes_the_queues_it_opened(
        running: list[Running], tmp_path: Path, rx: RecordingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    r = start(running, tmp_path, dest("rx", rx.url))
    import relay.control.service

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("pipeline exploded")

    monkeypatch.setattr(relay.control.service, "Pipeline", broken)
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url) + dest("second", rx.url)))
    ok, message = r.runtime.reload_config()
    assert not ok and "pipeline exploded" in message
    monkeypatch.undo()
    # the second queue file was closed again: a later reload can open it
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    assert set(r.runtime.destinations) == {"rx", "second"}


class ScriptedTransport:
    """Records every post; answers ``status`` (a 503 keeps the sender retrying the same batch)."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        with self.lock:
            self.bodies.append(body)
        return Response(self.status, {}, b"")

    def samples(self) -> list[tuple[object, int, float]]:
        with self.lock:
            bodies = list(self.bodies)
        return [(lb, ts, v) for b in bodies for lb, ss in wire.decode_write_request(snappy.uncompress(b))
                for ts, v in ss]


def test_reload_changing_the_url_stops_the_old_sender_before_the_new_one_sends(
        running: list[Running], tmp_path: Path) -> None:
    transports = {"http://old/api/v1/write": ScriptedTransport(503), "http://new/api/v1/write": ScriptedTransport(204)}

    def factory(d: DestinationConfig) -> ScriptedTransport:
        return transports[d.url]

    r = start(running, tmp_path, dest("d", "http://old/api/v1/write"), transport_factory=factory)
    t = now_ms()
    assert r.post([(S("m", i=str(i)), [(t, float(i))]) for i in range(5)]) == 204
    old, new = transports["http://old/api/v1/write"], transports["http://new/api/v1/write"]
    assert wait_until(lambda: len(old.bodies) >= 2)  # retrying
    r.path.write_text(config_text(tmp_path, dest("d", "http://new/api/v1/write")))
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    tried_old = len(old.bodies)
    assert wait_until(lambda: len(new.samples()) >= 5)
    time.sleep(0.3)
    assert len(old.bodies) == tried_old  # the old sender is stopped for good
    assert sorted(new.samples()) == sorted((S("m", i=str(i)), t, float(i)) for i in range(5))  # once each


def test_reload_applies_a_limits_window_change(running: list[Running], tmp_path: Path, rx: RecordingServer) -> None:
    r = start(running, tmp_path, dest("rx", rx.url))
    assert r.runtime.overview("rx")["window_seconds"] == 3600
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url, "    limits: {window: 10m}\n")))
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    assert r.runtime.overview("rx")["window_seconds"] == 600


def test_reload_applies_scrape_changes(running: list[Running], tmp_path: Path, rx: RecordingServer) -> None:
    fetched: list[str] = []
    lock = threading.Lock()

    def fetch(url: str, timeout: float) -> str:
        with lock:
            fetched.append(url)
        return "some_metric 1\n"

    def scrapers(targets: list[ScrapeTarget], sink: object) -> Scraper:
        return Scraper(targets, sink, fetch=fetch)  # type: ignore[arg-type]

    def scrape(target: str) -> str:
        return (f"scrape:\n  - job_name: j\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
                f"    static_configs: [{{targets: ['{target}']}}]\n")

    r = start(running, tmp_path, dest("rx", rx.url), scrape("a.invalid:9400"), scraper_factory=scrapers)
    assert wait_until(lambda: "http://a.invalid:9400/metrics" in fetched)
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url), scrape("b.invalid:9400")))
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    with lock:
        fetched.clear()
    assert wait_until(lambda: "http://b.invalid:9400/metrics" in fetched)
    time.sleep(1.2)
    with lock:
        assert "http://a.invalid:9400/metrics" not in fetched
    got = {dict(lb).get("__name__") for lb, _, _ in rx.snapshot()}
    assert wait_until(lambda: "some_metric" in {dict(lb).get("__name__") for lb, _, _ in rx.snapshot()}), got


# ---- the config file watch (issue 10) -------------------------------------------------------------


def test_config_watcher_reloads_once_per_change_and_a_bad_file_is_refused_once(
        running: list[Running], tmp_path: Path, rx: RecordingServer, caplog: pytest.LogCaptureFixture) -> None:
    r = start(running, tmp_path, dest("rx", rx.url))
    watcher = ConfigWatcher(str(r.path), r.runtime.reload_config, interval_s=0.01)
    assert watcher.poll() is None  # nothing changed yet
    relabel = "    write_relabel_configs: [{target_label: gen, replacement: '2'}]\n"
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url, relabel)))
    assert watcher.poll() is True
    assert r.metric(*SUCCESS) == 1
    caplog.set_level(logging.ERROR)
    r.path.write_text(config_text(tmp_path, dest("rx", rx.url, relabel)).replace("50ms", "5q"))
    assert watcher.poll() is False
    for _ in range(5):
        assert watcher.poll() is None  # refused once, not at every poll
    assert r.metric(*FAILURE) == 1
    refused = [rec for rec in caplog.records if "reload refused" in rec.getMessage()]
    assert len(refused) == 1 and "invalid duration" in refused[0].getMessage()
    t = now_ms()
    assert r.post([(S("m"), [(t, 1.0)])]) == 204  # the good generation still runs
    assert wait_until(lambda: (S("m", gen="2"), t, 1.0) in rx.snapshot())


def test_config_watcher_thread_picks_up_an_atomic_symlink_swap(tmp_path: Path) -> None:
    # how the kubelet updates a mounted ConfigMap: a new directory, then the ..data link is swapped
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "relay.yaml").write_text("a: 1\n")
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "relay.yaml").symlink_to("..data/relay.yaml")
    calls: list[int] = []
    watcher = ConfigWatcher(str(tmp_path / "relay.yaml"), lambda: (calls.append(1) is None, "ok"), interval_s=0.02)
    watcher.start()
    try:
        (tmp_path / "v2").mkdir()
        (tmp_path / "v2" / "relay.yaml").write_text("a: 2\n")  # same size, different inode
        (tmp_path / "..data_tmp").symlink_to("v2")
        (tmp_path / "..data_tmp").rename(tmp_path / "..data")
        assert wait_until(lambda: len(calls) == 1, timeout=5)
        time.sleep(0.1)
        assert len(calls) == 1
    finally:
        watcher.stop()


def test_config_watcher_logs_a_missing_file_once_and_reloads_when_it_returns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text("x\n")
    calls: list[int] = []
    watcher = ConfigWatcher(str(path), lambda: (calls.append(1) is None, "ok"))
    path.unlink()
    caplog.set_level(logging.WARNING)
    assert [watcher.poll() for _ in range(3)] == [None, None, None]
    assert sum("cannot be read" in rec.getMessage() for rec in caplog.records) == 1
    path.write_text("yy\n")
    assert watcher.poll() is True and calls == [1]
    assert file_signature(str(tmp_path / "absent")) is None
    with pytest.raises(ValueError, match="interval_s must be positive"):
        ConfigWatcher(str(path), lambda: (True, ""), interval_s=0)


def test_reload_changing_max_disk_resizes_the_kept_queue(running: list[Running], tmp_path: Path,
                                                         rx: RecordingServer) -> None:
    r = start(running, tmp_path, dest("rx", rx.url))
    queue = r.runtime.destinations["rx"].queue
    assert queue is not None
    bigger = dest("rx", rx.url).replace("max_shards: 2", "max_shards: 2, max_disk: 1MiB")
    r.path.write_text(config_text(tmp_path, bigger))
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    assert r.runtime.destinations["rx"].queue is queue  # one queue object per file, kept
    assert queue.max_disk_bytes == 1 << 20


@pytest.mark.skipif(not hasattr(DurableQueue, "last_id"),
                    reason="needs relay.queue's shard barrier (DurableQueue.last_id, Sender.drain_first)")
def test_reload_changing_max_shards_keeps_per_series_order(running: list[Running], tmp_path: Path) -> None:
    down = ScriptedTransport(503)
    up = ScriptedTransport(204)

    def factory(d: DestinationConfig) -> ScriptedTransport:
        return down if "max-4" in d.url else up

    r = start(running, tmp_path, dest("d", "http://max-4/api/v1/write").replace("max_shards: 2", "max_shards: 4"),
              transport_factory=factory)
    t = now_ms()
    names = [f"s{i}" for i in range(8)]
    for step in range(10):  # queued under 4 shards while the destination is down
        assert r.post([(S("m", s=n), [(t + step, float(step))]) for n in names]) == 204
    r.path.write_text(config_text(tmp_path, dest("d", "http://max-2/api/v1/write")))
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    for step in range(10, 20):  # queued under 2 shards
        assert r.post([(S("m", s=n), [(t + step, float(step))]) for n in names]) == 204
    assert wait_until(lambda: len(up.samples()) >= 160, timeout=20)
    got = up.samples()
    assert len(got) == 160  # none lost, none twice
    for n in names:
        stamps = [ts for lb, ts, _ in got if lb == S("m", s=n)]
        assert stamps == sorted(stamps) == [t + k for k in range(20)], n


@pytest.mark.parametrize(("sigv4", "env", "expected"), [
    (None, {}, "none (no sigv4)"),
    ({"access_key": "AKIA", "secret_key": "s"}, {}, "sigv4 region r1, static keys from the config"),
    ({"profile": "prod"}, {}, "sigv4 region r1, profile prod"),
    ({}, {"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/token", "AWS_ROLE_ARN": "arn:r"},
     "sigv4 region r1, default chain (IRSA web identity)"),
    ({}, {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"},
     "sigv4 region r1, default chain (EKS Pod Identity / container credentials)"),
    ({}, {"AWS_ACCESS_KEY_ID": "AKIA"}, "sigv4 region r1, default chain (environment keys)"),
    ({"role_arn": "arn:aws:iam::1:role/w"}, {},
     "sigv4 region r1, default chain, then assume role arn:aws:iam::1:role/w"),
])
def test_credential_method_names_how_a_destination_signs_without_secrets(
        sigv4: dict[str, str] | None, env: dict[str, str], expected: str) -> None:
    from types import SimpleNamespace

    from relay.control.destinations import credential_method

    s = None
    if sigv4 is not None:
        s = SimpleNamespace(**{"region": "r1", "profile": None, "role_arn": None, "access_key": None, **sigv4})
    got = credential_method(SimpleNamespace(sigv4=s), env)  # type: ignore[arg-type]
    assert got == expected
    assert "AKIA" not in got and "secret" not in got


def test_setup_error_is_one_line_naming_the_destination_once() -> None:
    from relay.control.destinations import SetupError

    e = SetupError("amp", "credentials", ValueError("destination 'amp': no credentials\ndetail"), "do X")
    assert str(e) == "destination amp: cannot set up credentials: no credentials (do X)"
    e = SetupError("amp", "its queue /q/amp.queue.db", OSError(), "check storage.path")
    assert str(e) == "destination amp: cannot set up its queue /q/amp.queue.db: OSError (check storage.path)"


class GatedQueue(DurableQueue):
    """A real queue whose put waits for ``gate`` while it is set: a request routed by the old
    pipeline whose write is still in progress when a reload commits."""

    gate: threading.Event | None = None
    waiting = threading.Event()

    def put(self, pieces: object, blocks: object = None) -> int:  # type: ignore[override]
        gate = GatedQueue.gate
        if gate is not None:
            GatedQueue.waiting.set()
            gate.wait(10)
        return super().put(pieces, blocks)  # type: ignore[arg-type]


class SlowForStamp(ScriptedTransport):
    """Answers 204; a request whose samples are all stamped ``slow`` is held 0.5 s before it is
    recorded, so a request of another shard sent meanwhile is recorded first."""

    def __init__(self, slow: int) -> None:
        super().__init__(204)
        self.slow = slow

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        stamps = {ts for _, ss in wire.decode_write_request(snappy.uncompress(body)) for ts, _ in ss}
        if stamps == {self.slow}:
            time.sleep(0.5)
        return super().post(url, body, headers, timeout)


def test_reload_changing_max_shards_keeps_order_for_a_request_whose_write_was_in_progress(
        running: list[Running], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = now_ms()
    tx = SlowForStamp(t)
    # 4 shards, fixed (min_shards: 4), then max_shards 2: the running count comes down to 2 at the reload
    r = start(running, tmp_path, dest("d", "http://rx/api/v1/write").replace("max_shards: 2",
                                                                              "min_shards: 4, max_shards: 4"),
              transport_factory=lambda d: tx,
              queue_factory=lambda d, p: GatedQueue(p, d.queue.max_disk))
    names = [f"s{i}" for i in range(16)]
    gate = threading.Event()
    monkeypatch.setattr(GatedQueue, "gate", gate)
    GatedQueue.waiting.clear()
    statuses: list[int] = []
    first = threading.Thread(target=lambda: statuses.append(r.post([(S("m", s=n), [(t, 0.0)]) for n in names])))
    first.start()  # routed under 4 shards; its write waits at the gate
    old_pipeline = r.runtime.pipeline
    assert GatedQueue.waiting.wait(10)
    r.path.write_text(config_text(tmp_path, dest("d", "http://rx/api/v1/write")))  # max_shards 4 -> 2
    results: list[tuple[bool, str]] = []
    reload = threading.Thread(target=lambda: results.append(r.runtime.reload_config()))
    reload.start()
    assert wait_until(lambda: r.runtime.pipeline is not old_pipeline)
    time.sleep(0.1)
    gate.set()  # the old pipeline's write commits now
    monkeypatch.setattr(GatedQueue, "gate", None)
    first.join(10)
    reload.join(10)
    assert statuses == [204]
    assert results == [(True, "configuration reloaded")]
    assert r.runtime.destinations["d"].shards == 2 and r.runtime.pipeline.stages[0].shards == 2
    assert r.post([(S("m", s=n), [(t + 1, 1.0)]) for n in names]) == 204  # sent once the first was acked
    assert wait_until(lambda: len(tx.samples()) >= 32, timeout=20)
    got = tx.samples()
    assert len(got) == 32
    for n in names:
        assert [ts for lb, ts, _ in got if lb == S("m", s=n)] == [t, t + 1], n


class HangingTransport(ScriptedTransport):
    """A destination whose reply takes ``hang`` seconds whatever the client's timeout (a response
    that trickles in), then 204: the request delivered what it carried."""

    def __init__(self, hang: float) -> None:
        super().__init__(204)
        self.hang = hang
        self.entered = threading.Event()
        self.returned_at: float | None = None

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        self.entered.set()
        time.sleep(self.hang)
        reply = super().post(url, body, headers, timeout)
        self.returned_at = time.monotonic()
        return reply


class TimedTransport(ScriptedTransport):
    def __init__(self) -> None:
        super().__init__(204)
        self.first_at: float | None = None

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        if self.first_at is None:
            self.first_at = time.monotonic()
        return super().post(url, body, headers, timeout)


def test_reload_while_the_old_senders_request_outlives_its_timeout_never_sends_the_entries_twice(
        running: list[Running], tmp_path: Path) -> None:
    old, new = HangingTransport(2.5), TimedTransport()

    def factory(d: DestinationConfig) -> ScriptedTransport:
        return old if "old" in d.url else new

    queue = QUEUE.replace("}", ", timeout: 200ms}")
    r = start(running, tmp_path, dest("d", "http://old/api/v1/write").replace(QUEUE, queue),
              transport_factory=factory)
    t = now_ms()
    assert r.post([(S("m", i=str(i)), [(t, float(i))]) for i in range(5)]) == 204
    assert old.entered.wait(10)  # the old sender's request is in flight
    r.path.write_text(config_text(tmp_path, dest("d", "http://new/api/v1/write").replace(QUEUE, queue)))
    assert r.runtime.reload_config() == (True, "configuration reloaded")  # stop() gave up after 1.2 s
    assert wait_until(lambda: old.returned_at is not None, timeout=10)
    time.sleep(0.5)
    # the new sender sent nothing while the old request was in flight, and nothing twice
    assert new.first_at is None or (old.returned_at is not None and new.first_at >= old.returned_at)
    delivered = old.samples() + new.samples()
    assert sorted(delivered) == sorted((S("m", i=str(i)), t, float(i)) for i in range(5))


class CloseFailsQueue(DurableQueue):
    """A real queue whose close fails the way a full disk makes its last write fail."""

    def close(self) -> None:
        if "gone" in str(self.path):
            raise sqlite3.OperationalError("database or disk is full")
        super().close()


def test_reload_whose_removed_destinations_queue_fails_to_close_still_starts_the_new_senders(
        running: list[Running], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    transports = {"http://old/api/v1/write": ScriptedTransport(503), "http://new/api/v1/write": ScriptedTransport(204),
                  "http://gone/api/v1/write": ScriptedTransport(204)}
    r = start(running, tmp_path, dest("keep", "http://old/api/v1/write") + dest("gone", "http://gone/api/v1/write"),
              transport_factory=lambda d: transports[d.url],
              queue_factory=lambda d, p: CloseFailsQueue(p, d.queue.max_disk))
    t = now_ms()
    assert r.post([(S("m", i=str(i)), [(t, float(i))]) for i in range(5)]) == 204
    r.path.write_text(config_text(tmp_path, dest("keep", "http://new/api/v1/write")))
    with caplog.at_level(logging.WARNING):
        assert r.runtime.reload_config() == (True, "configuration reloaded")
    assert wait_until(lambda: len(transports["http://new/api/v1/write"].samples()) >= 5)
    assert any("gone" in rec.getMessage() and "disk is full" in rec.getMessage() for rec in caplog.records)
    assert not any(rec.exc_info for rec in caplog.records)


def test_stop_with_a_queue_that_fails_to_close_still_stops_and_closes_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(config_text(tmp_path, dest("gone", "http://gone/api/v1/write") + dest("b", "http://b/api/v1/write")))
    runtime = Runtime(str(path), load_config(path), transport_factory=lambda d: ScriptedTransport(204),
                      queue_factory=lambda d, p: CloseFailsQueue(p, d.queue.max_disk))
    runtime.start()
    with caplog.at_level(logging.WARNING):
        runtime.stop()  # graceful stop: one warning for the queue that could not close, no exception
    b = runtime.destinations["b"]
    assert b.queue is not None and b.queue.closed
    assert b.sender is not None and b.sender.finished()
    assert any("gone" in rec.getMessage() and "disk is full" in rec.getMessage() for rec in caplog.records)


def test_reload_during_a_max_shards_drain_keeps_the_drain_for_the_next_sender(
        running: list[Running], tmp_path: Path) -> None:
    t = now_ms()
    down, up = ScriptedTransport(503), SlowForStamp(t)
    r = start(running, tmp_path, dest("d", "http://down/api/v1/write").replace("max_shards: 2", "max_shards: 4"),
              transport_factory=lambda d: down if "down" in d.url else up)
    names = [f"s{i}" for i in range(16)]
    assert r.post([(S("m", s=n), [(t, 0.0)]) for n in names]) == 204  # sharded under 4
    assert wait_until(lambda: len(down.bodies) >= 1)
    r.path.write_text(config_text(tmp_path, dest("d", "http://down/api/v1/write")))  # 4 -> 2: draining, failing
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    assert r.post([(S("m", s=n), [(t + 1, 1.0)]) for n in names]) == 204  # sharded under 2
    tried = len(down.bodies)
    assert wait_until(lambda: len(down.bodies) > tried)  # the drain is retrying
    r.path.write_text(config_text(tmp_path, dest("d", "http://up/api/v1/write")))  # same 2 shards, new url
    assert r.runtime.reload_config() == (True, "configuration reloaded")
    assert wait_until(lambda: len(up.samples()) >= 32, timeout=20)
    got = up.samples()
    assert len(got) == 32
    for n in names:
        assert [ts for lb, ts, _ in got if lb == S("m", s=n)] == [t, t + 1], n


def test_restart_with_another_max_shards_ships_the_recovered_entries_first_in_order(tmp_path: Path) -> None:
    t = now_ms()
    path = tmp_path / "relay.yaml"
    four = dest("d", "http://down/api/v1/write").replace("max_shards: 2", "max_shards: 4")
    path.write_text(config_text(tmp_path, four))
    names = [f"s{i}" for i in range(16)]
    first = Running(path, transport_factory=lambda d: ScriptedTransport(503))
    assert first.post([(S("m", s=n), [(t, 0.0)]) for n in names]) == 204  # queued under 4 shards
    first.runtime.stop()
    up = SlowForStamp(t)
    path.write_text(config_text(tmp_path, dest("d", "http://up/api/v1/write")))  # restarted with 2 shards
    second = Running(path, transport_factory=lambda d: up)
    try:
        assert second.post([(S("m", s=n), [(t + 1, 1.0)]) for n in names]) == 204
        assert wait_until(lambda: len(up.samples()) >= 32, timeout=20)
        got = up.samples()
        assert len(got) == 32
        for n in names:
            assert [ts for lb, ts, _ in got if lb == S("m", s=n)] == [t, t + 1], n
    finally:
        second.runtime.stop()
    third = Running(path, transport_factory=lambda d: ScriptedTransport(204))  # same count again: no drain
    try:
        sender = third.runtime.destinations["d"].sender
        assert sender is not None and sender.drain_first is None
    finally:
        third.runtime.stop()
