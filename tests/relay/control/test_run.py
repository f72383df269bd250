"""`gpu-relay run` as a process: one-line start-up failures, the start-up line, --log-format,
--web.enable-lifecycle, the config file watch, SIGTERM flushing open aggregation windows; and
the telemetry listener (server.telemetry_listen)."""

from __future__ import annotations

import dataclasses
import http.client
import importlib.util
import inspect
import json
import logging
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from relay import native
from relay.config.config import Config, ServerConfig, load_config
from relay.control.daemon import listeners, log_config_warnings, server_options
from relay.control.service import Runtime
from relay.delivery.queue.durable import DurableQueue
from relay.ingest import wire
from relay.ingest.server import RelayHTTPServer
from tests.e2e.procs import VENV_BIN, running, start_relay
from tests.helpers import free_port, wait_until
from tests.relay.control.test_service import S, _http_metric, _http_post, now_ms

AMP = "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/api/v1/remote_write"


def aws_env(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(empty), AWS_SHARED_CREDENTIALS_FILE=str(empty), AWS_EC2_METADATA_DISABLED="true")
    return env


def run_to_exit(tmp_path: Path, config: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    cfg = tmp_path / "relay.yaml"
    cfg.write_text(config)
    p = subprocess.run([str(VENV_BIN / "gpu-relay"), *args, "run", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=60, env=env)
    return p.returncode, p.stdout + p.stderr


def test_run_with_a_missing_sigv4_profile_fails_with_one_line_naming_the_destination(tmp_path: Path) -> None:
    rc, out = run_to_exit(tmp_path, f"""\
server: {{listen: "127.0.0.1:{free_port()}"}}
storage: {{path: {tmp_path / 'q'}}}
destinations:
  - name: amp
    url: {AMP}
    sigv4: {{region: us-west-2, profile: nope}}
""", env=aws_env(tmp_path))
    assert rc == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert "amp" in lines[0] and "nope" in lines[0]
    assert "Traceback" not in out


def test_run_without_any_credentials_fails_with_one_line_and_what_to_do(tmp_path: Path) -> None:
    rc, out = run_to_exit(tmp_path, f"""\
server: {{listen: "127.0.0.1:{free_port()}"}}
storage: {{path: {tmp_path / 'q'}}}
destinations:
  - name: amp
    url: {AMP}
    sigv4: {{region: us-west-2}}
""", env=aws_env(tmp_path))
    assert rc == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert "destination amp: cannot set up credentials" in lines[0]
    assert "IRSA" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0]  # what to do
    assert "Traceback" not in out


def test_run_with_storage_that_cannot_be_created_fails_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    rc, out = run_to_exit(tmp_path, f"""\
server: {{listen: "127.0.0.1:{free_port()}"}}
storage: {{path: {tmp_path / 'afile' / 'queues'}}}
destinations:
  - name: rx
    url: http://127.0.0.1:1/api/v1/write
""")
    assert rc == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert "destination rx: cannot set up storage" in lines[0] and "storage.path" in lines[0]
    assert "Traceback" not in out


def cfg(tmp_path: Path, regex: str = "a_.*", extra: str = "") -> str:
    return f"""\
server: {{listen: "127.0.0.1:@PORT@"}}
storage: {{path: {tmp_path / 'queues'}}}
destinations:
  - name: amp
    url: {AMP}
    dry_run: true
    sigv4: {{region: us-west-2, role_arn: "arn:aws:iam::123456789012:role/writer"}}
    write_relabel_configs: [{{source_labels: [__name__], regex: "{regex}", action: keep}}]
  - name: local
    url: http://127.0.0.1:1/api/v1/write
    queue: {{min_backoff: 10ms, max_backoff: 50ms}}
{extra}"""


def test_startup_line_says_each_destinations_credentials_and_region_in_json_logs(tmp_path: Path) -> None:
    proc, url = start_relay(tmp_path, cfg(tmp_path), args=["--log-format", "json"],
                            env={"AWS_EC2_METADATA_DISABLED": "true"})
    with running(proc):
        assert wait_until(lambda: "gpu-relay 0" in proc.tail())
        events = [json.loads(line) for line in proc.tail().splitlines()]
    start = next(e for e in events if e["msg"].startswith("gpu-relay "))
    assert start["level"] == "info" and start["ts"].endswith("Z") and start["logger"] == "relay.daemon"
    msg = start["msg"]
    assert f"receiving remote-write on {url}/api/v1/write" in msg
    assert (f"amp -> {AMP} (dry run), sigv4 region us-west-2, default chain, then assume role "
            "arn:aws:iam::123456789012:role/writer") in msg
    assert "local -> http://127.0.0.1:1/api/v1/write, none (no sigv4)" in msg


@pytest.mark.parametrize("native_env", ["0", ""])
def test_the_start_says_once_whether_the_native_core_runs_and_build_info_agrees(
        tmp_path: Path, native_env: str) -> None:
    proc, url = start_relay(tmp_path, cfg(tmp_path), env={"GPU_RELAY_NATIVE": native_env})
    with running(proc):
        assert wait_until(lambda: "gpu-relay 0" in proc.tail())
        warnings = [ln for ln in proc.tail().splitlines() if "native per-series core" in ln]
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            metrics = r.read().decode()
    built = all(importlib.util.find_spec(f"relay.native._{n}") is not None for n in native.MODULES)
    on = built and native_env == ""
    assert len(warnings) == (0 if on else 1), warnings
    if not on:
        assert "WARNING" in warnings[0].upper() and ("GPU_RELAY_NATIVE" in warnings[0] or "setup.sh" in warnings[0])
    assert f'native="{"true" if on else "false"}"' in next(
        ln for ln in metrics.splitlines() if ln.startswith("gpu_relay_build_info{"))


def test_log_format_from_the_environment(tmp_path: Path) -> None:
    proc, _url = start_relay(tmp_path, cfg(tmp_path), env={"GPU_RELAY_LOG_FORMAT": "logfmt"})
    with running(proc):
        assert wait_until(lambda: "gpu-relay 0" in proc.tail())
        line = next(ln for ln in proc.tail().splitlines() if "gpu-relay 0" in ln)
    assert line.startswith("ts=") and " level=info " in line and " logger=relay.daemon " in line


def test_a_bad_log_format_in_the_environment_is_refused_naming_the_choices(tmp_path: Path) -> None:
    env = dict(os.environ, GPU_RELAY_LOG_FORMAT="xml")
    rc, out = run_to_exit(tmp_path, cfg(tmp_path).replace("@PORT@", str(free_port())), env=env)
    assert rc == 2
    assert "GPU_RELAY_LOG_FORMAT" in out and "json" in out and "Traceback" not in out


def _post_reload(url: str) -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("POST", "/-/reload")
        return conn.getresponse().status
    finally:
        conn.close()


def test_web_enable_lifecycle_serves_post_reload(tmp_path: Path) -> None:
    proc, url = start_relay(tmp_path, cfg(tmp_path))
    with running(proc):
        status = _post_reload(url)
    if "enable_lifecycle" in inspect.signature(RelayHTTPServer.__init__).parameters:
        assert status == 403  # off by default, as Prometheus's --web.enable-lifecycle
    proc, url = start_relay(tmp_path, cfg(tmp_path), run_args=["--web.enable-lifecycle"])
    with running(proc):
        assert _post_reload(url) == 200


def test_a_changed_config_file_is_reloaded_without_a_signal(tmp_path: Path) -> None:
    proc, url = start_relay(tmp_path, cfg(tmp_path), run_args=["--config.watch-interval", "0.2"])
    port = url.rsplit(":", 1)[1]
    path = tmp_path / "relay.yaml"
    success = 'gpu_relay_config_reloads_total{result="success"}'
    failure = 'gpu_relay_config_reloads_total{result="failure"}'
    with running(proc):
        path.write_text(cfg(tmp_path, "b_.*").replace("@PORT@", port))
        assert wait_until(lambda: _http_metric(url, success) == 1.0, timeout=10), proc.tail()
        path.write_text(cfg(tmp_path, "b_.*").replace("@PORT@", port).replace("10ms", "1q"))
        assert wait_until(lambda: _http_metric(url, failure) == 1.0, timeout=10), proc.tail()
        assert _http_metric(url, "gpu_relay_config_last_reload_successful") == 0.0
        time.sleep(1.0)  # several polls of the same bad file: refused (and logged) once
        assert _http_metric(url, failure) == 1.0
        assert proc.tail(200).count("reload refused") == 1
        assert _http_post(url, [(S("b_1"), [(now_ms(), 1.0)])]) == 204  # the good generation still runs
        proc.p.send_signal(signal.SIGTERM)
        assert proc.p.wait(10) == 0


def test_sigterm_queues_open_aggregation_windows_before_exit(tmp_path: Path) -> None:
    agg = """\
  - name: agg
    url: http://127.0.0.1:1/api/v1/write
    queue: {min_backoff: 10ms, max_backoff: 50ms}
    aggregate:
      - {match: '{__name__="gpu_util"}', without: [gpu], interval: 1h, outputs: [sum]}
"""
    proc, url = start_relay(tmp_path, cfg(tmp_path, extra=agg))
    with running(proc):
        t = now_ms()
        assert _http_post(url, [(S("gpu_util", gpu=str(g)), [(t, 1.0 + g)]) for g in range(4)]) == 204
        proc.p.send_signal(signal.SIGTERM)
        assert proc.p.wait(10) == 0
    queue = DurableQueue(tmp_path / "queues" / "agg.queue.db", 1 << 30)
    try:
        got = [(lb, v) for shard in queue.shards() for e in queue.peek(shard, 1 << 20)
               for lb, samples in wire.decode_write_request(e.payload) for _ts, v in samples]
    finally:
        queue.close()
    assert (S("gpu_util:1h_without_gpu_sum"), 10.0) in got, got


# ---- in-process: listeners, warnings -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TelemetryServer(ServerConfig):
    telemetry_listen: str | None = None


def test_telemetry_listen_opens_a_second_listener_serving_the_status_page(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(cfg(tmp_path).replace("@PORT@", "0"))
    config = load_config(path)
    tele_port = free_port()
    config = dataclasses.replace(config, server=TelemetryServer(listen="127.0.0.1:0",
                                                                telemetry_listen=f"127.0.0.1:{tele_port}"))
    runtime = Runtime(str(path), config)
    servers = listeners(config, runtime, enable_lifecycle=False)
    try:
        assert len(servers) == 2
        assert servers[1].server_address[1] == tele_port
        for s in servers:
            s.start()
        with urllib.request.urlopen(f"http://127.0.0.1:{tele_port}/", timeout=5) as r:
            assert r.headers["Content-Type"] == "text/html; charset=utf-8"
            assert b"gpu-relay status" in r.read()
        t = now_ms()
        assert _http_post(servers[0].url, [(S("a_1"), [(t, 1.0)])]) == 204
    finally:
        for s in servers:
            s.stop()
        runtime.stop()


def test_server_options_come_from_the_flag_or_the_config() -> None:
    config = Config()
    assert server_options(config, enable_lifecycle=True)["enable_lifecycle"] is True
    assert server_options(config, enable_lifecycle=False)["enable_lifecycle"] is False

    @dataclasses.dataclass(frozen=True)
    class Lifecycle(ServerConfig):
        enable_lifecycle: bool = True

    assert server_options(dataclasses.replace(config, server=Lifecycle()), False)["enable_lifecycle"] is True


def test_config_warnings_are_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    @dataclasses.dataclass(frozen=True)
    class Warned(Config):
        warnings: tuple[str, ...] = ("relay.yaml:4: remote_write[0].queue_config.capacity: not honoured",
                                     "relay.yaml:9: remote_write[0].metadata_config.send_interval: not honoured")

    caplog.set_level(logging.WARNING)
    log_config_warnings(Warned())
    got = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert got == list(Warned().warnings)


def test_run_with_a_bad_config_fails_with_every_error_in_one_event(tmp_path: Path) -> None:
    rc, out = run_to_exit(tmp_path, f"""\
server: {{listen: "127.0.0.1:{free_port()}"}}
storage: {{path: {tmp_path / 'q'}}}
destinations:
  - name: rx
    url: http://127.0.0.1:1/api/v1/write
    queue: {{max_backoff: 5q, max_shards: many}}
""", "--log-format", "json")
    assert rc == 1
    [line] = out.strip().splitlines()
    event = json.loads(line)
    assert event["level"] == "error" and event["msg"].startswith("cannot start, the configuration has errors")
    assert 'destinations[0].queue.max_backoff: invalid duration "5q"' in event["msg"]
    assert "destinations[0].queue.max_shards" in event["msg"]
