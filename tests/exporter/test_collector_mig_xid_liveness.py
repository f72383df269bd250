"""Collector behaviour issue 7 asks for: MIG GPU-wide fields on each GPU instance, time-sliced pods,
XID err_code/err_msg (dcgm-exporter 4.8.2), GPUs down at start or hung, liveness vs readiness,
field_unavailable, self-metrics naming the node."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import pynvml
import pytest

from exporter.backend import DeviceInfo, Entity, MigInstance, Value
from exporter.collector import Collector
from exporter.counters_csv import filter_supported, load_counters
from exporter.fields import FIELDS
from exporter.kubernetes import PodInfo
from exporter.nvml.backend import NvmlBackend
from exporter.xid import XidState
from tests.exporter.fake_pynvml import FakeNvml
from tests.exporter.stubs import Pod, Spec
from tests.exporter.test_collector import SPECS, UP0, FakeBackend, device, lines, make

MIG_SPECS = [
    *SPECS,
    Spec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM frequency (in MHz)."),
    Spec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    Spec("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
]
MIGS = (MigInstance(1, "3g.40gb", "MIG-a0", ("MIG-a0", "MIG-a1")), MigInstance(2, "4g.40gb", "MIG-b0"))


@dataclass
class MigBackend(FakeBackend):
    """GPU 0 in MIG mode: NVML-like answer with GPU-wide values on Entity(0) and FB/PROF per GI."""

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        if gpu != 0:
            return super().read(gpu, fields)
        wide: dict[str, Value] = {"DCGM_FI_DEV_SM_CLOCK": 1410, "DCGM_FI_DEV_POWER_USAGE": 250.5,
                                  "DCGM_FI_DEV_FB_USED": 99999, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9}
        return {
            Entity(0): wide,
            Entity(0, 1): {"DCGM_FI_DEV_FB_USED": 100, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.25},
            Entity(0, 2): {"DCGM_FI_DEV_FB_USED": 200},
        }


def mig_collector(**kw: object) -> Collector:
    be = MigBackend(n=2, mig={0: MIGS})
    ints = frozenset({"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"})
    kw.setdefault("integer_fields", ints)
    return Collector(be, MIG_SPECS, "node-a", 5.0, **kw)  # type: ignore[arg-type]


def test_mig_gpu_wide_fields_are_on_every_gpu_instance_series_like_dcgm_exporter_713() -> None:
    exp = mig_collector().collect_once()
    sm = [ln for ln in lines(exp, "DCGM_FI_DEV_SM_CLOCK{") if 'gpu="0"' in ln]
    assert len(sm) == 2 and all(ln.endswith("} 1410") for ln in sm)
    assert 'GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"' in sm[0] and 'GPU_I_ID="2"' in sm[1]
    power = [ln for ln in lines(exp, "DCGM_FI_DEV_POWER_USAGE{") if 'gpu="0"' in ln]
    assert len(power) == 2


def test_mig_fb_and_prof_are_the_instances_own_never_the_parents() -> None:
    exp = mig_collector().collect_once()
    fb = [ln for ln in lines(exp, "DCGM_FI_DEV_FB_USED{") if 'gpu="0"' in ln]
    assert [ln.rsplit(" ", 1)[1] for ln in fb] == ["100", "200"]
    prof = [ln for ln in lines(exp, "DCGM_FI_PROF_GR_ENGINE_ACTIVE{") if 'gpu="0"' in ln]
    assert len(prof) == 1 and 'GPU_I_ID="1"' in prof[0] and prof[0].endswith(" 0.250000")


def test_gpu_instance_with_two_compute_instances_has_one_label_set_and_either_uuids_pod() -> None:
    pods = {"MIG-a1": (Pod("p1", "ns", "c1"),)}
    exp = mig_collector(pods=lambda: pods).collect_once()
    sm = [ln for ln in lines(exp, "DCGM_FI_DEV_SM_CLOCK{") if 'gpu="0"' in ln]
    assert len(sm) == len(set(ln.rsplit(" ", 1)[0] for ln in sm)) == 2
    assert 'pod="p1"' in sm[0] and "pod=" not in sm[1]


def test_time_sliced_gpu_gives_one_series_per_pod_and_no_pod_labels_when_none_holds_it() -> None:
    pods = {"GPU-00000000": (Pod("a", "ns", "c"), Pod("b", "ns", "c")), "GPU-00000001": ()}
    exp = make(FakeBackend(n=3), pods=lambda: pods).collect_once()
    util = lines(exp, "DCGM_FI_DEV_GPU_UTIL{")
    assert [ln.split('"')[1] for ln in util] == ["0", "0", "1", "2"]
    assert 'pod="a"' in util[0] and 'pod="b"' in util[1]
    assert "pod=" not in util[2] and "pod=" not in util[3]


def test_virtual_gpu_replicas_of_one_pod_are_distinct_series_by_vgpu_label_like_4_8_2() -> None:
    # dcgm-exporter 4.8.2 --kubernetes-virtual-gpus adds the ``vgpu`` attribute, after ``pod`` in
    # the Go template's sorted attribute order; two replicas held by one container stay two series.
    xids = XidState()
    pods = {"GPU-00000000": (PodInfo("p", "ns", "c", "0"), PodInfo("p", "ns", "c", "3"))}
    exp = make(FakeBackend(n=1), xids=xids, pods=lambda: pods).collect_once()
    util = lines(exp, "DCGM_FI_DEV_GPU_UTIL{")
    assert len(util) == 2 and util[0].endswith('container="c",namespace="ns",pod="p",vgpu="0"} 10')
    assert 'pod="p",vgpu="3"}' in util[1]
    xid = lines(exp, "DCGM_FI_DEV_XID_ERRORS{")
    assert len(xid) == 2 and xid[1].endswith('err_msg="No Error",namespace="ns",pod="p",vgpu="3"} 0')
    keys = [ln.rsplit(" ", 1)[0] for ln in exp.text.decode().splitlines() if ln.startswith("DCGM_")]
    assert len(keys) == len(set(keys))


def test_xid_series_has_err_code_and_err_msg_like_4_8_2_sorted_with_pod_attributes() -> None:
    xids = XidState()
    pods = {"GPU-00000000": (Pod("p", "ns", "c"),)}
    c = make(FakeBackend(n=1), xids=xids, pods=lambda: pods)
    line = lines(c.collect_once(), "DCGM_FI_DEV_XID_ERRORS{")[0]
    assert line.endswith(',DCGM_FI_DRIVER_VERSION="580.159.04",container="c",err_code="0",err_msg="No Error",'
                         'namespace="ns",pod="p"} 0')
    xids.record(0, 79)
    line = lines(c.collect_once(), "DCGM_FI_DEV_XID_ERRORS{")[0]
    assert 'err_code="79",err_msg="GPU has fallen off the bus"' in line and line.endswith("} 79")
    util = lines(c.exposition, "DCGM_FI_DEV_GPU_UTIL{")[0]
    assert "err_code" not in util


def test_mig_xid_lands_on_the_affected_instance_only() -> None:
    xids = XidState()
    c = mig_collector(xids=xids)
    xids.record(0, 31, 2)
    xid = [ln for ln in lines(c.collect_once(), "DCGM_FI_DEV_XID_ERRORS{") if 'gpu="0"' in ln]
    assert [ln.rsplit(" ", 1)[1] for ln in xid] == ["0", "31"]
    assert 'GPU_I_ID="2"' in xid[1] and 'err_msg="GPU memory page fault"' in xid[1]


def test_no_xid_series_when_the_backend_cannot_receive_xid_events() -> None:
    be = FakeBackend(n=1)
    be.unsupported.add("DCGM_FI_DEV_XID_ERRORS")
    exp = make(be).collect_once()
    assert not lines(exp, "DCGM_FI_DEV_XID_ERRORS{")  # never a fake 0


@dataclass
class StartFaults(FakeBackend):
    """GPU 1 failed at start (DeviceInfo.problem) until ``fixed``."""

    fixed: bool = False
    probes: list[int] = field(default_factory=list)

    def devices(self) -> list[DeviceInfo]:
        out = super().devices()
        if not self.fixed:
            out[1] = DeviceInfo(1, "", "", "", -1, problem="RESET_REQUIRED")
        return out

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        self.probes.append(gpu)
        return super().supported_fields(gpu, fields) if self.fixed or gpu != 1 else set()

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        if gpu == 1 and not self.fixed:
            from exporter.backend import GpuLostError

            raise GpuLostError(1, "RESET_REQUIRED")
        return super().read(gpu, fields)


def test_gpu_down_at_start_is_listed_down_others_served_then_probed_when_it_answers() -> None:
    be = StartFaults(n=3)
    c = make(be)
    exp = c.collect_once()
    text = exp.text.decode()
    assert 'gpu_exporter_device_up{gpu="1",UUID="",pci_bus_id="",Hostname="node-a"} 0' in text
    assert [ln.split('"')[1] for ln in lines(exp, "DCGM_FI_DEV_GPU_UTIL{")] == ["0", "2"]
    assert c.health() == (True, "OK; gpu 1 (no UUID) down: RESET_REQUIRED")
    be.fixed = True
    exp = c.collect_once()
    assert [ln.split('"')[1] for ln in lines(exp, "DCGM_FI_DEV_GPU_UTIL{")] == ["0", "1", "2"]
    assert 'UUID="GPU-00000001"' in lines(exp, "DCGM_FI_DEV_GPU_UTIL{")[1]
    assert be.probes.count(1) == 1  # probed once it answered, not at start
    assert c.health() == (True, "OK")


def test_all_gpus_down_keeps_liveness_and_fails_readiness_naming_each_gpu() -> None:
    be = FakeBackend(n=2, failing={0, 1})
    c = make(be)
    c.collect_once()
    live, text = c.health()
    assert live is True and "gpu 0 (GPU-00000000) down: fallen off the bus" in text
    ready, rtext = c.readiness()
    assert ready is False and rtext.startswith("no GPU is up") and "gpu 1 (GPU-00000001)" in rtext
    be.failing = {1}
    c.collect_once()
    assert c.readiness()[0] is True


@dataclass
class Hanging(FakeBackend):
    gate: threading.Event = field(default_factory=threading.Event)
    started: dict[int, int] = field(default_factory=dict)

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        self.started[gpu] = self.started.get(gpu, 0) + 1
        if gpu == 0:
            self.gate.wait(30)
        return super().read(gpu, fields)


def test_a_hung_gpu_read_is_bounded_marked_timeout_and_not_started_again_until_it_returns() -> None:
    be = Hanging(n=2)
    c = make(be, read_timeout_s=0.2)
    try:
        t0 = time.monotonic()
        exp = c.collect_once()
        assert time.monotonic() - t0 < 2.0
        assert [ln.split('"')[1] for ln in lines(exp, "DCGM_FI_DEV_GPU_UTIL{")] == ["1"]
        assert "gpu 0 (GPU-00000000) down: timeout" in c.health()[1]
        c.collect_once()
        assert be.started == {0: 1, 1: 2}  # the hung read is not started a second time
        be.gate.set()
        for _ in range(50):
            if c.collect_once().devices_up == 2:
                break
            time.sleep(0.05)
        assert len(lines(c.exposition, "DCGM_FI_DEV_GPU_UTIL{")) == 2
    finally:
        be.gate.set()


@dataclass
class Refused(FakeBackend):
    intervals: list[float] = field(default_factory=list)

    def unavailable(self, gpu: int) -> dict[str, str]:
        return {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": "NO_PERMISSION"}

    def set_interval(self, interval_s: float) -> None:
        self.intervals.append(interval_s)


def test_refused_fields_are_exposed_as_field_unavailable_and_the_interval_is_passed_on() -> None:
    be = Refused(n=1)
    exp = Collector(be, SPECS, "node-a", 5.0).collect_once()  # the PROF row was already dropped
    text = exp.text.decode()
    assert ('gpu_exporter_field_unavailable{gpu="0",UUID="GPU-00000000",pci_bus_id="00000000:10:00.0",'
            'Hostname="node-a",field="DCGM_FI_PROF_GR_ENGINE_ACTIVE",reason="NO_PERMISSION"} 1') in text
    assert be.intervals == [5.0]


def test_self_metrics_name_the_node_without_hostname_they_omit_it() -> None:
    text = make(FakeBackend(n=1)).collect_once().text.decode()
    assert UP0 + " 1" in text
    bare = Collector(FakeBackend(n=1), SPECS, None, 5.0).collect_once().text.decode()
    assert 'gpu_exporter_device_up{gpu="0",UUID="GPU-00000000",pci_bus_id="00000000:10:00.0"} 1' in bare


@dataclass
class Relayout(FakeBackend):
    def devices(self) -> list[DeviceInfo]:
        return [device(i, self.mig.get(i, ())) for i in range(self.n)]


def test_mig_layout_change_reported_by_the_backend_rebuilds_the_series_without_restart() -> None:
    be = Relayout(n=1, mig={0: (MigInstance(1, "1g.10gb", "MIG-x"),)})
    c = make(be)
    assert 'GPU_I_PROFILE="1g.10gb"' in lines(c.collect_once(), "DCGM_FI_DEV_GPU_UTIL{")[0]
    be.mig = {0: (MigInstance(0, "7g.79gb", "MIG-y"),)}
    util = lines(c.collect_once(), "DCGM_FI_DEV_GPU_UTIL{")
    assert len(util) == 1 and 'GPU_I_PROFILE="7g.79gb",GPU_I_ID="0"' in util[0]


def test_device_label_is_the_nvml_index_not_the_minor_number() -> None:
    @dataclass
    class OddMinor(FakeBackend):
        def devices(self) -> list[DeviceInfo]:
            return [replace(device(i), minor=7 - i) for i in range(self.n)]

    util = lines(make(OddMinor(n=2)).collect_once(), "DCGM_FI_DEV_GPU_UTIL{")
    assert 'device="nvidia0"' in util[0] and 'device="nvidia1"' in util[1]


# --- end to end over the NVML backend and the fake pynvml ----------------------------------------


def nvml_collector(fake: FakeNvml, **kw: object) -> tuple[NvmlBackend, Collector]:
    b = NvmlBackend(fake, clock=fake.clock)
    specs = load_counters(None)
    ints = frozenset(n for n, f in FIELDS.items() if f.integer)
    return b, Collector(b, specs, "node-a", 5.0, integer_fields=ints, **kw)  # type: ignore[arg-type]


def test_a100_mig_layout_over_nvml_no_duplicate_series_and_gpu_wide_fields_per_instance() -> None:
    fake = FakeNvml(n_gpus=2, mig={0: [(1, 3, 40192, 0), (1, 3, 40192, 1), (2, 4, 40192, 0)]})
    b, c = nvml_collector(fake)
    try:
        fake.now += 5.0
        c.collect_once()
        fake.now += 5.0
        text = c.collect_once().text.decode().splitlines()
        series = [ln.rsplit(" ", 1)[0] for ln in text if ln.startswith("DCGM_")]
        assert len(series) == len(set(series))
        sm = [ln for ln in text if ln.startswith('DCGM_FI_DEV_SM_CLOCK{gpu="0"')]
        assert len(sm) == 2 and 'GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"' in sm[0]
        assert 'GPU_I_PROFILE="4g.40gb",GPU_I_ID="2"' in sm[1]
        for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                     "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                     "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_XID_ERRORS"):
            assert sum(ln.startswith(f'{name}{{gpu="0"') for ln in text) == 2, name
        fb = [ln for ln in text if ln.startswith('DCGM_FI_DEV_FB_USED{gpu="0"')]
        assert [int(ln.rsplit(" ", 1)[1]) for ln in fb] == [39168 // 4, 39168 // 4]
    finally:
        b.close()


def test_reset_required_mid_run_marks_the_gpu_down_then_it_recovers_over_nvml() -> None:
    fake = FakeNvml(n_gpus=2)
    b, c = nvml_collector(fake)
    try:
        fake.now += 5.0
        c.collect_once()
        fake.broken[1] = pynvml.NVML_ERROR_RESET_REQUIRED
        fake.now += 5.0
        exp = c.collect_once()
        assert 'gpu_exporter_device_up{gpu="1",' in exp.text.decode()
        assert not [ln for ln in lines(exp, "DCGM_FI_DEV_GPU_TEMP{") if 'gpu="1"' in ln]
        assert c.health() == (True, f"OK; gpu 1 ({b.devices()[1].uuid}) down: RESET_REQUIRED")
        del fake.broken[1]
        fake.now += 5.0
        exp = c.collect_once()
        assert len(lines(exp, "DCGM_FI_DEV_GPU_TEMP{")) == 2 and c.health() == (True, "OK")
    finally:
        b.close()


def test_gpu_lost_at_start_over_nvml_is_down_with_labels_and_the_node_is_served() -> None:
    fake = FakeNvml(n_gpus=2)
    fake.handle_error[0] = pynvml.NVML_ERROR_GPU_IS_LOST
    b, c = nvml_collector(fake)
    try:
        fake.now += 5.0
        exp = c.collect_once()
        assert 'gpu_exporter_device_up{gpu="0",UUID="",pci_bus_id="",Hostname="node-a"} 0' in exp.text.decode()
        assert [ln.split('"')[1] for ln in lines(exp, "DCGM_FI_DEV_GPU_TEMP{")] == ["1"]
        assert c.readiness()[0] is True
    finally:
        b.close()


def test_profiling_refused_over_nvml_lists_each_prof_row_unavailable_after_cli_style_filtering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml(n_gpus=1)
    fake.gpm_refused = True
    b = NvmlBackend(fake, clock=fake.clock)
    specs = load_counters(None)
    supported = {0: b.supported_fields(0, [s.field for s in specs if s.kind != "label"])}
    with caplog.at_level("WARNING"):
        kept = filter_supported(specs, supported[0] | {"DCGM_FI_DEV_XID_ERRORS"}, logging.getLogger("t"))
    assert sum("Skipping line" in m and "DCGM_FI_PROF_" in m for m in caplog.messages) == 5
    c = Collector(b, kept, "node-a", 5.0, supported=supported)
    try:
        text = c.collect_once().text.decode()
        assert text.count("gpu_exporter_field_unavailable{") == 5  # the default set's PROF rows
        assert 'field="DCGM_FI_PROF_DRAM_ACTIVE",reason="NO_PERMISSION"} 1' in text
        assert "DCGM_FI_PROF_DRAM_ACTIVE{" not in text
    finally:
        b.close()


def test_mig_enabled_mid_run_then_disabled_switches_series_without_restart_or_duplicates() -> None:
    fake = FakeNvml(n_gpus=2)
    b, c = nvml_collector(fake)
    try:
        def sm_lines() -> list[str]:
            fake.now += 5.0
            text = c.collect_once().text.decode().splitlines()
            keys = [ln.rsplit(" ", 1)[0] for ln in text if ln.startswith("DCGM_")]
            assert len(keys) == len(set(keys))
            return [ln for ln in text if ln.startswith('DCGM_FI_DEV_SM_CLOCK{gpu="0"')]

        assert len(sm_lines()) == 1 and "GPU_I_ID" not in sm_lines()[0]
        fake.mig[0] = [(1, 3, 40192, 0), (1, 3, 40192, 1), (2, 4, 40192, 0)]
        sm = sm_lines()
        assert [ln.split('GPU_I_ID="')[1][0] for ln in sm] == ["1", "2"]
        assert 'GPU_I_PROFILE="3g.40gb"' in sm[0] and 'GPU_I_PROFILE="4g.40gb"' in sm[1]
        del fake.mig[0]
        sm = sm_lines()
        assert len(sm) == 1 and "GPU_I_ID" not in sm[0]
    finally:
        b.close()
