"""The fake NVML's GPM calls: support query, sample buffers, per-GPU and per-MIG-instance samples, and
``nvmlGpmMetricsGet`` answering the recorded training load (half of it on a MIG GPU instance)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml as _real

from tests.exporter.fake_nvml_common import FakeBase, Handle


@dataclass
class Sample:
    entity: Handle | None = None
    taken: int = 0


@dataclass
class Metric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


@dataclass
class MetricsGet:
    version: int = 0
    numMetrics: int = 0
    sample1: Sample | None = None
    sample2: Sample | None = None
    metrics: list[Metric] = field(default_factory=lambda: [Metric() for _ in range(256)])

class GpmCalls(FakeBase):
    """``nvmlGpm*`` as nvml.h documents them; ``gpm_values`` maps a metric id to its value."""

    gpm_supported: bool
    gpm_refused: bool
    gpm_values: dict[int, float]

    def nvmlGpmQueryDeviceSupport(self, h: Handle) -> SimpleNamespace:
        self._hit("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Sample:
        self._hit("nvmlGpmSampleAlloc")
        return Sample()

    def nvmlGpmSampleFree(self, sample: Sample) -> None:
        self._hit("nvmlGpmSampleFree")

    def nvmlGpmSampleGet(self, h: Handle, sample: Sample) -> Sample:
        self._hit("nvmlGpmSampleGet", h)
        if self.gpm_refused:
            raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)
        sample.entity, sample.taken = h, self.calls["nvmlGpmSampleGet"] + self.calls["nvmlGpmMigSampleGet"]
        return sample

    def nvmlGpmMigSampleGet(self, h: Handle, gi: int, sample: Sample) -> Sample:
        self._hit("nvmlGpmMigSampleGet", h)
        if self.gpm_refused:
            raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)
        sample.entity, sample.taken = (
            Handle(h.gpu, gi),
            self.calls["nvmlGpmSampleGet"] + self.calls["nvmlGpmMigSampleGet"],
        )
        return sample

    def c_nvmlGpmMetricsGet_t(self) -> MetricsGet:
        return MetricsGet()

    def nvmlGpmMetricsGet(self, req: MetricsGet) -> MetricsGet:
        self._hit("nvmlGpmMetricsGet", req.sample2.entity if req.sample2 else None)
        assert req.sample1 is not None and req.sample2 is not None and req.sample1 is not req.sample2
        assert req.sample1.entity == req.sample2.entity and req.sample1.taken < req.sample2.taken
        share = 0.5 if req.sample2.entity is not None and req.sample2.entity.gi is not None else 1.0
        for m in req.metrics[: req.numMetrics]:
            if m.metricId in self.gpm_values:
                m.nvmlReturn, m.value = 0, self.gpm_values[m.metricId] * share
            else:
                m.nvmlReturn, m.value = _real.NVML_ERROR_NOT_SUPPORTED, 0.0
        return req
