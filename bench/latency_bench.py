"""Relay queue latency: how long after a sample is acknowledged it reaches the destination.

Steady load into a real DurableQueue (SQLite, fsync per group commit, as in production) drained by
the real Sender (requests transport) into a loopback HTTP receiver. Each put carries ``--per-put``
samples whose value is the unix time at which the put returned (the moment Prometheus would get its
2xx); the receiver records, for every sample, arrival time minus that value. The rate is chosen so
that a batch of ``--batch`` samples fills in ``--fill`` seconds per shard. Goal (issue 8 defect 21):
p99 <= fill time + 50 ms; before the fix a batch that did not add up to exactly max_samples_per_send
waited for batch_send_deadline (5 s).

    .venv/bin/python bench/latency_bench.py                 # 20 s, 1 shard, 1000-sample batches, 0.3 s fill
    .venv/bin/python bench/latency_bench.py --seconds 5     # smoke test
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import snappy
from prometheus_client import CollectorRegistry

from relay.common.metrics import RelayMetrics
from relay.delivery.queue.durable import DurableQueue
from relay.delivery.sender import Sender, SenderSettings
from relay.delivery.transport import HttpTransport
from relay.ingest.wire import decode_write_request, encode_write_request


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.delays: list[tuple[float, float]] = []  # (acknowledged at, delivered - acknowledged)
        self.requests = 0
        self.max_batch = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        now = time.time()
        series = decode_write_request(snappy.uncompress(body))
        delays = [(v, now - v) for _, samples in series for _, v in samples]
        with self.server.lock:
            self.server.delays.extend(delays)
            self.server.requests += 1
            self.server.max_batch = max(self.server.max_batch, len(delays))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()


def run(seconds: float, batch: int, fill: float, per_put: int, shards: int, deadline: float) -> dict[str, float]:
    rate = batch / fill * shards  # samples per second, all shards
    interval = per_put / rate
    rx = _Receiver()
    threading.Thread(target=rx.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        queue = DurableQueue(Path(tmp) / "bench.queue.db", 1 << 30)
        sender = Sender("bench", f"http://127.0.0.1:{rx.server_address[1]}/api/v1/write", queue,
                        HttpTransport(pool_size=shards),
                        SenderSettings(max_samples_per_send=batch, batch_send_deadline=deadline),
                        RelayMetrics(CollectorRegistry()))
        sender.start()
        sent = 0
        i = 0
        start = time.monotonic()
        next_at = start
        stop_at = start + seconds + 2 * fill  # keep the load on a little longer: the last measured
        measured_until = time.time() + seconds  # batches fill as in steady state, not at shutdown
        while time.monotonic() < stop_at:
            shard = i % shards
            labels = (("__name__", "bench"), ("shard", str(shard)), ("i", str(i % 50)))
            stamp = time.time()  # the value: when this request arrived (its put returns right after)
            payload = encode_write_request([(labels, [(int(stamp * 1000) + k, stamp) for k in range(per_put)])])
            queue.put([(shard, payload, per_put, int(stamp * 1000))])
            sent += per_put if stamp < measured_until else 0
            i += 1
            next_at += interval
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        achieved = sent / seconds
        end = time.monotonic() + 15
        while time.monotonic() < end and sum(1 for t, _ in rx.delays if t < measured_until) < sent:
            time.sleep(0.05)
        sender.stop()
        queue.close()
    rx.shutdown()
    d = sorted(delay for t, delay in rx.delays if t < measured_until)
    q = statistics.quantiles(d, n=100) if len(d) >= 100 else [max(d)] * 99
    return {"rate": achieved, "fill": batch / (achieved / shards), "samples": float(sent),
            "delivered": float(len(d)), "requests": float(rx.requests), "max_batch": float(rx.max_batch),
            "p50": q[49], "p99": q[98], "max": d[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=1000, help="max_samples_per_send")
    ap.add_argument("--fill", type=float, default=0.3, help="seconds for a batch to fill, per shard")
    ap.add_argument("--per-put", type=int, default=50, help="samples per incoming request")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=5.0, help="batch_send_deadline")
    a = ap.parse_args()
    r = run(a.seconds, a.batch, a.fill, a.per_put, a.shards, a.deadline)
    goal = r["fill"] + 0.05
    print(f"{'rate samples/s':>15} {'fill s':>7} {'samples':>8} {'delivered':>9} {'requests':>8} "
          f"{'max batch':>9} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'goal p99':>8}")
    print(f"{r['rate']:>15.0f} {r['fill']:>7.3f} {r['samples']:>8.0f} {r['delivered']:>9.0f} "
          f"{r['requests']:>8.0f} {r['max_batch']:>9.0f} {r['p50']:>7.3f} {r['p99']:>7.3f} {r['max']:>7.3f} "
          f"{'<= ' + format(goal, '.3f'):>8} {'OK' if r['p99'] <= goal else 'MISSED'}")


if __name__ == "__main__":
    main()
