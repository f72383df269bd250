"""Relay throughput: samples per CPU-second through gpu-relay and through vmagent, same payload, same run.

Both receive the same pre-encoded remote-write requests (a GPU cluster's dcgm-exporter series as
Prometheus would send them), apply the same rules, queue on disk and forward to the same sink.
The figure is input samples divided by the CPU time (user+system, from /proc) of the relay
process from the first request until the sink has everything. Scenarios: "keep4" (keep 4 critical
metrics + labeldrop of 2 labels) and "passthrough".

    .venv/bin/python bench/relay_bench.py [--nodes 50] [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import snappy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relay import wire
from tests.helpers import free_port, wait_until

METRICS = [
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
]
KEEP = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
DROP_LABELS = ["pci_bus_id", "DCGM_FI_DRIVER_VERSION"]
PER_REQUEST = 2000  # Prometheus's max_samples_per_send default


def cluster_series(nodes: int) -> list[tuple[tuple[str, str], ...]]:
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


def build_requests(series: list[Any], rounds: int) -> list[bytes]:
    reqs = []
    t0 = int(time.time() * 1000) - rounds * 15_000
    for r in range(rounds):
        ts = t0 + r * 15_000
        for i in range(0, len(series), PER_REQUEST):
            chunk = series[i : i + PER_REQUEST]
            reqs.append(snappy.compress(wire.encode_write_request(
                [(s, [(ts, float((r * 7 + j) % 100))]) for j, s in enumerate(chunk)])))
    return reqs


class Sink(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.samples = 0
        self.lock = threading.Lock()
        sink = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                raw = snappy.uncompress(body) if self.headers.get("Content-Encoding", "snappy") == "snappy" else body
                routed = wire.route(raw, 1, {}, lambda k: ((b"x", 0, ""),))
                with sink.lock:
                    sink.samples += routed.samples_in
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(("127.0.0.1", 0), H)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/api/v1/write"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def post_all(url: str, reqs: list[bytes]) -> None:
    def one(body: bytes) -> None:
        r = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0"})
        for _ in range(50):
            try:
                with urllib.request.urlopen(r, timeout=30) as resp:
                    if resp.status < 300:
                        return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError(f"could not post to {url}")

    with ThreadPoolExecutor(4) as ex:  # like a few Prometheus shards
        list(ex.map(one, reqs))


def run_one(kind: str, scenario: str, reqs: list[bytes], expected: int, tmp: Path) -> dict[str, Any]:
    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    port = free_port()
    work = tmp / f"{kind}-{scenario}"
    work.mkdir()
    if kind == "gpu-relay":
        rules = ""
        if scenario == "keep4":
            rules = (f"    write_relabel_configs:\n      - source_labels: [__name__]\n        regex: {'|'.join(KEEP)}\n"
                     f"        action: keep\n      - regex: {'|'.join(DROP_LABELS)}\n        action: labeldrop\n")
        cfg = work / "relay.yaml"
        cfg.write_text(f"server: {{listen: '127.0.0.1:{port}'}}\nstorage: {{path: {work / 'q'}}}\n"
                       f"destinations:\n  - name: sink\n    url: {sink.url}\n{rules}"
                       f"    queue: {{max_samples_per_send: 2000, batch_send_deadline: 1s, max_shards: 4}}\n")
        args = [str(Path(sys.executable).parent / "gpu-relay"), "run", "--config", str(cfg)]
        ready = f"http://127.0.0.1:{port}/-/ready"
        write = f"http://127.0.0.1:{port}/api/v1/write"
    else:
        args = [shutil.which("vmagent") or "vmagent", f"-httpListenAddr=127.0.0.1:{port}",
                f"-remoteWrite.url={sink.url}", f"-remoteWrite.tmpDataPath={work / 'q'}", "-loggerLevel=ERROR"]
        if scenario == "keep4":
            rc = work / "relabel.yml"
            rc.write_text(f"- source_labels: [__name__]\n  regex: {'|'.join(KEEP)}\n  action: keep\n"
                          f"- regex: {'|'.join(DROP_LABELS)}\n  action: labeldrop\n")
            args.append(f"-remoteWrite.urlRelabelConfig={rc}")
        ready = f"http://127.0.0.1:{port}/health"
        write = f"http://127.0.0.1:{port}/api/v1/write"
    with open(work / "log.txt", "wb") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            def up() -> bool:
                try:
                    with urllib.request.urlopen(ready, timeout=1) as r:
                        return bool(r.status == 200)
                except Exception:
                    return False

            if not wait_until(up, timeout=30):
                raise RuntimeError(f"{kind} did not start: {(work / 'log.txt').read_text()[-2000:]}")
            c0 = cpu_seconds(p.pid)
            w0 = time.monotonic()
            post_all(write, reqs)
            if not wait_until(lambda: sink.samples >= expected, timeout=300, interval=0.05):
                raise RuntimeError(f"{kind}: sink got {sink.samples} of {expected} samples")
            wall = time.monotonic() - w0
            cpu = cpu_seconds(p.pid) - c0
            rss_kb = int(next(ln.split()[1] for ln in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                              if ln.startswith("VmRSS")))
        finally:
            p.terminate()
            p.wait(10)
            sink.shutdown()
    return {"cpu": cpu, "wall": wall, "rss_mb": rss_kb / 1024, "delivered": sink.samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50, help="GPU nodes (8 GPUs, 23 metrics each)")
    ap.add_argument("--rounds", type=int, default=10, help="scrape rounds (the same series resent)")
    args = ap.parse_args()
    series = cluster_series(args.nodes)
    reqs = build_requests(series, args.rounds)
    total = len(series) * args.rounds
    kept = sum(1 for s in series if dict(s)["__name__"] in KEEP) * args.rounds
    have_vm = shutil.which("vmagent") is not None
    print(f"payload: {len(series)} series x {args.rounds} rounds = {total} samples in {len(reqs)} requests "
          f"({sum(map(len, reqs)) / 1e6:.1f} MB snappy)")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for scenario, expected in (("keep4", kept), ("passthrough", total)):
            res = {}
            for kind in ("gpu-relay", "vmagent") if have_vm else ("gpu-relay",):
                res[kind] = run_one(kind, scenario, reqs, expected, Path(td))
            rows.append((scenario, res))
    print()
    print(f"{'scenario':<12} {'program':<10} {'samples/CPU-s':>14} {'CPU s':>7} {'wall s':>7} {'RSS MB':>7}")
    for scenario, res in rows:
        for kind, r in res.items():
            print(f"{scenario:<12} {kind:<10} {total / r['cpu']:>14,.0f} {r['cpu']:>7.2f} {r['wall']:>7.2f} "
                  f"{r['rss_mb']:>7.1f}")
        if "vmagent" in res:
            ratio = res["vmagent"]["cpu"] / res["gpu-relay"]["cpu"]
            print(f"{'':<12} {'ratio':<10} gpu-relay does {ratio:.2f}x vmagent's samples per CPU-second "
                  f"({1e6 * res['gpu-relay']['cpu'] / total:.2f} vs {1e6 * res['vmagent']['cpu'] / total:.2f} "
                  f"us CPU per sample)")


if __name__ == "__main__":
    main()
