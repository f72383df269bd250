"""The fake NVML's ``nvmlDeviceValidateInforom``, as nvml.h documents it: SUCCESS when the infoROM is
not corrupted (the default, as on the recorded H200's generation), ``NVML_ERROR_CORRUPTED_INFOROM``
when it is, NOT_SUPPORTED where the device cannot validate it. ``inforom[gpu]`` sets that GPU's
answer (an NVML return code, 0 for SUCCESS)."""

from __future__ import annotations

import pynvml as _real

from tests.exporter.fake_nvml_common import FakeBase, Handle


class HealthCalls(FakeBase):
    """InfoROM validation; see the module docstring."""

    inforom: dict[int, int]

    def nvmlDeviceValidateInforom(self, h: Handle) -> None:
        self._hit("nvmlDeviceValidateInforom", h)
        code = self.inforom.get(h.gpu, _real.NVML_SUCCESS)
        if code != _real.NVML_SUCCESS:
            raise _real.NVMLError(code)
