"""The collectors CSV parser: dcgm-exporter's format, its errors with line numbers, support filtering."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from exporter.counters_csv import (
    CountersError,
    CounterSpec,
    default_text,
    filter_supported,
    load_counters,
    parse_counters,
)
from exporter.fields import DEFAULT_FIELDS, FIELDS

# The shape of dcgm-exporter's own etc/default-counters.csv (4.x): aligned columns, a space before
# a comma, commented optional rows, exporter-owned rows, label rows and the DCP block.
DCGM_EXPORTER_DEFAULT = """\
# Format
# If line starts with a '#' it is considered a comment
# DCGM FIELD, Prometheus metric type, help message

# Clocks
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
# DCGM_EXP_CLOCK_EVENTS_COUNT, gauge, Count of clock events within the user-specified time window.

# Temperature
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).

# Power
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).

# PCIE
# DCGM_FI_PROF_PCIE_TX_BYTES,  counter, Total number of bytes transmitted through PCIe TX via NVML.
# DCGM_FI_PROF_PCIE_RX_BYTES,  counter, Total number of bytes received through PCIe RX via NVML.
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.

# Utilization (the sample period varies depending on the product)
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL,      gauge, Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).

# Errors and violations
DCGM_FI_DEV_XID_ERRORS,              gauge,   Value of the last XID error encountered.
# DCGM_EXP_XID_ERRORS_COUNT,         gauge,   Count of XID Errors within user-specified time window.
# DCGM_FI_DEV_POWER_VIOLATION,       counter, Throttling duration due to power constraints (in us).

# Memory usage
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED, gauge, Framebuffer memory reserved (in MiB).

# NVLink
# DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, Total number of NVLink bandwidth counters for all lanes.

# VGPU License status
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status

# Remapped rows
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed

# Static configuration information. These appear as labels on your other metrics
DCGM_FI_DRIVER_VERSION,        label, Driver Version
# DCGM_FI_NVML_VERSION,          label, NVML Version

# DCP metrics
DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE,        gauge, Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_PCIE_RX_BYTES,      gauge, The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
"""  # noqa: E501


def test_dcgm_exporter_default_file_parses_with_fields_types_and_lines() -> None:
    specs = parse_counters(DCGM_EXPORTER_DEFAULT, "default-counters.csv")
    names = [s.field for s in specs]
    assert names[:2] == ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"]
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in names
    assert specs[0] == CounterSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", 6)
    dec = next(s for s in specs if s.field == "DCGM_FI_DEV_DEC_UTIL")
    assert dec.help == "Decoder utilization (in %)."  # "FIELD ," trimmed
    label = next(s for s in specs if s.field == "DCGM_FI_DRIVER_VERSION")
    assert label.kind == "label"
    assert len(specs) == 26


def test_built_in_default_is_the_design_default_set_with_reference_help() -> None:
    specs = load_counters(None)
    assert [s.field for s in specs] == list(DEFAULT_FIELDS)
    for spec in specs:
        assert spec.help == FIELDS[spec.field].help
        assert spec.kind == FIELDS[spec.field].kind
    assert default_text().startswith("#")


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (
            "DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_FOO, gauge, nope\n",
            2,
            "unknown field 'DCGM_FI_DEV_FOO'",
        ),
        ("# c\n\nDCGM_FI_DEV_GPU_UTIL, gauge\n", 3, "expected 3 fields"),
        ("DCGM_FI_DEV_GPU_UTIL, gauge, help, extra\n", 1, "expected 3 fields"),
        ("DCGM_FI_DEV_GPU_UTIL, gauge, GPU util, in %\n", 1, "got 4"),
        ("DCGM_FI_DEV_GPU_UTIL, histogram, help\n", 1, "unknown type 'histogram'"),
        ("DCGM_FI_DEV_GPU_UTIL, Gauge, help\n", 1, "unknown type 'Gauge'"),
        ("DCGM_FI_DEV_GPU_UTIL, gauge, a\n\ndcgm_not_a_1x_name, counter, b\n", 3, "unknown field"),
        ("DCGM_FI_DEV_GPU_UTIL\n", 1, "got 1"),
        ('DCGM_FI_DEV_GPU_UTIL, gauge, "unterminated\n', 1, "DCGM_FI_DEV_GPU_UTIL"),
    ],
)
def test_bad_rows_raise_with_source_and_line(text: str, line: int, needle: str) -> None:
    with pytest.raises(CountersError) as info:
        parse_counters(text, "counters.csv")
    err = info.value
    assert err.source == "counters.csv"
    assert err.line == line
    assert str(err).startswith(f"counters.csv:{line}: ")
    assert needle in str(err)
    assert isinstance(err, ValueError)


def test_unknown_field_message_format_matches_contract() -> None:
    text = "\n" * 11 + "DCGM_FI_DEV_FOO, gauge, x\n"
    with pytest.raises(CountersError, match=r"^counters\.csv:12: unknown field 'DCGM_FI_DEV_FOO'$"):
        parse_counters(text, "counters.csv")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("# only a comment\n\n   \n", []),
        ("  # indented comment\nDCGM_FI_DEV_GPU_UTIL,gauge,x\n", [("DCGM_FI_DEV_GPU_UTIL", "gauge", "x", 2)]),
        (
            'DCGM_FI_DEV_GPU_UTIL, gauge, "GPU util, in %"\n',
            [("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU util, in %", 1)],
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL, counter, user's choice\r\n",
            [("DCGM_FI_DEV_GPU_UTIL", "counter", "user's choice", 1)],
        ),
        (
            "DCGM_FI_DEV_SERIAL, label, Device Serial Number\n",
            [("DCGM_FI_DEV_SERIAL", "label", "Device Serial Number", 1)],
        ),
    ],
)
def test_comments_blank_lines_quotes_and_kind_overrides(
    text: str, expected: list[tuple[str, str, str, int]]
) -> None:
    assert [(s.field, s.kind, s.help, s.line) for s in parse_counters(text)] == expected


def test_load_counters_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n")
    assert [s.field for s in load_counters(str(good))] == ["DCGM_FI_DEV_GPU_UTIL"]
    bad = tmp_path / "bad.csv"
    bad.write_text("DCGM_FI_DEV_NOPE, gauge, x\n")
    with pytest.raises(CountersError, match=r"bad\.csv:1: unknown field"):
        load_counters(str(bad))
    with pytest.raises(CountersError, match="cannot read"):
        load_counters(str(tmp_path / "missing.csv"))


def test_filter_supported_drops_unsupported_with_dcgm_warning_and_keeps_labels(
    caplog: pytest.LogCaptureFixture,
) -> None:
    specs = parse_counters(
        "DCGM_FI_DEV_GPU_UTIL, gauge, a\n"
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, b\n"
        "DCGM_FI_DRIVER_VERSION, label, c\n"
    )
    log = logging.getLogger("test.counters")
    with caplog.at_level(logging.WARNING, logger="test.counters"):
        kept = filter_supported(specs, {"DCGM_FI_DEV_GPU_UTIL"}, log)
    assert [s.field for s in kept] == ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DRIVER_VERSION"]
    assert caplog.messages == ["Skipping line 2 ('DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL'): metric not enabled"]


def test_builtin_default_set_does_not_warn_about_its_own_rows_at_every_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 10: a PCIe H200 has no NVLink, so the default NVLINK_BANDWIDTH_TOTAL row is dropped
    quietly (one INFO line), while a user's file keeps dcgm-exporter's per-row warning."""
    specs = load_counters(None)
    supported = {s.field for s in specs} - {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}
    log = logging.getLogger("test.counters.default")
    with caplog.at_level(logging.INFO, logger="test.counters.default"):
        kept = filter_supported(specs, supported, log)
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in [s.field for s in kept]
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in caplog.messages[0]


def test_builtin_default_prof_rows_still_get_dcgm_skipping_line_when_profiling_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """dcgm-exporter prints "Skipping line N ('X'): metric not enabled" for each DCP row it cannot
    watch; the PROF rows say so even in the built-in set (GPM refused or absent)."""
    specs = load_counters(None)
    supported = {s.field for s in specs if not s.field.startswith("DCGM_FI_PROF_")}
    log = logging.getLogger("test.counters.prof")
    with caplog.at_level(logging.WARNING, logger="test.counters.prof"):
        filter_supported(specs, supported, log)
    prof = [s for s in specs if s.field.startswith("DCGM_FI_PROF_")]
    assert caplog.messages == [f"Skipping line {s.line} ('{s.field}'): metric not enabled" for s in prof]
