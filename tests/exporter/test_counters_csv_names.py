"""Collectors CSV names as dcgm-exporter 4.8.2 handles them (issue 21 points 3, 4 and 7): the
shipped /etc/dcgm-exporter files, the default -f path, aliases and 1.x names exported under the
listed name, and a duplicate row warned once and kept once."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from exporter import counters_csv
from exporter.collector import Collector
from exporter.counters_csv import SHIPPED_CSVS, filter_supported, load_counters, parse_counters, shipped_text
from exporter.fields import FIELDS, LEGACY_NAMES
from exporter.simulated import SimulatedBackend
from tests.helpers import REPO_ROOT

DATA = REPO_ROOT / "exporter" / "data"


def series(text: str, name: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(name + "{")]


@pytest.mark.parametrize("name", SHIPPED_CSVS)
def test_the_three_dcgm_exporter_csvs_ship_and_parse(name: str) -> None:
    path = DATA / f"dcgm-exporter.{name}"
    specs = load_counters(str(path))
    assert specs and all(s.builtin for s in specs)  # shipped text: treated like the built-in set
    assert shipped_text(name) == path.read_text()


def test_dockerfile_puts_each_shipped_csv_at_the_dcgm_exporter_path() -> None:
    docker = (REPO_ROOT / "Dockerfile").read_text()
    for name in SHIPPED_CSVS:
        assert f"COPY exporter/data/dcgm-exporter.{name} /etc/dcgm-exporter/{name}" in docker


@pytest.mark.parametrize(("exists", "expected"), [(True, counters_csv.DCGM_DEFAULT_PATH), (False, None)])
def test_default_collectors_is_dcgm_exporters_path_when_it_exists(
    monkeypatch: pytest.MonkeyPatch, exists: bool, expected: str | None
) -> None:
    monkeypatch.setattr(os.path, "isfile", lambda p: exists and p == counters_csv.DCGM_DEFAULT_PATH)
    assert counters_csv.default_path() == expected


def test_a_users_copy_that_differs_is_not_treated_as_built_in(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text(shipped_text("default-counters.csv") + "DCGM_FI_DEV_GPU_TEMP_LIMIT, gauge, margin\n")
    assert not any(s.builtin for s in load_counters(str(path)))


@pytest.mark.parametrize(
    ("row", "name", "read_as"),
    [
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, reasons", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
         "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        ("dcgm_sm_clock, gauge, SM clock", "dcgm_sm_clock", "DCGM_FI_DEV_SM_CLOCK"),
        ("dcgm_fi_prof_pcie_tx_bytes, counter, tx", "dcgm_fi_prof_pcie_tx_bytes", "DCGM_FI_PROF_PCIE_TX_BYTES"),
        ("DCGM_FI_DEV_GPU_UTIL, gauge, util", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL"),
    ],
)
def test_aliases_and_1x_names_keep_the_listed_name_and_read_the_field(row: str, name: str, read_as: str) -> None:
    (spec,) = parse_counters(row + "\n")
    assert (spec.field, spec.read_as) == (name, read_as)


def test_every_1x_name_resolves_to_a_known_field() -> None:
    assert all(target in FIELDS for target in LEGACY_NAMES.values())


def test_alias_row_passes_the_support_filter_when_its_target_is_supported(caplog: pytest.LogCaptureFixture) -> None:
    specs = parse_counters("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, reasons\n")
    kept = filter_supported(specs, {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}, logging.getLogger("t"))
    assert [s.field for s in kept] == ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] and "Skipping" not in caplog.text


def test_duplicate_row_is_warned_once_and_kept_once(caplog: pytest.LogCaptureFixture) -> None:
    text = "DCGM_FI_DEV_GPU_UTIL, gauge, a\n\nDCGM_FI_DEV_GPU_UTIL, counter, b\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n"
    with caplog.at_level(logging.WARNING):
        specs = parse_counters(text, "c.csv")
    assert [(s.field, s.kind, s.line) for s in specs] == [
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", 1), ("DCGM_FI_DEV_GPU_TEMP", "gauge", 4)]
    warned = [r.getMessage() for r in caplog.records if "listed again" in r.getMessage()]
    assert warned == ["c.csv:3: field DCGM_FI_DEV_GPU_UTIL is listed again (first on line 1); exporting it once, "
                      "as on line 1"]


def collect(csv_text: str, **kwargs: object) -> str:
    backend = SimulatedBackend(n_gpus=1, clock=lambda: 100.0)
    specs = parse_counters(csv_text)
    c = Collector(backend, specs, "node-a", 5.0, **kwargs)  # type: ignore[arg-type]
    return c.collect_once().text.decode()


def test_clock_throttle_reasons_is_exported_under_the_listed_name() -> None:
    text = collect("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, Current clock throttle reasons.\n")
    (line,) = series(text, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    assert line.endswith(" 4") or line.endswith(" 0") or line.endswith(" 1")
    assert "# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge" in text
    assert not series(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")


def test_the_1x_legacy_csv_is_read_and_exported_under_its_names() -> None:
    text = collect(shipped_text("1.x-compatibility-metrics.csv"))
    for name in ("dcgm_sm_clock", "dcgm_gpu_temp", "dcgm_gpu_utilization", "dcgm_fb_used", "dcgm_fi_prof_dram_active"):
        assert len(series(text, name)) == 1, name
    assert text.count("# TYPE dcgm_fi_prof_pcie_tx_bytes ") == 1  # listed twice, exported once
    (util,) = series(text, "dcgm_gpu_utilization")
    assert util.rsplit(" ", 1)[1].isdigit()  # an integer field keeps %d under its 1.x name

