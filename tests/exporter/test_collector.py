"""Collector: one cycle reads every GPU once; a failing GPU is isolated and retried; pods;
MIG per-instance series; health verdicts; self-metrics; the background thread."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest

from exporter.backend import DeviceInfo, Entity, GpuLostError, MigInstance, Value
from exporter.collector import Collector, DownGpu, Exposition, liveness_of, readiness_of
from exporter.xid import XidState
from tests.exporter.stubs import Pod, Spec
from tests.helpers import wait_until

SPECS = [
    Spec("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    Spec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Spec("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    Spec("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink bandwidth."),
    Spec("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
]
INTS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS"})


def device(i: int, mig: tuple[MigInstance, ...] = ()) -> DeviceInfo:
    return DeviceInfo(i, f"GPU-{i:08d}", f"00000000:{0x10 + i:02X}:00.0", "NVIDIA H200", i, mig)


@dataclass
class FakeBackend:
    """A tiny GpuBackend: fixed values, a read counter, and GPUs that can be made to fail."""

    n: int = 2
    mig: dict[int, tuple[MigInstance, ...]] = field(default_factory=dict)
    failing: set[int] = field(default_factory=set)
    reads: int = 0
    closed: bool = False
    unsupported: set[str] = field(default_factory=lambda: {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def driver_version(self) -> str:
        return "580.159.04"

    def devices(self) -> list[DeviceInfo]:
        return [device(i, self.mig.get(i, ())) for i in range(self.n)]

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        return set(fields) - self.unsupported

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        with self.lock:
            self.reads += 1
        if gpu in self.failing:
            raise GpuLostError(gpu, "fallen off the bus")
        values: dict[str, Value] = {"DCGM_FI_DEV_GPU_UTIL": 10 + gpu, "DCGM_FI_DEV_POWER_USAGE": 100.25 + gpu}
        values = {k: v for k, v in values.items() if k in fields}
        if gpu in self.mig:
            return {Entity(gpu, m.gpu_instance_id): values for m in self.mig[gpu]}
        return {Entity(gpu): values}

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        return []

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(backend: FakeBackend, **kw: object) -> Collector:
    kw.setdefault("integer_fields", INTS)
    return Collector(backend, SPECS, "node-a", 5.0, **kw)  # type: ignore[arg-type]


UP0 = 'gpu_exporter_device_up{gpu="0",UUID="GPU-00000000",pci_bus_id="00000000:10:00.0",Hostname="node-a"}'
UP1 = 'gpu_exporter_device_up{gpu="1",UUID="GPU-00000001",pci_bus_id="00000000:11:00.0",Hostname="node-a"}'


def lines(exp: Exposition, prefix: str) -> list[str]:
    return [ln for ln in exp.text.decode().splitlines() if ln.startswith(prefix)]


def test_one_cycle_reads_each_gpu_once_and_renders_exact_lines() -> None:
    be = FakeBackend(n=2)
    exp = make(be).collect_once()
    assert be.reads == 2
    assert lines(exp, "DCGM_FI_DEV_GPU_UTIL{") == [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-00000000",pci_bus_id="00000000:10:00.0",device="nvidia0",'
        'modelName="NVIDIA H200",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04"} 10',
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-00000001",pci_bus_id="00000000:11:00.0",device="nvidia1",'
        'modelName="NVIDIA H200",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04"} 11',
    ]
    assert lines(exp, "DCGM_FI_DEV_POWER_USAGE{")[0].endswith("} 100.250000")


def test_unsupported_field_is_absent() -> None:
    exp = make(FakeBackend()).collect_once()
    assert b"NVLINK_BANDWIDTH" not in exp.text


def test_xid_errors_is_zero_until_an_xid_then_the_last_code() -> None:
    xids = XidState()
    c = make(FakeBackend(n=1), xids=xids)
    assert lines(c.collect_once(), "DCGM_FI_DEV_XID_ERRORS{")[0].endswith("} 0")
    xids.record(0, 79)
    xids.record(0, 48)
    exp = c.collect_once()
    assert lines(exp, "DCGM_FI_DEV_XID_ERRORS{")[0].endswith("} 48")
    assert ('gpu_exporter_xid_errors_total{gpu="0",UUID="GPU-00000000",pci_bus_id="00000000:10:00.0",'
            'Hostname="node-a",xid="48"} 1') in lines(exp, "gpu_exporter_xid_errors_total{")


def test_failing_gpu_is_down_its_series_gone_others_present_then_recovers() -> None:
    be = FakeBackend(n=3, failing={1})
    c = make(be)
    exp = c.collect_once()
    util = lines(exp, "DCGM_FI_DEV_GPU_UTIL{")
    assert [ln.split('"')[1] for ln in util] == ["0", "2"]
    assert UP1 + " 0" in exp.text.decode()
    assert UP0 + " 1" in exp.text.decode()
    assert (exp.devices_up, exp.devices_total) == (2, 3)
    assert "fallen off the bus" in exp.problem
    c.collect_once()  # retried every cycle
    assert be.reads == 6
    assert ('gpu_exporter_collection_errors_total{gpu="1",UUID="GPU-00000001",pci_bus_id="00000000:11:00.0",'
            'Hostname="node-a"} 2') in c.exposition.text.decode()
    be.failing.clear()
    exp = c.collect_once()
    assert len(lines(exp, "DCGM_FI_DEV_GPU_UTIL{")) == 3
    assert UP1 + " 1" in exp.text.decode()
    assert exp.problem == ""


def test_any_exception_from_read_isolates_that_gpu() -> None:
    class Boom(FakeBackend):
        def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
            if gpu == 0:
                raise OSError("ioctl failed")
            return super().read(gpu, fields)

    exp = make(Boom(n=2)).collect_once()
    assert len(lines(exp, "DCGM_FI_DEV_GPU_UTIL{")) == 1
    assert "OSError: ioctl failed" in exp.problem


def test_mig_gpu_reports_only_per_instance_with_parent_gpu_and_uuid() -> None:
    migs = (MigInstance(2, "3g.71gb", "MIG-b"), MigInstance(1, "1g.18gb", "MIG-a"))
    exp = make(FakeBackend(n=2, mig={0: migs})).collect_once()
    util = lines(exp, "DCGM_FI_DEV_GPU_UTIL{")
    assert len(util) == 3
    assert util[0].startswith(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-00000000",pci_bus_id="00000000:10:00.0",'
        'device="nvidia0",modelName="NVIDIA H200",GPU_I_PROFILE="1g.18gb",GPU_I_ID="1",Hostname="node-a"')
    assert 'GPU_I_ID="2"' in util[1]
    assert "GPU_I_ID" not in util[2]


def test_pod_labels_only_on_held_gpus_and_mig_instances() -> None:
    migs = (MigInstance(1, "1g.18gb", "MIG-a"), MigInstance(2, "1g.18gb", "MIG-b"))
    pods = {"GPU-00000001": Pod("p1", "ns", "c1"), "MIG-b": Pod("p2", "ns", "c2")}
    exp = make(FakeBackend(n=3, mig={0: migs}), pods=lambda: pods).collect_once()
    util = lines(exp, "DCGM_FI_DEV_GPU_UTIL{")
    assert [("pod=" in ln) for ln in util] == [False, True, True, False]
    assert util[1].endswith(',DCGM_FI_DRIVER_VERSION="580.159.04",container="c2",namespace="ns",pod="p2"} 10')
    assert 'pod="p1"' in util[2]


def test_pod_source_failure_counts_kubelet_error_and_keeps_series() -> None:
    def broken() -> Mapping[str, Pod]:
        raise ConnectionError("kubelet down")

    exp = make(FakeBackend(n=1), pods=broken, kubelet_errors=lambda: 3).collect_once()
    assert len(lines(exp, "DCGM_FI_DEV_GPU_UTIL{")) == 1
    assert 'gpu_exporter_kubelet_errors_total{Hostname="node-a"} 4' in exp.text.decode()


def test_kubelet_family_absent_without_kubernetes() -> None:
    assert b"kubelet" not in make(FakeBackend(n=1)).collect_once().text


def test_no_hostname_omits_the_label() -> None:
    exp = Collector(FakeBackend(n=1), SPECS, None, 5.0).collect_once()
    assert b"Hostname" not in exp.text
    assert b'modelName="NVIDIA H200",DCGM_FI_DRIVER_VERSION="580.159.04"} 10' in exp.text


def test_openmetrics_variant_ends_with_eof_and_self_counters_use_total_samples() -> None:
    om = make(FakeBackend(n=1)).collect_once().openmetrics.decode()
    assert om.endswith("# EOF\n")
    assert "# TYPE gpu_exporter_collection_errors counter\n" in om
    assert ('gpu_exporter_collection_errors_total{gpu="0",UUID="GPU-00000000",pci_bus_id="00000000:10:00.0",'
            'Hostname="node-a"} 0') in om


def test_build_info_and_last_collection_timestamp() -> None:
    exp = make(FakeBackend(n=1), backend_name="simulated", wall_clock=lambda: 1_700_000_000.5).collect_once()
    text = exp.text.decode()
    assert 'gpu_exporter_last_collection_timestamp_seconds{Hostname="node-a"} 1700000000.5\n' in text
    assert 'backend="simulated",Hostname="node-a"} 1' in text


def test_supported_probe_can_be_passed_in() -> None:
    be = FakeBackend(n=1)
    exp = make(be, supported={0: {"DCGM_FI_DEV_GPU_UTIL"}}).collect_once()
    assert lines(exp, "DCGM_FI_DEV_GPU_UTIL{") and not lines(exp, "DCGM_FI_DEV_POWER_USAGE{")


DOWN0 = (DownGpu(0, "GPU-a", "GPU_IS_LOST"),)


@pytest.mark.parametrize(
    ("collected_at", "now", "up", "total", "down", "live", "ready", "reason_part"),
    [
        (None, 0.0, 0, 0, (), False, False, "no collection"),
        (100.0, 100.0, 2, 2, (), True, True, "OK"),
        (100.0, 114.9, 2, 2, (), True, True, "OK"),
        (100.0, 115.0, 2, 2, (), False, False, "more than 3 intervals"),
        (100.0, 101.0, 1, 2, DOWN0, True, True, "OK; gpu 0 (GPU-a) down: GPU_IS_LOST"),
        # issue 7: every GPU lost is not a liveness failure (a restart cannot fix hardware)
        (100.0, 101.0, 0, 1, DOWN0, True, False, "gpu 0 (GPU-a) down: GPU_IS_LOST"),
        (100.0, 101.0, 0, 0, (), True, True, "OK"),
    ],
)
def test_liveness_and_readiness_verdicts(
    collected_at: float | None, now: float, up: int, total: int, down: tuple[DownGpu, ...],
    live: bool, ready: bool, reason_part: str,
) -> None:
    exp = Exposition(b"", b"", collected_at, up, total, "", down)
    ok, reason = liveness_of(exp, now, 5.0)
    assert ok is live and (reason_part in reason or not live)
    ok, reason = readiness_of(exp, now, 5.0)
    assert ok is ready and reason_part in reason


def test_health_turns_stale_with_injected_clock() -> None:
    clock = Clock()
    c = make(FakeBackend(n=1), clock=clock)
    # issue 7: liveness fails only when the loop is stale: the first cycle has 3 intervals
    assert c.health() == (True, "OK; no collection has finished yet")
    assert c.readiness() == (False, "no collection has finished yet")
    clock.t += 15.0
    assert c.health()[0] is False
    c.collect_once()
    assert c.health() == (True, "OK")
    clock.t += 15.0
    assert c.health()[0] is False


def test_background_thread_collects_and_stops() -> None:
    be = FakeBackend(n=2)
    c = Collector(be, SPECS, "h", 0.05)
    c.start()
    try:
        assert wait_until(lambda: be.reads >= 6, timeout=5)
    finally:
        c.stop()
    reads = be.reads
    assert c.exposition.collected_at is not None
    assert wait_until(lambda: False, timeout=0.15) is False
    assert be.reads == reads


def test_wake_runs_a_cycle_before_the_next_tick() -> None:
    be = FakeBackend(n=1)
    c = Collector(be, SPECS, "h", 60.0)
    c.start()
    try:
        assert wait_until(lambda: be.reads == 1, timeout=5)
        c.wake(0, 79)
        assert wait_until(lambda: be.reads == 2, timeout=5)
    finally:
        c.stop()


def test_label_rows_come_from_backend_labels_sorted_after_hostname() -> None:
    class WithLabels(FakeBackend):
        def labels(self, gpu: int) -> dict[str, str]:
            return {"DCGM_FI_DEV_SERIAL": f"13241{gpu}", "DCGM_FI_DRIVER_VERSION": "580.159.04"}

    specs = [*SPECS, Spec("DCGM_FI_DEV_SERIAL", "label", "Device Serial Number"),
             Spec("DCGM_FI_DEV_VBIOS_VERSION", "label", "VBIOS version")]
    exp = Collector(WithLabels(n=1), specs, "h", 5.0).collect_once()
    util = lines(exp, "DCGM_FI_DEV_GPU_UTIL{")[0]
    assert util.endswith(',Hostname="h",DCGM_FI_DEV_SERIAL="132410",DCGM_FI_DRIVER_VERSION="580.159.04"} 10')
