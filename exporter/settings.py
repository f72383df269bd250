"""gpu-exporter settings: flags + environment -> one frozen ``Settings``.

Precedence is one rule: flag > ``GPU_EXPORTER_<FLAG>`` env > dcgm-exporter's env name > default.
Flag names, aliases and env names follow dcgm-exporter 4.8.2 ``pkg/cmd/app.go`` (``NewApp``), so
its DaemonSet args and NVIDIA's Helm chart work unchanged. Its flags that have no meaning here
(no DCGM hostengine, no ConfigMap API client, ...) are accepted and each named in one warning at
start (``Settings.warnings``), never silently dropped.

Durations: ``--interval`` / ``GPU_EXPORTER_INTERVAL`` take ``5s``, ``500ms``, ``1m`` (a bare number
is an error, as in the relay); ``-c/--collect-interval`` and ``DCGM_EXPORTER_INTERVAL`` are
milliseconds, as in dcgm-exporter.
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.devices import ALL as ALL_DEVICES
from exporter.devices import DeviceSelection, DeviceSelectionError, parse_devices
from telemetry_common.logs import LOG_FORMATS, LOG_LEVELS

DEFAULT_LISTEN = "127.0.0.1:9400"
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
BACKENDS = ("nvml", "simulated")
# The node label's name: dcgm-exporter 4.8.2 writes Hostname; its main branch, after 4.8.2, hostname (#655).
HOSTNAME_LABELS = ("Hostname", "hostname")
GPU_ID_TYPES = ("uid", "device-name")


class SettingsError(ValueError):
    """A flag or env value is invalid. Carries the setting's name and the bad value."""

    def __init__(self, name: str, value: str, reason: str) -> None:
        super().__init__(f"{name}={value!r}: {reason}")
        self.name = name
        self.value = value
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Settings:
    listen_host: str  # "" = all interfaces
    listen_port: int
    collectors: str | None  # None = built-in default set
    interval_s: float
    backend: str
    simulate_gpus: int
    kubernetes: bool
    pod_resources_socket: str
    hostname: str | None  # None with --no-hostname
    log_level: str
    log_format: str = "text"
    devices: DeviceSelection = ALL_DEVICES
    devices_source: str = "--devices"
    web_config_file: str | None = None
    kubernetes_gpu_id_type: str = "uid"
    nvidia_resource_names: tuple[str, ...] = ()
    kubernetes_virtual_gpus: bool = False
    pod_attribution_max_age_s: float = 300.0
    openmetrics: bool = False
    xid_window_ms: int = 300000
    clock_events_window_ms: int = 300000
    replace_blanks: bool = False
    pod_labels: bool = False
    pod_uid: bool = False
    hpc_job_mapping_dir: str | None = None
    hostname_label: str = HOSTNAME_LABELS[0]  # --hostname-label: the node label's name
    simulate_workloads: tuple[tuple[int, str], ...] = ()
    warnings: tuple[str, ...] = ()  # dcgm-exporter flags accepted but not applicable, one line each

    @property
    def listen(self) -> tuple[str, int]:
        return (self.listen_host, self.listen_port)


# (dest, flags, GPU_EXPORTER env, dcgm-exporter env or None, default as text, is_bool, help)
_Spec = tuple[str, tuple[str, ...], str | None, str | None, str | None, bool, str]
_SPEC: tuple[_Spec, ...] = (
    ("listen", ("--listen", "-a", "--address"), "GPU_EXPORTER_LISTEN", "DCGM_EXPORTER_LISTEN", DEFAULT_LISTEN,
     False, f"HTTP address (default {DEFAULT_LISTEN}; :9400 = all interfaces)"),
    ("collectors", ("--collectors", "-f"), "GPU_EXPORTER_COLLECTORS", "DCGM_EXPORTER_COLLECTORS", None, False,
     "dcgm-exporter counters CSV (default: /etc/dcgm-exporter/default-counters.csv when it exists, "
     "else the built-in set)"),
    ("interval", ("--interval",), "GPU_EXPORTER_INTERVAL", None, "5s", False,
     "collection period as a duration: 5s, 500ms, 1m"),
    ("interval_ms", ("--collect-interval", "-c"), None, "DCGM_EXPORTER_INTERVAL", None, False,
     "collection period in milliseconds (dcgm-exporter's -c)"),
    ("backend", ("--backend",), "GPU_EXPORTER_BACKEND", None, "nvml", False, "nvml (default) or simulated"),
    ("simulate_gpus", ("--simulate-gpus",), "GPU_EXPORTER_SIMULATE_GPUS", None, "8", False,
     "GPUs for --backend simulated (default 8)"),
    ("simulate_workloads", ("--simulate-workloads",), "GPU_EXPORTER_SIMULATE_WORKLOADS", None, "", False,
     "scripted GPUs for --backend simulated: 0:training,1:nccl_hang (training, idle, checkpoint, eval, "
     "data_starved, nccl_hang, finished_holding, stalled)"),
    ("kubernetes", ("--kubernetes", "-k"), "GPU_EXPORTER_KUBERNETES", "DCGM_EXPORTER_KUBERNETES", "false", True,
     "add pod, namespace, container from the kubelet PodResources API"),
    ("pod_resources_socket", ("--pod-resources-socket", "--pod-resources-kubelet-socket"),
     "GPU_EXPORTER_POD_RESOURCES_SOCKET", "DCGM_POD_RESOURCES_KUBELET_SOCKET", DEFAULT_SOCKET, False,
     f"kubelet PodResources socket (default {DEFAULT_SOCKET})"),
    ("kubernetes_gpu_id_type", ("--kubernetes-gpu-id-type",), "GPU_EXPORTER_KUBERNETES_GPU_ID_TYPE",
     "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "uid", False,
     "how the device plugin names whole GPUs: uid (GPU-<uuid>, default) or device-name (nvidia<N>)"),
    ("nvidia_resource_names", ("--nvidia-resource-names",), "GPU_EXPORTER_NVIDIA_RESOURCE_NAMES",
     "NVIDIA_RESOURCE_NAMES", "", False,
     "extra GPU resource names besides nvidia.com/gpu and nvidia.com/mig-*, comma-separated"),
    ("kubernetes_virtual_gpus", ("--kubernetes-virtual-gpus",), "GPU_EXPORTER_KUBERNETES_VIRTUAL_GPUS",
     "KUBERNETES_VIRTUAL_GPUS", "false", True,
     "one series per pod on a shared (time-sliced, MPS) GPU; without it one holder is chosen"),
    ("pod_attribution_max_age", ("--pod-attribution-max-age",), "GPU_EXPORTER_POD_ATTRIBUTION_MAX_AGE", None,
     "5m", False, "keep the last kubelet answer this long while the kubelet fails (default 5m)"),
    ("devices", ("--devices", "-d"), "GPU_EXPORTER_DEVICES", "DCGM_EXPORTER_DEVICES_STR", "f", False,
     "which GPUs: f (all; MIG GPUs per instance), g[:0,1] GPUs, i[:0,2-4] GPU instances"),
    ("no_hostname", ("--no-hostname", "-n"), "GPU_EXPORTER_NO_HOSTNAME", "DCGM_EXPORTER_NO_HOSTNAME", "false",
     True, "omit the Hostname label"),
    ("hostname_label", ("--hostname-label",), "GPU_EXPORTER_HOSTNAME_LABEL", None, HOSTNAME_LABELS[0], False,
     "the node label's name: Hostname (default, as dcgm-exporter 4.8.2) or hostname (as its main branch)"),
    ("web_config_file", ("--web-config-file",), "GPU_EXPORTER_WEB_CONFIG_FILE", "DCGM_EXPORTER_WEB_CONFIG_FILE",
     "", False, "exporter-toolkit web config (TLS, basic auth)"),
    ("openmetrics", ("--enable-openmetrics",), "GPU_EXPORTER_ENABLE_OPENMETRICS", None, "false", True,
     "serve OpenMetrics to scrapers that ask (default: classic text always, as dcgm-exporter)"),
    ("xid_window", ("--xid-count-window-size", "-x"), "GPU_EXPORTER_XID_COUNT_WINDOW_SIZE",
     "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "300000", False,
     "window in milliseconds of DCGM_EXP_XID_ERRORS_COUNT (default 300000)"),
    ("clock_events_window", ("--clock-events-count-window-size",), "GPU_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE",
     "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE", "300000", False,
     "window in milliseconds of DCGM_EXP_CLOCK_EVENTS_COUNT (default 300000)"),
    ("replace_blanks", ("--replace-blanks-in-model-name", "-rbmn"), "GPU_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
     "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME", "false", True,
     "modelName with '-' for blanks: NVIDIA-H100-80GB-HBM3"),
    ("pod_labels", ("--kubernetes-enable-pod-labels",), "GPU_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",
     "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "false", True,
     "add the holder pod's labels (sanitized names) from the API server (RBAC: get pods)"),
    ("pod_uid", ("--kubernetes-enable-pod-uid",), "GPU_EXPORTER_KUBERNETES_ENABLE_POD_UID",
     "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "false", True,
     "add pod_uid from the API server (RBAC: get pods)"),
    ("hpc_job_mapping_dir", ("--hpc-job-mapping-dir",), "GPU_EXPORTER_HPC_JOB_MAPPING_DIR",
     "DCGM_HPC_JOB_MAPPING_DIR", "", False,
     "directory of files named by GPU id ('0', '2.1' for a MIG instance), one job id a line: hpc_job"),
    ("log_level", ("--log-level",), "GPU_EXPORTER_LOG_LEVEL", None, "info", False,
     "debug, info (default), warning, error"),
    ("debug", ("--debug",), "GPU_EXPORTER_DEBUG", "DCGM_EXPORTER_DEBUG", "false", True,
     "same as --log-level debug"),
    ("log_format", ("--log-format",), "GPU_EXPORTER_LOG_FORMAT", "DCGM_EXPORTER_LOG_FORMAT", "text", False,
     "text (default), json or logfmt"),
)

# dcgm-exporter 4.8.2 flags accepted for compatibility but not applicable here:
# (flags, dcgm env, is_bool, default as text, why).
_NOT_APPLICABLE: tuple[tuple[tuple[str, ...], str, bool, str, str], ...] = (
    (("--configmap-data", "-m"), "DCGM_EXPORTER_CONFIGMAP_DATA", False, "none",
     "counters come from -f/--collectors, not from a ConfigMap read through the API server"),
    (("--remote-hostengine-info", "-r"), "DCGM_REMOTE_HOSTENGINE_INFO", False, "localhost:5555",
     "gpu-exporter reads NVML in process; there is no DCGM hostengine to connect to"),
    (("--use-old-namespace", "-o"), "DCGM_EXPORTER_USE_OLD_NAMESPACE", True, "false",
     "only the current pod/namespace/container label names are written"),
    (("--cpu-devices", "-p"), "DCGM_EXPORTER_CPU_DEVICES_STR", False, "f", "CPUs are not monitored"),
    (("--switch-devices", "-s"), "DCGM_EXPORTER_OTHER_DEVICES_STR", False, "f", "NVSwitches are not monitored"),
    (("--fake-gpus",), "DCGM_EXPORTER_USE_FAKE_GPUS", True, "false", "use --backend simulated"),
    (("--enable-dcgm-log",), "DCGM_EXPORTER_ENABLE_DCGM_LOG", True, "false", "there is no DCGM log"),
    (("--dcgm-log-level",), "DCGM_EXPORTER_DCGM_LOG_LEVEL", False, "NONE", "there is no DCGM log"),
    (("--kubernetes-pod-label-allowlist-regex",), "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX", False, "",
     "no allowlist: --kubernetes-enable-pod-labels adds every label of the pod"),
    (("--kubernetes-enable-dra",), "KUBERNETES_ENABLE_DRA", True, "false", "DRA claims are not attributed"),
    (("--dump-enabled",), "DCGM_EXPORTER_DUMP_ENABLED", True, "false", "debug dumps are not implemented"),
    (("--dump-directory",), "DCGM_EXPORTER_DUMP_DIRECTORY", False, "/tmp/dcgm-exporter-debug",
     "debug dumps are not implemented"),
    (("--dump-retention",), "DCGM_EXPORTER_DUMP_RETENTION", False, "24", "debug dumps are not implemented"),
    (("--dump-compression",), "DCGM_EXPORTER_DUMP_COMPRESSION", True, "true", "debug dumps are not implemented"),
    (("--disable-startup-validate",), "DISABLE_STARTUP_VALIDATE", True, "false",
     "there is no separate start-up validation"),
    (("--enable-gpu-bind-unbind-watch",), "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH", True, "false",
     "GPUs that go away are reported down and retried instead"),
    (("--gpu-bind-unbind-poll-interval",), "DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL", False, "1s",
     "GPUs that go away are reported down and retried instead"),
    (("--enable-pprof",), "DCGM_EXPORTER_ENABLE_PPROF", True, "false", "there is no pprof in Python"),
    (("--web-systemd-socket",), "DCGM_EXPORTER_SYSTEMD_SOCKET", True, "false",
     "systemd socket activation is not supported; use --listen"),
)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(name: str, text: str, minimum_s: float = 0.05) -> float:
    """``5s``, ``500ms``, ``1m``, ``1.5s``. A bare number is an error ("did you mean 5s?")."""
    value = text.strip()
    m = _DURATION.match(value)
    if m is None:
        if re.fullmatch(r"\d+(?:\.\d+)?", value):
            raise SettingsError(name, text, f"a duration needs a unit: did you mean {value}s "
                                            f"(or {value}ms; -c/--collect-interval takes milliseconds)?")
        raise SettingsError(name, text, "expected a duration like 5s, 500ms or 1m")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds < minimum_s:
        raise SettingsError(name, text, f"must be at least {minimum_s * 1000:g}ms")
    return seconds


def parse_milliseconds(name: str, text: str) -> float:
    """dcgm-exporter's ``-c`` / ``DCGM_EXPORTER_INTERVAL``: an integer number of milliseconds."""
    value = text.strip()
    if not value.isdigit():
        raise SettingsError(name, text, "expected an integer number of milliseconds (dcgm-exporter's -c)")
    if int(value) < 50:
        raise SettingsError(name, text, "interval must be at least 50ms")
    return int(value) / 1000.0


def parse_window(name: str, text: str) -> int:
    """dcgm-exporter's ``-x`` / ``--clock-events-count-window-size``: a positive integer of ms."""
    value = text.strip()
    if not value.isdigit() or int(value) < 1:
        raise SettingsError(name, text, "expected a positive integer number of milliseconds")
    return int(value)


def parse_listen(name: str, text: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces, like dcgm-exporter)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingsError(name, text, "expected host:port, [ipv6]:port or :port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def parse_bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on", "t"):
        return True
    if value in ("0", "false", "no", "off", "f", ""):
        return False
    raise SettingsError(name, text, "expected true or false")


def _bool_arg(p: argparse._ActionsContainer, flags: tuple[str, ...], dest: str, help_text: str) -> None:
    # Go's bool flags: "-k", "--kubernetes", "--kubernetes=true", "--kubernetes=false".
    p.add_argument(*flags, dest=dest, nargs="?", const="true", metavar="BOOL", help=help_text)


def _parser() -> argparse.ArgumentParser:
    from exporter import __version__

    p = argparse.ArgumentParser(
        prog="gpu-exporter",
        description="NVML -> Prometheus exposition; a drop-in for dcgm-exporter 4.8.2.",
    )
    p.add_argument("--version", "-v", action="version", version=f"gpu-exporter {__version__}")
    for dest, flags, _env, _dcgm, _default, is_bool, help_text in _SPEC:
        if is_bool:
            _bool_arg(p, flags, dest, help_text)
        elif dest == "nvidia_resource_names":  # a string slice in urfave/cli: repeated or comma-separated
            p.add_argument(*flags, dest=dest, action="append", help=help_text)
        else:
            p.add_argument(*flags, dest=dest, help=help_text)
    compat = p.add_argument_group("dcgm-exporter flags accepted for compatibility (warned, no effect)")
    for i, (flags, _env, is_bool, _default, why) in enumerate(_NOT_APPLICABLE):
        if is_bool:
            _bool_arg(compat, flags, f"_na{i}", why)
        else:
            compat.add_argument(*flags, dest=f"_na{i}", help=why)
    return p


def _not_applicable(ns: dict[str, str | None], env: Mapping[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    for i, (flags, env_name, _is_bool, default, why) in enumerate(_NOT_APPLICABLE):
        value = ns.pop(f"_na{i}")
        if value is not None:
            out.append(f"{flags[0]}={value} is a dcgm-exporter flag with no effect here: {why}")
        elif env.get(env_name, default).strip().lower() != default.lower():
            out.append(f"{env_name}={env[env_name]} is a dcgm-exporter setting with no effect here: {why}")
    return tuple(out)


def load_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Parse flags and env once. Raises ``SettingsError``; argparse exits 2 on unknown flags."""
    ns: dict[str, str | None] = vars(_parser().parse_args(list(argv)))
    if ns.get("nvidia_resource_names") is not None:
        ns["nvidia_resource_names"] = ",".join(ns["nvidia_resource_names"] or [])
    warnings = _not_applicable(ns, env)
    raw: dict[str, str | None] = {}
    source: dict[str, str] = {}
    for dest, flags, env_name, dcgm_env, default, _is_bool, _help in _SPEC:
        value, name = ns.get(dest), flags[0]
        if value is None and env_name is not None and env_name in env:
            value, name = env[env_name], env_name
        if value is None and dcgm_env is not None and dcgm_env in env:
            value, name = env[dcgm_env], dcgm_env
        raw[dest] = value if value is not None else default
        source[dest] = name

    def text(dest: str) -> str:
        return raw[dest] or ""

    def flag_given(dest: str) -> bool:
        return ns.get(dest) is not None

    host, port = parse_listen(source["listen"], text("listen"))
    backend = text("backend").strip().lower()
    if backend not in BACKENDS:
        raise SettingsError(source["backend"], text("backend"), "expected nvml or simulated")
    gpus_text = text("simulate_gpus").strip()
    if not gpus_text.isdigit() or not 1 <= int(gpus_text) <= 1024:
        raise SettingsError(source["simulate_gpus"], gpus_text, "expected an integer 1..1024")
    level = text("log_level").strip().lower()
    if level not in LOG_LEVELS:
        raise SettingsError(source["log_level"], level, "expected one of " + ", ".join(LOG_LEVELS))
    if parse_bool(source["debug"], text("debug")) and not flag_given("log_level"):
        level = "debug"
    log_format = text("log_format").strip().lower()
    if log_format not in LOG_FORMATS:
        raise SettingsError(source["log_format"], log_format, "expected one of " + ", ".join(LOG_FORMATS))
    id_type = text("kubernetes_gpu_id_type").strip()
    if id_type not in GPU_ID_TYPES:
        raise SettingsError(source["kubernetes_gpu_id_type"], id_type, "expected uid or device-name")
    try:
        devices = parse_devices(text("devices"))
    except DeviceSelectionError as exc:
        raise SettingsError(source["devices"], text("devices"), str(exc)) from None
    interval_s = _interval(ns, env, raw, source)
    no_hostname = parse_bool(source["no_hostname"], text("no_hostname"))
    hostname_label = text("hostname_label").strip()
    if hostname_label not in HOSTNAME_LABELS:
        raise SettingsError(source["hostname_label"], text("hostname_label"),
                            "expected Hostname (dcgm-exporter 4.8.2) or hostname (dcgm-exporter after 4.8.2)")
    collectors = raw["collectors"]
    names = tuple(n.strip() for n in text("nvidia_resource_names").split(",") if n.strip())
    return Settings(
        listen_host=host,
        listen_port=port,
        collectors=collectors if collectors else None,
        interval_s=interval_s,
        backend=backend,
        simulate_gpus=int(gpus_text),
        kubernetes=parse_bool(source["kubernetes"], text("kubernetes")),
        pod_resources_socket=text("pod_resources_socket"),
        hostname=None if no_hostname else resolve_hostname(env),
        log_level=level,
        log_format=log_format,
        devices=devices,
        devices_source=source["devices"],
        web_config_file=text("web_config_file") or None,
        kubernetes_gpu_id_type=id_type,
        nvidia_resource_names=names,
        kubernetes_virtual_gpus=parse_bool(source["kubernetes_virtual_gpus"], text("kubernetes_virtual_gpus")),
        pod_attribution_max_age_s=parse_duration(source["pod_attribution_max_age"],
                                                 text("pod_attribution_max_age"), minimum_s=0.0),
        openmetrics=parse_bool(source["openmetrics"], text("openmetrics")),
        xid_window_ms=parse_window(source["xid_window"], text("xid_window")),
        clock_events_window_ms=parse_window(source["clock_events_window"], text("clock_events_window")),
        replace_blanks=parse_bool(source["replace_blanks"], text("replace_blanks")),
        pod_labels=parse_bool(source["pod_labels"], text("pod_labels")),
        pod_uid=parse_bool(source["pod_uid"], text("pod_uid")),
        hpc_job_mapping_dir=text("hpc_job_mapping_dir") or None,
        hostname_label=hostname_label,
        simulate_workloads=_workloads(source["simulate_workloads"], text("simulate_workloads"), int(gpus_text)),
        warnings=warnings,
    )


def _interval(
    ns: Mapping[str, str | None], env: Mapping[str, str], raw: Mapping[str, str | None], source: Mapping[str, str]
) -> float:
    """--interval > -c > GPU_EXPORTER_INTERVAL > DCGM_EXPORTER_INTERVAL > 5s; -c and dcgm's env are ms."""
    if ns.get("interval") is not None:
        return parse_duration("--interval", ns["interval"] or "")
    if ns.get("interval_ms") is not None:
        return parse_milliseconds("-c/--collect-interval", ns["interval_ms"] or "")
    if "GPU_EXPORTER_INTERVAL" in env:
        return parse_duration("GPU_EXPORTER_INTERVAL", env["GPU_EXPORTER_INTERVAL"])
    if "DCGM_EXPORTER_INTERVAL" in env:
        return parse_milliseconds("DCGM_EXPORTER_INTERVAL", env["DCGM_EXPORTER_INTERVAL"])
    return parse_duration(source["interval"], raw["interval"] or "5s")


def _workloads(name: str, text: str, n_gpus: int) -> tuple[tuple[int, str], ...]:
    from exporter.workloads import parse_workloads

    try:
        return tuple(sorted(parse_workloads(text, n_gpus).items()))
    except ValueError as exc:
        raise SettingsError(name, text, str(exc)) from None


def resolve_hostname(env: Mapping[str, str]) -> str:
    """dcgm-exporter's rule: env ``NODE_NAME`` if set, else the host name."""
    return env.get("NODE_NAME") or socket.gethostname()
