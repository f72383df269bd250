"""The fake NVML's XID event calls: supported types, event sets, registration, and waits that answer
the queued ``xids`` (else TIMEOUT, NVML's idle answer)."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml as _real

from tests.exporter.fake_nvml_common import REC, FakeBase, Handle


class EventCalls(FakeBase):
    """XID events as nvml.h documents them."""

    xids: list[tuple[int, ...]]
    registered: list[int]

    def nvmlDeviceGetSupportedEventTypes(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetSupportedEventTypes", h)
        return int(REC["static"]["supported_event_types"])

    def nvmlEventSetCreate(self) -> object:
        self._hit("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: object) -> None:
        self._hit("nvmlDeviceRegisterEvents", h)
        self.registered.append(h.gpu)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._hit("nvmlEventSetWait_v2")
        if not self.xids:
            raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)
        event = self.xids.pop(0)
        gpu, xid = event[0], event[1]
        gi = event[2] if len(event) > 2 else 0xFFFFFFFF
        return SimpleNamespace(
            device=Handle(gpu, gen=self.gen),
            eventType=_real.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=gi,
            computeInstanceId=0xFFFFFFFF,
        )

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._hit("nvmlEventSetFree")
