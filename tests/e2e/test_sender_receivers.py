"""The concatenated snappy body (queue_codec.concat: several stored snappy rows and a raw row under
one header) is what real receivers accept: victoria-metrics and Prometheus decode it with Go's snappy,
a SigV4-checking receiver hashes exactly the bytes sent. Each gets one batch from a real queue
through the relay's default HTTP transport, and every sample must arrive."""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import cramjam
import pytest
import snappy
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from bench.receivers import VictoriaMetrics
from relay.common.metrics import RelayMetrics
from relay.delivery import sigv4
from relay.delivery.queue import codec as queue_codec
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import Sender, SenderSettings
from relay.delivery.transport import HttpTransport, Response
from relay.ingest.wire import encode_write_request
from tests.e2e.procs import prom_query, running, start_prometheus
from tests.helpers import isolate_aws, require_binary, wait_until
from tests.sigv4_receiver import SigV4Receiver

pytestmark = pytest.mark.e2e

NAME = "sendcat_e2e_value"
ROWS, PER_ROW = 5, 30  # compressed rows of 30 series each, plus one raw row of one series


def _row(r: int, series: int, now_ms: int) -> bytes:
    return encode_write_request([
        ((("__name__", NAME), ("host", f"ip-10-0-{r}-{j}.ec2.internal"), ("row", str(r)), ("series", str(j)),
          ("job", "sendcat")), [(now_ms, float(r * 1000 + j))])
        for j in range(series)])


def _payloads(now_ms: int) -> list[tuple[bytes, int]]:
    """(payload, samples): compressed rows around a raw one, in the order they are queued."""
    rows = [(_row(r, PER_ROW, now_ms), PER_ROW) for r in range(ROWS)]
    return [*rows[:3], (_row(ROWS, 1, now_ms), 1), *rows[3:]]


EXPECTED_SAMPLES = ROWS * PER_ROW + 1
EXPECTED_SUM = sum(r * 1000 + j for r in range(ROWS) for j in range(PER_ROW)) + ROWS * 1000


class Recording:
    """The relay's HttpTransport, recording every body it posts and every status it got."""

    def __init__(self, inner: HttpTransport) -> None:
        self.inner = inner
        self.bodies: list[bytes] = []
        self.statuses: list[int] = []
        self.lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        r = self.inner.post(url, body, headers, timeout)
        with self.lock:
            self.bodies.append(body)
            self.statuses.append(r.status)
        return r


def send_one_batch(tmp: Path, url: str, auth: sigv4.SigV4Auth | None = None) -> Recording:
    """Queue the rows, check how they are stored, and let a Sender deliver them as one batch."""
    now_ms = int(time.time() * 1000)
    payloads = _payloads(now_ms)
    queue = DurableQueue(tmp / "dest.queue.db", 1 << 30)
    queue.put([(0, p, n, now_ms) for p, n in payloads])
    with sqlite3.connect(tmp / "dest.queue.db") as db:
        stored = [(bytes(p), r) for p, r in db.execute("SELECT payload, raw_len FROM entries ORDER BY id")]
    assert [r is None for _, r in stored] == [False, False, False, True, False, False]  # 5 snappy rows, 1 raw
    transport = Recording(HttpTransport(auth=auth))
    sender = Sender("dest", url, queue, transport, SenderSettings(max_samples_per_send=10_000,
                    batch_send_deadline=0.05), RelayMetrics(CollectorRegistry()))
    sender.start()
    try:
        assert wait_until(lambda: queue.shards() == [], timeout=20), transport.statuses
    finally:
        sender.stop(timeout=5)
        transport.inner.close()
        queue.close()
    assert len(transport.bodies) == 1 and 200 <= transport.statuses[0] < 300, transport.statuses
    [body] = transport.bodies
    assert body == queue_codec.concat(stored)  # the stored rows' bytes, not a new compression
    assert snappy.uncompress(body) == b"".join(p for p, _ in payloads)
    return transport


def test_victoria_metrics_decodes_a_concatenated_body_and_stores_every_sample(tmp_path: Path) -> None:
    require_binary("victoria-metrics")
    vm = VictoriaMetrics(tmp_path / "vm")
    try:
        send_one_batch(tmp_path, vm.url)
        assert wait_until(lambda: vm.rows() >= EXPECTED_SAMPLES, timeout=20)
        got = vm.contents()
        assert got.samples == EXPECTED_SAMPLES and got.series == EXPECTED_SAMPLES
        assert got.names == {NAME: EXPECTED_SAMPLES}
    finally:
        vm.close()


def test_prometheus_decodes_a_concatenated_body_and_stores_every_sample(tmp_path: Path) -> None:
    proc, url = start_prometheus(tmp_path, "global: {scrape_interval: 1m}\n", receiver=True)
    with running(proc):
        send_one_batch(tmp_path, url + "/api/v1/write")

        def stored() -> tuple[int, float]:
            res = prom_query(url, f'count({NAME}{{job="sendcat"}})')
            total = prom_query(url, f'sum({NAME}{{job="sendcat"}})')
            return (int(res[0]["value"][1]), float(total[0]["value"][1])) if res and total else (0, 0.0)

        assert wait_until(lambda: stored()[0] >= EXPECTED_SAMPLES, timeout=20)
        assert stored() == (EXPECTED_SAMPLES, float(EXPECTED_SUM))


def test_a_sigv4_receiver_verifies_the_payload_hash_of_a_concatenated_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_aws(monkeypatch, tmp_path)
    with SigV4Receiver("AKIDCONCAT", "concat/secret", region="us-east-1", service="aps") as rx:
        auth = sigv4.SigV4Auth(region="us-east-1", service="aps", access_key="AKIDCONCAT",
                               secret_key="concat/secret")
        send_one_batch(tmp_path, rx.url, auth)
        assert rx.accepted == 1 and rx.rejected == 0
        got = rx.samples()
    assert len(got) == EXPECTED_SAMPLES
    assert sum(v for _, points in got for _, v in points) == EXPECTED_SUM


def _store(kind: str, part: bytes) -> tuple[bytes, int | None]:
    if kind == "pack":
        return queue_codec.pack(part)
    if kind == "cramjam":
        return bytes(cramjam.snappy.compress_raw(part)), len(part)
    return part, None


KINDS = st.sampled_from(["pack", "cramjam", "raw"])


def test_go_snappy_in_victoria_metrics_accepts_any_byte_split_of_a_request_concatenated(tmp_path: Path) -> None:
    """Rows cut at any byte (not only between series), each stored as pack() would, as another
    encoder's block, or raw: the concatenation is one request victoria-metrics decodes (a 204 comes
    after its snappy and protobuf decoding), and every sample of every request is stored."""
    require_binary("victoria-metrics")
    vm = VictoriaMetrics(tmp_path / "vm")
    serial = itertools.count()
    posted = [0]
    transport = HttpTransport()

    @settings(max_examples=40, deadline=None)
    @given(st.integers(1, 60), st.lists(st.tuples(st.integers(0, 1 << 20), KINDS), max_size=8), KINDS)
    def one_request(n: int, cuts: list[tuple[int, str]], last: str) -> None:
        k = next(serial)
        now_ms = int(time.time() * 1000)
        payload = encode_write_request([
            ((("__name__", "sendcat_property"), ("case", str(k)), ("series", str(j)), ("pad", "p" * (j % 7) * 40)),
             [(now_ms, float(j))]) for j in range(n)])
        edges = sorted({0, len(payload), *(c % (len(payload) + 1) for c, _ in cuts)})
        kinds = [kind for _, kind in cuts] + [last]
        rows = [_store(kinds[i % len(kinds)], payload[a:b]) for i, (a, b) in enumerate(itertools.pairwise(edges))]
        r = transport.post(vm.url, queue_codec.concat(rows),
                           {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}, 10)
        assert r.status == 204, r.body
        posted[0] += n

    try:
        one_request()
        assert posted[0] > 0
        assert wait_until(lambda: vm.rows() >= posted[0], timeout=20)
        assert vm.rows() == posted[0]
        assert vm.contents().names == {"sendcat_property": posted[0]}
    finally:
        transport.close()
        vm.close()
