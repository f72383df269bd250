"""The fake NVML's MIG calls: mode, MIG device handles, GPU/compute instance ids, attributes and the
GPU-instance profile table, built from ``FakeNvml.mig`` (see its docstring for the entry forms)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pynvml as _real

from tests.exporter.fake_nvml_common import FakeBase, Handle


class MigCalls(FakeBase):
    """MIG as nvml.h documents it; ``profiles = False`` makes the profile calls NOT_SUPPORTED."""

    mig: dict[int, Sequence[tuple[int, ...]]]
    profiles: bool

    def _mig_entry(self, h: Handle) -> tuple[int, int, int, int]:
        """(gi, slices, profile memorySizeMB, memory total MiB) for a MIG device handle."""
        for m in self.mig[h.gpu]:
            if m[0] == h.gi and (len(m) < 4 or m[3] == h.ci):
                if len(m) < 4:
                    mb = m[2] * 1024 - 300
                    return m[0], m[1], mb, mb
                return m[0], m[1], m[2], m[2] - 1024
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        self._hit("nvmlDeviceGetMigMode", h)
        return [1, 1] if h.gpu in self.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7 if h.gpu in self.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, index: int) -> Handle:
        self._hit("nvmlDeviceGetMigDeviceHandleByIndex", h)
        instances = self.mig.get(h.gpu, ())
        if index >= len(instances):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        m = instances[index]
        return Handle(h.gpu, m[0], m[3] if len(m) > 3 else 0, gen=self.gen)

    def nvmlDeviceGetGpuInstanceId(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetGpuInstanceId", h)
        assert h.gi is not None
        return h.gi

    def nvmlDeviceGetComputeInstanceId(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetComputeInstanceId", h)
        assert h.gi is not None
        return h.ci

    def nvmlDeviceGetAttributes(self, h: Handle) -> SimpleNamespace:
        """The MIG device's attributes; memorySizeMB is the memory it reports (for 4-tuple
        entries a GiB under the profile's), so only the profile route names profiles as DCGM."""
        self._hit("nvmlDeviceGetAttributes", h)
        _gi, slices, _profile_mb, total = self._mig_entry(h)
        return SimpleNamespace(gpuInstanceSliceCount=slices, memorySizeMB=total)

    def _profiles(self, gpu: int) -> list[tuple[int, int]]:
        """GPU instance profiles by profile index: (sliceCount, memorySizeMB); id = 100 + index."""
        out = set()
        for m in self.mig.get(gpu, ()):
            out.add((m[1], m[2] * 1024 - 300 if len(m) < 4 else m[2]))
        return sorted(out)

    def nvmlDeviceGetGpuInstanceById(self, h: Handle, gi: int) -> Handle:
        self._hit("nvmlDeviceGetGpuInstanceById", h)
        if not self.profiles or not any(m[0] == gi for m in self.mig.get(h.gpu, ())):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED if not self.profiles else _real.NVML_ERROR_NOT_FOUND)
        return Handle(h.gpu, gi, gen=self.gen)

    def nvmlGpuInstanceGetInfo(self, gih: Handle) -> SimpleNamespace:
        self._hit("nvmlGpuInstanceGetInfo", gih)
        m = next(m for m in self.mig[gih.gpu] if m[0] == gih.gi)
        key = (m[1], m[2] * 1024 - 300 if len(m) < 4 else m[2])
        return SimpleNamespace(id=gih.gi, profileId=100 + self._profiles(gih.gpu).index(key))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Handle, profile: int) -> SimpleNamespace:
        self._hit("nvmlDeviceGetGpuInstanceProfileInfo", h)
        table = self._profiles(h.gpu)
        if not self.profiles or profile >= len(table):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        slices, mb = table[profile]
        return SimpleNamespace(id=100 + profile, sliceCount=slices, memorySizeMB=mb)
