"""The simulated HGX H200 SXM board's NVLink fields (issue 22 section 2) and its MIG instances' compute
process counts: per workload, NVLink moves tens of GB/s while NCCL trains and ~nothing in a hang;
a PCIe board (``nvlink=False``) and a GPU in MIG mode have no NVLink series; the shipped DaemonSet
CSV loads on the simulated backend without skipping them."""

from __future__ import annotations

import http.client
import re
import threading

import pytest

from exporter.backend import Entity
from exporter.cli import EXIT_OK, main
from exporter.settings import Settings
from exporter.simulated import SimulatedBackend
from tests.helpers import REPO_ROOT, free_port, wait_until

BW = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
TX = "DCGM_FI_PROF_NVLINK_TX_BYTES"
RX = "DCGM_FI_PROF_NVLINK_RX_BYTES"
NVLINK = frozenset({BW, TX, RX})
GB = 1e9
COLLECTORS = REPO_ROOT / "deploy" / "exporter" / "collectors.csv"


def scripted(workload: str, t: float) -> dict[str, float]:
    now = [0.0]
    b = SimulatedBackend(n_gpus=1, clock=lambda: now[0], workloads={0: workload})
    now[0] = t
    (values,) = b.read(0, NVLINK).values()
    return {k: float(v) for k, v in values.items()}


@pytest.mark.parametrize(
    ("workload", "t", "low_gb_s", "high_gb_s"),
    [
        ("training", 600, 30, 60),  # NCCL all-reduce: tens of GB/s each way
        ("data_starved", 600, 5, 20),  # fewer steps, fewer collectives
        ("eval", 2400, 0.5, 3),  # metrics only
        ("checkpoint", 1500, 0, 0.01),  # writing to storage: PCIe, not NVLink
        ("nccl_hang", 60, 30, 60),  # still training
        ("nccl_hang", 600, 0, 0.001),  # the collective hangs: nothing moves
        ("idle", 600, 0, 0.001),
        ("stalled", 600, 0, 0.001),
        ("finished_holding", 600, 0, 0.001),
    ],
)
def test_each_workload_moves_its_nvlink_bytes(workload: str, t: float, low_gb_s: float, high_gb_s: float) -> None:
    v = scripted(workload, t)
    assert set(v) == NVLINK
    for name in (TX, RX):
        assert low_gb_s * GB <= v[name] <= high_gb_s * GB, (name, v[name])
    # DCGM's BANDWIDTH_TOTAL: (TX + RX) KiB/s / 1000, an integer MB/s-like rate
    assert v[BW] == pytest.approx((v[TX] + v[RX]) / 1024 / 1000, abs=1)


def test_the_default_training_model_moves_nvlink_with_its_activity() -> None:
    now = [0.0]
    b = SimulatedBackend(n_gpus=4, clock=lambda: now[0])
    before = {k: float(x) for k, x in b.read(0, NVLINK)[Entity(0)].items()}
    now[0] = 200.0  # every job has started and warmed up by then
    busy = {k: float(x) for k, x in b.read(0, NVLINK)[Entity(0)].items()}
    stuck = {k: float(x) for k, x in b.read(3, NVLINK)[Entity(3)].items()}  # every fourth GPU holds, idle
    assert before[TX] == 0 and before[BW] == 0  # before the job starts
    assert 20 * GB < busy[TX] < 60 * GB and busy[BW] > 20_000
    assert stuck == {TX: 0, RX: 0, BW: 0}


def test_a_pcie_board_has_no_nvlink_series_and_no_nvlink_p2p() -> None:
    b = SimulatedBackend(n_gpus=2, clock=lambda: 300.0, nvlink=False)
    assert b.supported_fields(0, NVLINK) == set()
    assert not set(b.read(0, NVLINK)[Entity(0)]) & NVLINK
    assert b.p2p_status(0) == {1: 5}  # NVML_P2P_STATUS_NOT_SUPPORTED
    sxm = SimulatedBackend(n_gpus=2, clock=lambda: 300.0)
    assert sxm.supported_fields(0, NVLINK) == NVLINK and sxm.p2p_status(0) == {1: 0}


def test_a_mig_gpu_has_no_nvlink_values_on_the_parent_or_its_instances() -> None:
    b = SimulatedBackend(n_gpus=2, clock=lambda: 300.0, mig={0: ["3g.71gb", "3g.71gb"]})
    out = b.read(0, NVLINK | {"DCGM_FI_DEV_FB_USED"})
    assert len(out) == 3
    for entity, values in out.items():
        assert not set(values) & NVLINK, entity
    assert set(b.read(1, NVLINK)[Entity(1)]) == NVLINK  # the other GPU, not in MIG mode


def test_mig_instances_count_their_compute_processes() -> None:
    now = [0.0]
    b = SimulatedBackend(n_gpus=1, clock=lambda: now[0], mig={0: ["3g.71gb", "2g.35gb", "1g.18gb"]})
    gis = [m.gpu_instance_id for m in b.devices()[0].mig]
    idle = b.compute_processes(0)
    assert set(idle) == {Entity(0, gi) for gi in gis}  # one count per GPU instance, none for the parent
    assert {pc.processes for pc in idle.values()} == {0}  # before the job starts: nothing runs
    now[0] = 200.0
    busy = b.compute_processes(0)
    fb = b.read(0, frozenset({"DCGM_FI_DEV_FB_USED"}))
    for gi in gis:
        pc = busy[Entity(0, gi)]
        assert pc.processes == 1 and pc.fb_used_mib == fb[Entity(0, gi)]["DCGM_FI_DEV_FB_USED"] > 0


def serve(argv: list[str], capsys: pytest.CaptureFixture[str], factory: object = None) -> tuple[str, str]:
    """Run the real CLI until it serves one scrape; (stderr, /metrics body)."""
    port = free_port()
    stop = threading.Event()
    result: list[int] = []
    full = ["--listen", f"127.0.0.1:{port}", "--interval", "100ms", "--backend", "simulated", *argv]
    kwargs = {} if factory is None else {"backend_factory": factory}
    t = threading.Thread(target=lambda: result.append(main(full, stop, **kwargs)))  # type: ignore[arg-type]
    t.start()
    err = ""
    try:
        def serving() -> bool:
            nonlocal err
            err += capsys.readouterr().err
            return "serving http://" in err or bool(result)

        assert wait_until(serving, timeout=10)
        body = ""

        def scraped() -> bool:
            nonlocal body
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read().decode()
            conn.close()
            return "gpu_exporter_compute_processes{" in body

        assert wait_until(scraped, timeout=10)
    finally:
        stop.set()
        t.join(timeout=10)
    assert result == [EXIT_OK]
    return err + capsys.readouterr().err, body


def test_the_daemonsets_collectors_csv_skips_no_nvlink_row_on_the_simulated_backend(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err, body = serve(["--simulate-gpus", "2", "-f", str(COLLECTORS)], capsys)
    skipped = re.findall(r"Skipping line \d+ \('([A-Z0-9_]+)'\)", err)
    assert not set(skipped) & NVLINK, skipped
    for name in sorted(NVLINK):
        assert f"\n{name}{{gpu=\"0\"" in body and f"\n{name}{{gpu=\"1\"" in body, name
    assert "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter" in body  # dcgm-exporter 4.8.2's type
    assert "# TYPE DCGM_FI_PROF_NVLINK_TX_BYTES gauge" in body


def test_mig_instances_are_served_with_their_compute_process_gauge(capsys: pytest.CaptureFixture[str]) -> None:
    def factory(_settings: Settings) -> SimulatedBackend:
        return SimulatedBackend(n_gpus=1, mig={0: ["3g.71gb", "3g.71gb"]})

    _err, body = serve(["-f", str(COLLECTORS)], capsys, factory)
    rows = [ln for ln in body.splitlines() if ln.startswith("gpu_exporter_compute_processes{")]
    assert len(rows) == 2 and all('GPU_I_ID="' in ln for ln in rows), rows
    assert {ln.split('GPU_I_ID="')[1].split('"')[0] for ln in rows} == {"1", "2"}
