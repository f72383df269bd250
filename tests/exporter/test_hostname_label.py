"""``--hostname-label`` (issue 21 point 11): dcgm-exporter 4.8.2 names the node label ``Hostname``,
its main branch after 4.8.2 ``hostname`` (NVIDIA/dcgm-exporter d5e5f51, #655). The flag picks the
name for every series the exporter serves, the DCGM_* rows and its own gpu_exporter_* families,
the default stays ``Hostname``, and any other value is refused naming the flag or env variable."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import EXIT_USAGE, main
from exporter.collector import Collector
from exporter.counters_csv import load_counters
from exporter.selfmetrics import BuildInfo, DeviceStat, SelfState, Unavailable, render_self_metrics
from exporter.settings import SettingsError, load_settings
from exporter.simulated import SimulatedBackend
from exporter.xid import XidState

NODE = "gpu-node-7"


@pytest.mark.parametrize(
    ("argv", "env", "label"),
    [
        ([], {}, "Hostname"),
        (["--hostname-label", "hostname"], {}, "hostname"),
        (["--hostname-label=hostname"], {}, "hostname"),
        (["--hostname-label", "Hostname"], {}, "Hostname"),
        ([], {"GPU_EXPORTER_HOSTNAME_LABEL": "hostname"}, "hostname"),
        ([], {"GPU_EXPORTER_HOSTNAME_LABEL": " hostname "}, "hostname"),
        (["--hostname-label", "Hostname"], {"GPU_EXPORTER_HOSTNAME_LABEL": "hostname"}, "Hostname"),  # flag > env
    ],
)
def test_hostname_label_setting_default_flag_and_env(argv: list[str], env: dict[str, str], label: str) -> None:
    assert load_settings(argv, env).hostname_label == label


@pytest.mark.parametrize(
    ("argv", "env", "name", "value"),
    [
        (["--hostname-label", "HOSTNAME"], {}, "--hostname-label", "HOSTNAME"),
        (["--hostname-label", "node"], {}, "--hostname-label", "node"),
        (["--hostname-label="], {}, "--hostname-label", ""),
        ([], {"GPU_EXPORTER_HOSTNAME_LABEL": "host_name"}, "GPU_EXPORTER_HOSTNAME_LABEL", "host_name"),
    ],
)
def test_bad_hostname_label_is_refused_naming_the_flag(
    argv: list[str], env: dict[str, str], name: str, value: str
) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(argv, env)
    assert (err.value.name, err.value.value) == (name, value)
    assert "expected Hostname (dcgm-exporter 4.8.2) or hostname" in str(err.value)


def test_bad_hostname_label_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "simulated", "--hostname-label", "Node"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--hostname-label='Node'" in err and "hostname" in err


def _exposition(label: str | None) -> str:
    backend = SimulatedBackend(n_gpus=2, mig={1: ["3g.71gb", "3g.71gb"]}, clock=lambda: 50.0)
    xids = XidState()
    xids.record(0, 79)
    kw = {} if label is None else {"hostname_label": label}
    collector = Collector(backend, load_counters(None), NODE, 5.0, lambda: {}, xids=xids,
                          kubelet_errors=lambda: 0, backend_name="simulated", **kw)  # type: ignore[arg-type]
    return collector.collect_once().text.decode()


def _samples(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]


@pytest.mark.parametrize("label", [None, "Hostname", "hostname"])
def test_every_series_carries_the_chosen_node_label_and_not_the_other(label: str | None) -> None:
    want = label or "Hostname"
    other = "hostname" if want == "Hostname" else "Hostname"
    samples = _samples(_exposition(label))
    names = {n for n, _ in samples}
    # both kinds of series are there: DCGM rows (whole GPUs and MIG instances) and the exporter's own
    assert {"DCGM_FI_DEV_GPU_UTIL", "gpu_exporter_build_info", "gpu_exporter_device_up",
            "gpu_exporter_xid_errors_total", "gpu_exporter_kubelet_errors_total",
            "gpu_exporter_last_collection_timestamp_seconds"} <= names
    assert any("GPU_I_ID" in labels for _, labels in samples)
    for name, labels in samples:
        assert labels.get(want) == NODE, (name, labels)
        assert other not in labels, (name, labels)


def test_the_label_keeps_its_place_in_the_dcgm_label_order() -> None:
    def series(text: str) -> list[str]:  # each line without its value (durations and clocks differ)
        return [ln.rsplit(" ", 1)[0] for ln in text.splitlines()]

    default, renamed = _exposition(None), _exposition("hostname")
    assert series(renamed) == series(default.replace(f'Hostname="{NODE}"', f'hostname="{NODE}"'))
    clocks = [ln for ln in renamed.splitlines() if ln.startswith("DCGM_FI_DEV_SM_CLOCK{")]
    assert len(clocks) == 3  # GPU 0, and GPU 1's two instances
    assert f'modelName="NVIDIA H200",hostname="{NODE}",DCGM_FI_DRIVER_VERSION=' in clocks[0]
    assert f'GPU_I_ID="1",hostname="{NODE}",DCGM_FI_DRIVER_VERSION=' in clocks[1]


@pytest.mark.parametrize("label", ["Hostname", "hostname"])
def test_self_metrics_families_all_use_the_chosen_label(label: str) -> None:
    state = SelfState(
        devices=[DeviceStat(0, "GPU-a", True, 0.01, 1, "00000000:10:00.0")],
        build=BuildInfo("1.0", "3.11.9", "nvml"),
        last_collection_ts=1.0,
        kubelet_errors=2,
        xid_counts={(0, "GPU-a", "00000000:10:00.0", 79): 1},
        hostname=NODE,
        hostname_label=label,
        unavailable=[Unavailable(0, "GPU-a", "00000000:10:00.0", "DCGM_FI_PROF_SM_ACTIVE", "NO_PERMISSION")],
    )
    samples = _samples(render_self_metrics(state))
    assert len({n for n, _ in samples}) == 8
    assert all(labels.get(label) == NODE and len([k for k in labels if k.lower() == "hostname"]) == 1
               for _, labels in samples), samples


def test_no_hostname_leaves_out_either_name() -> None:
    state = SelfState(devices=[DeviceStat(0, "GPU-a", True, None, 0)], build=BuildInfo("1", "3", "nvml"),
                      hostname=None, hostname_label="hostname")
    text = render_self_metrics(state)
    assert "ostname" not in text and 'gpu_exporter_device_up{gpu="0",UUID="GPU-a",pci_bus_id=""} 1' in text
