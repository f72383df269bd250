"""gpu-exporter settings and CLI: flag > GPU_EXPORTER_* env > dcgm-exporter env > default, exit codes,
and an in-process run against a fake backend."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.backend import BackendError, DeviceInfo, Entity, GpuBackend, GpuLostError, Value
from exporter.cli import EXIT_BACKEND, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, main
from exporter.devices import parse_devices
from exporter.settings import DEFAULT_SOCKET, Settings, SettingsError, load_settings, parse_duration
from tests.exporter.test_collector import FakeBackend
from tests.helpers import TEST_DATA, free_port, wait_until

HOST = socket.gethostname()


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, dict(listen=("127.0.0.1", 9400), interval_s=5.0, backend="nvml", simulate_gpus=8,
                      kubernetes=False, pod_resources_socket=DEFAULT_SOCKET, hostname=HOST, collectors=None,
                      log_level="info")),
        ([], {"GPU_EXPORTER_LISTEN": ":9500"}, dict(listen=("", 9500))),
        ([], {"DCGM_EXPORTER_LISTEN": ":9400"}, dict(listen=("", 9400))),
        ([], {"DCGM_EXPORTER_LISTEN": ":9400", "GPU_EXPORTER_LISTEN": "127.0.0.1:9401"},
         dict(listen=("127.0.0.1", 9401))),
        (["--listen", "127.0.0.1:9402"], {"GPU_EXPORTER_LISTEN": ":9500"}, dict(listen=("127.0.0.1", 9402))),
        (["-a", "[::1]:9400"], {}, dict(listen=("::1", 9400))),
        ([], {"DCGM_EXPORTER_INTERVAL": "30000"}, dict(interval_s=30.0)),
        ([], {"GPU_EXPORTER_INTERVAL": "2s", "DCGM_EXPORTER_INTERVAL": "30000"}, dict(interval_s=2.0)),
        (["--interval", "1500ms"], {"GPU_EXPORTER_INTERVAL": "2s"}, dict(interval_s=1.5)),
        (["-c", "10000"], {"GPU_EXPORTER_INTERVAL": "2s"}, dict(interval_s=10.0)),  # flag > env
        (["--interval", "3s", "-c", "10000"], {}, dict(interval_s=3.0)),
        (["--collect-interval", "2500"], {}, dict(interval_s=2.5)),
        (["--interval", "250ms"], {}, dict(interval_s=0.25)),
        (["-c", "10000"], {}, dict(interval_s=10.0)),
        (["--interval", "1m"], {}, dict(interval_s=60.0)),
        ([], {"DCGM_EXPORTER_KUBERNETES": "true"}, dict(kubernetes=True)),
        ([], {"GPU_EXPORTER_KUBERNETES": "0", "DCGM_EXPORTER_KUBERNETES": "true"}, dict(kubernetes=False)),
        (["-k"], {"GPU_EXPORTER_KUBERNETES": "false"}, dict(kubernetes=True)),
        ([], {"DCGM_EXPORTER_NO_HOSTNAME": "true", "NODE_NAME": "n1"}, dict(hostname=None)),
        (["--no-hostname"], {}, dict(hostname=None)),
        ([], {"NODE_NAME": "node-7"}, dict(hostname="node-7")),
        ([], {"DCGM_POD_RESOURCES_KUBELET_SOCKET": "/x.sock"}, dict(pod_resources_socket="/x.sock")),
        (["--pod-resources-kubelet-socket", "/y.sock"], {"GPU_EXPORTER_POD_RESOURCES_SOCKET": "/z.sock"},
         dict(pod_resources_socket="/y.sock")),
        ([], {"DCGM_EXPORTER_COLLECTORS": "/etc/x.csv"}, dict(collectors="/etc/x.csv")),
        (["-f", "/etc/y.csv"], {"DCGM_EXPORTER_COLLECTORS": "/etc/x.csv"}, dict(collectors="/etc/y.csv")),
        ([], {"GPU_EXPORTER_BACKEND": "simulated", "GPU_EXPORTER_SIMULATE_GPUS": "64"},
         dict(backend="simulated", simulate_gpus=64)),
        (["--backend", "simulated", "--simulate-gpus", "2"], {"GPU_EXPORTER_SIMULATE_GPUS": "64"},
         dict(backend="simulated", simulate_gpus=2)),
        ([], {"GPU_EXPORTER_LOG_LEVEL": "DEBUG"}, dict(log_level="debug")),
        (["--debug"], {}, dict(log_level="debug")),
        ([], {"DCGM_EXPORTER_DEBUG": "true"}, dict(log_level="debug")),
        (["--debug", "--log-level", "warning"], {}, dict(log_level="warning")),
        ([], {}, dict(log_format="text", devices=parse_devices("f"), web_config_file=None,
                      kubernetes_gpu_id_type="uid", nvidia_resource_names=(), kubernetes_virtual_gpus=False,
                      openmetrics=False, pod_attribution_max_age_s=300.0, warnings=())),
        (["--log-format", "json"], {"GPU_EXPORTER_LOG_FORMAT": "logfmt"}, dict(log_format="json")),
        ([], {"GPU_EXPORTER_LOG_FORMAT": "logfmt", "DCGM_EXPORTER_LOG_FORMAT": "json"}, dict(log_format="logfmt")),
        ([], {"DCGM_EXPORTER_LOG_FORMAT": "json"}, dict(log_format="json")),
        (["-d", "g:0,2-3"], {}, dict(devices=parse_devices("g:0,2-3"), devices_source="--devices")),
        ([], {"DCGM_EXPORTER_DEVICES_STR": "i"}, dict(devices=parse_devices("i"),
                                                      devices_source="DCGM_EXPORTER_DEVICES_STR")),
        (["--web-config-file", "/w.yml"], {}, dict(web_config_file="/w.yml")),
        ([], {"DCGM_EXPORTER_WEB_CONFIG_FILE": "/etc/dcgm-exporter/web-config.yaml"},
         dict(web_config_file="/etc/dcgm-exporter/web-config.yaml")),
        (["--kubernetes-gpu-id-type", "device-name"], {}, dict(kubernetes_gpu_id_type="device-name")),
        ([], {"DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE": "device-name"}, dict(kubernetes_gpu_id_type="device-name")),
        (["--nvidia-resource-names", "nvidia.com/gpu.shared,nvidia.com/a100"], {},
         dict(nvidia_resource_names=("nvidia.com/gpu.shared", "nvidia.com/a100"))),
        (["--nvidia-resource-names", "a", "--nvidia-resource-names", "b"], {}, dict(nvidia_resource_names=("a", "b"))),
        ([], {"NVIDIA_RESOURCE_NAMES": "nvidia.com/gpu.shared"},
         dict(nvidia_resource_names=("nvidia.com/gpu.shared",))),
        (["--kubernetes-virtual-gpus"], {}, dict(kubernetes_virtual_gpus=True)),
        ([], {"KUBERNETES_VIRTUAL_GPUS": "true"}, dict(kubernetes_virtual_gpus=True)),
        (["--kubernetes=false"], {"DCGM_EXPORTER_KUBERNETES": "true"}, dict(kubernetes=False)),  # Go bool syntax
        (["-k=true"], {}, dict(kubernetes=True)),
        (["--enable-openmetrics"], {}, dict(openmetrics=True)),
        (["--pod-attribution-max-age", "30s"], {}, dict(pod_attribution_max_age_s=30.0)),
        (["--address=:9400"], {}, dict(listen=("", 9400))),
    ],
)
def test_settings_precedence(argv: list[str], env: dict[str, str], expected: dict[str, object]) -> None:
    s = load_settings(argv, env)
    for key, value in expected.items():
        assert getattr(s, key) == value, key


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--interval", "5x"], {}, "--interval"),
        ([], {"DCGM_EXPORTER_INTERVAL": "soon"}, "DCGM_EXPORTER_INTERVAL"),
        (["--interval", "1ms"], {}, "at least 50ms"),
        (["--interval", "1.5"], {}, "did you mean 1.5s"),
        (["--interval", "5"], {}, "did you mean 5s"),
        ([], {"GPU_EXPORTER_INTERVAL": "30"}, "GPU_EXPORTER_INTERVAL='30': a duration needs a unit"),
        (["-c", "5s"], {}, "-c/--collect-interval='5s': expected an integer number of milliseconds"),
        ([], {"DCGM_EXPORTER_INTERVAL": "10"}, "at least 50ms"),
        (["-d", "x:1"], {}, "--devices='x:1'"),
        ([], {"DCGM_EXPORTER_DEVICES_STR": "g:a"}, "DCGM_EXPORTER_DEVICES_STR"),
        (["--log-format", "xml"], {}, "--log-format='xml': expected one of text, json, logfmt"),
        (["--kubernetes-gpu-id-type", "serial"], {}, "expected uid or device-name"),
        (["--kubernetes-virtual-gpus=maybe"], {}, "--kubernetes-virtual-gpus"),
        ([], {"GPU_EXPORTER_LISTEN": "9400"}, "GPU_EXPORTER_LISTEN"),
        (["--listen", "h:99999"], {}, "--listen"),
        (["--backend", "cuda"], {}, "nvml or simulated"),
        (["--simulate-gpus", "0"], {}, "--simulate-gpus"),
        ([], {"DCGM_EXPORTER_KUBERNETES": "maybe"}, "DCGM_EXPORTER_KUBERNETES"),
        (["--log-level", "trace"], {}, "--log-level"),
    ],
)
def test_invalid_values_raise_settings_error_naming_the_source(
    argv: list[str], env: dict[str, str], names: str
) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(argv, env)
    assert names in str(err.value)


def test_settings_error_is_a_value_error_carrying_the_value() -> None:
    with pytest.raises(ValueError) as err:
        parse_duration("--interval", "forever")
    assert isinstance(err.value, SettingsError) and err.value.value == "forever"


FLAGS_TSV = TEST_DATA / "dcgm_exporter_4.8.2_flags.tsv"
DCGM_FLAGS = [ln.split("\t") for ln in FLAGS_TSV.read_text().splitlines() if ln and not ln.startswith("#")]


@pytest.mark.parametrize(("flag", "alias", "env", "kind", "value"), DCGM_FLAGS, ids=[r[0] for r in DCGM_FLAGS])
def test_every_dcgm_exporter_4_8_2_flag_alias_and_env_is_accepted(
    flag: str, alias: str, env: str, kind: str, value: str
) -> None:
    forms = [[f"--{flag}={value}"], [f"--{flag}", value]] if kind != "Bool" else [[f"--{flag}"], [f"--{flag}={value}"]]
    if alias != "-":
        forms.append([f"-{alias}", value] if kind != "Bool" else [f"-{alias}"])
    for argv in forms:
        load_settings(argv, {})  # argparse would exit 2 on an unknown flag
    load_settings([], {env: value})


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["-m", "gpu-operator:metrics"], {}, "--configmap-data=gpu-operator:metrics is a dcgm-exporter flag with no "
                                             "effect here: counters come from -f/--collectors"),
        (["-r", "10.0.0.1:5555"], {}, "--remote-hostengine-info=10.0.0.1:5555"),
        (["--remote-hostengine-info", "localhost:5555"], {}, "there is no DCGM hostengine"),
        ([], {"DCGM_EXPORTER_CONFIGMAP_DATA": "ns:cm"},
         "DCGM_EXPORTER_CONFIGMAP_DATA=ns:cm is a dcgm-exporter setting"),
        ([], {"DCGM_REMOTE_HOSTENGINE_INFO": "host:5555"}, "DCGM_REMOTE_HOSTENGINE_INFO=host:5555"),
        (["--kubernetes-enable-dra"], {}, "--kubernetes-enable-dra=true"),
        ([], {"DCGM_EXPORTER_DUMP_COMPRESSION": "false"}, "DCGM_EXPORTER_DUMP_COMPRESSION=false"),
    ],
)
def test_not_applicable_dcgm_flags_are_accepted_and_named_in_one_warning(
    argv: list[str], env: dict[str, str], needle: str
) -> None:
    warnings = load_settings(argv, env).warnings
    assert len(warnings) == 1 and needle in warnings[0]


def test_not_applicable_settings_at_their_defaults_warn_nothing() -> None:
    env = {"DCGM_EXPORTER_CONFIGMAP_DATA": "none", "DCGM_REMOTE_HOSTENGINE_INFO": "localhost:5555",
           "DCGM_EXPORTER_DUMP_COMPRESSION": "true"}
    assert load_settings([], env).warnings == ()


def test_unknown_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load_settings(["--no-such-flag"], {})
    assert exc.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version_prints_the_package_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    from exporter import __version__

    with pytest.raises(SystemExit) as exc:
        main([flag])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpu-exporter {__version__}"


def test_bad_flag_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--interval", "nope"]) == EXIT_USAGE
    assert "--interval='nope'" in capsys.readouterr().err


def test_bad_collectors_csv_exits_2_with_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = tmp_path / "counters.csv"
    csv.write_text("# comment\nDCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_NOPE, gauge, bad\n")
    assert main(["--backend", "simulated", "--collectors", str(csv)]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"{csv}:3:" in err[0] and "DCGM_FI_DEV_NOPE" in err[0]


def test_backend_that_cannot_start_exits_3_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def no_nvml(settings: Settings) -> GpuBackend:
        raise BackendError("NVML Shared Library Not Found (is the NVIDIA driver installed?)")

    assert main(["--backend", "nvml"], backend_factory=no_nvml) == EXIT_BACKEND
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu-exporter: error: nvml backend: NVML Shared Library Not Found (is the NVIDIA driver "
                   "installed?)"]


def test_real_nvml_backend_without_a_gpu_exits_3_never_falls_back(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML; the no-NVML path cannot be shown here")
    except pynvml.NVMLError:
        pass
    stop = threading.Event()
    stop.set()
    assert main(["--backend", "nvml", "--listen", f"127.0.0.1:{free_port()}"], stop) == EXIT_BACKEND
    assert "gpu-exporter: error: nvml backend:" in capsys.readouterr().err


def test_port_in_use_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        rc = main(["--listen", f"127.0.0.1:{port}"], backend_factory=lambda _: FakeBackend(n=1))
    assert rc == EXIT_RUNTIME
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err


def test_in_process_run_serves_then_stops_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    be = FakeBackend(n=2)
    port = free_port()
    stop = threading.Event()
    result: list[int] = []
    t = threading.Thread(
        target=lambda: result.append(main(["--listen", f"127.0.0.1:{port}", "--interval", "100ms",
                                           "--no-hostname"], stop, backend_factory=lambda _: be)))
    t.start()
    try:
        assert wait_until(lambda: f"serving http://127.0.0.1:{port}/metrics" in capsys.readouterr().err
                          or bool(result), timeout=10)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        conn.request("GET", "/health")
        health = conn.getresponse()
        assert (health.status, health.read()) == (200, b"OK")
        conn.close()
        assert b'DCGM_FI_DEV_GPU_UTIL{gpu="1"' in body
        assert b"Hostname" not in body
        assert b"# HELP DCGM_FI_DEV_XID_ERRORS" in body
    finally:
        stop.set()
        t.join(timeout=10)
    assert result == [EXIT_OK]
    assert be.closed


def test_bad_web_config_exits_2_naming_file_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [X]\n")
    be = FakeBackend(n=1)
    assert main(["--web-config-file", str(web)], backend_factory=lambda _: be) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpu-exporter: error: {web}:4: tls_server_config.cipher_suites: unknown cipher suite 'X' "
                   "(cipher_suites lists the TLS 1.2 suites the server may negotiate, by Go's names, e.g. "
                   "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)"]


def test_web_config_from_dcgm_env_is_read_never_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DCGM_EXPORTER_WEB_CONFIG_FILE", str(tmp_path / "missing.yml"))
    assert main([], backend_factory=lambda _: FakeBackend(n=1)) == EXIT_USAGE
    assert "missing.yml: cannot read" in capsys.readouterr().err


def test_devices_id_that_does_not_exist_exits_2_and_closes_the_backend(capsys: pytest.CaptureFixture[str]) -> None:
    be = FakeBackend(n=2)
    assert main(["-d", "g:5"], backend_factory=lambda _: be) == EXIT_USAGE
    assert "no GPU 5 on this node (it has 0, 1)" in capsys.readouterr().err
    assert be.closed


def run_briefly(argv: list[str], be: GpuBackend) -> tuple[int, str]:
    """Run main in process until it serves one scrape, then stop; returns (port, /metrics body)."""
    port = free_port()
    stop = threading.Event()
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(
        main(["--listen", f"127.0.0.1:{port}", "--interval", "100ms", *argv], stop, backend_factory=lambda _: be)))
    t.start()
    try:
        def up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                return bool(result)
        assert wait_until(up, timeout=10), result
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
    finally:
        stop.set()
        t.join(timeout=10)
    assert result == [EXIT_OK]
    return port, body


def test_devices_selection_limits_the_served_gpus() -> None:
    _, body = run_briefly(["-d", "g:1", "--no-hostname"], FakeBackend(n=3))
    gpus = {ln.split('gpu="')[1].split('"')[0] for ln in body.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")}
    assert gpus == {"1"}


def test_not_applicable_flags_warn_once_in_the_chosen_log_format(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    run_briefly(["-m", "ns:cm", "-r", "host:5555", "--log-format", "json"], FakeBackend(n=1))
    records = [json.loads(ln) for ln in capsys.readouterr().err.splitlines() if ln.startswith("{")]
    warned = [r["msg"] for r in records if r["level"] == "warning" and "dcgm-exporter flag" in r["msg"]]
    assert len(warned) == 2
    assert warned[0].startswith("--configmap-data=ns:cm") and warned[1].startswith("--remote-hostengine-info=host:5555")
    assert all(r["ts"].endswith("Z") and r["logger"] for r in records)


class _EveryGpuLostAtStart(FakeBackend):
    """Every GPU is down when the exporter starts (listed with a problem, probes and reads raise), and
    answers again once ``lost`` is cleared."""

    lost = True

    def devices(self) -> list[DeviceInfo]:
        return [replace(d, problem="GPU_IS_LOST") if self.lost else d for d in super().devices()]

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        if self.lost:
            raise GpuLostError(gpu, "GPU_IS_LOST")
        return super().supported_fields(gpu, fields)

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        if self.lost:
            raise GpuLostError(gpu, "GPU_IS_LOST")
        return super().read(gpu, fields)


def test_every_gpu_lost_at_start_keeps_the_counter_set_and_serves_the_gpus_once_they_answer() -> None:
    """No GPU to probe at start is no reason to drop every counter row: the GPUs are reported down,
    and their series come once they answer (issue 7: faults stay local, recovery without restart)."""
    be = _EveryGpuLostAtStart(n=2)
    port = free_port()
    stop = threading.Event()
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(main(
        ["--listen", f"127.0.0.1:{port}", "--interval", "100ms", "--no-hostname"], stop,
        backend_factory=lambda _: be)))
    t.start()

    def scrape() -> str:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read().decode()
            conn.close()
            return body
        except OSError:
            return ""

    try:
        assert wait_until(lambda: "gpu_exporter_device_up{" in scrape(), timeout=10), result
        body = scrape()
        assert body.count("gpu_exporter_device_up{") == 2
        assert all(ln.endswith(" 0") for ln in body.splitlines() if ln.startswith("gpu_exporter_device_up{"))
        assert "DCGM_FI_DEV_GPU_UTIL{" not in body
        be.lost = False
        assert wait_until(lambda: scrape().count("DCGM_FI_DEV_GPU_UTIL{") == 2, timeout=15), scrape()
    finally:
        stop.set()
        t.join(timeout=10)
    assert result == [EXIT_OK]


def test_every_line_the_exporter_writes_with_log_format_json_is_a_json_object(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--log-format json: the start-up banner too is an event (issue 10: one event per line that an
    SRE's tools can read), and nothing goes to stdout."""
    import json

    run_briefly(["--log-format", "json", "--no-hostname"], FakeBackend(n=1))
    captured = capsys.readouterr()
    assert captured.out == ""
    records = [json.loads(ln) for ln in captured.err.splitlines()]
    assert any(r["msg"].startswith("serving http://127.0.0.1:") and r["gpus"] == 1 for r in records)
