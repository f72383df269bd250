"""The NVML call behind DCGM's InfoROM health check that the field tables cannot express as a getter.

``nvmlDeviceValidateInforom`` (nvml.h): SUCCESS when the infoROM is not corrupted,
``NVML_ERROR_CORRUPTED_INFOROM`` when its checksums fail, NOT_SUPPORTED when the device cannot
validate it. It becomes ``DCGM_FI_DEV_INFOROM_CONFIG_VALID`` (DCGM field 84: 1 valid, 0 corrupt); any
other error propagates, so a GPU that cannot validate does not report the field (absent, not valid).
It reads the infoROM from flash, so it is a static value (read when the GPU is probed; DCGM re-reads
it hourly).
"""

from __future__ import annotations

from typing import Any

INFOROM_VALID = "DCGM_FI_DEV_INFOROM_CONFIG_VALID"


def inforom_valid(nvml: Any, h: Any) -> int:
    """1 when NVML validates the infoROM, 0 when it answers CORRUPTED_INFOROM; other errors raise."""
    try:
        nvml.nvmlDeviceValidateInforom(h)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_CORRUPTED_INFOROM:
            return 0
        raise
    return 1
