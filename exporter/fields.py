"""The DCGM field table: every ``DCGM_FI_*`` name a dcgm-exporter CSV may name.

Names and numeric ids follow DCGM's ``dcgm_fields.h`` (the ids are stable across DCGM releases;
4.x renamed some macros but kept the old names as aliases with the same id). ``kind`` is the
Prometheus type dcgm-exporter's own CSVs give the field (a user's CSV may override it); ``help``
is the help string of dcgm-exporter 4.8.2's CSVs where the field appears there, else DCGM's
description. ``integer`` tells int64 fields (rendered ``%d``) from doubles (rendered ``%f``).

How each field is read from NVML lives with the backend (``exporter.nvml``); this table only
says what exists.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldDef:
    name: str
    field_id: int
    kind: str  # "gauge" | "counter" | "label"
    help: str
    integer: bool


KINDS = ("gauge", "counter", "label")

G, C, L = "gauge", "counter", "label"
N, F = True, False  # integer (int64, rendered %d) or float (double, rendered %f)

# (name without the DCGM_FI_ prefix, id, kind, integer, help)
_TABLE: tuple[tuple[str, int, str, bool, str], ...] = (
    # --- system and static identity (label-friendly strings) ---
    ("DRIVER_VERSION", 1, L, F, "Driver Version"),
    ("NVML_VERSION", 2, L, F, "NVML Version"),
    ("PROCESS_NAME", 3, L, F, "Process Name"),
    ("DEV_COUNT", 4, G, N, "Number of Devices on the node"),
    ("CUDA_DRIVER_VERSION", 5, G, N, "Cuda Driver Version"),
    ("DEV_NAME", 50, L, F, "Name of the GPU device"),
    ("DEV_BRAND", 51, L, F, "Device Brand"),
    ("DEV_NVML_INDEX", 52, G, N, "NVML index of this GPU"),
    ("DEV_SERIAL", 53, L, F, "Device Serial Number"),
    ("DEV_UUID", 54, L, F, "UUID corresponding to the device"),
    ("DEV_MINOR_NUMBER", 55, G, N, "Device node minor number /dev/nvidia#"),
    ("DEV_OEM_INFOROM_VER", 56, L, F, "OEM inforom version"),
    ("DEV_PCI_BUSID", 57, L, F, "PCI attributes for the device"),
    ("DEV_PCI_COMBINED_ID", 58, G, N, "The combined 16-bit device id and 16-bit vendor id"),
    ("DEV_PCI_SUBSYS_ID", 59, G, N, "The 32-bit Sub System Device ID"),
    ("DEV_CUDA_COMPUTE_CAPABILITY", 63, G, N, "Cuda compute capability for the device"),
    ("DEV_P2P_NVLINK_STATUS", 64, G, N, "Bitmap of the P2P NVLink status from this GPU to others"),
    ("DEV_COMPUTE_MODE", 65, G, N, "Compute mode for the device"),
    ("DEV_PERSISTENCE_MODE", 66, G, N, "Persistence mode for the device"),
    ("DEV_MIG_MODE", 67, G, N, "MIG mode for the device"),
    ("DEV_CUDA_VISIBLE_DEVICES_STR", 68, L, F, "The string that CUDA_VISIBLE_DEVICES should be set to"),
    ("DEV_MIG_MAX_SLICES", 69, G, N, "The maximum number of MIG slices supported by this GPU"),
    ("DEV_CC_MODE", 74, G, N, "ConfidentialCompute/AmpereProtectedMemory status for this system"),
    ("DEV_ECC_INFOROM_VER", 80, L, F, "ECC inforom version"),
    ("DEV_POWER_INFOROM_VER", 81, L, F, "Power management object inforom version"),
    ("DEV_INFOROM_IMAGE_VER", 82, L, F, "Inforom image version"),
    ("DEV_INFOROM_CONFIG_CHECK", 83, G, N, "Inforom configuration checksum"),
    ("DEV_INFOROM_CONFIG_VALID", 84, G, N, "Reads the infoROM from the flash and verifies the checksums"),
    ("DEV_VBIOS_VERSION", 85, L, F, "VBIOS version of the device"),
    ("DEV_BAR1_TOTAL", 90, G, N, "Total BAR1 of the GPU in MB"),
    ("DEV_BAR1_USED", 92, G, N, "Used BAR1 of the GPU in MB"),
    ("DEV_BAR1_FREE", 93, G, N, "Free BAR1 of the GPU in MB"),
    ("DEV_GPM_SUPPORT", 94, G, N, "GPM support for the device"),
    # --- clocks ---
    ("DEV_SM_CLOCK", 100, G, N, "SM clock frequency (in MHz)."),
    ("DEV_MEM_CLOCK", 101, G, N, "Memory clock frequency (in MHz)."),
    ("DEV_VIDEO_CLOCK", 102, G, N, "Video encoder/decoder clock for the device"),
    ("DEV_APP_SM_CLOCK", 110, G, N, "SM Application clocks"),
    ("DEV_APP_MEM_CLOCK", 111, G, N, "Memory Application clocks"),
    ("DEV_CLOCKS_EVENT_REASONS", 112, G, N, "Current clock event reasons (bitmask)"),
    ("DEV_CLOCK_THROTTLE_REASONS", 112, G, N, "Current clock throttle reasons (deprecated alias)"),
    ("DEV_MAX_SM_CLOCK", 113, G, N, "Maximum supported SM clock for the device"),
    ("DEV_MAX_MEM_CLOCK", 114, G, N, "Maximum supported Memory clock for the device"),
    ("DEV_MAX_VIDEO_CLOCK", 115, G, N, "Maximum supported Video encoder/decoder clock for the device"),
    ("DEV_AUTOBOOST", 120, G, N, "Auto-boost for the device (1 = enabled. 0 = disabled)"),
    # --- temperature and power ---
    ("DEV_MEMORY_TEMP", 140, G, N, "Memory temperature (in C)."),
    ("DEV_GPU_TEMP", 150, G, N, "GPU temperature (in C)."),
    ("DEV_MEM_MAX_OP_TEMP", 151, G, N, "Maximum operating temperature for the memory of this GPU"),
    ("DEV_GPU_MAX_OP_TEMP", 152, G, N, "Maximum operating temperature for this GPU"),
    ("DEV_GPU_TEMP_LIMIT", 153, G, N, "Thermal margin temperature (distance to nearest slowdown threshold)"),
    ("DEV_POWER_USAGE", 155, G, F, "Power draw (in W)."),
    ("DEV_TOTAL_ENERGY_CONSUMPTION", 156, C, N, "Total energy consumption since boot (in mJ)."),
    ("DEV_POWER_USAGE_INSTANT", 157, G, F, "Current instantaneous power usage of the device in Watts"),
    ("DEV_SLOWDOWN_TEMP", 158, G, N, "Slowdown temperature for the device"),
    ("DEV_SHUTDOWN_TEMP", 159, G, N, "Shutdown temperature for the device"),
    ("DEV_POWER_MGMT_LIMIT", 160, G, F, "Current Power limit for the device"),
    ("DEV_POWER_MGMT_LIMIT_MIN", 161, G, F, "Minimum power management limit for the device"),
    ("DEV_POWER_MGMT_LIMIT_MAX", 162, G, F, "Maximum power management limit for the device"),
    ("DEV_POWER_MGMT_LIMIT_DEF", 163, G, F, "Default power management limit for the device"),
    ("DEV_ENFORCED_POWER_LIMIT", 164, G, F, "Effective power limit that the driver enforces"),
    ("DEV_FABRIC_MANAGER_STATUS", 170, G, N, "The status of the fabric manager"),
    ("DEV_FABRIC_MANAGER_ERROR_CODE", 171, G, N, "Fabric Manager start-up failure"),
    ("DEV_FABRIC_CLUSTER_UUID", 172, L, F, "The uuid of the cluster to which this GPU belongs"),
    ("DEV_FABRIC_CLIQUE_ID", 173, G, N, "The ID of the fabric clique to which this GPU belongs"),
    ("DEV_PSTATE", 190, G, N, "Performance state (P-State) 0-15. 0=highest"),
    ("DEV_FAN_SPEED", 191, G, N, "Fan speed for the device in percent 0-100"),
    # --- PCIe and utilization ---
    ("DEV_PCIE_TX_THROUGHPUT", 200, C, N,
     "Total number of bytes transmitted through PCIe TX (in KB) via NVML."),
    ("DEV_PCIE_RX_THROUGHPUT", 201, C, N,
     "Total number of bytes received through PCIe RX (in KB) via NVML."),
    ("DEV_PCIE_REPLAY_COUNTER", 202, C, N, "Total number of PCIe retries."),
    ("DEV_GPU_UTIL", 203, G, N, "GPU utilization (in %)."),
    ("DEV_MEM_COPY_UTIL", 204, G, N, "Memory utilization (in %)."),
    ("DEV_ENC_UTIL", 206, G, N, "Encoder utilization (in %)."),
    ("DEV_DEC_UTIL", 207, G, N, "Decoder utilization (in %)."),
    ("DEV_XID_ERRORS", 230, G, N, "Value of the last XID error encountered."),
    ("DEV_PCIE_MAX_LINK_GEN", 235, G, N, "PCIe Max Link Generation"),
    ("DEV_PCIE_MAX_LINK_WIDTH", 236, G, N, "PCIe Max Link Width"),
    ("DEV_PCIE_LINK_GEN", 237, G, N, "PCIe Current Link Generation"),
    ("DEV_PCIE_LINK_WIDTH", 238, G, N, "PCIe Current Link Width"),
    # --- violations (counters, ns in DCGM 4; the CSV help still says us) ---
    ("DEV_POWER_VIOLATION", 240, C, N, "Throttling duration due to power constraints (in us)."),
    ("DEV_THERMAL_VIOLATION", 241, C, N, "Throttling duration due to thermal constraints (in us)."),
    ("DEV_SYNC_BOOST_VIOLATION", 242, C, N, "Throttling duration due to sync-boost constraints (in us)."),
    ("DEV_BOARD_LIMIT_VIOLATION", 243, C, N, "Throttling duration due to board limit constraints (in us)."),
    ("DEV_LOW_UTIL_VIOLATION", 244, C, N, "Throttling duration due to low utilization (in us)."),
    ("DEV_RELIABILITY_VIOLATION", 245, C, N, "Throttling duration due to reliability constraints (in us)."),
    ("DEV_TOTAL_APP_CLOCKS_VIOLATION", 246, C, N, "App clock violation limit."),
    ("DEV_TOTAL_BASE_CLOCKS_VIOLATION", 247, C, N, "Base clock violation limit."),
    # --- framebuffer ---
    ("DEV_FB_TOTAL", 250, G, N, "Total Frame Buffer of the GPU in MB"),
    ("DEV_FB_FREE", 251, G, N, "Framebuffer memory free (in MiB)."),
    ("DEV_FB_USED", 252, G, N, "Framebuffer memory used (in MiB)."),
    ("DEV_FB_RESERVED", 253, G, N, "Framebuffer memory reserved (in MiB)."),
    ("DEV_FB_USED_PERCENT", 254, G, F, "Framebuffer used / (total - reserved), 0.0-1.0"),
    ("DEV_C2C_LINK_COUNT", 285, G, N, "C2C Link Count"),
    ("DEV_C2C_LINK_STATUS", 286, G, N, "C2C Link Status"),
    ("DEV_C2C_MAX_BANDWIDTH", 287, G, N, "C2C Max Bandwidth (in MB/s)"),
    # --- ECC ---
    ("DEV_ECC_CURRENT", 300, G, N, "Current ECC mode for the device"),
    ("DEV_ECC_PENDING", 301, G, N, "Pending ECC mode for the device"),
    ("DEV_ECC_SBE_VOL_TOTAL", 310, C, N, "Total number of single-bit volatile ECC errors."),
    ("DEV_ECC_DBE_VOL_TOTAL", 311, C, N, "Total number of double-bit volatile ECC errors."),
    ("DEV_ECC_SBE_AGG_TOTAL", 312, C, N, "Total number of single-bit persistent ECC errors."),
    ("DEV_ECC_DBE_AGG_TOTAL", 313, C, N, "Total number of double-bit persistent ECC errors."),
    ("DEV_ECC_SBE_VOL_L1", 314, C, N, "L1 cache single bit volatile ECC errors"),
    ("DEV_ECC_DBE_VOL_L1", 315, C, N, "L1 cache double bit volatile ECC errors"),
    ("DEV_ECC_SBE_VOL_L2", 316, C, N, "L2 cache single bit volatile ECC errors"),
    ("DEV_ECC_DBE_VOL_L2", 317, C, N, "L2 cache double bit volatile ECC errors"),
    ("DEV_ECC_SBE_VOL_DEV", 318, C, N, "Device memory single bit volatile ECC errors"),
    ("DEV_ECC_DBE_VOL_DEV", 319, C, N, "Device memory double bit volatile ECC errors"),
    ("DEV_ECC_SBE_VOL_REG", 320, C, N, "Register file single bit volatile ECC errors"),
    ("DEV_ECC_DBE_VOL_REG", 321, C, N, "Register file double bit volatile ECC errors"),
    ("DEV_ECC_SBE_VOL_TEX", 322, C, N, "Texture memory single bit volatile ECC errors"),
    ("DEV_ECC_DBE_VOL_TEX", 323, C, N, "Texture memory double bit volatile ECC errors"),
    ("DEV_ECC_SBE_AGG_L1", 324, C, N, "L1 cache single bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_DBE_AGG_L1", 325, C, N, "L1 cache double bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_SBE_AGG_L2", 326, C, N, "L2 cache single bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_DBE_AGG_L2", 327, C, N, "L2 cache double bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_SBE_AGG_DEV", 328, C, N, "Device memory single bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_DBE_AGG_DEV", 329, C, N, "Device memory double bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_SBE_AGG_REG", 330, C, N, "Register File single bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_DBE_AGG_REG", 331, C, N, "Register File double bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_SBE_AGG_TEX", 332, C, N, "Texture memory single bit aggregate (persistent) ECC errors"),
    ("DEV_ECC_DBE_AGG_TEX", 333, C, N, "Texture memory double bit aggregate (persistent) ECC errors"),
    # --- retired pages and row remapping ---
    ("DEV_RETIRED_SBE", 390, C, N, "Total number of retired pages due to single-bit errors."),
    ("DEV_RETIRED_DBE", 391, C, N, "Total number of retired pages due to double-bit errors."),
    ("DEV_RETIRED_PENDING", 392, C, N, "Total number of pages pending retirement."),
    ("DEV_UNCORRECTABLE_REMAPPED_ROWS", 393, C, N, "Number of remapped rows for uncorrectable errors"),
    ("DEV_CORRECTABLE_REMAPPED_ROWS", 394, C, N, "Number of remapped rows for correctable errors"),
    ("DEV_ROW_REMAP_FAILURE", 395, G, N, "Whether remapping of rows has failed"),
    ("DEV_ROW_REMAP_PENDING", 396, G, N, "Whether remapping of rows is pending"),
    # --- NVLink totals (per-lane ids are generated below) ---
    ("DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 409, C, N, "Total number of NVLink flow-control CRC errors."),
    ("DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 419, C, N, "Total number of NVLink data CRC errors."),
    ("DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 429, C, N, "Total number of NVLink retries."),
    ("DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 439, C, N, "Total number of NVLink recovery errors."),
    ("DEV_NVLINK_BANDWIDTH_TOTAL", 449, C, N, "Total number of NVLink bandwidth counters for all lanes."),
    ("DEV_GPU_NVLINK_ERRORS", 450, G, N, "GPU NVLink error information"),
    # --- virtualization ---
    ("DEV_VIRTUAL_MODE", 500, G, N, "Virtualization Mode corresponding to the GPU"),
    ("DEV_VGPU_LICENSE_STATUS", 526, G, N, "vGPU License status"),
    # --- profiling (DCP; from NVML GPM on Hopper and later) ---
    ("PROF_GR_ENGINE_ACTIVE", 1001, G, F, "Ratio of time the graphics engine is active."),
    ("PROF_SM_ACTIVE", 1002, G, F, "The ratio of cycles an SM has at least 1 warp assigned."),
    ("PROF_SM_OCCUPANCY", 1003, G, F, "The ratio of number of warps resident on an SM."),
    ("PROF_PIPE_TENSOR_ACTIVE", 1004, G, F, "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("PROF_DRAM_ACTIVE", 1005, G, F,
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("PROF_PIPE_FP64_ACTIVE", 1006, G, F, "Ratio of cycles the fp64 pipes are active."),
    ("PROF_PIPE_FP32_ACTIVE", 1007, G, F, "Ratio of cycles the fp32 pipes are active."),
    ("PROF_PIPE_FP16_ACTIVE", 1008, G, F, "Ratio of cycles the fp16 pipes are active."),
    ("PROF_PCIE_TX_BYTES", 1009, G, N,
     "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads "
     "- in bytes per second."),
    ("PROF_PCIE_RX_BYTES", 1010, G, N,
     "The rate of data received over the PCIe bus - including both protocol headers and data payloads "
     "- in bytes per second."),
    ("PROF_NVLINK_TX_BYTES", 1011, G, N,
     "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second."),
    ("PROF_NVLINK_RX_BYTES", 1012, G, N,
     "The rate of data received over NVLink, not including protocol headers, in bytes per second."),
    ("PROF_PIPE_TENSOR_IMMA_ACTIVE", 1013, G, F, "Ratio of cycles the tensor (IMMA) pipe is active."),
    ("PROF_PIPE_TENSOR_HMMA_ACTIVE", 1014, G, F, "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("PROF_PIPE_TENSOR_DFMA_ACTIVE", 1015, G, F, "Ratio of cycles the tensor (DFMA) pipe is active."),
    ("PROF_PIPE_INT_ACTIVE", 1016, G, F, "Ratio of cycles the integer pipe is active."),
    ("PROF_C2C_TX_ALL_BYTES", 1076, G, N, "Bytes transmitted over the C2C interface, header and payload"),
    ("PROF_C2C_TX_DATA_BYTES", 1077, G, N, "Data-only bytes transmitted over the C2C interface"),
    ("PROF_C2C_RX_ALL_BYTES", 1078, G, N, "Bytes received over the C2C interface, header and payload"),
    ("PROF_C2C_RX_DATA_BYTES", 1079, G, N, "Data-only bytes received over the C2C interface"),
    # --- clock-event durations (DCGM 4) ---
    ("DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", 1420, C, N, "Throttling to not exceed power limits in ns"),
    ("DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS", 1421, C, N, "Throttling to match the Sync Boost Group in ns"),
    ("DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", 1422, C, N, "SW thermal slowdown in ns"),
    ("DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS", 1423, C, N, "HW thermal slowdown in ns"),
    ("DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS", 1424, C, N, "HW power brake slowdown in ns"),
)

# Per-lane and per-engine families, generated: (name pattern, first id, count, kind, integer, help pattern)
_FAMILIES: tuple[tuple[str, tuple[int, ...], str, bool, str], ...] = (
    ("DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L{n}", (*range(400, 406), *range(451, 457)), C, N,
     "NVLink flow control CRC error counter for lane {n}"),
    ("DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{n}", (*range(410, 416), *range(457, 463)), C, N,
     "NVLink data CRC error counter for lane {n}"),
    ("DEV_NVLINK_REPLAY_ERROR_COUNT_L{n}", (*range(420, 426), *range(463, 469)), C, N,
     "NVLink replay error counter for lane {n}"),
    ("DEV_NVLINK_RECOVERY_ERROR_COUNT_L{n}", (*range(430, 436), *range(469, 475)), C, N,
     "NVLink recovery error counter for lane {n}"),
    ("DEV_NVLINK_BANDWIDTH_L{n}", (*range(440, 446), *range(475, 481)), C, N,
     "NVLink bandwidth counter for lane {n}"),
    ("PROF_NVDEC{n}_ACTIVE", tuple(range(1017, 1025)), G, F, "Ratio of cycles NVDEC engine {n} is active."),
    ("PROF_NVJPG{n}_ACTIVE", tuple(range(1025, 1033)), G, F, "Ratio of cycles NVJPG engine {n} is active."),
    ("PROF_NVOFA{n}_ACTIVE", tuple(range(1033, 1035)), G, F, "Ratio of cycles NVOFA engine {n} is active."),
)

# dcgm-exporter's own counters (counters/const.go): not DCGM fields, but valid CSV rows. No NVML
# backend value; the collector may compute them. Ids are outside DCGM's range.
_EXPORTER_OWNED: tuple[tuple[str, int, str, bool, str], ...] = (
    ("DCGM_EXP_CLOCK_EVENTS_COUNT", 9001, G, N,
     "Count of clock events within the user-specified time window "
     "(see clock-events-count-window-size param)."),
    ("DCGM_EXP_XID_ERRORS_COUNT", 9002, G, N,
     "Count of XID Errors within user-specified time window (see xid-count-window-size param)."),
    ("DCGM_EXP_GPU_HEALTH_STATUS", 9003, G, N, "Health status of the GPU"),
    ("DCGM_EXP_P2P_STATUS", 9004, G, N, "P2P status of the GPU"),
)


def _build() -> dict[str, FieldDef]:
    out: dict[str, FieldDef] = {}
    for short, fid, kind, integer, help_ in _TABLE:
        name = f"DCGM_FI_{short}"
        out[name] = FieldDef(name, fid, kind, help_, integer)
    for pattern, ids, kind, integer, help_pattern in _FAMILIES:
        for n, fid in enumerate(ids):
            name = "DCGM_FI_" + pattern.format(n=n)
            out[name] = FieldDef(name, fid, kind, help_pattern.format(n=n), integer)
    for name, fid, kind, integer, help_ in _EXPORTER_OWNED:
        out[name] = FieldDef(name, fid, kind, help_, integer)
    return out


FIELDS: dict[str, FieldDef] = _build()

# Names sharing an id with another (deprecated macro aliases DCGM keeps for compatibility). A CSV
# row naming an alias is read as its target and exported under the name it lists, as go-dcgm's
# GetFieldID resolves it for dcgm-exporter 4.8.2.
ALIASES: dict[str, str] = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}

# dcgm-exporter 1.x metric names (go-dcgm's legacyDCGMFields), what etc/1.x-compatibility-metrics.csv
# lists: read as the DCGM field, exported under the 1.x name.
LEGACY_NAMES: dict[str, str] = {
    "dcgm_" + legacy: "DCGM_FI_" + current
    for legacy, current in (
        ("sm_clock", "DEV_SM_CLOCK"), ("memory_clock", "DEV_MEM_CLOCK"), ("memory_temp", "DEV_MEMORY_TEMP"),
        ("gpu_temp", "DEV_GPU_TEMP"), ("power_usage", "DEV_POWER_USAGE"),
        ("total_energy_consumption", "DEV_TOTAL_ENERGY_CONSUMPTION"), ("pcie_tx_throughput", "DEV_PCIE_TX_THROUGHPUT"),
        ("pcie_rx_throughput", "DEV_PCIE_RX_THROUGHPUT"), ("pcie_replay_counter", "DEV_PCIE_REPLAY_COUNTER"),
        ("gpu_utilization", "DEV_GPU_UTIL"), ("mem_copy_utilization", "DEV_MEM_COPY_UTIL"),
        ("enc_utilization", "DEV_ENC_UTIL"), ("dec_utilization", "DEV_DEC_UTIL"), ("xid_errors", "DEV_XID_ERRORS"),
        ("power_violation", "DEV_POWER_VIOLATION"), ("thermal_violation", "DEV_THERMAL_VIOLATION"),
        ("sync_boost_violation", "DEV_SYNC_BOOST_VIOLATION"), ("board_limit_violation", "DEV_BOARD_LIMIT_VIOLATION"),
        ("low_util_violation", "DEV_LOW_UTIL_VIOLATION"), ("reliability_violation", "DEV_RELIABILITY_VIOLATION"),
        ("fb_free", "DEV_FB_FREE"), ("fb_used", "DEV_FB_USED"),
        ("ecc_sbe_volatile_total", "DEV_ECC_SBE_VOL_TOTAL"), ("ecc_dbe_volatile_total", "DEV_ECC_DBE_VOL_TOTAL"),
        ("ecc_sbe_aggregate_total", "DEV_ECC_SBE_AGG_TOTAL"), ("ecc_dbe_aggregate_total", "DEV_ECC_DBE_AGG_TOTAL"),
        ("retired_pages_sbe", "DEV_RETIRED_SBE"), ("retired_pages_dbe", "DEV_RETIRED_DBE"),
        ("retired_pages_pending", "DEV_RETIRED_PENDING"),
        ("nvlink_flit_crc_error_count_total", "DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
        ("nvlink_data_crc_error_count_total", "DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
        ("nvlink_replay_error_count_total", "DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
        ("nvlink_recovery_error_count_total", "DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
        ("nvlink_bandwidth_total", "DEV_NVLINK_BANDWIDTH_TOTAL"),
        ("fi_prof_gr_engine_active", "PROF_GR_ENGINE_ACTIVE"), ("fi_prof_sm_active", "PROF_SM_ACTIVE"),
        ("fi_prof_sm_occupancy", "PROF_SM_OCCUPANCY"), ("fi_prof_pipe_tensor_active", "PROF_PIPE_TENSOR_ACTIVE"),
        ("fi_prof_dram_active", "PROF_DRAM_ACTIVE"), ("fi_prof_pcie_tx_bytes", "PROF_PCIE_TX_BYTES"),
        ("fi_prof_pcie_rx_bytes", "PROF_PCIE_RX_BYTES"),
    )
}  # fmt: skip


def canonical(name: str) -> str | None:
    """The DCGM field a CSV name is read as: itself, an alias's target, a 1.x name's field; None
    when unknown."""
    if name in ALIASES:
        return ALIASES[name]
    if name in FIELDS:
        return name
    return LEGACY_NAMES.get(name)

# DESIGN.md's default set in dcgm-exporter 4.8.2 default-counters.csv order, plus the driver label.
DEFAULT_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)


def field(name: str) -> FieldDef:
    """The definition of a field name; KeyError names the unknown field."""
    try:
        return FIELDS[name]
    except KeyError:
        raise KeyError(f"unknown DCGM field {name!r}") from None
