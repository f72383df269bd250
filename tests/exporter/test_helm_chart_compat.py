"""NVIDIA's dcgm-exporter Helm chart 4.8.2 with its default values, with our image swapped in.

What the chart passes is recorded in tests/data/nvidia_dcgm_exporter_chart_4.8.2/chart.json, from
NVIDIA/dcgm-exporter tag 4.5.3-4.8.2: deployment/values.yaml (``arguments``, ``service``,
``livenessProbe``, ``readinessProbe``), deployment/templates/daemonset.yaml (env, ports, probes)
and deployment/templates/web-config-configmap.yaml (TLS and basic auth variants); its counters
ConfigMap (templates/metrics-configmap.yaml) is default-counters.csv beside it.

The run tests bind 127.0.0.1 on a free port (GPU_EXPORTER_LISTEN, which by the precedence rule
beats the chart's DCGM_EXPORTER_LISTEN) and read the ConfigMap's CSV from the test data folder
instead of its mount path; everything else is exactly what the chart passes.
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from exporter.cli import EXIT_OK, main
from exporter.settings import load_settings
from exporter.simulated import SimulatedBackend
from tests.helpers import TEST_DATA, free_port, wait_until
from tests.tls_certs import Certs, make_certs

DATA = TEST_DATA / "nvidia_dcgm_exporter_chart_4.8.2"
CHART: dict[str, Any] = json.loads((DATA / "chart.json").read_text())
CSV_MOUNT = "/etc/dcgm-exporter/default-counters.csv"
NODE = "gpu-node-7"


def chart_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: (NODE if isinstance(v, dict) else v) for k, v in CHART["env"].items()}  # fieldRef spec.nodeName
    env.update(extra or {})
    return env


def chart_args() -> list[str]:
    return [str(DATA / "default-counters.csv") if a == CSV_MOUNT else a for a in CHART["args"]]


@pytest.fixture
def run_chart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    threads: list[tuple[threading.Thread, threading.Event, list[int]]] = []

    def start(extra_env: dict[str, str] | None = None) -> int:
        port = free_port()
        env = chart_env({"GPU_EXPORTER_LISTEN": f"127.0.0.1:{port}",
                         "GPU_EXPORTER_POD_RESOURCES_SOCKET": str(tmp_path / "no-kubelet.sock"), **(extra_env or {})})
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        stop, result = threading.Event(), []
        t = threading.Thread(target=lambda: result.append(
            main(chart_args(), stop, backend_factory=lambda _: SimulatedBackend(n_gpus=2))))
        t.start()
        threads.append((t, stop, result))
        assert wait_until(lambda: _connects(port) or bool(result), timeout=10), result
        return port

    yield start
    for t, stop, result in threads:
        stop.set()
        t.join(timeout=10)
        assert result == [EXIT_OK]


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def get(port: int, path: str, *, tls: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn: http.client.HTTPConnection
    if tls is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=tls)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_chart_default_args_and_env_parse_exactly_as_dcgm_exporter_would_run() -> None:
    s = load_settings(CHART["args"], chart_env())
    assert s.listen == ("", CHART["container_port"])  # DCGM_EXPORTER_LISTEN=":9400": all interfaces
    assert s.kubernetes is True
    assert s.collectors == CSV_MOUNT
    assert s.hostname == NODE
    assert s.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"  # the chart's mount
    assert s.warnings == ()
    assert s.web_config_file is None


def test_chart_probe_paths_and_port_are_what_we_serve() -> None:
    for probe in ("liveness_probe", "readiness_probe"):
        http_get = CHART[probe]["httpGet"]
        assert (http_get["path"], http_get["port"], http_get["scheme"]) == ("/health", 9400, "HTTP")
    assert CHART["container_port"] == 9400


def test_chart_default_deployment_serves_metrics_and_passes_its_probes(run_chart: Any) -> None:
    port = run_chart()
    for probe in ("liveness_probe", "readiness_probe"):
        status, body = get(port, CHART[probe]["httpGet"]["path"])
        assert status == 200, (probe, body)
    status, body = get(port, "/metrics")
    assert status == 200
    text = body.decode()
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in text and f'Hostname="{NODE}"' in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text  # the chart CSV's rows, as typed there


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("chart-tls"))


def test_chart_with_tls_enabled_serves_https_and_its_https_probes_pass(
    run_chart: Any, tmp_path: Path, certs: Certs
) -> None:
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    shutil.copy(certs.server_cert, tls_dir / "tls.crt")
    shutil.copy(certs.server_key, tls_dir / "tls.key")
    web = tmp_path / "web-config.yaml"  # the chart's file, its secret mount moved to tmp
    web.write_text(CHART["with_tls"]["web_config"].replace("/etc/dcgm-exporter/tls/", f"{tls_dir}/"))
    assert CHART["with_tls"]["env"] == {"DCGM_EXPORTER_WEB_CONFIG_FILE": "/etc/dcgm-exporter/web-config.yaml"}
    port = run_chart({"DCGM_EXPORTER_WEB_CONFIG_FILE": str(web)})
    assert CHART["with_tls"]["probe_scheme"] == "HTTPS"
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    assert get(port, "/health", tls=ctx)[0] == 200
    assert get(port, "/metrics", tls=ctx)[0] == 200
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        get(port, "/health")  # plain HTTP no longer answers


def test_chart_with_basic_auth_passes_its_tcp_probe_and_guards_metrics(run_chart: Any, tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(4)).decode().replace("$2b$", "$2a$", 1)  # Helm's htpasswd
    web = tmp_path / "web-config.yaml"
    web.write_text(CHART["with_basic_auth"]["web_config_template"].format(hash=hashed))
    port = run_chart({"DCGM_EXPORTER_WEB_CONFIG_FILE": str(web)})
    assert CHART["with_basic_auth"]["probe"] == {"tcpSocket": {"port": 9400}}
    assert _connects(port)  # the chart's tcpSocket probe
    assert get(port, "/metrics")[0] == 401
    auth = "Basic " + base64.b64encode(b"prometheus:scrape-me").decode()
    status, body = get(port, "/metrics", headers={"Authorization": auth})
    assert status == 200 and b"DCGM_FI_DEV_GPU_UTIL" in body
