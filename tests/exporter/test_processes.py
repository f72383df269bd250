"""gpu_exporter_compute_processes (issue 22 section 2): a count a GPU / MIG instance from NVML's
running compute processes, no PIDs, withheld (one log line) once NVML is seen blind to other
containers' processes."""

from __future__ import annotations

import logging

import pytest

from exporter.backend import Entity
from exporter.collector import Collector
from exporter.counters_csv import parse_counters
from exporter.nvml.backend import NvmlBackend
from exporter.processes import COMPUTE_PROCESSES, ProcessCount, Visibility
from exporter.simulated import SimulatedBackend
from tests.exporter.fake_pynvml import FakeNvml

CSV = "DCGM_FI_DEV_GPU_UTIL, gauge, util\n"
E0 = Entity(0)


@pytest.mark.parametrize(
    ("answers", "exported", "blind"),
    [
        ([ProcessCount(2, 30000)] * 3, [{E0: 2}] * 3, False),  # busy and visible
        ([ProcessCount(0, 3)] * 3, [{E0: 0}] * 3, False),  # idle: no memory held, 0 is true
        ([ProcessCount(0, 30000), ProcessCount(1, 30000)], [{E0: 0}, {E0: 1}], False),  # one odd cycle
        ([ProcessCount(0, 30000)] * 3, [{E0: 0}, {}, {}], True),  # memory held, nothing visible: blind
    ],
)
def test_blind_view_is_detected_from_memory_without_processes(
    answers: list[ProcessCount], exported: list[dict[Entity, int]], blind: bool
) -> None:
    v = Visibility()
    assert [v.counts({E0: a}) for a in answers] == exported
    assert v.blind is blind


def test_blindness_is_logged_once_and_withholds_every_gpu(caplog: pytest.LogCaptureFixture) -> None:
    v = Visibility()
    with caplog.at_level(logging.WARNING, logger="exporter.processes"):
        for _ in range(4):
            v.counts({E0: ProcessCount(0, 5000)})
        assert v.counts({Entity(1): ProcessCount(3, 5000)}) == {}
    (record,) = caplog.records
    assert "hostPID" in record.getMessage() and "GPU 0" in record.getMessage()


def test_nvml_counts_distinct_pids_per_gpu_and_per_mig_instance() -> None:
    fake = FakeNvml(n_gpus=2, mig={1: [(1, 3, 71), (2, 2, 35)]})
    fake.processes = {0: [10, 11, 11], (1, 1): [20], (1, 2): []}
    b = NvmlBackend(fake)
    assert b.compute_processes(0) == {Entity(0): ProcessCount(2, fake.load["memory_v2"]["used"] // 1048576)}
    got = b.compute_processes(1)
    assert {e: pc.processes for e, pc in got.items()} == {Entity(1, 1): 1, Entity(1, 2): 0}


def test_nvml_without_the_call_exports_nothing() -> None:
    fake = FakeNvml(n_gpus=1)
    fake.fail["nvmlDeviceGetComputeRunningProcesses"] = fake.NVML_ERROR_NOT_SUPPORTED
    assert NvmlBackend(fake).compute_processes(0) == {}


def render(backend: object, cycles: int = 1) -> str:
    c = Collector(backend, parse_counters(CSV), "node-a", 5.0)  # type: ignore[arg-type]
    text = ""
    for _ in range(cycles):
        text = c.collect_once().text.decode()
    return text


def test_gauge_carries_the_entitys_labels_and_no_pid() -> None:
    fake = FakeNvml(n_gpus=1)
    fake.processes = {0: [4242, 4243]}
    text = render(NvmlBackend(fake))
    (line,) = [ln for ln in text.splitlines() if ln.startswith(COMPUTE_PROCESSES + "{")]
    assert line.startswith(COMPUTE_PROCESSES + '{gpu="0",UUID="GPU-') and line.endswith('Hostname="node-a"} 2')
    assert "4242" not in text and f"# TYPE {COMPUTE_PROCESSES} gauge" in text


def test_hidden_processes_withhold_the_family_after_two_cycles() -> None:
    fake = FakeNvml(n_gpus=1)
    fake.hidden_processes = True
    assert f"{COMPUTE_PROCESSES}{{" not in render(NvmlBackend(fake), cycles=2)


@pytest.mark.parametrize(("workload", "t", "expected"), [
    ("training", 300.0, 1), ("idle", 300.0, 0), ("finished_holding", 60.0, 1), ("finished_holding", 300.0, 0)])
def test_simulated_workloads_report_their_process_count(workload: str, t: float, expected: int) -> None:
    now = [0.0]
    b = SimulatedBackend(n_gpus=1, clock=lambda: now[0], workloads={0: workload})
    now[0] = t
    assert b.compute_processes(0)[Entity(0)].processes == expected


def test_gauge_is_an_integer_like_other_int64_fields() -> None:
    from exporter.fields import FIELDS

    b = SimulatedBackend(n_gpus=1, clock=lambda: 500.0, workloads={0: "training"})
    ints = frozenset(n for n, f in FIELDS.items() if f.integer)
    text = Collector(b, parse_counters(CSV), "n", 5.0, integer_fields=ints).collect_once().text.decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(COMPUTE_PROCESSES + "{")]
    assert line.endswith("} 1")
