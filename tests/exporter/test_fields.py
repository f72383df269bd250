"""The DCGM field table: ids, kinds, the default set and its help strings."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from exporter.fields import ALIASES, DEFAULT_FIELDS, FIELDS, KINDS, field

# dcgm-exporter 4.8.2 default set: (field, id, type, help) verbatim from the compatibility reference §1.
REFERENCE_DEFAULTS = [
    ("DCGM_FI_DEV_SM_CLOCK", 100, "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", 101, "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", 140, "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", 150, "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", 155, "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156, "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 202, "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", 203, "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", 204, "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", 206, "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", 207, "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", 230, "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", 251, "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", 252, "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", 253, "gauge", "Framebuffer memory reserved (in MiB)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        449,
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        393,
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        394,
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 395, "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", 1, "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001, "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004, "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        1005,
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        1009,
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        1010,
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
    ),
]


def test_default_fields_are_the_reference_set_in_csv_order() -> None:
    assert list(DEFAULT_FIELDS) == [row[0] for row in REFERENCE_DEFAULTS]


@pytest.mark.parametrize(("name", "field_id", "kind", "help_"), REFERENCE_DEFAULTS)
def test_default_field_matches_reference_id_type_and_help_verbatim(
    name: str, field_id: int, kind: str, help_: str
) -> None:
    f = FIELDS[name]
    assert (f.name, f.field_id, f.kind, f.help) == (name, field_id, kind, help_)


def test_field_ids_are_unique_except_declared_aliases() -> None:
    counts = Counter(f.field_id for f in FIELDS.values())
    shared = {fid for fid, n in counts.items() if n > 1}
    alias_ids = {FIELDS[a].field_id for a in ALIASES}
    assert shared == alias_ids
    for alias, target in ALIASES.items():
        assert FIELDS[alias].field_id == FIELDS[target].field_id


def test_every_field_is_well_formed() -> None:
    for name, f in FIELDS.items():
        assert f.name == name
        assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", name), name
        assert f.kind in KINDS
        assert f.help.strip() == f.help and f.help
        assert f.field_id > 0


@pytest.mark.parametrize(
    "name",
    [
        # commented optional rows of dcgm-exporter's CSVs
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        # label fields
        "DCGM_FI_NVML_VERSION",
        "DCGM_FI_DEV_BRAND",
        "DCGM_FI_DEV_SERIAL",
        "DCGM_FI_DEV_OEM_INFOROM_VER",
        "DCGM_FI_DEV_ECC_INFOROM_VER",
        "DCGM_FI_DEV_POWER_INFOROM_VER",
        "DCGM_FI_DEV_INFOROM_IMAGE_VER",
        "DCGM_FI_DEV_VBIOS_VERSION",
        # exporter-owned rows
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_EXP_CLOCK_EVENTS_COUNT",
    ],
)
def test_optional_csv_rows_are_known_fields(name: str) -> None:
    assert name in FIELDS


@pytest.mark.parametrize(
    ("name", "field_id"),
    [
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L5", 445),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L6", 475),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L11", 480),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6", 451),
        ("DCGM_FI_PROF_NVDEC0_ACTIVE", 1017),
        ("DCGM_FI_PROF_NVJPG7_ACTIVE", 1032),
        ("DCGM_FI_PROF_NVOFA1_ACTIVE", 1034),
    ],
)
def test_generated_lane_and_engine_ids_follow_dcgm_fields_h(name: str, field_id: int) -> None:
    assert FIELDS[name].field_id == field_id


@pytest.mark.parametrize(
    ("name", "integer"),
    [
        ("DCGM_FI_DEV_POWER_USAGE", False),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", False),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", True),
        ("DCGM_FI_DEV_SM_CLOCK", True),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", True),
        ("DCGM_FI_DEV_FB_USED", True),
    ],
)
def test_value_type_matches_dcgm_int64_or_double(name: str, integer: bool) -> None:
    assert FIELDS[name].integer is integer


def test_field_lookup_names_the_unknown_field() -> None:
    assert field("DCGM_FI_DEV_GPU_UTIL").field_id == 203
    with pytest.raises(KeyError, match="DCGM_FI_DEV_FOO"):
        field("DCGM_FI_DEV_FOO")
