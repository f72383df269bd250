"""The fake NVML's ``nvmlDeviceGetFieldValues`` and NVLink link state.

Field values answer what the recorded H200 answered (``field_values_supported``); an id it did not
support answers NOT_SUPPORTED in that entry's ``nvmlReturn``, as nvml.h documents. The clock drives
the energy, PCIe byte and NVLink KiB counters and the timestamps (``zero_timestamps``: 0, as some
drivers answer). ``nvmlDeviceGetNvLinkState``: NOT_SUPPORTED without NVLink (the recorded PCIe H200),
else links ``0 .. nvlink_links - 1`` exist (18 on an H100/H200 SXM; INVALID_ARGUMENT past them) and
are active unless listed in ``links_down``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml as _real

from tests.exporter.fake_nvml_common import MIB, FakeBase, Handle, _value_obj


class FieldValueCalls(FakeBase):
    """Field values and NVLink state; see the module docstring."""

    fields: dict[int, tuple[int, float]]
    field_requests: list[list[Any]]
    load: dict[str, Any]
    memory_temp_type: int | None
    zero_timestamps: bool
    nvlink: bool
    nvlink_links: int
    links_down: set[int]

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        self._hit("nvmlDeviceGetNvLinkState", h)
        if not self.nvlink:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < min(self.nvlink_links, _real.NVML_NVLINK_MAX_LINKS):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return int(_real.NVML_FEATURE_DISABLED if link in self.links_down else _real.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetFieldValues(self, h: Handle, ids: list[Any]) -> list[SimpleNamespace]:
        self._hit("nvmlDeviceGetFieldValues", h)
        self.field_requests.append(list(ids))
        t = self._t()
        out = []
        for entry in ids:
            fid, scope = entry if isinstance(entry, tuple) else (entry, 0)
            known = self.fields.get(fid)
            if known is None:
                out.append(
                    SimpleNamespace(
                        fieldId=fid,
                        scopeId=scope,
                        nvmlReturn=_real.NVML_ERROR_NOT_SUPPORTED,
                        valueType=0,
                        timestamp=0,
                        value=_value_obj(0, 0),
                    )
                )
                continue
            vtype, value = known
            if fid == _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                value = self.load["energy_mj"] + int(t * self.load["power_mw"])  # mW * s = mJ
            elif fid == _real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
                value = value + int(t * 5 * MIB)
            elif fid == _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
                value = value + int(t * 13 * MIB)
            elif fid == _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                value = int(t * 3000)
            elif fid == _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                value = int(t * 1000)
            obj = _value_obj(vtype, value)
            if fid == _real.NVML_FI_DEV_MEMORY_TEMP and self.memory_temp_type is not None:
                vtype = self.memory_temp_type  # the driver claims another type; only 4 bytes are set
                obj = _value_obj(vtype, (0xDEAD << 32) | int(value))
                obj.uiVal = int(value)
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=scope,
                    nvmlReturn=0,
                    valueType=vtype,
                    timestamp=0 if self.zero_timestamps else int(t * 1e6),
                    value=obj,
                )
            )
        return out
