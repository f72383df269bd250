"""gpu-check's checks against a running gpu-exporter (run by scripts/gpu-check.sh; not a module of the
programs).

Contract: one line a check, ``PASS|FAIL|SKIP <check>: <reason>``; exit 1 when any check FAILs, else 0.
Per entity (a GPU, or each MIG GPU instance of a MIG GPU): its series are present with dcgm-exporter's
labels, PROF ratios lie in 0..1, XID events are registered, compute processes are visible. Per GPU:
values agree with ``nvidia-smi --query-gpu`` within ``TOLERANCES``, NVLink series exist where NVLink
links are active. Under a load the script starts itself (``load.py``: torch fp16 matmul, else it says
it could not load the GPU): GPU_UTIL rises and the PROF activity ratios are non-zero. The exporter's
RSS and CPU stay within the DaemonSet's limits (read from deploy/daemonset.yaml). The kubelet socket
and dcgm-exporter's CSV paths (/etc/dcgm-exporter/*.csv) are checked where they exist.

Arguments: port, load seconds, load.py, exporter pid, exporter stderr file, DaemonSet manifest.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
CORE = ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"]
NOT_ON_MIG = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"}  # NVML has no utilisation in MIG mode
RATIOS = ["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
          "DCGM_FI_PROF_DRAM_ACTIVE"]
NVLINK = ["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"]
# nvidia-smi field -> (exporter series, absolute tolerance, relative tolerance, whole GPUs only)
TOLERANCES: dict[str, tuple[str, float, float, bool]] = {
    "temperature.gpu": ("DCGM_FI_DEV_GPU_TEMP", 3.0, 0.0, False),
    "power.draw": ("DCGM_FI_DEV_POWER_USAGE", 15.0, 0.10, False),
    "clocks.sm": ("DCGM_FI_DEV_SM_CLOCK", 60.0, 0.10, False),
    "clocks.mem": ("DCGM_FI_DEV_MEM_CLOCK", 60.0, 0.05, False),
    "memory.used": ("DCGM_FI_DEV_FB_USED", 256.0, 0.05, True),
    "utilization.gpu": ("DCGM_FI_DEV_GPU_UTIL", 30.0, 0.0, True),
}
BLIND = re.compile(r"compute process|hostPID", re.I)
XID_FAILED = re.compile(r"XID events unavailable|cannot watch XID events")
SKIPPED_ROW = re.compile(r"Skipping line \d+ \('(\w+)'\): (.*)")
CSV_NAMES = ("default-counters.csv", "dcp-metrics-included.csv", "1.x-compatibility-metrics.csv")
KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

Key = tuple[str, str]  # (gpu, GPU_I_ID or "")
Scrape = dict[str, list[tuple[dict[str, str], float]]]
results: list[str] = []


def report(status: str, check: str, reason: str) -> None:
    results.append(status)
    print(f"{status} {check}: {reason}", flush=True)


def where(key: Key) -> str:
    return f"gpu {key[0]}" + (f" GI {key[1]}" if key[1] else "")


def get(base: str, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return int(r.status), r.read().decode()


def scrape(base: str) -> Scrape:
    out: Scrape = {}
    for fam in text_string_to_metric_families(get(base, "/metrics")[1]):
        for s in fam.samples:
            name = fam.name if s.name.startswith("DCGM_") else s.name  # DCGM counters carry no _total
            out.setdefault(name, []).append((dict(s.labels), float(s.value)))
    return out


def by_entity(snap: Scrape, name: str) -> dict[Key, float]:
    return {(lb["gpu"], lb.get("GPU_I_ID", "")): v for lb, v in snap.get(name, [])}


def entities(snap: Scrape) -> list[Key]:
    keys = {k for name in snap if name.startswith("DCGM_FI_") for k in by_entity(snap, name)}
    return sorted(keys, key=lambda k: (int(k[0]), k[1]))


def wait_healthy(base: str, pid: int) -> bool:
    deadline, body = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        try:
            if get(base, "/health")[0] == 200:
                report("PASS", "health", "/health 200")
                return True
        except Exception as exc:  # 503 raises HTTPError; refused before bind
            body = str(exc)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            report("FAIL", "health", "the exporter exited before becoming healthy")
            return False
        time.sleep(0.5)
    report("FAIL", "health", f"not healthy within 30 s: {body}")
    return False


def check_series(snap: Scrape, keys: list[Key], mig_gpus: set[str], skipped: dict[str, str]) -> None:
    for key in keys:
        want = [n for n in CORE if not (key[1] and n in NOT_ON_MIG) and n not in skipped]
        missing = [n for n in want if key not in by_entity(snap, n)]
        bad = [f"{n}={v}" for n in RATIOS for k, v in by_entity(snap, n).items() if k == key and not 0 <= v <= 1]
        labels = [lb for name, samples in snap.items() if name.startswith("DCGM_FI_") for lb, _ in samples
                  if (lb["gpu"], lb.get("GPU_I_ID", "")) == key]
        mislabelled = [lb for lb in labels if list(lb)[:5] != LABELS]
        if not key[1] and key[0] in mig_gpus:
            report("FAIL", f"series {where(key)}", "a MIG GPU has GPU-level series besides its instances'")
        elif missing or bad or mislabelled:
            why = [f"missing {', '.join(missing)}"] if missing else []
            why += [f"outside 0..1: {', '.join(bad)}"] if bad else []
            why += [f"labels {list(mislabelled[0])}"] if mislabelled else []
            report("FAIL", f"series {where(key)}", "; ".join(why))
        else:
            report("PASS", f"series {where(key)}", f"{len(want)} core series, labels as dcgm-exporter's")


def nvidia_smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=False)
    return out.stdout if out.returncode == 0 else None


def check_values(base: str, keys: list[Key]) -> None:
    fields = ["uuid", *TOLERANCES]
    text = nvidia_smi(f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    snap = scrape(base)  # right after nvidia-smi: the same moment, as near as two readers get
    if text is None:
        report("SKIP", "nvidia-smi", "nvidia-smi not found or failed: values not cross-checked")
        return
    uuids = {lb["UUID"]: (lb["gpu"], lb.get("GPU_I_ID", "")) for lb, _ in snap.get("DCGM_FI_DEV_GPU_TEMP", [])}
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        values = dict(zip(fields, (c.strip() for c in row), strict=False))
        key = uuids.get(values["uuid"])
        if key is None:
            report("FAIL", f"nvidia-smi {values['uuid']}", "a GPU nvidia-smi lists has no series")
            continue
        off, compared = [], 0
        for field, (series, abs_tol, rel_tol, whole_only) in TOLERANCES.items():
            raw = values.get(field, "")
            if (whole_only and key[1]) or not re.fullmatch(r"-?\d+(\.\d+)?", raw):
                continue  # [N/A], [Not Supported], or per-instance where nvidia-smi is per GPU
            mine = by_entity(snap, series).get(key)
            if mine is None:
                continue  # absence is the series check's to report
            compared += 1
            if abs(mine - float(raw)) > max(abs_tol, rel_tol * abs(float(raw))):
                off.append(f"{series} {mine:g} vs nvidia-smi {field} {raw}")
        status = "FAIL" if off else "PASS"
        report(status, f"nvidia-smi gpu {key[0]}", "; ".join(off) if off else f"{compared} values within tolerance")


def check_nvlink(snap: Scrape, skipped: dict[str, str]) -> None:
    text = nvidia_smi("nvlink", "--status")
    if text is None:
        report("SKIP", "nvlink", "nvidia-smi nvlink --status unavailable")
        return
    uuid_gpu = {lb["UUID"]: lb["gpu"] for lb, _ in snap.get("DCGM_FI_DEV_GPU_TEMP", [])}
    active: dict[str, int] = {}
    current = ""
    for line in text.splitlines():
        m = re.match(r"GPU (\d+): .*\(UUID: ([^)]+)\)", line)
        if m:
            current = uuid_gpu.get(m.group(2), m.group(1))
            active.setdefault(current, 0)
        elif current and re.search(r"Link \d+: [\d.]+ GB/s", line):
            active[current] += 1
    for gpu, links in sorted(active.items(), key=lambda kv: int(kv[0])):
        if links == 0:
            report("SKIP", f"nvlink gpu {gpu}", "no active NVLink link on this board")
            continue
        have = [n for n in NVLINK if any(lb["gpu"] == gpu for lb, _ in snap.get(n, []))]
        why = "; ".join(f"{n}: {skipped[n]}" for n in NVLINK if n in skipped)
        if have:
            report("PASS", f"nvlink gpu {gpu}", f"{links} active links; {', '.join(have)}")
        else:
            report("FAIL", f"nvlink gpu {gpu}", f"{links} active links but no NVLink series ({why or 'none exported'})")


def check_xid(snap: Scrape, keys: list[Key], log: str) -> None:
    failed = [ln for ln in log.splitlines() if XID_FAILED.search(ln)]
    for key in keys:
        present = key in by_entity(snap, "DCGM_FI_DEV_XID_ERRORS")
        if present and not failed:
            report("PASS", f"xid {where(key)}", "XID events registered (DCGM_FI_DEV_XID_ERRORS served)")
        else:
            report("FAIL", f"xid {where(key)}", failed[0].strip() if failed else "no DCGM_FI_DEV_XID_ERRORS")


def check_processes(samples: list[Scrape], keys: list[Key], log: str, loaded: bool) -> None:
    blind = [ln for ln in log.splitlines() if BLIND.search(ln) and "WARNING" in ln]
    for key in keys:
        counts = [c for s in samples if (c := by_entity(s, "gpu_exporter_compute_processes").get(key)) is not None]
        if blind:
            report("FAIL", f"compute-processes {where(key)}", f"withheld: {blind[0].strip()}")
        elif not counts:
            report("SKIP", f"compute-processes {where(key)}", "the backend counts no processes for this entity")
        elif loaded and max(counts) < 1:
            report("FAIL", f"compute-processes {where(key)}", "0 processes seen while this script's load ran")
        else:
            report("PASS", f"compute-processes {where(key)}", f"visible (max {max(counts):g})")


def run_load(base: str, load_s: float, load_py: str, pid: int, usage: list[tuple[float, float, float]]) -> tuple[
        bool, list[Scrape]]:
    load = subprocess.Popen([sys.executable, load_py, str(load_s)], stdout=subprocess.PIPE, text=True)
    samples: list[Scrape] = []
    t_end = time.monotonic() + load_s
    time.sleep(min(8.0, load_s / 2))
    while time.monotonic() < t_end - 1 and load.poll() is None:
        samples.append(scrape(base))
        usage.append(proc_usage(pid))
        time.sleep(2.0)
    out, _ = load.communicate(timeout=load_s + 60)
    said = out.strip().splitlines()[-1] if out.strip() else ""
    if load.returncode == 0:
        report("PASS", "load", said or "matmul load ran")
        return True, samples
    if load.returncode == 3:
        report("SKIP", "load", f"could not load the GPU: {said}")
    else:
        report("FAIL", "load", f"the load process exited {load.returncode}: {said}")
    return False, samples


def check_under_load(idle: Scrape, samples: list[Scrape], keys: list[Key], loaded: bool) -> None:
    if not loaded:
        report("SKIP", "under-load", "no load ran: GPU_UTIL rise and PROF activity not asserted")
        return
    unavailable = {lb.get("field", ""): lb.get("reason", "")
                   for lb, _ in idle.get("gpu_exporter_field_unavailable", [])}
    for key in keys:
        checks: list[str] = []
        util = [v for s in samples if (v := by_entity(s, "DCGM_FI_DEV_GPU_UTIL").get(key)) is not None]
        if util and max(util) < max(30.0, by_entity(idle, "DCGM_FI_DEV_GPU_UTIL").get(key, 0.0) + 1):
            checks.append(f"GPU_UTIL peak {max(util):g} did not rise")
        prof = {n: max((by_entity(s, n).get(key, 0.0) for s in samples), default=0.0) for n in
                ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
                if any(key in by_entity(s, n) for s in samples)}
        checks += [f"{n} stayed 0 under load" for n, v in prof.items() if v <= 0.0]
        if checks:
            report("FAIL", f"under-load {where(key)}", "; ".join(checks))
        elif not prof:
            reason = unavailable.get("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "not served")
            report("SKIP", f"under-load PROF {where(key)}", f"no PROF fields ({reason}): needs SYS_ADMIN or "
                   "NVreg_RestrictProfilingToAdminUsers=0")
        else:
            report("PASS", f"under-load {where(key)}", " ".join(f"{n[13:]}={v:.3f}" for n, v in prof.items()))


def proc_usage(pid: int) -> tuple[float, float, float]:
    """(monotonic time, CPU seconds, RSS bytes) of the exporter process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(int(ln.split()[1]) * 1024 for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
               if ln.startswith("VmRSS:"))
    return time.monotonic(), cpu, rss


def quantity(text: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * mult
    return float(text)


def check_resources(usage: list[tuple[float, float, float]], manifest: str) -> None:
    docs = [d for d in yaml.safe_load_all(Path(manifest).read_text()) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    c = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "gpu-exporter")
    limits = c["resources"]["limits"]
    mem_limit, cpu_limit = quantity(limits["memory"]), quantity(limits["cpu"])
    if len(usage) < 2:
        report("SKIP", "resources", "too few samples of the exporter process")
        return
    rss = max(u[2] for u in usage)
    cpu = (usage[-1][1] - usage[0][1]) / max(usage[-1][0] - usage[0][0], 1e-9)
    status = "PASS" if rss < mem_limit and cpu < cpu_limit else "FAIL"
    report(status, "resources", f"RSS {rss / 2**20:.0f} MiB (limit {limits['memory']}), CPU {cpu * 1000:.0f}m "
           f"(limit {limits['cpu']}) over {usage[-1][0] - usage[0][0]:.0f} s, this script's load and scrapes included")


def check_kubelet_socket() -> None:
    path = os.environ.get("GPU_CHECK_KUBELET_SOCKET", KUBELET_SOCKET)
    if not os.path.exists(path):
        report("SKIP", "kubelet-socket", f"{path} absent (not a Kubernetes node): no pod attribution here")
        return
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(3)
            s.connect(path)
        report("PASS", "kubelet-socket", f"{path} accepts connections")
    except OSError as exc:
        report("FAIL", "kubelet-socket", f"{path}: {exc} (the DaemonSet runs as uid 0 for this socket)")


def check_dcgm_csvs(directory: str) -> None:
    from exporter.counters_csv import load_counters, shipped_text

    for name in CSV_NAMES:
        path = Path(directory) / name
        try:
            shipped = len([ln for ln in shipped_text(name).splitlines() if ln.strip() and not ln.startswith("#")])
        except Exception as exc:  # a missing resource: the wheel lacks the copy the image installs
            report("FAIL", f"dcgm-csv {name}", f"the exporter has no copy of it: {exc}")
            continue
        if not path.exists():
            report("SKIP", f"dcgm-csv {name}", f"{path} absent here (the image has it); the exporter's copy has "
                   f"{shipped} rows")
            continue
        try:
            rows = load_counters(str(path))
            report("PASS", f"dcgm-csv {name}", f"{path} loads ({len(rows)} fields)")
        except Exception as exc:
            report("FAIL", f"dcgm-csv {name}", f"{path}: {exc}")


def skipped_rows(log: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in (SKIPPED_ROW.search(ln) for ln in log.splitlines()) if m}


def main(argv: Iterable[str]) -> int:
    port, load_s, load_py, pid, err_file, manifest = list(argv)
    base = f"http://127.0.0.1:{port}"
    if not wait_healthy(base, int(pid)):
        return 1
    usage = [proc_usage(int(pid))]
    time.sleep(float(os.environ.get("GPU_CHECK_SETTLE_SECONDS", "2.5")))
    idle = scrape(base)
    log = Path(err_file).read_text(errors="replace")
    skipped = skipped_rows(log)
    keys = entities(idle)
    mig_gpus = {k[0] for k in keys if k[1]}
    if not keys:
        report("FAIL", "series", "no DCGM series at all")
        return 1
    check_series(idle, keys, mig_gpus, skipped)
    check_values(base, keys)
    check_nvlink(idle, skipped)
    check_xid(idle, keys, log)
    usage.append(proc_usage(int(pid)))
    loaded, samples = run_load(base, float(load_s), load_py, int(pid), usage)
    check_under_load(idle, samples, keys, loaded)
    log = Path(err_file).read_text(errors="replace")
    check_processes([idle, *samples], keys, log, loaded)
    usage.append(proc_usage(int(pid)))
    check_resources(usage, manifest)
    check_kubelet_socket()
    check_dcgm_csvs(os.environ.get("GPU_CHECK_DCGM_CSV_DIR", "/etc/dcgm-exporter"))
    failed = results.count("FAIL")
    print(f"gpu-check: {'PASS' if not failed else 'FAIL'} ({results.count('PASS')} passed, {failed} failed, "
          f"{results.count('SKIP')} skipped)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
