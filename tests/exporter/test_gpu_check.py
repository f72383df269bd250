"""scripts/gpu-check.sh without a GPU: valid bash, and its NVML probe pass runs against the fake
pynvml (GPU_CHECK_FAKE), printing the GPM permission state, three cycles' PROF values and the
per-GPU collection time, once as started and once under the DaemonSet's securityContext."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu-check.sh"


def run(mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_CHECK_FAKE": mode, "GPU_CHECK_PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env, check=False)


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
