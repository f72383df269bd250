"""--replace-blanks-in-model-name as dcgm-exporter 4.8.2 (issue 21 point 6): strings.Fields joined by '-'."""

from __future__ import annotations

import pytest

from exporter.collector import Collector
from exporter.counters_csv import parse_counters
from exporter.settings import load_settings
from exporter.simulated import SimulatedBackend


@pytest.mark.parametrize(("flag", "model"), [(False, 'modelName="NVIDIA H200"'), (True, 'modelName="NVIDIA-H200"')])
def test_model_name_blanks_are_replaced_only_with_the_flag(flag: bool, model: str) -> None:
    c = Collector(SimulatedBackend(n_gpus=1, clock=lambda: 50.0), parse_counters("DCGM_FI_DEV_GPU_UTIL, gauge, u\n"),
                  "n", 5.0, replace_blanks=flag)
    (line,) = [ln for ln in c.collect_once().text.decode().splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert model in line


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["-rbmn"], {}, True), (["--replace-blanks-in-model-name=false"], {}, False),
    ([], {"DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME": "true"}, True), ([], {}, False)])
def test_replace_blanks_flag_and_env(argv: list[str], env: dict[str, str], expected: bool) -> None:
    s = load_settings(argv, env)
    assert s.replace_blanks is expected and s.warnings == ()
