"""Rendering: dcgm-exporter 4.8.2's exact lines, label order, %d/%f, MIG, pods, OpenMetrics."""

from __future__ import annotations

import pytest

from exporter.backend import DeviceInfo, MigInstance, Value
from exporter.render import (
    Row,
    entity_labels,
    escape_label_value,
    format_value,
    render_series,
    wants_openmetrics,
    with_pod,
)
from tests.exporter.stubs import Pod, Spec

H200 = DeviceInfo(0, "GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b", "00000000:8D:00.0", "NVIDIA H200", 0)
MIG = MigInstance(1, "3g.71gb", "MIG-5c2b9a8e-0000-5000-8000-000000000001")
DRIVER = {"DCGM_FI_DRIVER_VERSION": "580.159.04"}
BASE = ('{gpu="0",UUID="GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b",pci_bus_id="00000000:8D:00.0",'
        'device="nvidia0",modelName="NVIDIA H200"')


@pytest.mark.parametrize(
    ("value", "integer", "expected"),
    [
        (1410, True, "1410"),
        (30.982, False, "30.982000"),
        (0.06868, False, "0.068680"),
        (7, None, "7"),  # by type
        (7.0, None, "7.000000"),
        (300, False, "300.000000"),  # a double field whose value happens to be whole
        (12.9, True, "12"),  # an int64 field truncates like Go's int64 conversion
        (0, True, "0"),
    ],
)
def test_format_value_uses_go_percent_d_and_percent_f(
    value: Value, integer: bool | None, expected: str
) -> None:
    assert format_value(value, integer) == expected


@pytest.mark.parametrize(
    ("mig", "hostname", "pod", "expected"),
    [
        (None, "node-a", None, BASE + ',Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04"}'),
        (None, None, None, BASE + ',DCGM_FI_DRIVER_VERSION="580.159.04"}'),
        (MIG, "node-a", None,
         BASE + ',GPU_I_PROFILE="3g.71gb",GPU_I_ID="1",Hostname="node-a",'
         'DCGM_FI_DRIVER_VERSION="580.159.04"}'),
        (None, "node-a", Pod("p", "ns", "c"),
         BASE + ',Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04",'
         'container="c",namespace="ns",pod="p"}'),
        (MIG, None, Pod("trainer-0", "ml", "main"),
         BASE + ',GPU_I_PROFILE="3g.71gb",GPU_I_ID="1",DCGM_FI_DRIVER_VERSION="580.159.04",'
         'container="main",namespace="ml",pod="trainer-0"}'),
    ],
    ids=["gpu", "no-hostname", "mig", "pod", "mig-pod-no-hostname"],
)
def test_label_block_follows_dcgm_order(
    mig: MigInstance | None, hostname: str | None, pod: Pod | None, expected: str
) -> None:
    assert with_pod(entity_labels(H200, mig, hostname, DRIVER), pod) == expected


def test_label_fields_are_sorted_after_hostname() -> None:
    fields = {"DCGM_FI_DRIVER_VERSION": "580", "DCGM_FI_DEV_NAME": "NVIDIA H200"}
    block = with_pod(entity_labels(H200, None, "h", fields), None)
    assert block.endswith(',Hostname="h",DCGM_FI_DEV_NAME="NVIDIA H200",DCGM_FI_DRIVER_VERSION="580"}')


def test_label_values_are_escaped() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert 'Hostname="we\\"ird"' in entity_labels(H200, None, 'we"ird', {})


SPECS = [
    Spec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    Spec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Spec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    Spec("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters."),
    Spec("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
]
INTS = frozenset({"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"})


def _rows() -> list[Row]:
    g0 = with_pod(entity_labels(H200, None, "node-a", DRIVER), None)
    return [Row(g0, {"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_POWER_USAGE": 112.5,
                     "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789})]


def test_render_series_exact_text_format() -> None:
    labels = BASE + ',Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.159.04"}'
    assert render_series(SPECS, _rows(), INTS) == (
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n"
        "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n"
        f"DCGM_FI_DEV_SM_CLOCK{labels} 1980\n"
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        f"DCGM_FI_DEV_POWER_USAGE{labels} 112.500000\n"
        "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n"
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{labels} 123456789\n"
    )


def test_our_own_per_gpu_series_keeps_the_join_labels_without_dcgms_camelcase_model_name() -> None:
    """gpu_exporter_compute_processes joins the DCGM series on gpu/UUID/Hostname/pod, and as one of our
    own series passes `promtool check metrics` (no camelCase label): the same block less modelName."""
    pod = Pod("train-0", "ml", "trainer")
    row = Row(with_pod(entity_labels(H200, None, "node-a", DRIVER), pod),
              {"DCGM_FI_DEV_SM_CLOCK": 1980, "gpu_exporter_compute_processes": 2})
    out = render_series([SPECS[0], Spec("gpu_exporter_compute_processes", "gauge", "Compute processes.")],
                        [row], frozenset({"DCGM_FI_DEV_SM_CLOCK", "gpu_exporter_compute_processes"}))
    dcgm, own = (ln for ln in out.splitlines() if not ln.startswith("#"))
    assert 'modelName="NVIDIA H200"' in dcgm and "modelName" not in own
    assert own == "gpu_exporter_compute_processes" + dcgm.rsplit(" ", 1)[0][len("DCGM_FI_DEV_SM_CLOCK"):].replace(
        ',modelName="NVIDIA H200"', "") + " 2"
    assert 'pod="train-0"' in own and 'UUID="GPU-' in own and 'Hostname="node-a"' in own


def test_field_without_values_is_absent_not_zero() -> None:
    assert "NVLINK_BANDWIDTH" not in render_series(SPECS, _rows(), INTS)


def test_openmetrics_declares_dcgm_counters_unknown_and_keeps_names() -> None:
    om = render_series(SPECS, _rows(), INTS, openmetrics=True)
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n" in om
    assert "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n" in om
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in om
    assert "_total{" not in om


def test_rows_render_in_given_order_grouped_by_metric() -> None:
    g1 = DeviceInfo(1, "GPU-1", "00000000:91:00.0", "NVIDIA H200", 1)
    rows = [*_rows(), Row(with_pod(entity_labels(g1, None, None, {}), None), {"DCGM_FI_DEV_SM_CLOCK": 1})]
    text = render_series(SPECS[:1], rows, INTS)
    lines = text.splitlines()
    assert lines[2].startswith('DCGM_FI_DEV_SM_CLOCK{gpu="0"')
    assert lines[3] == ('DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-1",pci_bus_id="00000000:91:00.0",'
                        'device="nvidia1",modelName="NVIDIA H200"} 1')


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, False),
        ("text/plain;version=0.0.4;q=0.5,*/*;q=0.1", False),
        ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5", True),
        ("application/openmetrics-text; version=0.0.1", True),
    ],
)
def test_openmetrics_is_chosen_from_the_accept_header(accept: str | None, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected
