"""--hpc-job-mapping-dir as dcgm-exporter 4.8.2's hpcMapper (issue 21 point 6): files named by GPU id
(or <gpu>.<GPU instance id>), one job id a line, one row set per job with an hpc_job attribute."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from exporter.collector import Collector
from exporter.counters_csv import parse_counters
from exporter.hpc import HpcJobMap
from exporter.settings import load_settings
from exporter.simulated import SimulatedBackend

CSV = "DCGM_FI_DEV_GPU_UTIL, gauge, util\n"


def test_reads_files_named_by_gpu_id_one_job_a_line(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("job1\njob2\n\n")
    (tmp_path / "2.1").write_text("mig-job\n")
    (tmp_path / "notes.txt").write_text("ignored\n")
    (tmp_path / "3").mkdir()
    (tmp_path / "1").write_text("")
    assert HpcJobMap(str(tmp_path)).read() == {"0": ["job1", "job2"], "2.1": ["mig-job"]}


def test_missing_directory_is_logged_once_and_picked_up_when_it_appears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "hpc"
    with caplog.at_level(logging.INFO, logger="exporter.hpc"):
        m = HpcJobMap(str(d))
        assert m.read() == {} and m.read() == {}
        d.mkdir()
        (d / "0").write_text("42\n")
        assert m.read() == {"0": ["42"]}
    assert sum("not found" in r.getMessage() for r in caplog.records) == 1


def test_each_mapped_job_repeats_the_gpus_series_with_hpc_job(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("1001\n1002\n")
    backend = SimulatedBackend(n_gpus=2, clock=lambda: 100.0)
    c = Collector(backend, parse_counters(CSV), "node-a", 5.0, hpc=HpcJobMap(str(tmp_path)))
    lines = [ln for ln in c.collect_once().text.decode().splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    gpu0 = [ln for ln in lines if ln.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="0"')]
    assert [ln.split('Hostname="node-a"')[1].split("}")[0] for ln in gpu0] == [',hpc_job="1001"', ',hpc_job="1002"']
    assert sum('gpu="1"' in ln and "hpc_job" not in ln for ln in lines) == 1


def test_hpc_flag_and_env_set_the_directory_without_a_no_effect_warning() -> None:
    s = load_settings(["--hpc-job-mapping-dir", "/var/run/hpc"], {})
    assert s.hpc_job_mapping_dir == "/var/run/hpc" and s.warnings == ()
    assert load_settings([], {"DCGM_HPC_JOB_MAPPING_DIR": "/x"}).hpc_job_mapping_dir == "/x"
