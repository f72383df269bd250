"""gpu-jobwatch scale benchmark: prints a table.

A fake Kubernetes API server (tests/jobwatch/fake_apiserver.py, in this process) holds 2,000 GPU
nodes, 5,000 GPU pods (500 TrainJobs x 10 ranks) plus 1,000 CPU pods, and 500 TrainJobs whose
``status.trainerStatus`` changes every 5 s (100 watch events a second), with 200 pod churn events a
minute (a pod deleted and its replacement created). The real ``gpu-jobwatch`` runs as a child
process against it. Measured:

- time from start until all 5,000 GPU pods are served (the initial paged list);
- RSS of gpu-jobwatch at the end and its peak (VmHWM); goal < 150 MB;
- CPU of gpu-jobwatch as a fraction of one core over the steady state, including the scrapes this
  benchmark makes; goal < 0.1;
- /metrics latency p50/p99 over one scrape every 2 s; goal < 200 ms;
- change visible: a TrainJob's step set to a unique value, time until /metrics shows it; goal < 5 s.

Run: ``.venv/bin/python bench/jobwatch_bench.py [--duration 120]``
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.jobwatch.fake_apiserver import (  # noqa: E402
    FakeAPIServer,
    gpu_pod,
    node,
    trainer_status,
    trainjob,
    trainjob_pod,
)

NODES, JOBS, RANKS, CPU_PODS = 2000, 500, 10, 1000
PROGRESS_PERIOD = 5.0
CHURN_PER_MINUTE = 200
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / CLK_TCK


def scrape(port: int) -> tuple[float, bytes]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read()
    conn.close()
    return time.perf_counter() - start, body


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def pod_node(j: int, i: int) -> str:
    return f"gpu-node-{(j * RANKS + i) % NODES}"


def populate(fake: FakeAPIServer) -> None:
    labels = {"node.kubernetes.io/instance-type": "p5.48xlarge", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
              "karpenter.sh/capacity-type": "on-demand"}
    for n in range(NODES):
        fake.apply("nodes", node(f"gpu-node-{n}", labels=labels))
    for j in range(JOBS):
        fake.apply("trainjobs", trainjob(f"job-{j}", f"team-{j % 50}", status=trainer_status(1, 100_000)))
        for i in range(RANKS):
            fake.apply("pods", trainjob_pod(f"job-{j}", i, f"team-{j % 50}", node=pod_node(j, i)))
    for c in range(CPU_PODS):
        fake.apply("pods", gpu_pod(f"web-{c}", f"team-{c % 50}", gpus=0))


class Driver:
    """Progress every 5 s per TrainJob, pod churn, and the visibility probes' own steps."""

    def __init__(self, fake: FakeAPIServer) -> None:
        self.fake = fake
        self.steps = [1] * JOBS
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.generation = [0] * (JOBS * RANKS)
        self.probing = -1

    def set_step(self, j: int, step: int) -> None:
        with self.lock:
            self.steps[j] = step
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.fake.apply("trainjobs", trainjob(f"job-{j}", f"team-{j % 50}", status=trainer_status(
                step, 100_000_000, at=at)))

    def progress(self) -> None:
        tick = PROGRESS_PERIOD / JOBS  # one TrainJob every 10 ms: each every 5 s
        j, next_at = 0, time.monotonic()
        while not self.stop.is_set():
            if j != self.probing:  # a probe's job keeps the probe's step until it is seen
                self.set_step(j, self.steps[j] + 7)
            j = (j + 1) % JOBS
            next_at += tick
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def churn(self) -> None:
        period = 120.0 / CHURN_PER_MINUTE  # a delete and an add: 2 events
        rnd = random.Random(7)
        next_at = time.monotonic()
        while not self.stop.is_set():
            k = rnd.randrange(JOBS * RANKS)
            j, i = divmod(k, RANKS)
            ns = f"team-{j % 50}"
            old = trainjob_pod(f"job-{j}", i, ns)
            gen = self.generation[k]
            name = old["metadata"]["name"] + (f"-r{gen}" if gen else "")
            self.fake.delete("pods", ns, name)
            self.generation[k] = gen + 1
            new = trainjob_pod(f"job-{j}", i, ns, node=pod_node(j, i))
            new["metadata"]["name"] += f"-r{gen + 1}"
            self.fake.apply("pods", new)
            next_at += period
            self.stop.wait(max(0.0, next_at - time.monotonic()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=120.0, help="steady-state seconds (default 120)")
    args = ap.parse_args()
    exe = Path(sys.executable).parent / "gpu-jobwatch"
    with tempfile.TemporaryDirectory() as tmp, FakeAPIServer(keep_events=50_000, max_watch_s=60) as fake:
        t0 = time.perf_counter()
        populate(fake)
        print(f"fake API server: {NODES} nodes, {JOBS * RANKS} GPU pods + {CPU_PODS} CPU pods, {JOBS} TrainJobs "
              f"({time.perf_counter() - t0:.1f} s to build)", flush=True)
        cfg = Path(tmp, "jobwatch.yaml")
        cfg.write_text("prices:\n  - {instance_type: p5.48xlarge, usd_per_instance_hour: 55.04, gpus: 8}\n")
        port = free_port()
        proc = subprocess.Popen([str(exe), "--kubeconfig", str(fake.kubeconfig(Path(tmp, "kc"))),
                                 "--listen", f"127.0.0.1:{port}", "--config", str(cfg), "--log-level", "warning"])
        try:
            started = time.monotonic()
            synced = None
            while time.monotonic() - started < 120:
                time.sleep(0.25)
                try:
                    _, body = scrape(port)
                except OSError:
                    continue
                if b"gpu_jobwatch_gpu_pods 5000" in body and b'job_name="job-499"' in body:
                    synced = time.monotonic() - started
                    break
            assert synced is not None, "gpu-jobwatch never served the 5,000 pods"
            driver = Driver(fake)
            threads = [threading.Thread(target=driver.progress, daemon=True),
                       threading.Thread(target=driver.churn, daemon=True)]
            for t in threads:
                t.start()
            time.sleep(5)  # let the event rate settle before measuring
            cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
            events0 = fake.rv
            latencies: list[float] = []
            visible: list[float] = []
            sizes: list[int] = []
            probe = 0
            end = wall0 + args.duration
            next_scrape = next_probe = wall0
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_scrape:
                    took, body = scrape(port)
                    latencies.append(took)
                    sizes.append(len(body))
                    next_scrape = now + 2.0
                if now >= next_probe:
                    probe += 1
                    j = (probe * 37) % JOBS
                    marker = 900_000_000 + probe
                    driver.probing = j
                    changed_at = time.monotonic()
                    driver.set_step(j, marker)
                    want = f'gpu_job_progress_step{{namespace="team-{j % 50}",job_kind="TrainJob",' \
                           f'job_name="job-{j}"}} {marker}'.encode()
                    while time.monotonic() - changed_at < 30:
                        _, body = scrape(port)
                        if want in body:
                            visible.append(time.monotonic() - changed_at)
                            break
                        time.sleep(0.1)
                    driver.probing = -1
                    next_probe = time.monotonic() + 4.0
                time.sleep(0.05)
            wall = time.monotonic() - wall0
            cpu = cpu_seconds(proc.pid) - cpu0
            events = fake.rv - events0
            rss, peak = rss_mb(proc.pid)
            driver.stop.set()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rows = [
        ("initial list until all 5,000 GPU pods served", f"{synced:.1f} s", ""),
        ("API events during the run", f"{events} ({events / wall:.0f}/s)", "100/s progress + 3.3/s churn"),
        ("RSS at the end / peak (VmHWM)", f"{rss:.0f} MB / {peak:.0f} MB", "< 150 MB"),
        ("CPU, fraction of one core (incl. the bench's scrapes)", f"{cpu / wall:.3f}", "< 0.1"),
        (f"/metrics latency p50 / p99 ({len(latencies)} scrapes, {statistics.median(sizes) / 1e6:.1f} MB)",
         f"{pct(latencies, 0.5) * 1e3:.0f} ms / {pct(latencies, 0.99) * 1e3:.0f} ms", "< 200 ms"),
        (f"change visible p50 / max ({len(visible)} probes)",
         f"{statistics.median(visible):.2f} s / {max(visible):.2f} s" if visible else "none seen", "< 5 s"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\ngpu-jobwatch, {wall:.0f} s steady state on {os.cpu_count()} CPUs")
    print(f"{'measure':<{width}}  {'value':<24}  goal")
    for name, value, goal in rows:
        print(f"{name:<{width}}  {value:<24}  {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
