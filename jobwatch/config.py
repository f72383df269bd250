"""gpu-jobwatch's settings: flags and ``GPU_JOBWATCH_<FLAG>`` environment variables, then the
optional ``--config`` YAML file (prices, metrics allowlist, thresholds, retention).

Precedence is one rule: flag > env > file > default. The file is read once; an unknown key or a
bad value is a ``ConfigError`` naming the file, line and field::

    prices: [...]                     # see jobwatch.prices
    default_usd_per_gpu_hour: 3.0
    metrics_allowlist: [loss, eval_loss, learning_rate, grad_norm]
    metrics_limit: 8                  # at most 8 gpu_job_metric series a job
    retention: 15m                    # how long a finished job's series stay
    thresholds:
      stall_after: 20m                # replaces the learned stall threshold of every job without
                                      # a gpu-telemetry.io/stall-after annotation (demos, tests)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from jobwatch import __version__
from jobwatch.prices import ConfigError, PriceTable, _line_of, load_prices
from jobwatch.progress import DEFAULT_ALLOW
from jobwatch.workload import DurationError, parse_duration
from telemetry_common.logs import LOG_FORMATS, LOG_LEVELS

DEFAULT_LISTEN = "127.0.0.1:9403"
DEFAULT_AUDIENCE = "gpu-telemetry"
MAX_METRICS = 8
ENV_PREFIX = "GPU_JOBWATCH_"
FILE_KEYS = ("prices", "default_usd_per_gpu_hour", "metrics_allowlist", "metrics_limit", "retention", "thresholds")


@dataclass(frozen=True)
class FileConfig:
    prices: PriceTable = field(default_factory=PriceTable)
    metrics_allowlist: tuple[str, ...] | None = None
    metrics_limit: int = MAX_METRICS
    retention_s: float = 900.0
    stall_after_s: float | None = None


@dataclass(frozen=True)
class Settings:
    kubeconfig: str | None
    listen: str
    push_listen: str | None
    push_audience: str
    push_tls_cert: str | None
    push_tls_key: str | None
    config: str | None
    discovery_interval_s: float
    metrics_allowlist: tuple[str, ...]
    log_format: str
    log_level: str
    file: FileConfig


class SettingsError(ValueError):
    """A flag or env value is invalid; names the setting."""


# (flag, default, help)
_FLAGS: tuple[tuple[str, str | None, str], ...] = (
    ("--kubeconfig", None, "kubeconfig file (default: KUBECONFIG, else in-cluster, else ~/.kube/config)"),
    ("--listen", DEFAULT_LISTEN, f"address for /metrics and /health (default {DEFAULT_LISTEN}; :9403 = all)"),
    ("--push-listen", None, "address of the Kubeflow-compatible push endpoint (default: off)"),
    ("--push-audience", DEFAULT_AUDIENCE, f"audience push tokens must carry (default {DEFAULT_AUDIENCE})"),
    ("--push-tls-cert", None, "TLS certificate for the push endpoint (with --push-tls-key)"),
    ("--push-tls-key", None, "TLS key for the push endpoint"),
    ("--config", None, "YAML config: prices, metrics_allowlist, metrics_limit, retention, thresholds"),
    ("--discovery-interval", "5m", "how often API discovery is re-checked for TrainJobs (default 5m)"),
    ("--metrics-allowlist", None, "training metrics exported as gpu_job_metric, comma-separated "
                                  f"(default {','.join(DEFAULT_ALLOW)}; at most {MAX_METRICS} a job)"),
    ("--log-format", "text", "text (default), json or logfmt"),
    ("--log-level", "info", "debug, info (default), warning, error"),
)


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-jobwatch", description="Watches Kubernetes GPU pods and training jobs "
                                "and serves whether their GPUs do useful work as Prometheus series. Every flag "
                                f"is also read from {ENV_PREFIX}<FLAG> (e.g. {env_name('--push-listen')}).")
    for flag, _default, text in _FLAGS:
        p.add_argument(flag, default=None, help=text)
    p.add_argument("--version", action="version", version=f"gpu-jobwatch {__version__}")
    return p


def _duration(name: str, text: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def _allowlist(name: str, text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(len(n) > 64 for n in names):
        raise SettingsError(f"{name}: a comma-separated list of metric names (1..64 characters each)")
    return names


def load_file(path: str) -> FileConfig:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(path, "", f"not YAML: {getattr(exc, 'problem', exc)}", mark.line + 1 if mark else 0) \
            from None
    try:
        return parse_file(data, path)
    except ConfigError as exc:
        raise ConfigError(path, exc.field, exc.message, exc.line or _line_of(text, exc.field)) from None


def parse_file(data: Any, where: str) -> FileConfig:
    if data is None:
        return FileConfig()
    if not isinstance(data, Mapping):
        raise ConfigError(where, "", "the config must be a mapping")
    for k in data:
        if k not in FILE_KEYS:
            raise ConfigError(where, str(k), f"unknown key (known: {', '.join(FILE_KEYS)})")
    prices = load_prices(data, where)
    allow = data.get("metrics_allowlist")
    if allow is not None and (not isinstance(allow, list) or not allow or
                              not all(isinstance(n, str) and 1 <= len(n) <= 64 for n in allow)):
        raise ConfigError(where, "metrics_allowlist", "must be a non-empty list of metric names")
    limit = data.get("metrics_limit", MAX_METRICS)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_METRICS:
        raise ConfigError(where, "metrics_limit", f"must be a whole number 0..{MAX_METRICS}")
    retention = _file_duration(data.get("retention", "15m"), where, "retention")
    thresholds = data.get("thresholds") or {}
    if not isinstance(thresholds, Mapping):
        raise ConfigError(where, "thresholds", "must be a mapping")
    for k in thresholds:
        if k != "stall_after":
            raise ConfigError(where, f"thresholds.{k}", "unknown key (known: stall_after)")
    stall = thresholds.get("stall_after")
    return FileConfig(prices, tuple(dict.fromkeys(allow)) if allow else None, limit, retention,
                      None if stall is None else _file_duration(stall, where, "thresholds.stall_after"))


def _file_duration(v: Any, where: str, field: str) -> float:
    if not isinstance(v, str):
        raise ConfigError(where, field, "must be a duration like 15m")
    try:
        return parse_duration(v)
    except DurationError as exc:
        raise ConfigError(where, field, str(exc)) from None


def load_settings(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> Settings:
    """Flags > env > file > default. Raises SettingsError or ConfigError."""
    env = os.environ if env is None else env
    ns = parser().parse_args(argv)
    values: dict[str, str | None] = {}
    for flag, default, _ in _FLAGS:
        dest = flag.lstrip("-").replace("-", "_")
        v = getattr(ns, dest)
        if v is None:
            v = env.get(env_name(flag)) or None
        values[dest] = v if v is not None else default
    if values["log_format"] not in LOG_FORMATS:
        raise SettingsError(f"--log-format: {values['log_format']!r} is not one of {', '.join(LOG_FORMATS)}")
    if str(values["log_level"]).lower() not in LOG_LEVELS:
        raise SettingsError(f"--log-level: {values['log_level']!r} is not one of {', '.join(LOG_LEVELS)}")
    if bool(values["push_tls_cert"]) != bool(values["push_tls_key"]):
        raise SettingsError("--push-tls-cert and --push-tls-key go together")
    from telemetry_common.httpfront import parse_listen
    for name in ("listen", "push_listen"):
        if values[name]:
            try:
                parse_listen(str(values[name]))
            except ValueError as exc:
                raise SettingsError(f"--{name.replace('_', '-')}: {exc}") from None
    file = load_file(str(values["config"])) if values["config"] else FileConfig()
    allow = (_allowlist("--metrics-allowlist", str(values["metrics_allowlist"])) if values["metrics_allowlist"]
             else file.metrics_allowlist or DEFAULT_ALLOW)
    return Settings(
        kubeconfig=values["kubeconfig"], listen=str(values["listen"]), push_listen=values["push_listen"],
        push_audience=str(values["push_audience"]), push_tls_cert=values["push_tls_cert"],
        push_tls_key=values["push_tls_key"], config=values["config"],
        discovery_interval_s=_duration("--discovery-interval", str(values["discovery_interval"])),
        metrics_allowlist=allow, log_format=str(values["log_format"]), log_level=str(values["log_level"]).lower(),
        file=file)
