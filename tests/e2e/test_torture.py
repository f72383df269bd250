"""CI's short variant of bench/torture.py: the real relay and victoria-metrics under kill -9 cycles,
a receiver outage, age/disk limits, a full disk, corrupted queue files and fuzzed HTTP bodies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import require_binary

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.slow
def test_torture_short_variant_loses_no_acknowledged_sample() -> None:
    require_binary("victoria-metrics")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "torture.py"), "--short"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "6 of 6 scenarios passed" in proc.stdout
