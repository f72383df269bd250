"""The `promtool test rules` cases of deploy/monitoring/rules/gpu-waste.rules.yaml (issue 22, "What it
must show"), built here and written to tests/deploy/data/gpu-waste.test.yaml, which promtool
runs as it is:

    python -m tests.deploy.waste_cases            # rewrite the YAML after changing a case
    promtool test rules tests/deploy/data/gpu-waste.test.yaml

Each case is a timeline, one sample a minute, of what gpu-exporter and gpu-jobwatch serve: per GPU
a workload profile per minute (training, idle, NCCL spin, ...) rendered into the DCGM fields, and
per job its step, last-advance time, threshold and conditions as gpu-jobwatch reports them. At every
check time every waste alert (and the old GPUIdleWhileHeldByPod) is checked: the expected ones with
their full labels and annotations, all others silent. promql_expr_test pins the waste series.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TEST_FILE = ROOT / "tests" / "deploy" / "data" / "gpu-waste.test.yaml"
ALERTS = ["GPUHeldIdle", "GPUJobStalled", "GPUJobBusyHang", "GPUJobRankHang", "GPUJobFinishedHoldingGPUs",
          "GPUJobNoProgressAcrossRestarts", "GPUJobLossNonFinite", "GPUJobUnderutilized", "GPUIdleWhileHeldByPod"]
SEVERITY = {"GPUHeldIdle": "warning", "GPUJobStalled": "warning", "GPUJobBusyHang": "critical",
            "GPUJobRankHang": "critical", "GPUJobFinishedHoldingGPUs": "warning",
            "GPUJobNoProgressAcrossRestarts": "critical", "GPUJobLossNonFinite": "critical",
            "GPUJobUnderutilized": "info"}

# DCGM field values of each workload profile: GR_ENGINE, GPU_UTIL, TENSOR, DRAM, POWER (W), PCIe TX+RX
# each (B/s), compute processes. Enforced power limit 700 W (H100 SXM).
FIELDS = ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
          "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PCIE_TX_BYTES",
          "DCGM_FI_PROF_PCIE_RX_BYTES", "gpu_exporter_compute_processes"]
PROFILES: dict[str, tuple[float, ...]] = {
    "train": (0.95, 100, 0.55, 0.45, 610, 3e8, 3e8, 1),       # a healthy bf16 GEMM-heavy step loop
    "idle": (0, 0, 0, 0, 72, 1e5, 1e5, 1),                    # a CUDA context and nothing else
    "noproc": (0, 0, 0, 0, 70, 0, 0, 0),                      # no process at all (CPU-only pod, sleep)
    "spin": (1.0, 100, 0, 0.01, 150, 1e6, 1e6, 1),            # NCCL busy-wait: 100 % util, no work
    "checkpoint": (0, 0, 0, 0, 80, 2e6, 2e6, 1),              # saving from host memory: GPU quiet
    "eval": (0.03, 4, 0.01, 0.03, 120, 4e7, 4e7, 1),          # eval loop: low but not zero use
    "starved": (0.2, 25, 0.12, 0.1, 240, 5e7, 5e7, 1),        # data loader cannot keep up
    "fp32": (0.98, 100, 0, 0.35, 520, 2e8, 2e8, 1),           # FP32 CUDA cores, no tensor cores
    "busy": (0.9, 100, 0.3, 0.3, 450, 1e8, 1e8, 1),           # busy, no hang signature, no progress
    "notebook": (0.4, 45, 0.2, 0.2, 300, 1e8, 1e8, 4),        # one notebook of four running a cell
}
LIMIT_W = 700


def encode(values: list[float | None]) -> str:
    """promtool's expanding notation for one sample a minute: runs of a constant or a constant step
    as `a+bxN` (N+1 values), missing samples as `_`."""
    out: list[str] = []
    i = 0
    while i < len(values):
        v = values[i]
        if v is None:
            j = i
            while j + 1 < len(values) and values[j + 1] is None:
                j += 1
            out.append("_" if j == i else f"_x{j - i + 1}")  # `_xN` is N blanks (a number `axN` is N+1)
            i = j + 1
            continue
        j = i
        step = None
        while j + 1 < len(values) and values[j + 1] is not None:
            d = values[j + 1] - values[j]  # type: ignore[operator]
            if step is None:
                step = d
            elif not math.isclose(d, step, rel_tol=0, abs_tol=1e-9):
                break
            j += 1
        if j == i:
            out.append(num(v))
        elif step == 0:
            out.append(f"{num(v)}x{j - i}")
        else:
            out.append(f"{num(v)}{'+' if step >= 0 else '-'}{num(abs(step))}x{j - i}")  # type: ignore[arg-type]
        i = j + 1
    return " ".join(out)


def num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def timeline(*segments: tuple[Any, int]) -> list[Any]:
    out: list[Any] = []
    for value, minutes in segments:
        out += [value] * minutes
    return out


def labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"


@dataclass
class Case:
    name: str
    minutes: int
    series: list[dict[str, str]] = field(default_factory=list)
    checks: dict[int, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    exprs: list[dict[str, Any]] = field(default_factory=list)
    gpus_on: dict[str, int] = field(default_factory=dict)
    # GPUIdleWhileHeldByPod (GPU_UTIL 0 for 30 min, kept as it was) is checked too, except where it
    # rightly fires on a GPU held idle for over 30 minutes
    legacy_idle: bool = True

    def add(self, name: str, lb: dict[str, str], values: list[Any]) -> None:
        self.series.append({"series": name + labels(lb), "values": encode(values)})

    def gpu(self, host: str, profiles: list[str], *, namespace: str = "", pod: str = "",
            held_from: int = 0, uuid: str | None = None, extra: dict[str, str] | None = None,
            model: str = "NVIDIA H100 80GB HBM3") -> dict[str, str]:
        """One GPU (or MIG instance / time-slice holder): its DCGM series for the profile of each minute."""
        i = self.gpus_on.get(host, 0)
        self.gpus_on[host] = i + 1
        uuid = uuid or f"GPU-{host}-{i}"
        base = {"gpu": str(i), "UUID": uuid, "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0", "device": f"nvidia{i}",
                "modelName": model, "Hostname": host, "DCGM_FI_DRIVER_VERSION": "570.124.06",
                **(extra or {}), "job": "gpu-exporter", "instance": f"{host}:9400"}
        held = {**base, "container": "main", "namespace": namespace, "pod": pod}
        for k, name in enumerate(FIELDS):
            vals = [PROFILES[p][k] for p in profiles]
            if pod and held_from:
                self.add(name, base, vals[:held_from] + [None] * (len(vals) - held_from))
                self.add(name, held, [None] * held_from + vals[held_from:])
            else:
                self.add(name, held if pod else base, vals)
        self.add("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", held if pod and not held_from else base,
                 [LIMIT_W] * len(profiles))
        return {"Hostname": host, "gpu": str(i), "UUID": uuid}

    def pod(self, namespace: str, pod: str, kind: str, job: str, host: str, *, rank: str | None = None,
            gpus: float = 1, minutes: int | None = None) -> None:
        n = minutes or self.minutes
        info = {"namespace": namespace, "pod": pod, "job_kind": kind, "job_name": job, "Hostname": host}
        if rank is not None:
            info["rank"] = rank
        self.add("gpu_pod_job_info", {**info, "job": "gpu-jobwatch"}, [1] * n)
        self.add("gpu_pod_gpus_requested", {"namespace": namespace, "pod": pod, "job": "gpu-jobwatch"}, [gpus] * n)

    def progress(self, namespace: str, kind: str, job: str, steps: list[float], threshold: float | list[float], *,
                 total: float = 100000, source: str = "trainjob_status", report_every_minute: bool = False,
                 resets_without_advance: list[float] | None = None) -> None:
        """A job's progress series as gpu-jobwatch serves them, from its step at each minute."""
        jk = {"namespace": namespace, "job_kind": kind, "job_name": job, "job": "gpu-jobwatch"}
        last_advance: list[float] = []
        adv = 0.0
        for m, s in enumerate(steps):
            if m == 0 or s > steps[m - 1] or s < steps[m - 1]:  # an increase, or a restart began
                adv = 60.0 * m
            last_advance.append(adv)
        thr = threshold if isinstance(threshold, list) else [threshold] * len(steps)
        self.add("gpu_job_progress_step", jk, steps)
        self.add("gpu_job_progress_total_steps", jk, [total] * len(steps))
        self.add("gpu_job_progress_ratio", jk, [round(min(s / total, 1), 6) for s in steps])
        self.add("gpu_job_progress_last_advance_timestamp_seconds", jk, last_advance)
        # upstream: the trainer's lastUpdatedTime moves with each report; RHOAI: the controller's poll
        # time, which keeps moving while the step is frozen
        self.add("gpu_job_progress_last_report_timestamp_seconds", jk,
                 [60.0 * m for m in range(len(steps))] if report_every_minute else last_advance)
        self.add("gpu_job_stall_threshold_seconds", jk, thr)
        self.add("gpu_job_progress_source_info", {**jk, "source": source}, [1] * len(steps))
        resets = resets_without_advance or [0] * len(steps)
        self.add("gpu_job_progress_resets_without_advance", jk, resets)
        for cond in ("Suspended", "Complete", "Failed"):
            self.add("gpu_job_condition", {**jk, "condition": cond}, [0] * len(steps))

    def expect(self, minute: int, alert: str, *alerts: dict[str, Any]) -> None:
        self.checks.setdefault(minute, {})[alert] = list(alerts)

    def quiet_at(self, *minutes: int) -> None:
        for m in minutes:
            self.checks.setdefault(m, {})

    def value(self, minute: int, expr: str, *samples: tuple[dict[str, str], float]) -> None:
        """The waste series' values at a minute (a bare metric name keeps its __name__). Dollars are
        compared rounded to a tenth of a cent (promtool compares floats exactly; PromQL's round()
        computes as below)."""
        if "usd" in expr:
            expr = f"round({expr}, 0.001)"
            samples = tuple((lb, math.floor(v * 1000 + 0.5) / 1000) for lb, v in samples)
        name = re.fullmatch(r"([\w:]+)(?:\{.*\})?", expr)
        prefix = name.group(1) if name else ""
        self.exprs.append({"expr": expr, "eval_time": f"{minute}m",
                           "exp_samples": [{"labels": prefix + labels(lb), "value": v} for lb, v in samples]})

    def test(self) -> dict[str, Any]:
        tests = []
        for minute in sorted(self.checks):
            for alert in ALERTS:
                if alert == "GPUIdleWhileHeldByPod" and not self.legacy_idle:
                    continue
                tests.append({"eval_time": f"{minute}m", "alertname": alert,
                              "exp_alerts": self.checks[minute].get(alert, [])})
        out: dict[str, Any] = {"name": self.name, "interval": "1m", "input_series": self.series,
                               "alert_rule_test": tests}
        if self.exprs:
            out["promql_expr_test"] = self.exprs
        return out


def usd(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def held_idle(ns: str, kind: str, job: str, pod: str, host: str, gpus: float, price: float | None) -> dict[str, Any]:
    return {"exp_labels": {"severity": "warning", "namespace": ns, "job_kind": kind, "job_name": job, "pod": pod,
                           "Hostname": host},
            "exp_annotations": {
                "summary": f"{ns}/{pod} ({kind} {job}) holds {num(gpus)} GPU(s) on {host} that did nothing for 15 "
                           "minutes: free them (scale it down, delete it) or mark it gpu-telemetry.io/exempt",
                "usd_per_hour": usd(None if price is None else price * gpus)}}


def job_alert(alert: str, ns: str, kind: str, job: str, summary: str, usd_per_hour: float | None,
              **extra: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": SEVERITY[alert], "namespace": ns, "job_kind": kind, "job_name": job, **extra},
            "exp_annotations": {"summary": summary, "usd_per_hour": usd(usd_per_hour)}}


def duration(seconds: float) -> str:
    """Prometheus' humanizeDuration for whole seconds."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = ([f"{d}d"] if d else []) + ([f"{h}h"] if h or d else []) + ([f"{m}m"] if m or h or d else [])
    return " ".join([*parts, f"{s}s"])


def stalled(ns: str, kind: str, job: str, age: float, threshold: float, price: float | None) -> dict[str, Any]:
    return job_alert("GPUJobStalled", ns, kind, job,
                     f"{kind} {ns}/{job} has not advanced a step for {duration(age)}, past its stall threshold of "
                     f"{duration(threshold)}: check its log and stop it or let it resume from its checkpoint", price)


def busy_hang(ns: str, kind: str, job: str, gpus: int, price: float | None) -> dict[str, Any]:
    return job_alert("GPUJobBusyHang", ns, kind, job,
                     f"{kind} {ns}/{job} looks busy but is hung: {gpus} GPU(s) at full utilisation with no tensor, "
                     "memory or power work for 10 minutes (a collective waiting for a peer); take a stack dump "
                     "(py-spy dump) and restart it from its checkpoint", price)


def steps_linear(per_minute: float, minutes: int, start: float = 0) -> list[float]:
    return [start + per_minute * m for m in range(minutes)]


# -- the cases -----------------------------------------------------------------------------------------

P5 = 55.04 / 8  # $/GPU-hour on a p5.48xlarge at $55.04/hour for 8 GPUs


def weekend_stall() -> Case:
    """Friday 22:00: an 8-GPU fine-tune stops advancing at minute 61 and its GPUs spin busy-looking
    (NCCL busy-wait) until Monday 08:00 (58 h): busy-hang at +10 min, stalled at threshold + 2."""
    minutes = 61 + 58 * 60
    c = Case("weekend stall: 8 GPUs busy-looking from Friday night to Monday", minutes)
    ns, kind, job, host = "llm", "TrainJob", "llama-ft", "ip-10-0-1-5"
    profile = timeline(("train", 61), ("spin", minutes - 61))
    for _ in range(8):
        c.gpu(host, profile, namespace=ns, pod="llama-ft-node-0-0")
    c.pod(ns, "llama-ft-node-0-0", kind, job, host, rank="0", gpus=8)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [P5] * minutes)
    steps = timeline(*[(s, 1) for s in steps_linear(10, 61)], (600, minutes - 61))
    c.progress(ns, kind, job, steps, 900)
    # the step last rose at minute 60 (t = 3600 s); the GPUs spin from minute 61
    c.quiet_at(60, 70)
    c.expect(71, "GPUJobBusyHang", busy_hang(ns, kind, job, 8, 8 * P5))
    c.expect(76, "GPUJobBusyHang", busy_hang(ns, kind, job, 8, 8 * P5))
    c.expect(77, "GPUJobBusyHang", busy_hang(ns, kind, job, 8, 8 * P5))
    c.expect(77, "GPUJobStalled", stalled(ns, kind, job, 77 * 60 - 3600, 900, 8 * P5))
    end = minutes - 1
    c.expect(end, "GPUJobBusyHang", busy_hang(ns, kind, job, 8, 8 * P5))
    c.expect(end, "GPUJobStalled", stalled(ns, kind, job, end * 60 - 3600, 900, 8 * P5))
    c.value(70, "namespace:gpu_wasted:count")
    for t in (71, end):
        c.value(t, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "hung"}, 8))
        c.value(t, "namespace:gpu_wasted_usd_per_hour:sum", ({"namespace": ns, "reason": "hung"}, 55.04))
        c.value(t, "namespace:gpu_held:count", ({"namespace": ns}, 8))
    # GPU-hours wasted over the weekend, read as the dashboard does: one sample a minute
    c.value(end, "sum_over_time(namespace:gpu_wasted:count[58h]) / 60", ({"namespace": ns, "reason": "hung"},
                                                                         8 * (end - 71 + 1) / 60))
    return c


def stall_past_ceiling() -> Case:
    """A job whose step freezes while its GPUs stay busy without the hang signature (a loop that
    does work but never finishes a step): only the 2-hour ceiling catches it."""
    minutes = 200
    c = Case("stall past the 2-hour ceiling while the GPUs look busy", minutes)
    ns, kind, job, host = "vision", "PyTorchJob", "detr-train", "ip-10-0-2-7"
    profile = timeline(("train", 61), ("busy", minutes - 61))
    for _ in range(4):
        c.gpu(host, profile, namespace=ns, pod="detr-train-master-0")
    c.pod(ns, "detr-train-master-0", kind, job, host, rank="0", gpus=4)
    c.progress(ns, kind, job, timeline(*[(s, 1) for s in steps_linear(5, 61)], (300, minutes - 61)), 3600)
    c.quiet_at(60, 125, 181)
    c.expect(182, "GPUJobStalled", stalled(ns, kind, job, 182 * 60 - 3600, 3600, None))
    c.value(180, "namespace:gpu_wasted:count")
    c.value(181, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "stalled"}, 4))
    c.value(182, "namespace:gpu_wasted_usd_per_hour:sum")  # no price: GPU-hours only
    return c


def checkpoint_every_1000_steps() -> Case:
    """2 s steps, a 9-minute checkpoint every 1,000 steps (33 min) with the GPUs quiet: no alert.
    gpu-jobwatch's threshold: max(10 x 2 s, 1.5 x 9 min, 15 min) = 15 min."""
    minutes = 240
    c = Case("a 9-minute checkpoint every 1,000 steps: no alert", minutes)
    ns, kind, job, host = "llm", "TrainJob", "mistral-sft", "ip-10-0-3-9"
    profile: list[str] = []
    steps: list[float] = []
    s = 0.0
    while len(profile) < minutes:
        for _ in range(33):
            profile.append("train")
            s += 30
            steps.append(s)
        profile += ["checkpoint"] * 9
        steps += [s] * 9
    profile, steps = profile[:minutes], steps[:minutes]
    for _ in range(8):
        c.gpu(host, profile, namespace=ns, pod="mistral-sft-node-0-0")
    c.pod(ns, "mistral-sft-node-0-0", kind, job, host, rank="0", gpus=8)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [P5] * minutes)
    c.progress(ns, kind, job, steps, 900)
    c.quiet_at(*range(35, minutes, 7))
    c.value(41, "namespace:gpu_wasted:count")
    c.value(41, "namespace:gpu_held:count", ({"namespace": ns}, 8))
    return c


def eval_25_minutes() -> Case:
    """Every hour a 25-minute eval with low GPU use (3 % activity); the job survived one before, so
    gpu-jobwatch's threshold is 1.5 x 25 min: no stall, not idle, not underutilized."""
    minutes = 260
    c = Case("a 25-minute eval with low GPU use: no stall alert", minutes)
    ns, kind, job, host = "nlp", "TrainJob", "bert-large", "ip-10-0-4-2"
    profile: list[str] = []
    steps: list[float] = []
    s = 0.0
    while len(profile) < minutes:
        for _ in range(60):
            profile.append("train")
            s += 20
            steps.append(s)
        profile += ["eval"] * 25
        steps += [s] * 25
    profile, steps = profile[:minutes], steps[:minutes]
    for _ in range(2):
        c.gpu(host, profile, namespace=ns, pod="bert-large-node-0-0")
    c.pod(ns, "bert-large-node-0-0", kind, job, host, rank="0", gpus=2)
    c.progress(ns, kind, job, steps, 2250)
    c.quiet_at(70, 84, 85, 155, 169, 170, 254)
    c.value(84, "namespace:gpu_wasted:count")
    return c


def data_starved() -> Case:
    """A job that progresses with its GPUs 20 % busy (the data loader cannot keep up):
    GPUJobUnderutilized after the hour, nothing else."""
    minutes = 90
    c = Case("a data-starved job: underutilized only", minutes)
    ns, kind, job, host = "vision", "PyTorchJob", "resnet-imagenet", "ip-10-0-2-8"
    for _ in range(4):
        c.gpu(host, ["starved"] * minutes, namespace=ns, pod="resnet-imagenet-master-0")
    c.pod(ns, "resnet-imagenet-master-0", kind, job, host, rank="0", gpus=4)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [4.1] * minutes)
    c.progress(ns, kind, job, steps_linear(3, minutes), 900)
    under = job_alert("GPUJobUnderutilized", ns, kind, job,
                      f"{kind} {ns}/{job} progresses but kept its GPUs only 20% busy over the last hour: look at its "
                      "data loading (more workers, faster storage) and batch size, or give it fewer GPUs", 4 * 4.1)
    c.quiet_at(30, 59)
    c.expect(60, "GPUJobUnderutilized", under)
    c.expect(89, "GPUJobUnderutilized", under)
    c.value(89, "namespace:gpu_wasted:count")
    return c


def oom_restart() -> Case:
    """Minute 40: the container is OOM-killed, restarts (GPUs without a process for 3 minutes) and
    resumes from the checkpoint at step 3000 (the step went from 4000 back to 3000): no alert."""
    minutes = 120
    c = Case("an OOM restart resuming from a checkpoint: no alert", minutes)
    ns, kind, job, host = "llm", "TrainJob", "qwen-dpo", "ip-10-0-5-1"
    profile = timeline(("train", 40), ("noproc", 3), ("train", minutes - 43))
    for _ in range(8):
        c.gpu(host, profile, namespace=ns, pod="qwen-dpo-node-0-0")
    c.pod(ns, "qwen-dpo-node-0-0", kind, job, host, rank="0", gpus=8)
    steps = timeline(*[(s, 1) for s in steps_linear(100, 41)], (3000, 3),
                     *[(3000 + 100 * (m + 1), 1) for m in range(minutes - 44)])
    resets = timeline((0, 41), (1, 11), (0, minutes - 52))  # back to 0 once past step 4000 (minute 54)
    c.progress(ns, kind, job, steps, [900] * 41 + [1800] * 30 + [900] * (minutes - 71),
               resets_without_advance=resets)
    c.quiet_at(43, 50, 58, 75, 119)
    c.value(58, "namespace:gpu_wasted:count")
    return c


def crash_loop() -> Case:
    """The job crashes every 10 minutes before it reaches the step it had: the third restart
    without a new highest step fires GPUJobNoProgressAcrossRestarts."""
    minutes = 70
    c = Case("a crash loop: no progress across restarts", minutes)
    ns, kind, job, host = "llm", "TrainJob", "gemma-pt", "ip-10-0-5-2"
    profile = timeline(("train", 30), *[seg for _ in range(4) for seg in (("noproc", 2), ("train", 8))])
    for _ in range(8):
        c.gpu(host, profile[:minutes], namespace=ns, pod="gemma-pt-node-0-0")
    c.pod(ns, "gemma-pt-node-0-0", kind, job, host, rank="0", gpus=8)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [P5] * minutes)
    steps = steps_linear(100, 31)  # to 3000 at minute 30
    resets: list[float] = [0] * 31
    n = 0
    while len(steps) < minutes:
        n += 1
        steps += [2000] * 2 + [2000 + 100 * (m + 1) for m in range(8)]  # resumes at 2000, dies at 2800
        resets += [n] * 10
    c.progress(ns, kind, job, steps[:minutes], 1800, resets_without_advance=resets[:minutes])
    crash = job_alert("GPUJobNoProgressAcrossRestarts", ns, kind, job,
                      f"{kind} {ns}/{job} restarted 3 times without getting past its highest step: a crash loop; "
                      "read the last pod's log before it is restarted again", 8 * P5)
    c.quiet_at(30, 50)
    c.expect(51, "GPUJobNoProgressAcrossRestarts", crash)
    return c


def nccl_hang_all_ranks() -> Case:
    """Two 4-GPU pods of a PyTorchJob without a progress source; at minute 31 every rank spins in
    an all-reduce (100 % util, no work): busy-hang at +10, the old idle alert silent."""
    minutes = 100
    c = Case("an all-rank NCCL hang: busy-hang, the old idle alert silent", minutes)
    ns, kind, job = "llm", "PyTorchJob", "gpt-pretrain"
    profile = timeline(("train", 31), ("spin", minutes - 31))
    for r, host in enumerate(("ip-10-0-6-1", "ip-10-0-6-2")):
        pod = f"gpt-pretrain-{'master' if r == 0 else 'worker'}-0"
        for _ in range(4):
            c.gpu(host, profile, namespace=ns, pod=pod)
        c.pod(ns, pod, kind, job, host, rank=str(r), gpus=4)
    c.quiet_at(30, 40)
    for t in (41, 99):
        c.expect(t, "GPUJobBusyHang", busy_hang(ns, kind, job, 8, None))
    c.value(41, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "hung"}, 8))
    return c


def one_hung_rank_of_16() -> Case:
    """16 ranks, one GPU each, on two nodes; at minute 31 rank 11 stops (its GPU goes quiet) and
    the other 15 spin waiting for it: RankHang names its pod and node; no BusyHang."""
    minutes = 60
    c = Case("one hung rank of 16: RankHang names its pod and Hostname", minutes)
    ns, kind, job = "llm", "TrainJob", "mixtral-ft"
    for r in range(16):
        host = "ip-10-0-7-1" if r < 8 else "ip-10-0-7-2"
        pod = f"mixtral-ft-node-{r}-0"
        profile = timeline(("train", 31), ("idle" if r == 11 else "spin", minutes - 31))
        c.gpu(host, profile, namespace=ns, pod=pod)
        c.pod(ns, pod, kind, job, host, rank=str(r), gpus=1)
        c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [P5] * minutes) \
            if r in (0, 8) else None
    c.progress(ns, kind, job, timeline(*[(s, 1) for s in steps_linear(10, 31)], (300, minutes - 31)), 1800)
    rank = job_alert("GPUJobRankHang", ns, kind, job,
                     f"Rank 11 of {kind} {ns}/{job} (pod mixtral-ft-node-11-0 on ip-10-0-7-2) stopped while the other "
                     "ranks wait for it in a collective: look at that pod and node first (its log, XIDs, NCCL), then "
                     "restart the job", 16 * P5, pod="mixtral-ft-node-11-0", rank="11", Hostname="ip-10-0-7-2")
    c.quiet_at(30, 40)
    c.expect(41, "GPUJobRankHang", rank)
    c.expect(59, "GPUJobRankHang", rank)
    c.value(41, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "hung"}, 16))
    c.value(41, "namespace:gpu_wasted_usd_per_hour:sum", ({"namespace": ns, "reason": "hung"}, 16 * P5))
    return c


def healthy_gemm_24h() -> Case:
    minutes = 24 * 60 + 1
    c = Case("a healthy GEMM run for 24 h: nothing", minutes)
    ns, kind, job, host = "llm", "TrainJob", "llama-pt", "ip-10-0-8-1"
    for _ in range(8):
        c.gpu(host, ["train"] * minutes, namespace=ns, pod="llama-pt-node-0-0")
    c.pod(ns, "llama-pt-node-0-0", kind, job, host, rank="0", gpus=8)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [P5] * minutes)
    c.progress(ns, kind, job, steps_linear(10, minutes), 900, total=1e6)
    c.quiet_at(*range(0, minutes, 120), minutes - 1)
    c.value(minutes - 1, "namespace:gpu_wasted:count")
    c.value(minutes - 1, "namespace:gpu_held:count", ({"namespace": ns}, 8))
    return c


def fp32_non_tensor() -> Case:
    minutes = 120
    c = Case("an FP32 non-tensor job: no busy-hang", minutes)
    ns, kind, job, host = "science", "Job", "cfd-solver", "ip-10-0-8-2"
    for _ in range(4):
        c.gpu(host, ["fp32"] * minutes, namespace=ns, pod="cfd-solver-x7k2p")
    c.pod(ns, "cfd-solver-x7k2p", kind, job, host, gpus=4)
    c.progress(ns, kind, job, steps_linear(2, minutes), 900)
    c.quiet_at(15, 30, 60, 119)
    c.value(119, "namespace:gpu_wasted:count")
    return c


def finished_holding() -> Case:
    """A TrainJob reaches 100 % at minute 30 and its container sleeps on its 2 GPUs; a batch Job's
    main container ends at minute 30 while a sidecar keeps the pod: both finished-holding at +10,
    never GPUHeldIdle, never stalled."""
    minutes = 80
    c = Case("a finished job sleeping on its GPUs", minutes)
    ns, host = "nlp", "ip-10-0-9-1"
    profile = timeline(("train", 31), ("noproc", minutes - 31))
    for _ in range(2):
        c.gpu(host, profile, namespace=ns, pod="t5-ft-node-0-0")
    c.pod(ns, "t5-ft-node-0-0", "TrainJob", "t5-ft", host, rank="0", gpus=2)
    c.progress(ns, "TrainJob", "t5-ft", timeline(*[(s, 1) for s in steps_linear(100, 31)], (3000, minutes - 31)),
               900, total=3000)
    c.gpu(host, profile, namespace=ns, pod="embed-batch-9xq2w")
    c.pod(ns, "embed-batch-9xq2w", "Job", "embed-batch", host, gpus=1)
    c.add("gpu_pod_main_container_terminated", {"namespace": ns, "pod": "embed-batch-9xq2w", "reason": "Completed",
                                                "job": "gpu-jobwatch"}, timeline((0, 31), (1, minutes - 31)))
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [3.0] * minutes)

    def fin(kind: str, job: str, pod: str, gpus: int) -> dict[str, Any]:
        return job_alert("GPUJobFinishedHoldingGPUs", ns, kind, job,
                         f"{kind} {ns}/{job} finished, but pod {pod} still holds {gpus} idle GPU(s) on {host}: delete "
                         "the pod or fix what keeps it running after training (a sidecar, a sleep)", 3.0 * gpus,
                         pod=pod, Hostname=host)

    c.quiet_at(30, 40)
    for t in (41, 79):
        c.expect(t, "GPUJobFinishedHoldingGPUs", fin("TrainJob", "t5-ft", "t5-ft-node-0-0", 2),
                 fin("Job", "embed-batch", "embed-batch-9xq2w", 1))
    c.value(31, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "finished_holding"}, 3))
    c.value(79, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "finished_holding"}, 3))
    c.value(79, "namespace:gpu_wasted_usd_per_hour:sum", ({"namespace": ns, "reason": "finished_holding"}, 9))
    c.legacy_idle = False
    return c


def notebooks_time_sliced() -> Case:
    """Two GPUs time-sliced four ways (the exporter's --kubernetes-virtual-gpus: one series per
    holder). On the first all four notebooks are idle: each is flagged with a quarter GPU. On the
    second one notebook runs a cell: the GPU is not idle, so none of its four is."""
    minutes = 40
    c = Case("four notebooks sharing a time-sliced GPU", minutes)
    ns, kind, host, price = "research", "StatefulSet", "ip-10-0-10-1", 2.0
    for g, profile in enumerate(("idle", "notebook")):
        uuid = f"GPU-ts-{g}"
        for v in range(4):
            nb = f"nb-{4 * g + v}"
            c.gpus_on[host] = g
            c.gpu(host, [profile] * minutes, namespace=ns, pod=f"{nb}-0", uuid=uuid, extra={"vgpu": str(v)})
            c.pod(ns, f"{nb}-0", kind, nb, host, rank="0", gpus=1)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [price] * minutes)
    c.quiet_at(14)
    for t in (15, 39):
        c.expect(t, "GPUHeldIdle", *[held_idle(ns, kind, f"nb-{v}", f"nb-{v}-0", host, 0.25, price) for v in range(4)])
    c.value(15, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "idle"}, 1))
    c.value(15, "namespace:gpu_held:count", ({"namespace": ns}, 2))
    c.value(15, "namespace:gpu_wasted_usd_per_hour:sum", ({"namespace": ns, "reason": "idle"}, 2))
    c.value(15, 'pod:gpu_wasted:count{pod="nb-2-0"}', ({"namespace": ns, "job_kind": kind, "job_name": "nb-2",
                                                       "pod": "nb-2-0", "Hostname": host, "reason": "idle"}, 0.25))
    c.legacy_idle = False
    return c


def cpu_only_deployment() -> Case:
    """A Deployment's pod that holds a GPU and never starts a CUDA process: GPUHeldIdle at 15 min.
    A second pod lands at minute 20 on a GPU that was already idle: flagged at 35, not before.
    A third, exempt (gpu-telemetry.io/exempt), is never flagged or counted as waste."""
    minutes = 50
    c = Case("a CPU-only Deployment holding a GPU", minutes)
    ns, host = "web", "ip-10-0-11-1"
    c.gpu(host, ["noproc"] * minutes, namespace=ns, pod="api-7d9f8-abcde")
    c.pod(ns, "api-7d9f8-abcde", "Deployment", "api", host, gpus=1)
    c.gpu(host, ["noproc"] * minutes, namespace=ns, pod="search-5c6b7-fghij", held_from=20)
    c.pod(ns, "search-5c6b7-fghij", "Deployment", "search", host, gpus=1)
    c.gpu(host, ["noproc"] * minutes, namespace=ns, pod="reserve-0")
    c.pod(ns, "reserve-0", "StatefulSet", "reserve", host, gpus=1)
    c.add("gpu_job_exempt", {"namespace": ns, "job_kind": "StatefulSet", "job_name": "reserve",
                             "job": "gpu-jobwatch"}, [1] * minutes)
    api = held_idle(ns, "Deployment", "api", "api-7d9f8-abcde", host, 1, None)
    search = held_idle(ns, "Deployment", "search", "search-5c6b7-fghij", host, 1, None)
    c.quiet_at(14)
    c.expect(15, "GPUHeldIdle", api)
    c.expect(34, "GPUHeldIdle", api)
    c.expect(35, "GPUHeldIdle", api, search)
    c.expect(49, "GPUHeldIdle", api, search)
    c.value(49, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "idle"}, 2))
    c.value(49, "namespace:gpu_held:count", ({"namespace": ns}, 3))
    c.legacy_idle = False
    return c


def p5_dollars() -> Case:
    """A p5.48xlarge ($55.04/hour, 8 GPUs: $6.88 a GPU-hour from OpenCost's node_gpu_hourly_cost,
    which wins over the $6.00 configured in gpu-jobwatch) whose 8 GPUs sit idle, and a MIG 3g.40gb
    instance (3/7 of an H100, priced at 3/7 of its GPU) idle on another node."""
    minutes = 40
    c = Case("dollars for a p5.48xlarge at $55.04/hour/8 GPUs", minutes)
    ns, host, mig_host = "llm", "ip-10-0-12-1", "ip-10-0-12-2"
    for _ in range(8):
        c.gpu(host, ["idle"] * minutes, namespace=ns, pod="vllm-0")
    c.pod(ns, "vllm-0", "StatefulSet", "vllm", host, gpus=8)
    c.add("node_gpu_hourly_cost", {"node": host, "instance": "opencost:9003", "instance_type": "p5.48xlarge",
                                   "job": "opencost"}, [P5] * minutes)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [6.0] * minutes)
    c.gpu(mig_host, ["idle"] * minutes, namespace=ns, pod="embed-0",
          extra={"GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "1"})
    c.pod(ns, "embed-0", "StatefulSet", "embed", mig_host, gpus=3 / 7)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": mig_host, "job": "gpu-jobwatch"}, [P5] * minutes)
    c.quiet_at(14)
    c.expect(15, "GPUHeldIdle", held_idle(ns, "StatefulSet", "vllm", "vllm-0", host, 8, P5),
             held_idle(ns, "StatefulSet", "embed", "embed-0", mig_host, 3 / 7, P5))
    c.value(15, "namespace:gpu_wasted_usd_per_hour:sum", ({"namespace": ns, "reason": "idle"}, 55.04 + P5 * 3 / 7))
    c.value(15, 'pod:gpu_wasted_usd_per_hour:sum{pod="vllm-0"}',
            ({"namespace": ns, "job_kind": "StatefulSet", "job_name": "vllm", "pod": "vllm-0", "Hostname": host,
              "reason": "idle"}, 55.04))
    c.value(15, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "idle"}, 8 + 3 / 7))
    c.value(15, "node:gpu_price_usd_per_gpu_hour:max", ({"Hostname": host}, P5), ({"Hostname": mig_host}, P5))
    c.legacy_idle = False
    return c


def rhoai_frozen_step() -> Case:
    """RHOAI: the controller's poll time (lastUpdatedTime) moves every minute while currentStep is
    frozen from minute 31 and the GPUs are quiet: idle at +15, then stalled once the 20-minute
    threshold passes (stalled outranks idle, so GPUHeldIdle resolves)."""
    minutes = 70
    c = Case("an RHOAI job whose lastUpdatedTime moves while its step does not", minutes)
    ns, kind, job, host = "rhoai-demo", "TrainJob", "granite-ft", "ip-10-0-13-1"
    profile = timeline(("train", 31), ("idle", minutes - 31))
    for _ in range(4):
        c.gpu(host, profile, namespace=ns, pod="granite-ft-node-0-0")
    c.pod(ns, "granite-ft-node-0-0", kind, job, host, rank="0", gpus=4)
    c.add("gpu_node_price_usd_per_gpu_hour", {"Hostname": host, "job": "gpu-jobwatch"}, [P5] * minutes)
    c.progress(ns, kind, job, timeline(*[(s, 1) for s in steps_linear(10, 31)], (300, minutes - 31)), 1200,
               source="rhoai_annotation", report_every_minute=True)
    c.quiet_at(45, 51)
    c.expect(46, "GPUHeldIdle", held_idle(ns, kind, job, "granite-ft-node-0-0", host, 4, P5))
    c.expect(50, "GPUHeldIdle", held_idle(ns, kind, job, "granite-ft-node-0-0", host, 4, P5))
    # last advance at 1800 s; 1800 + 1200 = minute 50: stalled from 51, firing (for 1m) at 52
    c.expect(52, "GPUJobStalled", stalled(ns, kind, job, 52 * 60 - 1800, 1200, 4 * P5))
    c.expect(69, "GPUJobStalled", stalled(ns, kind, job, 69 * 60 - 1800, 1200, 4 * P5))
    c.value(50, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "idle"}, 4))
    c.value(51, "namespace:gpu_wasted:count", ({"namespace": ns, "reason": "stalled"}, 4))
    c.legacy_idle = False
    return c


def nan_loss() -> Case:
    """The loss turns NaN at minute 20 and stays: GPUJobLossNonFinite 2 minutes later. Another job's
    eval_loss is NaN in one report only, and a third's grad_norm: no alert."""
    minutes = 40
    c = Case("a NaN loss", minutes)
    ns, host = "nlp", "ip-10-0-14-1"
    for job in ("opt-ft", "opt-eval", "opt-gn"):
        c.gpu(host, ["train"] * minutes, namespace=ns, pod=f"{job}-node-0-0")
        c.pod(ns, f"{job}-node-0-0", "TrainJob", job, host, rank="0", gpus=1)
        c.progress(ns, "TrainJob", job, steps_linear(10, minutes), 900)
    jk = {"namespace": ns, "job_kind": "TrainJob", "job": "gpu-jobwatch"}
    c.add("gpu_job_metric_nonfinite", {**jk, "job_name": "opt-ft", "name": "loss"}, timeline((0, 20), (1, 20)))
    c.add("gpu_job_metric_nonfinite", {**jk, "job_name": "opt-eval", "name": "eval_loss"},
          timeline((0, 20), (1, 1), (0, 19)))
    c.add("gpu_job_metric_nonfinite", {**jk, "job_name": "opt-gn", "name": "grad_norm"}, timeline((0, 20), (1, 20)))
    nan = job_alert("GPUJobLossNonFinite", ns, "TrainJob", "opt-ft",
                    "TrainJob nlp/opt-ft reports a NaN/Inf loss: training has diverged; stop it and resume from an "
                    "earlier checkpoint with a lower learning rate", None, name="loss")
    c.quiet_at(21)
    c.expect(22, "GPUJobLossNonFinite", nan)
    c.expect(39, "GPUJobLossNonFinite", nan)
    return c


CASES = [weekend_stall, stall_past_ceiling, checkpoint_every_1000_steps, eval_25_minutes, data_starved, oom_restart,
         crash_loop, nccl_hang_all_ranks, one_hung_rank_of_16, healthy_gemm_24h, fp32_non_tensor, finished_holding,
         notebooks_time_sliced, cpu_only_deployment, p5_dollars, rhoai_frozen_step, nan_loss]


def build() -> str:
    spec = {
        "rule_files": ["../../../deploy/monitoring/rules/gpu-waste.rules.yaml",
                       "../../../deploy/monitoring/rules/gpu-telemetry.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [case().test() for case in CASES],
    }
    header = ("# GENERATED by `python -m tests.deploy.waste_cases` (tests/deploy/waste_cases.py says what each case\n"
              "# is); run it with: promtool test rules tests/deploy/data/gpu-waste.test.yaml\n")
    return header + yaml.safe_dump(spec, sort_keys=False, width=120)


if __name__ == "__main__":
    TEST_FILE.parent.mkdir(parents=True, exist_ok=True)
    TEST_FILE.write_text(build())
    print(f"wrote {TEST_FILE}", file=sys.stderr)
