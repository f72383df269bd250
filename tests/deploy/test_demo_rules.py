"""scripts/demo_rules.py: the waste rules on the demo's faster clock are the real rules with every time
constant divided, and still load in promtool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, require_binary

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import demo_rules


@pytest.mark.parametrize(("duration", "factor", "expected"), [
    ("15m", 12, "75s"), ("10m", 12, "50s"), ("1h", 12, "300s"), ("1m", 12, "5s"), ("2m", 12, "10s"),
    ("5s", 12, "1s"),  # never below a second
])
def test_a_duration_is_divided_by_the_factor(duration: str, factor: float, expected: str) -> None:
    assert demo_rules.scaled(duration, factor) == expected


def test_windows_offsets_for_interval_and_ages_are_scaled_and_comments_are_not() -> None:
    text = ("groups:\n  - name: g\n    interval: 1m\n    rules:\n      # 15m window, kept as written\n"
            "      - alert: A\n        expr: min_over_time(x[15m]) == 1 and x offset 15m == 1"
            " and job:progress_age:seconds >= 600\n        for: 10m\n")
    out = demo_rules.scale_rules(text, 12)
    assert "interval: 5s\n" in out and "for: 50s\n" in out
    assert "x[75s]" in out and "offset 75s" in out and "job:progress_age:seconds >= 50" in out
    assert "# 15m window, kept as written" in out


def test_the_scaled_waste_rules_load_in_promtool_and_the_real_file_is_untouched(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    before = demo_rules.SOURCE.read_bytes()
    out = tmp_path / "demo-waste.rules.yaml"
    assert demo_rules.main([str(out)]) == 0
    result = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert demo_rules.SOURCE.read_bytes() == before
    def code(text: str) -> str:
        return "".join(ln for ln in text.splitlines(keepends=True) if not ln.lstrip().startswith("#"))
    assert "[15m]" in code(before.decode()) and "[15m]" not in code(out.read_text())
