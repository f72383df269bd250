"""scripts/gpu-check.sh without a GPU: valid bash; its NVML probe pass runs against the fake pynvml
(GPU_CHECK_FAKE), printing the GPM permission state, three cycles' PROF values and the per-GPU
collection time; and its checks run against the simulated backend (GPU_CHECK_BACKEND=simulated, a
launcher per case in GPU_CHECK_EXPORTER) with a fake `nvidia-smi` on PATH.

The fake nvidia-smi answers the two commands the script uses, in the formats NVIDIA documents:
``--query-gpu=<fields> --format=csv,noheader,nounits`` (one line a GPU, fields in the order asked,
``[N/A]`` where a value does not apply: utilisation in MIG mode) and ``nvlink --status`` (a
``GPU i: <name> (UUID: ...)`` line, then one ``Link n: <x> GB/s`` or ``Link n: <inactive>`` line a
link). A simulated GPU has no other source of truth, so its values are the ones the exporter serves
(read from its /metrics), shifted where a case says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port

SCRIPT = REPO_ROOT / "scripts" / "gpu-check.sh"

FAKE_SMI = r'''#!PYTHON
"""Fake nvidia-smi: --query-gpu (csv,noheader,nounits) and nvlink --status, from the exporter's /metrics."""
import os, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families

SERIES = {"uuid": None, "temperature.gpu": "DCGM_FI_DEV_GPU_TEMP", "power.draw": "DCGM_FI_DEV_POWER_USAGE",
          "clocks.sm": "DCGM_FI_DEV_SM_CLOCK", "clocks.mem": "DCGM_FI_DEV_MEM_CLOCK",
          "memory.used": "DCGM_FI_DEV_FB_USED", "utilization.gpu": "DCGM_FI_DEV_GPU_UTIL", "name": None}
text = urllib.request.urlopen(f"http://127.0.0.1:{os.environ['FAKE_SMI_PORT']}/metrics", timeout=5).read().decode()
gpus = {}  # gpu index -> {"uuid", "name", "mig", series -> [values of its entities]}
for fam in text_string_to_metric_families(text):
    for s in fam.samples:
        if "UUID" not in s.labels or not fam.name.startswith("DCGM_"):
            continue
        g = gpus.setdefault(int(s.labels["gpu"]), {"series": {}, "mig": False})
        g["uuid"], g["name"] = s.labels["UUID"], s.labels["modelName"]
        g["mig"] = g["mig"] or "GPU_I_ID" in s.labels
        g["series"].setdefault(fam.name, []).append(s.value)
offsets = {}
for spec in filter(None, os.environ.get("FAKE_SMI_OFFSET", "").split(",")):
    gpu, field, delta = spec.split(":")
    offsets[(int(gpu), field)] = float(delta)
pairs = filter(None, os.environ.get("FAKE_SMI_NVLINK", "").split(","))
links = {int(k): int(v) for k, v in (s.split(":") for s in pairs)}
args = sys.argv[1:]
if args[:2] == ["nvlink", "--status"]:
    for i, g in sorted(gpus.items()):
        print(f"GPU {i}: {g['name']} (UUID: {g['uuid']})")
        for n in range(18 if i in links else 0):
            print(f"\t Link {n}: {'26.562 GB/s' if n < links[i] else '<inactive>'}")
    sys.exit(0)
query = next(a.split("=", 1)[1] for a in args if a.startswith("--query-gpu="))
assert "--format=csv,noheader,nounits" in args, args
for i, g in sorted(gpus.items()):
    row = []
    for field in query.split(","):
        series = SERIES[field]
        if series is None:
            row.append(g[field if field != "name" else "name"])
        elif field == "utilization.gpu" and g["mig"]:
            row.append("[N/A]")
        else:
            values = g["series"].get(series, [])
            value = (sum(values) if field == "memory.used" else values[0]) if values else None
            row.append("[N/A]" if value is None else f"{value + offsets.get((i, field), 0.0):.2f}")
    print(", ".join(row))
'''

LAUNCHERS = {
    "two_gpus": "SimulatedBackend(n_gpus=2)",
    "pcie_pair": "SimulatedBackend(n_gpus=2, nvlink=False)",
    "all_mig": 'SimulatedBackend(n_gpus=2, mig={0: ["3g.71gb", "3g.71gb"], 1: ["7g.141gb"]})',
    "gpu1_without_util": "DropUtil(SimulatedBackend(n_gpus=2), gpu=1)",
}
LAUNCHER = '''import sys
from exporter.cli import main
from exporter.simulated import SimulatedBackend


class DropUtil:
    """The simulated backend, but one GPU never reports DCGM_FI_DEV_GPU_UTIL."""

    def __init__(self, inner, gpu):
        self._inner, self._gpu = inner, gpu

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def read(self, gpu, fields):
        out = self._inner.read(gpu, fields)
        if gpu != self._gpu:
            return out
        return {e: {k: v for k, v in vals.items() if k != "DCGM_FI_DEV_GPU_UTIL"} for e, vals in out.items()}


sys.exit(main(sys.argv[1:], backend_factory=lambda settings: BACKEND))
'''


def run(mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_CHECK_FAKE": mode, "GPU_CHECK_PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env, check=False)


def check(tmp_path: Path, case: str, **fake: str) -> tuple[int, dict[str, str]]:
    """Run the whole script on the simulated case; (exit code, {check name: its line})."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.replace("PYTHON", sys.executable, 1))
    smi.chmod(0o755)
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER.replace("BACKEND", LAUNCHERS[case]))
    port = free_port()
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_BACKEND": "simulated",
           "GPU_CHECK_EXPORTER": str(launcher), "GPU_CHECK_INTERVAL": "1s", "GPU_CHECK_LOAD_SECONDS": "4",
           "GPU_CHECK_PORT": str(port), "FAKE_SMI_PORT": str(port), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "GPU_CHECK_KUBELET_SOCKET": str(tmp_path / "no-kubelet.sock"),
           "GPU_CHECK_DCGM_CSV_DIR": str(tmp_path / "no-dcgm-dir"), **fake}
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=170, env=env, check=False)
    lines = {}
    for line in res.stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status in {"PASS", "FAIL", "SKIP"}:
            name, _, reason = rest.partition(": ")
            lines[name] = f"{status} {reason}"
    assert lines, res.stdout + res.stderr
    return res.returncode, lines


def test_gpu_check_is_valid_bash() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, check=False).returncode == 0


def test_probe_pass_prints_gpm_state_three_cycles_of_prof_and_collection_time() -> None:
    res = run("1")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "GPM permitted; 5 PROF fields" in out
    for cycle in (1, 2, 3):
        line = next(ln for ln in out.splitlines() if f"cycle {cycle} gpu 0: PROF" in ln)
        assert "GR_ENGINE_ACTIVE=0.993" in line  # the first cycle already has ratios
    assert "cycle 3 gpu 1: collection" in out and " ms" in out
    if os.getuid() == 0 and shutil.which("setpriv"):
        assert "DaemonSet securityContext" in out and "CapEff 0x0 (CAP_SYS_ADMIN no), NoNewPrivs 1" in out
    else:
        assert "second probe skipped" in out


@pytest.mark.parametrize("mode", ["refused"])
def test_probe_pass_says_when_profiling_is_refused_and_how_to_fix_it(mode: str) -> None:
    res = run(mode)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "GPM REFUSED (NO_PERMISSION); 0 PROF fields" in res.stdout
    assert "NVreg_RestrictProfilingToAdminUsers=0" in res.stdout
    assert "cycle 1 gpu 0: PROF (none)" in res.stdout


def test_two_healthy_gpus_pass_every_check_that_applies(tmp_path: Path) -> None:
    rc, lines = check(tmp_path, "two_gpus")
    assert rc == 0, lines
    for name in ("health", "series gpu 0", "series gpu 1", "nvidia-smi gpu 0", "nvidia-smi gpu 1", "xid gpu 0",
                 "compute-processes gpu 1", "resources"):
        assert lines[name].startswith("PASS"), (name, lines[name])
    assert lines["load"].startswith("SKIP could not load the GPU") or lines["load"].startswith("PASS")
    assert lines["kubelet-socket"].startswith("SKIP") and "absent" in lines["kubelet-socket"]
    assert lines["dcgm-csv dcp-metrics-included.csv"].startswith("SKIP")  # not on this machine; the copy is
    assert "limit 128Mi" in lines["resources"] and "limit 200m" in lines["resources"]
    assert lines["nvlink gpu 0"].startswith("SKIP no active NVLink")


def test_a_series_missing_on_one_of_two_gpus_fails_that_gpu(tmp_path: Path) -> None:
    rc, lines = check(tmp_path, "gpu1_without_util")
    assert rc == 1
    assert lines["series gpu 1"] == "FAIL missing DCGM_FI_DEV_GPU_UTIL"
    assert lines["series gpu 0"].startswith("PASS")


def test_an_all_mig_node_passes_per_gpu_instance(tmp_path: Path) -> None:
    rc, lines = check(tmp_path, "all_mig")
    assert rc == 0, lines
    for name in ("series gpu 0 GI 1", "series gpu 0 GI 2", "series gpu 1 GI 0", "xid gpu 0 GI 2",
                 "nvidia-smi gpu 0", "nvidia-smi gpu 1",
                 "compute-processes gpu 0 GI 1", "compute-processes gpu 0 GI 2", "compute-processes gpu 1 GI 0"):
        assert lines[name].startswith("PASS"), (name, lines[name])
    assert "series gpu 0" not in lines  # no whole-GPU entity on a MIG GPU


def test_a_value_off_from_nvidia_smi_fails_naming_both_values(tmp_path: Path) -> None:
    rc, lines = check(tmp_path, "two_gpus", FAKE_SMI_OFFSET="1:temperature.gpu:20")
    assert rc == 1
    assert lines["nvidia-smi gpu 1"].startswith("FAIL DCGM_FI_DEV_GPU_TEMP")
    assert "vs nvidia-smi temperature.gpu" in lines["nvidia-smi gpu 1"]
    assert lines["nvidia-smi gpu 0"].startswith("PASS")


def test_active_nvlink_without_nvlink_series_fails(tmp_path: Path) -> None:
    rc, lines = check(tmp_path, "pcie_pair", FAKE_SMI_NVLINK="0:18")
    assert rc == 1
    assert lines["nvlink gpu 0"].startswith("FAIL 18 active links but no NVLink series")
    assert lines["nvlink gpu 1"].startswith("SKIP")


def test_active_nvlink_with_the_simulated_sxm_boards_series_passes(tmp_path: Path) -> None:
    rc, lines = check(tmp_path, "two_gpus", FAKE_SMI_NVLINK="0:18,1:18")
    assert rc == 0, lines
    for gpu in (0, 1):
        line = lines[f"nvlink gpu {gpu}"]
        assert line.startswith("PASS 18 active links"), line
        for name in ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_NVLINK_TX_BYTES",
                     "DCGM_FI_PROF_NVLINK_RX_BYTES"):
            assert name in line, (name, line)
