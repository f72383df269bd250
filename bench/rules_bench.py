"""What the waste rules cost a real Prometheus with 16,000 GPUs' series (issue 22, point 6).

A synthetic scrape target serves what gpu-exporter (12 DCGM fields and the compute-process count per
GPU) and gpu-jobwatch (per pod and per job) would serve for N GPUs on 8-GPU nodes, one 8-GPU job a
node, in a mix of states (training, idle, NCCL spin, finished-holding, stalled). The real
`prometheus` scrapes it every 15 s and evaluates deploy/monitoring/rules/*.rules.yaml as they are
(the waste group every minute); after a number of evaluations the bench reads
prometheus_rule_group_last_duration_seconds and prometheus_rule_evaluation_duration_seconds from its
/metrics and each rule's evaluationTime from /api/v1/rules, and prints a table.

    python bench/rules_bench.py                    # 16,000 GPUs, 5 evaluations (~7 minutes)
    python bench/rules_bench.py --gpus 2000 --evaluations 2

The 1-hour windows (job:activity:avg1h) hold only as many minutes as the run lasted; --evaluations 61
measures them full.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "monitoring" / "rules"

# GR_ENGINE, GPU_UTIL, TENSOR, DRAM, SM, POWER, PCIE_TX, PCIE_RX, compute processes
PROFILES = {
    "train": (0.95, 100, 0.55, 0.45, 0.9, 610, 3e8, 3e8, 1),
    "idle": (0, 0, 0, 0, 0, 72, 1e5, 1e5, 0),
    "spin": (1.0, 100, 0, 0.01, 1.0, 150, 1e6, 1e6, 1),
    "finished": (0, 0, 0, 0, 0, 70, 0, 0, 0),
    "stalled": (0.01, 0, 0, 0, 0, 80, 1e5, 1e5, 1),
}
MIX = ["train"] * 16 + ["idle"] * 2 + ["spin", "finished"] + ["stalled"]  # by node, repeating


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exposition(gpus: int, now: float) -> bytes:
    lines: list[str] = []
    nodes = gpus // 8
    for n in range(nodes):
        host = f"ip-10-{n // 250}-{n % 250}-1"
        state = MIX[n % len(MIX)]
        ns, job, pod = f"team-{n % 50}", f"job-{n}", f"job-{n}-node-0-0"
        gr, util, tensor, dram, sm, power, tx, rx, procs = PROFILES[state]
        for g in range(8):
            lb = (f'gpu="{g}",UUID="GPU-{n:05d}-{g}",pci_bus_id="00000000:{0x18 + g:02X}:00.0",device="nvidia{g}",'
                  f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",DCGM_FI_DRIVER_VERSION="570.124.06",'
                  f'container="main",namespace="{ns}",pod="{pod}"')
            for name, v in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gr), ("DCGM_FI_DEV_GPU_UTIL", util),
                            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", tensor), ("DCGM_FI_PROF_DRAM_ACTIVE", dram),
                            ("DCGM_FI_PROF_SM_ACTIVE", sm), ("DCGM_FI_DEV_POWER_USAGE", power),
                            ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 700), ("DCGM_FI_PROF_PCIE_TX_BYTES", tx),
                            ("DCGM_FI_PROF_PCIE_RX_BYTES", rx), ("DCGM_FI_DEV_GPU_TEMP", 55),
                            ("DCGM_FI_DEV_FB_USED", 40000), ("DCGM_FI_DEV_FB_FREE", 41000),
                            ("gpu_exporter_compute_processes", procs)):
                lines.append(f"{name}{{{lb}}} {v}")
        jl = f'namespace="{ns}",job_kind="TrainJob",job_name="{job}"'
        lines.append(f'gpu_pod_job_info{{namespace="{ns}",pod="{pod}",job_kind="TrainJob",job_name="{job}",'
                     f'rank="0",Hostname="{host}"}} 1')
        lines.append(f'gpu_pod_gpus_requested{{namespace="{ns}",pod="{pod}",job_kind="TrainJob",job_name="{job}",'
                     f'rank="0",Hostname="{host}"}} 8')
        lines.append(f'gpu_pod_main_container_terminated{{namespace="{ns}",pod="{pod}",job_kind="TrainJob",'
                     f'job_name="{job}",rank="0",Hostname="{host}"}} {1 if state == "finished" else 0}')
        advance = now - (7300 if state in ("stalled", "spin") else 30)
        for name, v in (("gpu_job_exempt", 0), ("gpu_job_progress_step", 1000), ("gpu_job_progress_max_step", 1000),
                        ("gpu_job_progress_total_steps", 10000), ("gpu_job_progress_ratio", 0.1),
                        ("gpu_job_progress_eta_seconds", 36000), ("gpu_job_progress_epoch", 1),
                        ("gpu_job_progress_last_report_timestamp_seconds", now),
                        ("gpu_job_progress_last_advance_timestamp_seconds", advance),
                        ("gpu_job_step_duration_seconds", 2.0), ("gpu_job_longest_recovered_pause_seconds", 540),
                        ("gpu_job_stall_threshold_seconds", 900), ("gpu_job_progress_resets_total", 0),
                        ("gpu_job_redone_steps_total", 0), ("gpu_job_progress_resets_without_advance", 0)):
            lines.append(f"{name}{{{jl}}} {v}")
        lines.append(f'gpu_job_progress_source_info{{{jl},source="trainjob_status"}} 1')
        for c in ("Suspended", "Complete", "Failed"):
            lines.append(f'gpu_job_condition{{{jl},condition="{c}"}} 0')
        for m in ("loss", "learning_rate"):
            lines.append(f'gpu_job_metric{{{jl},name="{m}",phase="train"}} 1.5')
            lines.append(f'gpu_job_metric_nonfinite{{{jl},name="{m}"}} 0')
        lines.append(f'gpu_node_price_usd_per_gpu_hour{{Hostname="{host}"}} 6.88')
    return ("\n".join(lines) + "\n").encode()


class Target:
    """Serves the exposition, re-rendered every 30 s (the timestamps move)."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.body = exposition(gpus, time.time())
        self.series = self.body.count(b"\n")
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = target.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.server.server_address[1]
        self.stop = threading.Event()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._refresh, daemon=True).start()

    def _refresh(self) -> None:
        while not self.stop.wait(30):
            self.body = exposition(self.gpus, time.time())


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return str(r.read().decode())


def metric(text: str, name: str, **labels: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if (line.startswith((name + "{", name + " "))
                and all(f'{k}="{v}"' in line for k, v in labels.items())):
            key, _, value = line.rpartition(" ")
            out.append((key, float(value)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16000)
    ap.add_argument("--evaluations", type=int, default=5, help="waste-group evaluations to wait for")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "prometheus")
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    target = Target(args.gpus)
    print(f"target: {args.gpus} GPUs, {target.series} series, {len(target.body) / 1e6:.1f} MB a scrape "
          f"(rendered in {time.monotonic() - t0:.1f} s)", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="rules-bench-"))
    port = free_port()
    (work / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "15s", "scrape_timeout": "14s", "evaluation_interval": "1m"},
        "rule_files": [str(RULES / "gpu-waste.rules.yaml"), str(RULES / "gpu-telemetry.rules.yaml")],
        "scrape_configs": [{"job_name": "gpu-exporter", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{target.port}"]}]}],
    }))
    proc = subprocess.Popen([args.prometheus, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=open(work / "log", "w"))  # noqa: SIM115
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60 * (args.evaluations + 5)
        iterations = 0.0
        while time.monotonic() < deadline:
            time.sleep(5)
            if proc.poll() is not None:
                raise SystemExit(f"prometheus exited: {(work / 'log').read_text()[-2000:]}")
            try:
                text = get(base + "/metrics")
            except OSError:
                continue
            group = f"{RULES}/gpu-waste.rules.yaml;gpu-waste"
            it = metric(text, "prometheus_rule_group_iterations_total", rule_group=group)
            iterations = it[0][1] if it else 0
            if iterations >= args.evaluations:
                break
        else:
            raise SystemExit(f"only {iterations} evaluations of the waste group")
        text = get(base + "/metrics")
        rules = json.loads(get(base + "/api/v1/rules"))["data"]["groups"]
    finally:
        proc.terminate()
        proc.wait(30)
        target.stop.set()
        target.server.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    head = metric(text, "prometheus_tsdb_head_series")[0][1]
    cpu = metric(text, "process_cpu_seconds_total")[0][1]
    rss = metric(text, "process_resident_memory_bytes")[0][1]
    print(f"\nPrometheus {get_version(args.prometheus)}: {args.gpus} GPUs, {head:.0f} head series, "
          f"{iterations:.0f} evaluations of the waste group; process CPU {cpu:.0f} s, RSS {rss / 2**20:.0f} MiB")
    print(f"\n{'rule group':<28}{'last duration':>16}{'rules':>8}")
    for g in rules:
        dur = metric(text, "prometheus_rule_group_last_duration_seconds", rule_group=f"{g['file']};{g['name']}")
        print(f"{g['name']:<28}{dur[0][1] * 1000 if dur else 0:>13.0f} ms{len(g['rules']):>8}")
    quantiles = metric(text, "prometheus_rule_evaluation_duration_seconds")
    print("\nprometheus_rule_evaluation_duration_seconds (every rule evaluation, all groups):")
    for key, v in quantiles:
        print(f"  {key:<70}{v * 1000:10.2f} ms")
    (waste,) = [g for g in rules if g["name"] == "gpu-waste"]
    print(f"\n{'gpu-waste rule':<44}{'last evaluation':>16}{'alerts':>8}")
    for r in sorted(waste["rules"], key=lambda r: -r["evaluationTime"]):
        print(f"{r.get('name', ''):<44}{r['evaluationTime'] * 1000:>13.1f} ms"
              f"{len(r.get('alerts', [])) if r['type'] == 'alerting' else '':>8}")
    return 0


def get_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).split()[2] if (out.stdout or out.stderr) else "?"


if __name__ == "__main__":
    sys.exit(main())
