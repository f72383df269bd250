"""gpu-exporter end to end with dcgm-exporter's own rows (issue 21 points 4, 5): a CSV with the
alias and the DCGM_EXP_* rows (the health row included), served by the real CLI on the simulated backend."""

from __future__ import annotations

import http.client
import threading
from pathlib import Path

import pytest

from exporter.cli import EXIT_OK, main
from tests.helpers import free_port, wait_until

CSV = """\
DCGM_FI_DEV_GPU_UTIL, gauge, util
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, reasons
DCGM_EXP_XID_ERRORS_COUNT, counter, xids
DCGM_EXP_CLOCK_EVENTS_COUNT, counter, clocks
DCGM_EXP_GPU_HEALTH_STATUS, counter, health
DCGM_EXP_P2P_STATUS, counter, p2p
"""


def test_exp_rows_the_health_row_and_the_alias_are_served_from_the_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = tmp_path / "c.csv"
    csv.write_text(CSV)
    port = free_port()
    stop = threading.Event()
    result: list[int] = []
    argv = ["--listen", f"127.0.0.1:{port}", "--interval", "100ms", "--backend", "simulated", "--simulate-gpus", "2",
            "-f", str(csv), "-x", "60000"]
    t = threading.Thread(target=lambda: result.append(main(argv, stop)))
    t.start()
    err = ""
    try:
        def serving() -> bool:
            nonlocal err
            err += capsys.readouterr().err
            return "serving http://" in err or bool(result)

        assert wait_until(serving, timeout=10)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
    finally:
        stop.set()
        t.join(timeout=10)
    assert result == [EXIT_OK]
    assert "Skipping line" not in err and "metric not enabled" not in err
    for name in ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_CLOCK_EVENTS_COUNT",
                 "DCGM_EXP_P2P_STATUS", "DCGM_EXP_GPU_HEALTH_STATUS"):
        assert f"\n{name}{{gpu=" in body, name
    assert 'window_size_in_ms="60000"} 0' in body
    assert "# TYPE DCGM_EXP_GPU_HEALTH_STATUS counter" in body  # the CSV's type, as dcgm-exporter
    health = [ln for ln in body.splitlines() if ln.startswith("DCGM_EXP_GPU_HEALTH_STATUS{")]
    assert len(health) == 2 * 8  # 2 GPUs x PCIE, NVLINK, MEM, INFOROM, THERMAL, POWER, DRIVER, ALL
    assert all(ln.endswith('health_error_code="DCGM_FR_OK",health_watch="' + ln.split('health_watch="')[1])
               and ln.endswith("} 0") for ln in health)
