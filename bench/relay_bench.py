"""Relay throughput: samples per CPU-second through gpu-relay and through vmagent, same payload, same run.

Both receive the same pre-encoded remote-write requests (a GPU cluster's dcgm-exporter series as
Prometheus would send them: 8 GPUs x 23 metrics per node, one sample per series per 15 s round,
2000 samples per request, 4 concurrent senders), apply the same rules, queue and forward to the
same sink. The figure is input samples divided by the CPU time (user+system of every thread, from
/proc/PID/stat) the program spent from its first request until the sink held every sample. Each
program runs ``--repeat`` times (a fresh process each time); the table shows the run with the
median CPU time. Scenarios: "keep4" (keep 4 critical metrics + labeldrop of 2 labels) and
"passthrough". After each run the sink's content is checked: exactly the expected samples, metric
names and label names (so a rule that silently did nothing cannot look fast).

Not the same work, and said so in the table's footnote: gpu-relay answers 2xx only after the
request is committed to its on-disk queue (SQLite WAL, fsync per group commit); vmagent 1.79
acknowledges once the data is in its in-memory queue and writes to disk only when that overflows.

    .venv/bin/python bench/relay_bench.py                       # 50 nodes x 30 rounds x 3 runs
    .venv/bin/python bench/relay_bench.py --nodes 5 --rounds 2 --repeat 1   # smoke test

Other benches reuse ``payload``, ``Sink`` and ``run_relay`` (see bench/cardinality_bench.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import snappy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.fields import DEFAULT_FIELDS, FIELDS
from relay import wire
from tests.helpers import free_port, wait_until

# What a node's dcgm-exporter default set sends (NVLink bandwidth is absent on PCIe H200 nodes).
METRICS = [f for f in DEFAULT_FIELDS if FIELDS[f].kind != "label" and f != "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]
KEEP = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
DROP_LABELS = ["pci_bus_id", "DCGM_FI_DRIVER_VERSION"]
PER_REQUEST = 2000  # Prometheus's max_samples_per_send default
SCRAPE_MS = 15_000
SENDERS = 4  # concurrent requests, like a few Prometheus shards
FLUSH_S = 1.0  # batch_send_deadline (gpu-relay) and -remoteWrite.flushInterval (vmagent) in every run
KEEP4_RELABEL = (f"- source_labels: [__name__]\n  regex: {'|'.join(KEEP)}\n  action: keep\n"
                 f"- regex: {'|'.join(DROP_LABELS)}\n  action: labeldrop\n")
# the same rules as gpu-relay destination keys
KEEP4_RULES = "    write_relabel_configs:\n" + "".join(f"      {ln}\n" for ln in KEEP4_RELABEL.splitlines())
Series = tuple[tuple[str, str], ...]


def cluster_series(nodes: int) -> list[Series]:
    out = []
    for n in range(nodes):
        for g in range(8):
            for m in METRICS:
                labels = {
                    "__name__": m, "gpu": str(g), "UUID": f"GPU-{n:04d}{g:04d}-0d4f-4a8e-9b1c-3f2d6e8a7b90",
                    "pci_bus_id": f"00000000:{0x18 + g * 0x10:02X}:00.0", "device": f"nvidia{g}",
                    "modelName": "NVIDIA H200", "Hostname": f"ip-10-0-{n // 250}-{n % 250}.ec2.internal",
                    "DCGM_FI_DRIVER_VERSION": "580.159.04", "container": "trainer",
                    "namespace": "ml-team-a", "pod": f"llm-pretrain-{n // 4}-worker-{n % 4}",
                    "instance": f"10.0.{n // 250}.{n % 250}:9400", "job": "gpu-exporter",
                }
                out.append(tuple(sorted(labels.items())))
    return out


def build_requests(series: Sequence[Series], rounds: int, end_ago_s: float = 0.0) -> list[bytes]:
    """Snappy RW1 requests, round by round; the last round is stamped ``end_ago_s`` before now."""
    reqs = []
    t0 = int((time.time() - end_ago_s) * 1000) - (rounds - 1) * SCRAPE_MS
    for r in range(rounds):
        ts = t0 + r * SCRAPE_MS
        for i in range(0, len(series), PER_REQUEST):
            chunk = series[i : i + PER_REQUEST]
            reqs.append(snappy.compress(wire.encode_write_request(
                [(s, [(ts, float((r * 7 + j) % 100))]) for j, s in enumerate(chunk)])))
    return reqs


@dataclass
class Payload:
    series: list[Series]
    rounds: int
    requests: list[bytes]

    @property
    def samples(self) -> int:
        return len(self.series) * self.rounds

    def describe(self) -> str:
        return (f"{len(self.series)} series x {self.rounds} rounds = {self.samples:,} samples in "
                f"{len(self.requests)} requests ({sum(map(len, self.requests)) / 1e6:.1f} MB snappy)")


def payload(nodes: int, rounds: int, end_ago_s: float = 0.0) -> Payload:
    series = cluster_series(nodes)
    return Payload(series, rounds, build_requests(series, rounds, end_ago_s))


class Sink(ThreadingHTTPServer):
    """A remote-write receiver that counts samples and records the metric and label names it saw."""

    daemon_threads = True

    def __init__(self) -> None:
        self.samples = 0
        self.names: dict[str, int] = {}  # metric name -> samples
        self.label_names: set[str] = set()
        self.last_at = 0.0  # monotonic time of the last request with samples
        self.lock = threading.Lock()
        self._cache: dict[bytes, wire.Decision] = {}
        sink = self

        def decide(key: bytes) -> wire.Decision:
            labels = wire.decode_labels(key)
            sink.label_names.update(n for n, _ in labels)  # called by route(), under sink.lock
            return ((b"", 0, dict(labels).get("__name__", "")),)

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding not in ("snappy", ""):
                    self.send_response(415)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                raw = snappy.uncompress(body) if encoding == "snappy" else body
                with sink.lock:  # the cache is shared by the handler threads
                    routed = wire.route(raw, 1, sink._cache, decide)
                    for decision, _rest, n, _oldest in routed.per_dest[0]:
                        name = decision[2]
                        sink.names[name] = sink.names.get(name, 0) + n
                    sink.samples += routed.samples_in
                    if routed.samples_in:
                        sink.last_at = time.monotonic()
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(("127.0.0.1", 0), H)
        threading.Thread(target=self.serve_forever, name="sink", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/api/v1/write"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) / 1024
    return 0.0


def post_all(url: str, reqs: Sequence[bytes]) -> None:
    """POST every request, ``SENDERS`` at a time; 429/5xx/network errors are retried like Prometheus."""

    def one(body: bytes) -> None:
        r = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0"})
        last: Exception | None = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(r, timeout=30) as resp:
                    resp.read()
                    return
            except urllib.error.HTTPError as e:
                if e.code not in (408, 429) and e.code < 500:
                    raise RuntimeError(f"{url} answered {e.code}: {e.read()[:200]!r}") from e
                last = e
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"could not post to {url}: {last}")

    with ThreadPoolExecutor(SENDERS) as ex:
        list(ex.map(one, reqs))


@dataclass
class Result:
    cpu: float  # seconds of CPU from the first request until the sink had everything
    wall: float  # seconds from the first request until the sink's last sample
    rss_mb: float
    delivered: int
    names: dict[str, int]
    label_names: set[str]


def _measure(args: list[str], ready: str, write: str, reqs: Sequence[bytes], sink: Sink, expected: int | None,
             log_path: Path, settle_s: float, at_least: int = 0) -> Result:
    """Start ``args``; once ready, post ``reqs`` and wait for the sink. ``expected``: the exact sample count
    the sink must reach; None: wait until it has ``at_least`` samples and has been quiet for ``settle_s``
    (outputs whose count depends on timing, like aggregation windows). In both cases the sink must stay
    unchanged for ``settle_s`` afterwards, so over-delivery is caught too."""
    with open(log_path, "wb") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            def up() -> bool:
                try:
                    with urllib.request.urlopen(ready, timeout=1) as r:
                        return bool(r.status == 200)
                except Exception:
                    return p.poll() is not None

            if not wait_until(up, timeout=30) or p.poll() is not None:
                raise RuntimeError(f"{args[0]} did not start: {log_path.read_text(errors='replace')[-2000:]}")
            c0 = cpu_seconds(p.pid)
            w0 = time.monotonic()
            post_all(write, reqs)
            if expected is not None:
                if not wait_until(lambda: sink.samples >= expected, timeout=120, interval=0.02):
                    raise RuntimeError(f"{args[0]}: sink got {sink.samples} of {expected} samples")
                cpu = cpu_seconds(p.pid) - c0
            else:
                if not wait_until(lambda: sink.samples >= max(at_least, 1)
                                  and time.monotonic() - sink.last_at > settle_s, timeout=120, interval=0.05):
                    raise RuntimeError(f"{args[0]}: sink got {sink.samples} samples, expected {at_least} or more")
                cpu = cpu_seconds(p.pid) - c0  # includes settle_s of idling (about 1 ms/s: negligible)
            wall = sink.last_at - w0
            rss = rss_mb(p.pid)
            before = sink.samples
            time.sleep(settle_s)
            if sink.samples != before or (expected is not None and before != expected):
                raise RuntimeError(f"{args[0]}: sink got {sink.samples} samples, expected {expected or before}")
        finally:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    return Result(cpu, wall, rss, sink.samples, dict(sink.names), set(sink.label_names))


def relay_config(port: int, queue_dir: Path, sink_url: str, rules: str = "") -> str:
    """A one-destination gpu-relay config. ``rules``: extra destination keys, YAML at 4 spaces' indent."""
    return (f"server: {{listen: '127.0.0.1:{port}'}}\nstorage: {{path: {queue_dir}}}\n"
            f"destinations:\n  - name: sink\n    url: {sink_url}\n{rules}"
            f"    queue: {{max_samples_per_send: {PER_REQUEST}, batch_send_deadline: {FLUSH_S:g}s, max_shards: 4}}\n")


def run_relay(rules: str, pl: Payload, expected: int | None, work: Path, settle_s: float = 1.5,
              at_least: int = 0) -> Result:
    """One fresh gpu-relay (one destination with ``rules``) fed ``pl`` into a fresh sink; see ``_measure``
    for ``expected``, ``at_least`` and ``settle_s``."""
    work.mkdir(parents=True)
    port = free_port()
    sink = Sink()
    try:
        cfg = work / "relay.yaml"
        cfg.write_text(relay_config(port, work / "q", sink.url, rules))
        args = [str(Path(sys.executable).parent / "gpu-relay"), "run", "--config", str(cfg)]
        base = f"http://127.0.0.1:{port}"
        return _measure(args, base + "/-/ready", base + "/api/v1/write", pl.requests, sink, expected,
                        work / "log.txt", settle_s, at_least)
    finally:
        sink.close()


def run_vmagent(relabel: str, pl: Payload, expected: int | None, work: Path, settle_s: float = 1.5) -> Result:
    """One fresh vmagent 1.79 (``-remoteWrite.urlRelabelConfig`` = ``relabel`` if given) fed ``pl``."""
    work.mkdir(parents=True)
    port = free_port()
    sink = Sink()
    try:
        args = [shutil.which("vmagent") or "vmagent", f"-httpListenAddr=127.0.0.1:{port}",
                f"-remoteWrite.url={sink.url}", f"-remoteWrite.tmpDataPath={work / 'q'}",
                f"-remoteWrite.flushInterval={FLUSH_S:g}s", "-loggerLevel=ERROR"]
        if relabel:
            (work / "relabel.yml").write_text(relabel)
            args.append(f"-remoteWrite.urlRelabelConfig={work / 'relabel.yml'}")
        base = f"http://127.0.0.1:{port}"
        return _measure(args, base + "/health", base + "/api/v1/write", pl.requests, sink, expected,
                        work / "log.txt", settle_s)
    finally:
        sink.close()


def median_run(runs: Sequence[Result]) -> Result:
    cpus = [r.cpu for r in runs]
    return runs[cpus.index(statistics.median_low(cpus))]


def check_keep4(r: Result, pl: Payload, program: str) -> None:
    kept = {m: pl.rounds * sum(1 for s in pl.series if dict(s)["__name__"] == m) for m in KEEP}
    if r.names != kept:
        raise RuntimeError(f"{program} keep4: sink got metrics {r.names}, expected {kept}")
    if r.label_names & set(DROP_LABELS):
        raise RuntimeError(f"{program} keep4: dropped labels still present: {r.label_names & set(DROP_LABELS)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50, help="GPU nodes (8 GPUs, 23 metrics each); default 50")
    ap.add_argument("--rounds", type=int, default=30, help="scrape rounds (the same series resent); default 30")
    ap.add_argument("--repeat", type=int, default=3, help="runs per program and scenario (median shown); default 3")
    args = ap.parse_args()
    t_start = time.monotonic()
    pl = payload(args.nodes, args.rounds)
    total = pl.samples
    kept = sum(1 for s in pl.series if dict(s)["__name__"] in KEEP) * pl.rounds
    have_vm = shutil.which("vmagent") is not None
    programs = ("gpu-relay", "vmagent") if have_vm else ("gpu-relay",)
    print(f"payload: {pl.describe()}; {SENDERS} concurrent senders; {os.cpu_count()} CPUs", flush=True)
    if not have_vm:
        print("vmagent not found on PATH: measuring gpu-relay only")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for scenario, expected in (("keep4", kept), ("passthrough", total)):
            res: dict[str, Result] = {}
            for program in programs:
                runs = []
                for i in range(args.repeat):
                    work = Path(td) / f"{program}-{scenario}-{i}"
                    if program == "gpu-relay":
                        r = run_relay(KEEP4_RULES if scenario == "keep4" else "", pl, expected, work)
                    else:
                        r = run_vmagent(KEEP4_RELABEL if scenario == "keep4" else "", pl, expected, work)
                    if scenario == "keep4":
                        check_keep4(r, pl, program)
                    runs.append(r)
                    print(f"  {scenario:<12} {program:<10} run {i + 1}: {r.cpu:.2f} CPU s", flush=True)
                res[program] = median_run(runs)
            rows.append((scenario, expected, res))
    print()
    print(f"{'scenario':<12} {'program':<10} {'samples/CPU-s':>14} {'us/sample':>10} {'CPU s':>7} {'wall s':>7} "
          f"{'RSS MB':>7} {'delivered':>10}")
    for scenario, _expected, res in rows:
        for program, r in res.items():
            print(f"{scenario:<12} {program:<10} {total / r.cpu:>14,.0f} {1e6 * r.cpu / total:>10.2f} "
                  f"{r.cpu:>7.2f} {r.wall:>7.2f} {r.rss_mb:>7.1f} {r.delivered:>10,}")
        if "vmagent" in res:
            ratio = res["vmagent"].cpu / res["gpu-relay"].cpu
            print(f"{'':<12} {'ratio':<10} gpu-relay: {ratio:.2f}x vmagent's samples per CPU-second "
                  f"(vmagent {1 / ratio:.1f}x faster)")
    print(f"\nsamples/CPU-s counts input samples; median of {args.repeat} runs by CPU time; wall includes the "
          f"{FLUSH_S:g} s flush deadline.\ngpu-relay acknowledges after an fsynced disk commit; vmagent 1.79 after an "
          f"in-memory enqueue.\ntotal bench time {time.monotonic() - t_start:.0f} s")


if __name__ == "__main__":
    main()
