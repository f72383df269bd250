"""End to end: the real gpu-exporter process (simulated 8 x H200), scraped and checked by
`promtool check metrics`; OpenMetrics (--enable-openmetrics) parsed by prometheus_client's strict
parser; SIGTERM."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.helpers import free_port, require_binary, wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SERIES = [
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",  # the simulated board is an HGX H200 SXM (NVLink)
]
DCGM_COUNTERS = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
}
LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
# What dcgm-exporter's own schema makes promtool say (and nothing else is allowed):
INHERENT = [
    re.compile(r"^(DCGM_FI_\w+) label names should be written in 'snake_case' not 'camelCase'$"),
    re.compile(r'^(DCGM_FI_\w+) counter metrics should have "_total" suffix$'),
    re.compile(r"^(DCGM_FI_DEV_PCIE_REPLAY_COUNTER) metric name should not include type 'counter'$"),
]
SERIES = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


def exporter_cmd() -> list[str]:
    script = ROOT / ".venv" / "bin" / "gpu-exporter"
    return [str(script)] if script.exists() else [sys.executable, "-m", "exporter.cli"]


def scrape(port: int, path: str = "/metrics", accept: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def healthy(port: int) -> bool:
    try:
        return scrape(port, "/health")[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def exporter() -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = {**os.environ, "NODE_NAME": "node-e2e", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*exporter_cmd(), "--backend", "simulated", "--simulate-gpus", "8", "--listen", f"127.0.0.1:{port}",
         "--interval", "200ms", "--enable-openmetrics"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert wait_until(lambda: healthy(port) or proc.poll() is not None, timeout=20), "exporter not up"
        assert proc.poll() is None, proc.communicate()[1]
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_promtool_finds_nothing_beyond_dcgm_schema(exporter: tuple[subprocess.Popen[str], int]) -> None:
    promtool = require_binary("promtool")
    _, body = scrape(exporter[1])
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True,
                         timeout=30)
    problems = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert not [p for p in problems if "gpu_exporter_" in p]
    unexpected = []
    for p in problems:
        m = next((r.match(p) for r in INHERENT if r.match(p)), None)
        if m is None or ("_total" in p and m.group(1) not in DCGM_COUNTERS):
            unexpected.append(p)
    assert unexpected == []


def test_all_default_series_present_with_exact_labels(exporter: tuple[subprocess.Popen[str], int]) -> None:
    _, body = scrape(exporter[1])
    seen: dict[str, int] = {}
    for line in body.splitlines():
        m = SERIES.match(line)
        if m is None or not m.group(1).startswith("DCGM_FI_"):
            continue
        names = [pair.split("=", 1)[0] for pair in re.findall(r'(\w+="(?:[^"\\]|\\.)*")', m.group(2))]
        xid = m.group(1) == "DCGM_FI_DEV_XID_ERRORS"  # dcgm-exporter 4.8.2 adds err_code, err_msg there
        assert names == ([*LABELS, "err_code", "err_msg"] if xid else LABELS), line
        assert 'Hostname="node-e2e"' in line
        seen[m.group(1)] = seen.get(m.group(1), 0) + 1
    assert seen == {name: 8 for name in DEFAULT_SERIES}
    # DCGM's MB/s rate under dcgm-exporter 4.8.2's counter type; a board without NVLink has none
    # (tests/exporter/test_simulated_nvlink.py, tests/exporter/nvml/test_nvml_nvlink.py)
    assert "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter" in body


def test_self_metrics_present(exporter: tuple[subprocess.Popen[str], int]) -> None:
    _, body = scrape(exporter[1])
    assert body.count("gpu_exporter_device_up{") == 8
    assert 'backend="simulated",Hostname="node-e2e"} 1' in body
    assert 'gpu_exporter_last_collection_timestamp_seconds{Hostname="node-e2e"} ' in body


def test_openmetrics_with_the_flag_parses_strictly(exporter: tuple[subprocess.Popen[str], int]) -> None:
    status, body = scrape(exporter[1], accept="application/openmetrics-text; version=1.0.0")
    assert status == 200 and body.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "unknown"
    assert families["gpu_exporter_collection_errors"].type == "counter"
    assert len(families["DCGM_FI_DEV_GPU_UTIL"].samples) == 8


def test_sigterm_stops_cleanly(exporter: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = exporter
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    _, err = proc.communicate(timeout=5)
    assert f"serving http://127.0.0.1:{port}/metrics" in err


def test_nvml_backend_without_nvml_exits_3() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    except pynvml.NVMLError:
        pass
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*exporter_cmd(), "--backend", "nvml", "--listen", f"127.0.0.1:{free_port()}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 3
    assert out.stderr.startswith("gpu-exporter: error: nvml backend:")
    assert len(out.stderr.strip().splitlines()) == 1
