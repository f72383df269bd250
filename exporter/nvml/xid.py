"""XID critical-error events through one NVML event set (nvml.h ``nvmlEventSet*``)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from exporter.backend import XidEvent
from exporter.nvml.devices import NO_GI

log = logging.getLogger("exporter.nvml_xid")


class XidEvents:
    """The event set, the GPUs registered on it, and the wait. ``renew`` after NVML re-init: the
    old set is not freed (the XID thread may still be waiting on it)."""

    def __init__(self, nvml: Any, stop: threading.Event) -> None:
        self._nvml = nvml
        self._error: type[BaseException] = nvml.NVMLError
        self._stop = stop
        self._failing = False
        self.events: Any | None = None
        self.renew()

    def renew(self) -> None:
        try:
            self.events = self._nvml.nvmlEventSetCreate()
        except self._error as exc:
            self.events = None
            log.warning("XID events unavailable (nvmlEventSetCreate failed: %s): DCGM_FI_DEV_XID_ERRORS "
                        "is not published", exc)

    def watch(self, index: int, h: Any) -> bool:
        """Register one GPU; False (said once, with why) when its XID events cannot be received."""
        n = self._nvml
        if self.events is None:
            return False
        try:
            if n.nvmlDeviceGetSupportedEventTypes(h) & n.nvmlEventTypeXidCriticalError:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self.events)
                return True
            reason = "the GPU offers no XID critical error events"
        except self._error as exc:
            reason = str(exc)
        log.warning("GPU %d: cannot watch XID events (%s): DCGM_FI_DEV_XID_ERRORS is not published for it",
                    index, reason, extra={"gpu": index, "reason": reason})
        return False

    def wait(self, timeout_s: float) -> list[XidEvent]:
        """Block up to timeout_s: (gpu, xid) for the whole GPU, (gpu, xid, GPU instance id) when
        NVML names a MIG GPU instance. A failing wait is said once, then retried quietly."""
        n = self._nvml
        events = self.events
        if events is None:
            self._stop.wait(max(timeout_s, 0.0))
            return []
        out: list[XidEvent] = []
        wait_ms = max(int(timeout_s * 1000), 0)
        while len(out) < 64:
            try:
                data = n.nvmlEventSetWait_v2(events, wait_ms)
            except self._error as exc:
                if getattr(exc, "value", None) != n.NVML_ERROR_TIMEOUT:
                    if not self._failing:
                        log.warning("waiting for XID events failed (retrying quietly): %s", exc)
                    self._failing = True
                    self._stop.wait(min(max(timeout_s, 0.0), 1.0))
                break
            self._failing = False
            if data.eventType & n.nvmlEventTypeXidCriticalError:
                try:
                    gpu = int(n.nvmlDeviceGetIndex(data.device))
                except self._error as exc:
                    log.warning("XID %d on a device NVML cannot name: %s", data.eventData, exc)
                else:
                    gi = int(getattr(data, "gpuInstanceId", NO_GI))
                    out.append((gpu, int(data.eventData)) if gi == NO_GI else (gpu, int(data.eventData), gi))
            wait_ms = 0  # drain what else is queued, without blocking
        return out

    def close(self) -> None:
        if self.events is not None:
            self._nvml.nvmlEventSetFree(self.events)
            self.events = None
