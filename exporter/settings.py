"""gpu-exporter settings: flags + environment -> one frozen ``Settings``.

Precedence is one rule: flag > ``GPU_EXPORTER_<FLAG>`` env > dcgm-exporter's env name > default.
dcgm-exporter's short flags and long names (``-f``, ``-a/--address``, ``-c/--collect-interval`` in
ms, ``-k``, ``-n``, ``--pod-resources-kubelet-socket``) are accepted too, so its DaemonSet args work.
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_LISTEN = "127.0.0.1:9400"
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
BACKENDS = ("nvml", "simulated")
LOG_LEVELS = ("debug", "info", "warning", "error")


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

    @property
    def listen(self) -> tuple[str, int]:
        return (self.listen_host, self.listen_port)


# (dest, GPU_EXPORTER env, dcgm-exporter env or None, default as text)
_SPEC: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("listen", "GPU_EXPORTER_LISTEN", "DCGM_EXPORTER_LISTEN", DEFAULT_LISTEN),
    ("collectors", "GPU_EXPORTER_COLLECTORS", "DCGM_EXPORTER_COLLECTORS", None),
    ("interval", "GPU_EXPORTER_INTERVAL", "DCGM_EXPORTER_INTERVAL", "5s"),
    ("backend", "GPU_EXPORTER_BACKEND", None, "nvml"),
    ("simulate_gpus", "GPU_EXPORTER_SIMULATE_GPUS", None, "8"),
    ("kubernetes", "GPU_EXPORTER_KUBERNETES", "DCGM_EXPORTER_KUBERNETES", "false"),
    ("pod_resources_socket", "GPU_EXPORTER_POD_RESOURCES_SOCKET", "DCGM_POD_RESOURCES_KUBELET_SOCKET",
     DEFAULT_SOCKET),
    ("no_hostname", "GPU_EXPORTER_NO_HOSTNAME", "DCGM_EXPORTER_NO_HOSTNAME", "false"),
    ("log_level", "GPU_EXPORTER_LOG_LEVEL", None, "info"),
)

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(name: str, text: str) -> float:
    """``5s``, ``500ms``, ``1m``, ``1.5s``; a bare integer is milliseconds (dcgm-exporter's -c)."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise SettingsError(name, text, "expected a duration like 5s, 500ms, 1m or integer milliseconds")
    number, unit = m.group(1), m.group(2)
    if unit is None and "." in number:
        raise SettingsError(name, text, "a bare number is milliseconds and must be an integer")
    seconds = float(number) * _UNIT_S[unit or "ms"]
    if seconds < 0.05:
        raise SettingsError(name, text, "interval must be at least 50ms")
    return seconds


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
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(name, text, "expected true or false")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-exporter",
        description="NVML -> Prometheus exposition; a drop-in for dcgm-exporter 4.8.2.",
    )
    p.add_argument("--listen", "-a", "--address", dest="listen",
                   help=f"HTTP address (default {DEFAULT_LISTEN}; :9400 = all interfaces)")
    p.add_argument("--collectors", "-f", dest="collectors", help="dcgm-exporter counters CSV")
    p.add_argument("--interval", dest="interval", help="collection period: 5s, 500ms, or integer ms")
    p.add_argument("--collect-interval", "-c", dest="interval_ms", help="dcgm-exporter's -c, milliseconds")
    p.add_argument("--backend", dest="backend", help="nvml (default) or simulated")
    p.add_argument("--simulate-gpus", dest="simulate_gpus", help="GPUs for --backend simulated (default 8)")
    p.add_argument("--kubernetes", "-k", dest="kubernetes", action="store_const", const="true",
                   help="add pod, namespace, container from the kubelet PodResources API")
    p.add_argument("--pod-resources-socket", "--pod-resources-kubelet-socket", dest="pod_resources_socket",
                   help=f"kubelet PodResources socket (default {DEFAULT_SOCKET})")
    p.add_argument("--no-hostname", "-n", dest="no_hostname", action="store_const", const="true",
                   help="omit the Hostname label")
    p.add_argument("--log-level", dest="log_level", help="debug, info (default), warning, error")
    return p


def _interval_text(raw: str, from_dcgm_env: bool) -> str:
    return raw.strip() + "ms" if from_dcgm_env and raw.strip().isdigit() else raw


def load_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Parse flags and env once. Raises ``SettingsError``; argparse exits 2 on unknown flags."""
    ns = vars(_parser().parse_args(list(argv)))
    interval_ms = ns.pop("interval_ms")
    if interval_ms is not None and ns["interval"] is None:
        ns["interval"] = _interval_text(interval_ms, True)
    raw: dict[str, str | None] = {}
    source: dict[str, str] = {}
    for dest, env_name, dcgm_env, default in _SPEC:
        value = ns.get(dest)
        name = "--" + dest.replace("_", "-")
        if value is None and env_name in env:
            value, name = env[env_name], env_name
        if value is None and dcgm_env is not None and dcgm_env in env:
            value, name = env[dcgm_env], dcgm_env
            if dest == "interval":
                value = _interval_text(value, True)
        if value is None:
            value = default
        raw[dest] = value
        source[dest] = name

    def text(dest: str) -> str:
        value = raw[dest]
        assert value is not None
        return value

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
    no_hostname = parse_bool(source["no_hostname"], text("no_hostname"))
    collectors = raw["collectors"]
    return Settings(
        listen_host=host,
        listen_port=port,
        collectors=collectors if collectors else None,
        interval_s=parse_duration(source["interval"], text("interval")),
        backend=backend,
        simulate_gpus=int(gpus_text),
        kubernetes=parse_bool(source["kubernetes"], text("kubernetes")),
        pod_resources_socket=text("pod_resources_socket"),
        hostname=None if no_hostname else resolve_hostname(env),
        log_level=level,
    )


def resolve_hostname(env: Mapping[str, str]) -> str:
    """dcgm-exporter's rule: env ``NODE_NAME`` if set, else the host name."""
    return env.get("NODE_NAME") or socket.gethostname()
