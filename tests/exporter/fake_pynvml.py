"""A fake ``pynvml`` replaying the recorded H200 (exporter/data/h200.json), for NvmlBackend tests.

It exposes the pynvml names NvmlBackend uses, with pynvml's own constants and ``NVMLError`` classes,
counts every call (``calls``), and can be told to fail: ``init_error`` (an NVML error code for
nvmlInit), ``fail[func] = code`` (that function raises), ``lost`` (GPUs answering GPU_IS_LOST),
``unknown`` (GPUs answering NVML_ERROR_UNKNOWN to everything), ``broken[gpu] = code`` (every call on
that GPU's handles raises ``code``, e.g. RESET_REQUIRED), ``handle_error[gpu] = code`` (getting the
GPU's handle fails, as for a GPU lost before start), ``hang[gpu]`` (an Event: every call on that GPU
blocks until it is set), ``gpm_refused`` (GPM sampling answers NO_PERMISSION, as with
NVreg_RestrictProfilingToAdminUsers=1 and no CAP_SYS_ADMIN), ``pre_r510`` (no
``nvmlDeviceGetMemoryInfo_v2`` symbol: FUNCTION_NOT_FOUND), ``unprivileged`` (a MIG GPU's parent
handle answers NO_PERMISSION to memory info, as nvml.h documents), ``driver_reload()`` (every call answers
UNINITIALIZED until nvmlShutdown + nvmlInit; older handles are then invalid). ``xids`` queues XID
events: (gpu, xid) or (gpu, xid, gpu instance id). ``processes[gpu]`` (or ``[(gpu, gi)]`` for a MIG
GPU instance) lists the PIDs ``nvmlDeviceGetComputeRunningProcesses`` answers (default: one process a
GPU, the recording's load); ``hidden_processes`` makes it answer none while memory stays used, as NVML
does in a container that cannot see other PID namespaces. ``p2p[(a, b)]`` is the NVLink
nvmlGpuP2PStatus_t of a GPU pair (default NOT_SUPPORTED, a PCIe board); ``inforom[gpu]`` what
``nvmlDeviceValidateInforom`` answers (default SUCCESS; ``fake_nvml_health``). The clock (seconds)
drives energy, PCIe and NVLink counters and field timestamps. ``nvlink=True`` makes an SXM board: 18 NVLink links
(``nvlink_links``), active unless in ``links_down``, moving 3,000 KiB/s TX and 1,000 KiB/s RX (the
throughput counters and GPM agree); without it NVLink answers NOT_SUPPORTED and GPM's NVLink
metrics 0, as the recorded PCIe H200 did.

As nvml.h documents for a function the device or driver lacks, any ``nvml*`` name this fake does not
implement answers NVML_ERROR_NOT_SUPPORTED when called; it never succeeds silently.

MIG: ``mig[gpu]`` lists MIG devices as (gi, slices, GiB) (profile memory = memory total =
GiB * 1024 - 300 MiB, one compute instance) or (gi, slices, profile MiB, ci) (memory total one GiB
under the profile's memorySizeMB, as drivers reserve some; several entries with the same gi are
compute instances of one GPU instance). The GPU-instance profile table (nvmlGpuInstanceGetInfo,
nvmlDeviceGetGpuInstanceProfileInfo) is built from those entries.

The calls live by concern in ``fake_nvml_common`` (recording, handles, the fault gate every call
passes), ``fake_nvml_fields`` (field values, NVLink state), ``fake_nvml_gpm``, ``fake_nvml_mig`` and
``fake_nvml_events`` and ``fake_nvml_health``; :class:`FakeNvml` holds the state and the remaining device getters.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pynvml as _real

from tests.exporter.fake_nvml_common import ERROR_NAMES, MIB, REC, FakeBase, Handle, _not_supported, _uuid
from tests.exporter.fake_nvml_events import EventCalls
from tests.exporter.fake_nvml_fields import FieldValueCalls
from tests.exporter.fake_nvml_gpm import GpmCalls, Metric, MetricsGet, Sample
from tests.exporter.fake_nvml_health import HealthCalls
from tests.exporter.fake_nvml_mig import MigCalls

__all__ = ["ERROR_NAMES", "MIB", "REC", "FakeBase", "FakeNvml", "Handle", "Metric", "MetricsGet", "Sample", "_uuid"]


class FakeNvml(FieldValueCalls, GpmCalls, MigCalls, EventCalls, HealthCalls):
    """One fake NVML library instance. ``mig`` maps a GPU to its instances' (gi id, slices, GiB)."""

    def __init__(
        self,
        n_gpus: int = 1,
        clock: Callable[[], float] | None = None,
        mig: Mapping[int, Sequence[tuple[int, ...]]] | None = None,
        gpm_supported: bool = True,
        *,
        nvlink: bool = False,
    ) -> None:
        for name in dir(_real):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlMemory_v")) or name.startswith("NVMLError"):
                setattr(self, name, getattr(_real, name))
        self.n_gpus = n_gpus
        self.now = 0.0
        self.clock = clock or (lambda: self.now)
        self.mig = dict(mig or {})
        self.gpm_supported = gpm_supported
        self.calls: Counter[str] = Counter()
        self.init_error: int | None = None
        self.fail: dict[str, int] = {}
        self.lost: set[int] = set()
        self.unknown: set[int] = set()
        self.broken: dict[int, int] = {}
        self.handle_error: dict[int, int] = {}
        self.hang: dict[int, threading.Event] = {}
        self.gpm_refused = False
        self.pre_r510 = False
        self.memory_temp_type: int | None = None  # r545: a wrong valueType; only uiVal is filled
        self.zero_timestamps = False
        self.gen = 0
        self.uninitialized = False
        self.nvlink = nvlink
        self.profiles = True  # False: the GPU-instance profile calls answer NOT_SUPPORTED
        # True: the caller lacks privileges; nvml.h: "In MIG mode, if device handle is provided,
        # [nvmlDeviceGetMemoryInfo] returns aggregate information, only if the caller has
        # appropriate privileges" (else NO_PERMISSION; MIG device handles still answer)
        self.unprivileged = False
        self.xids: list[tuple[int, ...]] = []
        self.processes: dict[int | tuple[int, int], list[int]] = {}
        self.hidden_processes = False
        self.p2p: dict[tuple[int, int], int] = {}
        self.inforom: dict[int, int] = {}  # gpu -> nvmlDeviceValidateInforom's answer (default SUCCESS)
        self.registered: list[int] = []
        self.field_requests: list[list[Any]] = []
        self.load = REC["load"]
        fv = REC["field_values_supported"]
        self.fields: dict[int, tuple[int, float]] = {e["id"]: (e["type"], e["value"]) for e in fv.values()}
        self.fields[_real.NVML_FI_DEV_MEMORY_TEMP] = (1, self.load["memory_temp"])
        train = REC["gpm"]["training"]
        self.gpm_values = {getattr(_real, "NVML_GPM_METRIC_" + k): v for k, v in train.items()}
        self.gpm_values[_real.NVML_GPM_METRIC_INTEGER_UTIL] = REC["gpm"]["matmul"]["INTEGER_UTIL"]
        self.nvlink_links = 18 if nvlink else 0  # an H100/H200 SXM: 18 links to the NVSwitches
        self.links_down: set[int] = set()
        if nvlink:  # KiB counters, 3 000 KiB/s TX and 1 000 KiB/s RX in total; GPM says the same in MiB/s
            self.fields[_real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX] = (3, 0)
            self.fields[_real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX] = (3, 0)
            self.gpm_values[_real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = 3000 / 1024
            self.gpm_values[_real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] = 1000 / 1024

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            return _not_supported(name)
        raise AttributeError(name)

    def driver_reload(self) -> None:
        """The driver was unloaded and loaded again: calls answer UNINITIALIZED until re-init."""
        self.uninitialized = True
        self.gen += 1

    # --- system ------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self.uninitialized = False

    def nvmlShutdown(self) -> None:
        self._hit("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        self._hit("nvmlSystemGetDriverVersion")
        return str(REC["static"]["driver_version"])

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._hit("nvmlSystemGetNVMLVersion")
        return str(REC["static"]["nvml_version"])

    def nvmlDeviceGetCount(self) -> int:
        self._hit("nvmlDeviceGetCount")
        return self.n_gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._hit("nvmlDeviceGetHandleByIndex")
        if index in self.handle_error:
            raise _real.NVMLError(self.handle_error[index])
        if not 0 <= index < self.n_gpus:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index, gen=self.gen)

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes | str) -> Handle:
        self._hit("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i in range(self.n_gpus):
            if _uuid(Handle(i)) == text:
                if i in self.handle_error:
                    raise _real.NVMLError(self.handle_error[i])
                return Handle(i, gen=self.gen)
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetIndex")
        return h.gpu

    # --- static ------------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, h: Handle) -> str:
        self._hit("nvmlDeviceGetName", h)
        return str(REC["static"]["name"])

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        self._hit("nvmlDeviceGetUUID", h)
        return _uuid(h)

    def nvmlDeviceGetPciInfo(self, h: Handle) -> SimpleNamespace:
        self._hit("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=f"00000000:{0x18 + h.gpu:02X}:00.0".encode())

    def nvmlDeviceGetMinorNumber(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetMinorNumber", h)
        return h.gpu

    def nvmlDeviceGetSerial(self, h: Handle) -> str:
        self._hit("nvmlDeviceGetSerial", h)
        return str(REC["static"]["serial"])

    def nvmlDeviceGetVbiosVersion(self, h: Handle) -> str:
        self._hit("nvmlDeviceGetVbiosVersion", h)
        return str(REC["static"]["vbios"])

    def nvmlDeviceGetInforomImageVersion(self, h: Handle) -> str:
        self._hit("nvmlDeviceGetInforomImageVersion", h)
        return str(REC["static"]["inforom_image"])

    def nvmlDeviceGetInforomVersion(self, h: Handle, which: int) -> str:
        self._hit("nvmlDeviceGetInforomVersion", h)
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetBrand(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetBrand", h)
        return int(REC["static"]["brand"])

    def nvmlDeviceGetMaxClockInfo(self, h: Handle, kind: int) -> int:
        self._hit("nvmlDeviceGetMaxClockInfo", h)
        s = REC["static"]
        return int(s["max_clock_sm"] if kind == _real.NVML_CLOCK_SM else s["max_clock_mem"])

    def nvmlDeviceGetTemperatureThreshold(self, h: Handle, kind: int) -> int:
        self._hit("nvmlDeviceGetTemperatureThreshold", h)
        s = REC["static"]
        slowdown = kind == _real.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return int(s["temperature_slowdown"] if slowdown else s["temperature_shutdown"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetMaxPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetMaxPcieLinkWidth", h)
        return 16

    def nvmlDeviceGetPowerManagementLimit(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetPowerManagementLimit", h)
        return int(REC["static"]["power_limit_mw"])

    # --- per pass ----------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> SimpleNamespace:
        self._hit("nvmlDeviceGetUtilizationRates", h)
        if h.gpu in self.mig:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(**self.load["utilization"])

    def nvmlDeviceGetMemoryInfo(self, h: Handle, version: int | None = None) -> SimpleNamespace:
        self._hit("nvmlDeviceGetMemoryInfo", h)
        if version is not None and self.pre_r510:  # pynvml looks up nvmlDeviceGetMemoryInfo_v2
            raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if h.gi is None and h.gpu in self.mig and self.unprivileged:
            raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)
        if h.gi is not None:
            total = self._mig_entry(h)[3] * MIB
            return SimpleNamespace(total=total, used=total // 4, free=total - total // 4, reserved=0)
        m = self.load["memory_v2"]
        if version is None:  # nvmlMemory_t (v1): no reserved field, used includes it
            return SimpleNamespace(total=m["total"], free=m["free"], used=m["total"] - m["free"])
        return SimpleNamespace(**m)

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetPowerUsage", h)
        return int(self.load["power_mw"])

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        self._hit("nvmlDeviceGetTemperature", h)
        return int(self.load["temp"])

    def nvmlDeviceGetClockInfo(self, h: Handle, kind: int) -> int:
        self._hit("nvmlDeviceGetClockInfo", h)
        clocks = {_real.NVML_CLOCK_SM: self.load["clock_sm"], _real.NVML_CLOCK_MEM: self.load["clock_mem"]}
        return int(clocks.get(kind, 1755))

    def nvmlDeviceGetEncoderUtilization(self, h: Handle) -> list[int]:
        self._hit("nvmlDeviceGetEncoderUtilization", h)
        return [0, 100000]

    def nvmlDeviceGetDecoderUtilization(self, h: Handle) -> list[int]:
        self._hit("nvmlDeviceGetDecoderUtilization", h)
        return [0, 100000]

    def nvmlDeviceGetPerformanceState(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetPerformanceState", h)
        return 0

    def nvmlDeviceGetFanSpeed(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetFanSpeed", h)
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetCurrentClocksEventReasons", h)
        return int(self.load["clocks_event_reasons"])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetCurrPcieLinkWidth", h)
        return 16

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        self._hit("nvmlDeviceGetEnforcedPowerLimit", h)
        return int(REC["static"]["power_limit_mw"])

    def nvmlDeviceGetPcieThroughput(self, h: Handle, counter: int) -> int:
        self._hit("nvmlDeviceGetPcieThroughput", h)  # 20 ms on real hardware: must never be called
        return 705

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[SimpleNamespace]:
        """nvmlProcessInfo_t (v3) entries: pid, usedGpuMemory, gpuInstanceId, computeInstanceId."""
        self._hit("nvmlDeviceGetComputeRunningProcesses", h)
        key: int | tuple[int, int] = h.gpu if h.gi is None else (h.gpu, h.gi)
        pids = self.processes.get(key, [4000 + h.gpu] if h.gi is None else [])
        if self.hidden_processes:
            return []
        none = 0xFFFFFFFF
        return [SimpleNamespace(pid=pid, usedGpuMemory=self.load["memory_v2"]["used"] // max(len(pids), 1),
                                gpuInstanceId=none if h.gi is None else h.gi,
                                computeInstanceId=none if h.gi is None else h.ci) for pid in pids]

    def nvmlDeviceGetP2PStatus(self, h1: Handle, h2: Handle, index: int) -> int:
        self._hit("nvmlDeviceGetP2PStatus", h1)
        if index != _real.NVML_P2P_CAPS_INDEX_NVLINK:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return int(self.p2p.get((h1.gpu, h2.gpu), _real.NVML_P2P_STATUS_NOT_SUPPORTED))
