"""gpu-jobwatch's command line: flags, GPU_JOBWATCH_* env, the config file, exit codes, and the
console script run for real against the fake API server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from jobwatch.cli import main
from jobwatch.config import SettingsError, load_settings
from jobwatch.prices import ConfigError
from tests.jobwatch.fake_apiserver import FakeAPIServer, gpu_pod


def test_defaults() -> None:
    s = load_settings([], env={})
    assert s.listen == "127.0.0.1:9403"
    assert s.push_listen is None
    assert s.push_audience == "gpu-telemetry"
    assert s.discovery_interval_s == 300
    assert s.metrics_allowlist == ("loss", "eval_loss", "learning_rate", "grad_norm")
    assert s.file.retention_s == 900
    assert (s.log_format, s.log_level) == ("text", "info")


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("metrics_allowlist: [loss]\nretention: 5m\nthresholds: {stall_after: 20m}\n"
                   "default_usd_per_gpu_hour: 2.5\n")
    env = {"GPU_JOBWATCH_LISTEN": ":9999", "GPU_JOBWATCH_PUSH_LISTEN": ":9411", "GPU_JOBWATCH_CONFIG": str(cfg),
           "GPU_JOBWATCH_LOG_FORMAT": "json", "GPU_JOBWATCH_DISCOVERY_INTERVAL": "2m"}
    s = load_settings(["--listen", ":9403"], env=env)
    assert (s.listen, s.push_listen, s.log_format, s.discovery_interval_s) == (":9403", ":9411", "json", 120)
    assert s.metrics_allowlist == ("loss",)
    assert (s.file.retention_s, s.file.stall_after_s) == (300, 1200)
    assert s.file.prices.price_for({}) == 2.5
    s2 = load_settings(["--metrics-allowlist", "loss,grad_norm"], env=env)
    assert s2.metrics_allowlist == ("loss", "grad_norm")


@pytest.mark.parametrize(("argv", "message"), [
    (["--log-format", "xml"], "--log-format"),
    (["--log-level", "loud"], "--log-level"),
    (["--discovery-interval", "5"], "--discovery-interval"),
    (["--listen", "nonsense"], "--listen"),
    (["--push-tls-cert", "/c"], "go together"),
])
def test_bad_flags_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(argv, env={})


@pytest.mark.parametrize(("text", "message"), [
    ("retention: 15\n", "c.yaml:1: retention: must be a duration"),
    ("nope: 1\n", "c.yaml:1: nope: unknown key"),
    ("metrics_limit: 9\n", "metrics_limit: must be a whole number 0..8"),
    ("thresholds:\n  stall: 5m\n", "c.yaml:2: thresholds.stall: unknown key"),
    ("prices:\n  - {instance_type: p5, gpus: 8}\n", "prices[0]"),
    ("a: [\n", "not YAML"),
])
def test_bad_config_names_file_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_settings(["--config", str(cfg)], env={})


def test_main_exits_2_on_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["--log-format", "xml"]) == 2
    assert "--log-format" in capsys.readouterr().err
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main([]) == 2  # nowhere to find the API server


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("gpu-jobwatch 0.1.0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_console_script_serves_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "gpu-jobwatch"
    if not exe.exists():
        pytest.skip("gpu-jobwatch console script not installed (pip install -e .)")
    with FakeAPIServer() as fake:
        fake.apply("pods", gpu_pod("p1"))
        port = _free_port()
        env = {**os.environ, "GPU_JOBWATCH_KUBECONFIG": str(fake.kubeconfig(tmp_path / "kc")),
               "GPU_JOBWATCH_LISTEN": f"127.0.0.1:{port}", "GPU_JOBWATCH_LOG_FORMAT": "json"}
        proc = subprocess.Popen([str(exe)], env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            body = b""
            while time.monotonic() < deadline and b'pod="p1"' not in body:
                time.sleep(0.2)
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                        body = resp.read()
                except OSError:
                    continue
            assert b'gpu_pod_job_info{namespace="ml",pod="p1"' in body
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert '"msg": "gpu-jobwatch 0.1.0' in err
        assert fake.token not in err  # no secret in the logs
