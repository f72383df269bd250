"""Durable queue + sender, in process: CPU per sample from put to delivered, for issue 9's shape.

``--requests`` incoming requests of ``--series`` series (one sample each; issue 9: 2,000 series per
request) are cut into ``--shards`` pieces (what the pipeline hands the queue per request and
destination) and put by 4 threads (group commit), while a Sender (``max_samples_per_send`` 2,000,
``batch_send_deadline`` 1 s) drains the queue through the relay's default HTTP transport to a sink in
another process (127.0.0.1; it answers 204 and counts samples). The figure is this process's CPU time
(every thread: putters, sender, SQLite) from the first put until the sink counted every sample and
the queue was empty, divided by the samples. ``--kept`` sets the fraction of each request that reaches
the queue (keep4 of issue 9 keeps about 1/8 of the series: 0.127), ``passthrough`` is 1.0.

``--code DIR`` imports ``relay`` from another checkout (e.g. /work/main), so the same script measures
main's queue and sender side by side with this one:

    .venv/bin/python bench/queue_bench.py                       # this checkout, passthrough and keep4
    .venv/bin/python bench/queue_bench.py --code /work/main     # main's queue and sender, same shape
    .venv/bin/python bench/queue_bench.py --compare /work/main  # both, alternating, --repeat times each
    .venv/bin/python bench/queue_bench.py --one-row             # each request as ONE row (shard 0)

``--pack-min N`` sets relay.queue_codec.MIN_PACK_BYTES in both trees (``--pack-min 1099511627776``:
every row stored raw, so the sender compresses each batch itself, what the queue did before rows were
compressed): the cost of row compression against SQLite's cost per byte, measured.

``--one-row`` puts each request as one row instead of one per shard: an upper bound of what "one
row per request and destination" (issue 9) could save on the put side (the drain side then runs on
one shard thread, so compare the put wall and the CPU, not the latency).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

SINK = textwrap.dedent("""
    import sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import snappy
    count = [0, 0]
    lock = threading.Lock()
    def samples(raw):
        # top-level TimeSeries (field 1) and, inside, samples (field 2): tags and lengths only
        def varint(b, i):
            shift = v = 0
            while True:
                c = b[i]; i += 1; v |= (c & 0x7F) << shift; shift += 7
                if c < 0x80: return v, i
        n = i = 0
        while i < len(raw):
            tag, i = varint(raw, i); ln, i = varint(raw, i); end = i + ln
            if tag == 0x0A:
                j = i
                while j < end:
                    t, j = varint(raw, j); l2, j = varint(raw, j); j += l2
                    n += t == 0x12
            i = end
        return n
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a): pass
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            n = samples(snappy.uncompress(body))
            with lock:
                count[0] += n; count[1] += 1
            self.send_response(204); self.send_header("Content-Length", "0"); self.end_headers()
        def do_GET(self):
            with lock:
                out = f"{count[0]} {count[1]}".encode()
            self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
            self.wfile.write(out)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
""")


def _pieces(args: argparse.Namespace, wire: Any) -> list[list[tuple[int, bytes, int, int]]]:
    """The requests as the pipeline hands them to one destination's queue: one piece per shard."""
    now_ms = int(time.time() * 1000)
    kept = max(1, round(args.series * args.kept))
    out = []
    for r in range(args.requests):
        shards: list[list[bytes]] = [[] for _ in range(args.shards)]
        for j in range(kept):
            labels = (("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("Hostname", f"ip-10-0-{r % 250}-{j % 250}.ec2.internal"),
                      ("UUID", f"GPU-{r:06d}{j:04d}-0d4f-4a8e-9b1c-3f2d6e8a7b90"), ("container", "trainer"),
                      ("device", f"nvidia{j % 8}"), ("gpu", str(j % 8)), ("instance", f"10.0.{r % 250}.{j}:9400"),
                      ("job", "gpu-exporter"), ("modelName", "NVIDIA H200"), ("namespace", "ml-team-a"),
                      ("pod", f"llm-pretrain-{j}-worker-{r % 4}"))
            shards[j % args.shards].append(wire.wrap_series(wire.encode_labels(labels),
                                                            wire.encode_sample(now_ms, float(j))))
        out.append([(s, b"".join(p), len(p), now_ms) for s, p in enumerate(shards) if p])
    return out


def run_once(args: argparse.Namespace) -> dict[str, float]:
    if args.code:
        sys.path.insert(0, str(Path(args.code).resolve()))
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from prometheus_client import CollectorRegistry

    from relay.common.metrics import RelayMetrics
    from relay.control.service import default_transport
    from relay.delivery.queue import codec as queue_codec
    from relay.delivery.queue.durable import DurableQueue
    from relay.delivery.sender import Sender, SenderSettings
    from relay.ingest import wire

    if args.pack_min is not None:
        queue_codec.MIN_PACK_BYTES = args.pack_min
    reqs = _pieces(args, wire)
    if args.one_row:
        reqs = [[(0, b"".join(p[1] for p in r), sum(p[2] for p in r), min(p[3] for p in r))] for r in reqs]
    total = sum(p[2] for req in reqs for p in req)
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE)
    try:
        assert sink.stdout is not None
        url = f"http://127.0.0.1:{int(sink.stdout.readline())}"
        with tempfile.TemporaryDirectory() as tmp:
            q = DurableQueue(Path(tmp) / "sink.queue.db", 1 << 30)
            q.set_shard_count(args.shards)

            class D:
                sigv4 = None
                name = "sink"

            transport = default_transport(D())
            sender = Sender("sink", url + "/api/v1/write", q, transport,
                            SenderSettings(max_samples_per_send=2000, batch_send_deadline=1.0),
                            RelayMetrics(CollectorRegistry()))
            nxt = iter(reqs)
            lock = threading.Lock()

            def putter() -> None:
                while True:
                    with lock:
                        req = next(nxt, None)
                    if req is None:
                        return
                    q.put(req)

            def delivered() -> int:
                import urllib.request
                with urllib.request.urlopen(url + "/", timeout=10) as r:
                    return int(r.read().split()[0])

            c0, w0 = time.process_time(), time.monotonic()
            sender.start()
            putters = [threading.Thread(target=putter) for _ in range(4)]
            for t in putters:
                t.start()
            for t in putters:
                t.join()
            w_put = time.monotonic() - w0
            while delivered() < total or q.depth()[0] > 0:
                if time.monotonic() - w0 > 600:
                    raise RuntimeError(f"sink got {delivered()} of {total} samples")
                time.sleep(0.02)
            cpu, wall = time.process_time() - c0, time.monotonic() - w0
            sender.stop()
            close = getattr(transport, "close", None)
            if callable(close):
                close()
            q.close()
            got = delivered()
            if got != total:
                raise RuntimeError(f"sink got {got} samples, expected {total}")
    finally:
        sink.terminate()
        sink.wait(10)
    return {"samples": total, "cpu_s": cpu, "wall_s": wall, "put_wall_s": w_put, "us_per_sample": cpu / total * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--series", type=int, default=2000, help="series (samples) per incoming request")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--kept", type=str, default="1.0,0.127", help="fractions of each request queued (list)")
    ap.add_argument("--code", default="", help="import relay from this checkout instead")
    ap.add_argument("--compare", default="", help="a second checkout: run both, alternating")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--one-row", action="store_true", help="each request as one row (shard 0)")
    ap.add_argument("--pack-min", type=int, default=None,
                    help="queue_codec.MIN_PACK_BYTES for the run (e.g. 1099511627776: every row stored raw)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child run: print JSON
    args = ap.parse_args()
    if args.one:
        args.kept = float(args.kept)
        print(json.dumps(run_once(args)))
        return
    here = str(Path(__file__).resolve().parents[1])
    codes = [("this", args.code or here)] + ([("other", args.compare)] if args.compare else [])
    print(f"queue+sender: {args.requests} requests x {args.series} series, {args.shards} shards, "
          "max_samples_per_send 2000; CPU of the whole process (putters, sender, SQLite) until delivered")
    print(f"{'code':<28} {'kept':>6} {'samples':>9} {'CPU s':>7} {'wall s':>7} {'us/sample':>10}")
    for kept in args.kept.split(","):
        for _ in range(args.repeat):
            for _label, code in codes:
                cmd = [sys.executable, __file__, "--one", "--requests", str(args.requests), "--series",
                       str(args.series), "--shards", str(args.shards), "--kept", kept, "--code", code,
                       *(["--one-row"] if args.one_row else []),
                       *(["--pack-min", str(args.pack_min)] if args.pack_min is not None else [])]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{code:<28} {float(kept):>6.3f} {r['samples']:>9,} {r['cpu_s']:>7.2f} "
                      f"{r['wall_s']:>7.2f} {r['us_per_sample']:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
