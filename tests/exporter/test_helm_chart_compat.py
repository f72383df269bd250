"""NVIDIA's dcgm-exporter Helm chart 4.8.2 with its default values, with our image swapped in.

What the chart passes is recorded in tests/data/nvidia_dcgm_exporter_chart_4.8.2/chart.json, from
NVIDIA/dcgm-exporter tag 4.5.3-4.8.2: deployment/values.yaml (``arguments``, ``service``,
``livenessProbe``, ``readinessProbe``), deployment/templates/daemonset.yaml (env, ports, probes)
and deployment/templates/web-config-configmap.yaml (TLS and basic auth variants); its counters
ConfigMap (templates/metrics-configmap.yaml) is default-counters.csv beside it.

The swap (issue 21 point 11, docs/nvidia-helm-chart.md): the chart's templates themselves
(Chart.yaml, values.yaml, templates/_helpers.tpl, daemonset.yaml, service.yaml,
service-monitor.yaml, verbatim from that tag) are in chart/ beside it, rendered by
tests/exporter/helmrender.py as ``helm template`` would, with the values override read from the
doc's YAML block: the DaemonSet runs our image with arguments and environment the exporter's own
settings parser accepts, on the same port, behind the same Service, ServiceMonitor and job name.

The run tests bind 127.0.0.1 on a free port (GPU_EXPORTER_LISTEN, which by the precedence rule
beats the chart's DCGM_EXPORTER_LISTEN) and read the ConfigMap's CSV from the test data folder
instead of its mount path; everything else is exactly what the chart passes.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from exporter import __version__
from exporter.cli import EXIT_OK, main
from exporter.settings import load_settings
from exporter.simulated import SimulatedBackend
from tests.exporter.helmrender import coalesce, render_chart
from tests.helpers import REPO_ROOT, TEST_DATA, free_port, wait_until
from tests.tls_certs import Certs, make_certs

DATA = TEST_DATA / "nvidia_dcgm_exporter_chart_4.8.2"
CHART: dict[str, Any] = json.loads((DATA / "chart.json").read_text())
CSV_MOUNT = "/etc/dcgm-exporter/default-counters.csv"
NODE = "gpu-node-7"


def chart_env(extra: dict[str, str] | None = None, env: dict[str, Any] | None = None) -> dict[str, str]:
    base = CHART["env"] if env is None else env
    out = {k: (NODE if isinstance(v, dict) else v) for k, v in base.items()}  # fieldRef spec.nodeName
    out.update(extra or {})
    return out


def chart_args(args: list[str] | None = None) -> list[str]:
    return [str(DATA / "default-counters.csv") if a == CSV_MOUNT else a for a in (args or CHART["args"])]


@pytest.fixture
def run_chart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    threads: list[tuple[threading.Thread, threading.Event, list[int]]] = []

    def start(extra_env: dict[str, str] | None = None, *, args: list[str] | None = None,
              env: dict[str, Any] | None = None) -> int:
        """Run what the chart passes: its recorded default, or ``args``/``env`` of a rendering."""
        port = free_port()
        full_env = chart_env({"GPU_EXPORTER_LISTEN": f"127.0.0.1:{port}",
                              "GPU_EXPORTER_POD_RESOURCES_SOCKET": str(tmp_path / "no-kubelet.sock"),
                              **(extra_env or {})}, env)
        for k, v in full_env.items():
            monkeypatch.setenv(k, v)
        argv = chart_args(args)
        stop, result = threading.Event(), []
        t = threading.Thread(target=lambda: result.append(
            main(argv, stop, backend_factory=lambda _: SimulatedBackend(n_gpus=2))))
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


# -- the swap: the chart's templates rendered with docs/nvidia-helm-chart.md's override ---------------

CHART_DIR = DATA / "chart"
DOC = REPO_ROOT / "docs" / "nvidia-helm-chart.md"
OUR_DAEMONSET = REPO_ROOT / "deploy" / "exporter" / "daemonset.yaml"
# release name -> the chart's fullname, which names the Service and so the Prometheus Operator's job
RELEASES = {"dcgm-exporter": "dcgm-exporter", "monitoring": "monitoring-dcgm-exporter",
            "dcgm-exporter-1712345678": "dcgm-exporter-1712345678"}


def doc_values(name: str) -> dict[str, Any]:
    """The doc's ```yaml block whose first line is ``# <name>: ...``; exactly one such block."""
    blocks = [b for b in re.findall(r"^```yaml\n(.*?)^```$", DOC.read_text(), re.S | re.M)
              if b.startswith(f"# {name}:")]
    assert len(blocks) == 1, (name, len(blocks))
    values: dict[str, Any] = yaml.safe_load(blocks[0])
    return values


def rendered(overrides: dict[str, Any] | None = None, release: str = "dcgm-exporter") -> dict[str, dict[str, Any]]:
    docs = render_chart(CHART_DIR, overrides, release=release, namespace="gpu-operator")
    by_kind = {d["kind"]: d for d in docs}
    assert sorted(by_kind) == ["DaemonSet", "Service", "ServiceMonitor"] and len(docs) == 3
    return by_kind


def container(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = objs["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e["value"] if "value" in e else {"fieldRef": e["valueFrom"]["fieldRef"]["fieldPath"]}
            for e in c["env"]}


def test_rendering_the_recorded_templates_gives_what_chart_json_recorded() -> None:
    c = container(rendered())
    assert c["args"] == CHART["args"]
    assert env_of(c) == CHART["env"]
    assert c["ports"] == [{"name": CHART["port_name"], "containerPort": CHART["container_port"]}]
    assert c["image"] == "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"
    for probe, key in (("liveness_probe", "livenessProbe"), ("readiness_probe", "readinessProbe")):
        assert c[key] == CHART[probe]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == set(CHART["volume_mounts"])


def test_the_doc_has_one_override_and_one_hostname_block() -> None:
    values = doc_values("values-gpu-exporter.yaml")
    assert set(values) == {"image", "arguments", "service", "serviceMonitor"}
    assert set(doc_values("values-hostname.yaml")) == {"arguments"}


def test_the_override_runs_our_image_and_version() -> None:
    image = container(rendered(doc_values("values-gpu-exporter.yaml")))["image"]
    ours = next(d for d in yaml.safe_load_all(OUR_DAEMONSET.read_text()) if d and d["kind"] == "DaemonSet")
    (our_container,) = ours["spec"]["template"]["spec"]["containers"]
    repository, _, tag = image.rpartition(":")
    assert repository.rsplit("/", 1)[-1] + ":" + tag == our_container["image"] == f"gpu-telemetry:{__version__}"


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_override_keeps_the_charts_objects_port_and_job(release: str) -> None:
    before, after = rendered(release=release), rendered(doc_values("values-gpu-exporter.yaml"), release=release)
    assert after["Service"] == before["Service"]  # name, labels, selector, port 9400 -> 9400
    assert after["Service"]["metadata"]["name"] == RELEASES[release]
    assert after["Service"]["spec"]["ports"] == [{"name": "metrics", "port": 9400, "targetPort": 9400,
                                                  "protocol": "TCP"}]
    sm_before, sm_after = before["ServiceMonitor"], after["ServiceMonitor"]
    assert sm_after["metadata"] == sm_before["metadata"]
    assert sm_after["spec"]["selector"] == sm_before["spec"]["selector"]
    assert sm_after["spec"]["selector"]["matchLabels"].items() <= after["Service"]["metadata"]["labels"].items()
    assert "jobLabel" not in sm_after["spec"]  # so job="<the Service's name>", before and after
    (ep,) = sm_after["spec"]["endpoints"]
    assert (ep["port"], ep["path"], ep["honorLabels"]) == ("metrics", "/metrics", True)
    assert ep["relabelings"] == [{"action": "labeldrop", "regex": "pod|namespace|container"}]
    ds_before, ds_after = before["DaemonSet"], after["DaemonSet"]
    assert ds_after["metadata"] == ds_before["metadata"]
    assert ds_after["spec"]["selector"] == ds_before["spec"]["selector"]
    assert ds_after["spec"]["template"]["metadata"] == ds_before["spec"]["template"]["metadata"]
    c_before, c_after = container(before), container(after)
    for key in ("ports", "livenessProbe", "readinessProbe", "volumeMounts", "env"):
        assert c_after[key] == c_before[key], key
    assert c_after["image"] != c_before["image"]


def test_the_override_args_and_env_are_what_our_settings_parser_accepts() -> None:
    c = container(rendered(doc_values("values-gpu-exporter.yaml")))
    s = load_settings(c["args"], chart_env(env=env_of(c)))
    assert s.listen == ("", 9400)
    assert s.collectors == CSV_MOUNT
    assert s.kubernetes is True
    assert (s.hostname, s.hostname_label) == (NODE, "Hostname")
    assert s.warnings == ()


def test_the_hostname_block_layers_on_the_override_and_names_the_label_hostname() -> None:
    values = coalesce(doc_values("values-gpu-exporter.yaml"), doc_values("values-hostname.yaml"))
    c = container(rendered(values))
    s = load_settings(c["args"], chart_env(env=env_of(c)))
    assert (s.hostname, s.hostname_label, s.collectors) == (NODE, "hostname", CSV_MOUNT)


@pytest.mark.parametrize(("extra", "label"), [("values-gpu-exporter.yaml", "Hostname"),
                                               ("values-hostname.yaml", "hostname")])
def test_the_rendered_daemonset_runs_and_serves_its_probes_and_metrics(run_chart: Any, extra: str, label: str) -> None:
    values = coalesce(doc_values("values-gpu-exporter.yaml"), doc_values(extra))
    c = container(rendered(values))
    port = run_chart(args=c["args"], env=env_of(c))
    assert get(port, c["livenessProbe"]["httpGet"]["path"])[0] == 200
    assert get(port, c["readinessProbe"]["httpGet"]["path"])[0] == 200
    status, body = get(port, "/metrics")
    text = body.decode()
    assert status == 200 and 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in text
    other = "hostname" if label == "Hostname" else "Hostname"
    assert f'{label}="{NODE}"' in text and f'{other}="' not in text
    assert 'gpu_exporter_device_up{gpu="0",' in text


def test_chart_options_the_doc_names_reach_the_exporter() -> None:
    values = coalesce(doc_values("values-gpu-exporter.yaml"), {
        "kubernetes": {"enablePodLabels": True, "enablePodUID": True},
        "debugDump": {"enabled": True}, "kubernetesDRA": {"enabled": True}})
    objs = rendered(values)
    assert objs["DaemonSet"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    c = container(objs)
    s = load_settings(c["args"], chart_env(env=env_of(c)))
    assert s.pod_labels is True and s.pod_uid is True
    named = " ".join(s.warnings)
    for flag in ("--dump-enabled", "--dump-directory", "--dump-retention", "--dump-compression",
                 "KUBERNETES_ENABLE_DRA"):
        assert flag in named, flag
