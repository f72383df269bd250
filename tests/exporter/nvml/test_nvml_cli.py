"""The real CLI (in-process ``main``) on the NVML backend over the fake pynvml: MIG, XID, a GPU lost
at start, refused profiling, a GPU that answers RESET_REQUIRED mid-run and recovers, a driver
reload; every exposition checked by ``promtool check metrics`` and for duplicate label sets."""

from __future__ import annotations

import http.client
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter.cli import EXIT_OK, main
from exporter.nvml.backend import NvmlBackend
from tests.e2e.test_exporter_promtool import INHERENT
from tests.exporter.fake_pynvml import FakeNvml, Handle, _uuid
from tests.exporter.podresources_server import FakeKubelet, pod
from tests.helpers import free_port, require_binary, wait_until

# A100-like: GPU instance 1 (3g, two compute instances) and GPU instance 2 (4g, one)
A100_MIG = [(1, 3, 40192, 0), (1, 3, 40192, 1), (2, 4, 40192, 0)]


class Running:
    def __init__(self, port: int, fake: FakeNvml) -> None:
        self.port, self.fake = port, fake

    def get(self, path: str = "/metrics") -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def metrics(self) -> str:
        return self.get()[1]


@pytest.fixture
def run_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("NODE_NAME", "node-t")
    runs: list[tuple[threading.Thread, threading.Event, list[int]]] = []

    def start(fake: FakeNvml, *argv: str) -> Running:
        port = free_port()
        stop, result = threading.Event(), []
        args = ["--listen", f"127.0.0.1:{port}", "--interval", "100ms",
                "--backend", "nvml", *argv]
        t = threading.Thread(target=lambda: result.append(
            main(args, stop, backend_factory=lambda _: NvmlBackend(fake))))
        t.start()
        runs.append((t, stop, result))
        run = Running(port, fake)

        def serving() -> bool:
            try:
                return "gpu_exporter_device_up" in run.metrics()
            except OSError:
                return bool(result)

        assert wait_until(serving, timeout=10), result
        return run

    yield start
    for t, stop, result in runs:
        stop.set()
        t.join(timeout=10)
        assert result == [EXIT_OK]


def series_keys(text: str) -> list[str]:
    return [ln.rsplit(" ", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]


def promtool_complaints(text: str) -> list[str]:
    out = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=30)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    return [ln for ln in lines if not any(p.match(ln) for p in INHERENT)]


def a_faulty_mig_node() -> FakeNvml:
    fake = FakeNvml(n_gpus=3, clock=time.monotonic, mig={0: A100_MIG})
    fake.handle_error[2] = pynvml.NVML_ERROR_GPU_IS_LOST
    fake.gpm_refused = True
    fake.xids = [(0, 79, 2), (1, 31)]
    return fake


@pytest.mark.parametrize("argv", [[], ["-d", "i"], ["-d", "i:1"], ["-d", "g:0,1"]])
def test_mig_xid_lost_gpu_and_refused_gpm_pass_promtool_with_unique_label_sets(
    run_nvml: Any, argv: list[str]
) -> None:
    run = run_nvml(a_faulty_mig_node(), *argv)
    assert wait_until(lambda: "err_code=\"79\"" in run.metrics() or "-d" in argv, timeout=10)
    text = run.metrics()
    keys = series_keys(text)
    assert keys and len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    assert promtool_complaints(text) == []


def test_mig_xid_lands_on_its_instance_and_the_lost_gpu_is_down_named_on_the_node(run_nvml: Any) -> None:
    run = run_nvml(a_faulty_mig_node())
    assert wait_until(lambda: 'err_code="31"' in run.metrics(), timeout=10)
    text = run.metrics()
    xid = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_XID_ERRORS{")]
    gi2 = [ln for ln in xid if 'GPU_I_ID="2"' in ln]
    assert len(gi2) == 1 and 'err_code="79"' in gi2[0] and gi2[0].endswith(" 79")
    gi1 = [ln for ln in xid if 'GPU_I_ID="1"' in ln]
    assert len(gi1) == 1 and 'err_code="0",err_msg="No Error"' in gi1[0]
    assert 'gpu_exporter_device_up{gpu="2",UUID="",pci_bus_id="",Hostname="node-t"} 0' in text
    assert "gpu_exporter_field_unavailable{" in text and 'reason="NO_PERMISSION"' in text
    assert not [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_PROF_")]


def _gpu_temps(text: str) -> list[str]:
    return [ln.split('"')[1] for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_TEMP{")]


def test_cli_gpu_reset_required_mid_run_is_down_then_recovers_without_restart(run_nvml: Any) -> None:
    fake = FakeNvml(n_gpus=2, clock=time.monotonic)
    run = run_nvml(fake)
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"], timeout=10)
    fake.broken[1] = pynvml.NVML_ERROR_RESET_REQUIRED
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0"], timeout=10)
    status, health = run.get("/health")
    assert status == 200 and "gpu 1" in health and "RESET_REQUIRED" in health
    assert 'gpu_exporter_device_up{gpu="1",' in run.metrics()
    del fake.broken[1]
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"], timeout=10)
    assert "RESET_REQUIRED" not in run.get("/health")[1]


def test_cli_driver_reload_reinitialises_nvml_and_every_gpu_comes_back(run_nvml: Any) -> None:
    fake = FakeNvml(n_gpus=2, clock=time.monotonic)
    run = run_nvml(fake)
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"], timeout=10)
    inits = fake.calls["nvmlInit"]
    fake.driver_reload()
    assert wait_until(lambda: fake.calls["nvmlInit"] > inits, timeout=10)
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"], timeout=10)
    text = run.metrics()
    assert text.count("gpu_exporter_device_up{") == 2 and "} 0\n" not in "".join(
        ln + "\n" for ln in text.splitlines() if ln.startswith("gpu_exporter_device_up{"))
    fake.xids.append((1, 48))  # the new event set receives XIDs again
    assert wait_until(lambda: 'err_code="48"' in run.metrics(), timeout=10)


def test_faulty_mig_node_openmetrics_behind_the_flag_parses_strictly(run_nvml: Any) -> None:
    run = run_nvml(a_faulty_mig_node(), "--enable-openmetrics")
    assert wait_until(lambda: 'err_code="31"' in run.metrics(), timeout=10)
    conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=5)
    try:
        conn.request("GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    assert body.endswith("# EOF\n")
    families = {f.name: f for f in text_string_to_metric_families(body)}  # type: ignore[no-untyped-call]
    up = {s.labels["gpu"]: s.value for s in families["gpu_exporter_device_up"].samples}
    assert up == {"0": 1.0, "1": 1.0, "2": 0.0}
    assert len(families["DCGM_FI_DEV_SM_CLOCK"].samples) == 3  # GPU 0's two GPU instances and GPU 1


def _last_collection(text: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith("gpu_exporter_last_collection_timestamp_seconds"))
    return float(line.rsplit(" ", 1)[1])


def test_cli_hung_gpu_is_down_by_timeout_the_others_stay_fresh_and_it_recovers(run_nvml: Any) -> None:
    fake = FakeNvml(n_gpus=2, clock=time.monotonic)
    run = run_nvml(fake)
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"], timeout=10)
    gate = threading.Event()
    fake.hang[1] = gate
    try:
        assert wait_until(lambda: "timeout" in run.get("/health")[1], timeout=10)
        assert _gpu_temps(run.metrics()) == ["0"]
        before = _last_collection(run.metrics())
        assert wait_until(lambda: _last_collection(run.metrics()) > before + 0.5, timeout=10)
        assert _gpu_temps(run.metrics()) == ["0"]
    finally:
        del fake.hang[1]
        gate.set()
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"], timeout=10)
    assert "timeout" not in run.get("/health")[1]


def test_cli_stops_promptly_while_one_gpus_nvml_call_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-t")
    fake = FakeNvml(n_gpus=2, clock=time.monotonic)
    port, stop, result = free_port(), threading.Event(), []
    t = threading.Thread(target=lambda: result.append(main(
        ["--listen", f"127.0.0.1:{port}", "--interval", "100ms", "--backend", "nvml"], stop,
        backend_factory=lambda _: NvmlBackend(fake))))
    t.start()
    gate = threading.Event()
    run = Running(port, fake)
    try:
        assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"] if _serving(run) else bool(result), 10)
        fake.hang[1] = gate
        assert wait_until(lambda: "timeout" in run.get("/health")[1], timeout=10)
        started = time.monotonic()
        stop.set()
        t.join(timeout=15)
        assert result == [EXIT_OK] and time.monotonic() - started < 12
    finally:
        stop.set()
        gate.set()
        t.join(timeout=10)


def _serving(run: Running) -> bool:
    try:
        run.metrics()
        return True
    except OSError:
        return False


def test_cli_without_xid_events_publishes_no_xid_series_not_a_fake_zero(run_nvml: Any) -> None:
    fake = FakeNvml(n_gpus=2, clock=time.monotonic)
    fake.fail["nvmlEventSetCreate"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    run = run_nvml(fake)
    assert wait_until(lambda: _gpu_temps(run.metrics()) == ["0", "1"], timeout=10)
    assert "DCGM_FI_DEV_XID_ERRORS{" not in run.metrics()


def test_virtual_gpus_on_mig_and_time_sliced_gpus_pass_promtool_with_unique_label_sets(run_nvml: Any) -> None:
    # --kubernetes-virtual-gpus on an A100-like MIG GPU and a time-sliced whole GPU, an XID on a
    # shared GPU instance: one series per (pod, replica), never a duplicate label set.
    gi1_ci0, gi1_ci1, gi2 = _uuid(Handle(0, 1, 0)), _uuid(Handle(0, 1, 1)), _uuid(Handle(0, 2, 0))
    gpu1 = _uuid(Handle(1))
    fake = FakeNvml(n_gpus=2, clock=time.monotonic, mig={0: A100_MIG})
    fake.xids = [(0, 48, 2)]
    with FakeKubelet() as kubelet:
        kubelet.set_pods([
            pod("a", "ml", {"c": [("nvidia.com/mig-3g.40gb", [gi1_ci0])]}),
            pod("b", "ml", {"c": [("nvidia.com/mig-3g.40gb", [gi1_ci1])]}),
            pod("s1", "ml", {"c": [("nvidia.com/mig-4g.40gb", [gi2 + "::0", gi2 + "::1"])]}),
            pod("s2", "ml", {"c": [("nvidia.com/mig-4g.40gb", [gi2 + "::2"])]}),
            pod("t1", "ml", {"c": [("nvidia.com/gpu", [gpu1 + "::0"])], "d": [("nvidia.com/gpu", [gpu1 + "::1"])]}),
        ])
        run = run_nvml(fake, "-k", "--pod-resources-kubelet-socket", kubelet.socket_path,
                       "--kubernetes-virtual-gpus")
        assert wait_until(lambda: 'err_code="48"' in run.metrics() and 'pod="t1"' in run.metrics(), timeout=10)
        text = run.metrics()
    keys = series_keys(text)
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    assert promtool_complaints(text) == []
    sm = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_SM_CLOCK{")]
    gi1 = [ln for ln in sm if 'GPU_I_ID="1"' in ln]
    assert [ln.split('pod="')[1][0] for ln in gi1] == ["a", "b"]  # one GPU instance, two CIs, two pods
    gi2_holders = [(ln.split('pod="')[1].split('"')[0], ln.split('vgpu="')[1].split('"')[0])
                   for ln in sm if 'GPU_I_ID="2"' in ln]
    assert gi2_holders == [("s1", "0"), ("s1", "1"), ("s2", "2")]
    xid = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_XID_ERRORS{") and 'GPU_I_ID="2"' in ln]
    assert len(xid) == 3 and all(ln.endswith(" 48") for ln in xid)
    t1 = [ln for ln in sm if ln.startswith('DCGM_FI_DEV_SM_CLOCK{gpu="1"')]
    assert [(ln.split('container="')[1][0], ln.split('vgpu="')[1][0]) for ln in t1] == [("c", "0"), ("d", "1")]
