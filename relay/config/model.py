"""The relay config's data model: frozen dataclasses, one per section, and :class:`ConfigError`.

Parsing lives in :mod:`relay.config` (the relay's own keys) and :mod:`relay.promremote` (a
Prometheus ``remote_write`` entry mapped onto a :class:`DestinationConfig`); both build these.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from relay.common import labels as lb
from relay.config.yamlnodes import ConfigIssue
from relay.rules.relabel import RelabelConfig

MiB = 1024**2
AGGREGATE_OUTPUTS = ("sum", "avg", "min", "max", "count_series", "last", "total")


class ConfigError(ValueError):
    """Every problem found in one config; ``str()`` is one ``file:line: path: message`` per line."""

    def __init__(self, errors: list[ConfigIssue]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:9201"
    max_request_bytes: int = 32 * MiB  # after decompression
    telemetry_listen: str | None = None  # None: telemetry endpoints on the write listener
    max_concurrent_requests: int = 64  # beyond it: 503 with Retry-After
    read_timeout: float = 30.0  # seconds to read a request's headers and body
    idle_timeout: float = 120.0  # seconds an idle keep-alive connection stays open
    enable_lifecycle: bool = False  # POST /-/reload over HTTP (SIGHUP always works)
    decision_cache: int = 64 * MiB  # memory budget of the per-label-set decision cache (its real cost in RSS)


@dataclass(frozen=True)
class ScrapeConfig:
    job_name: str
    scrape_interval: float = 15.0
    scrape_timeout: float = 10.0  # never above scrape_interval
    targets: tuple[str, ...] = ()  # host:port, from every static_configs entry
    metrics_path: str = "/metrics"
    scheme: str = "http"
    honor_labels: bool = False  # True: an exposed job/instance wins over the target's
    honor_timestamps: bool = True  # False: every sample at the scrape's time
    sample_limit: int = 0  # a scrape with more samples fails (up 0, markers); 0: none
    label_limit: int = 0  # the most labels a series may have; 0: none
    label_name_length_limit: int = 0
    label_value_length_limit: int = 0


@dataclass(frozen=True)
class SigV4Config:
    region: str
    role_arn: str | None = None
    external_id: str | None = None
    profile: str | None = None
    service: str = "aps"
    access_key: str | None = None  # static credentials: both or neither
    secret_key: str | None = field(default=None, repr=False)  # never shown


@dataclass(frozen=True)
class AggregateConfig:
    """Exactly one of ``without`` and ``by`` was given; the other is ``()``. ``by`` is never empty."""

    match: str
    without: tuple[str, ...] = ()
    by: tuple[str, ...] = ()
    interval: float = 60.0  # seconds
    outputs: tuple[str, ...] = ("sum",)


@dataclass(frozen=True)
class LimitsConfig:
    max_series: int | None = None
    max_series_per_metric: int | None = None
    window: float = 3600.0  # seconds a series stays active after its last sample


@dataclass(frozen=True)
class QueueConfig:
    max_samples_per_send: int = 1000
    batch_send_deadline: float = 5.0
    max_shards: int = 8
    min_backoff: float = 0.03  # > 0 and <= max_backoff
    max_backoff: float = 5.0  # > 0
    max_sample_age: float = 3600.0
    max_disk: int = 1024 * MiB
    timeout: float = 30.0  # per HTTP request
    # the fewest shards the sender runs; it runs more, up to max_shards, when sending falls behind
    # (relay.shardplan; Prometheus's min_shards, same default)
    min_shards: int = 1
    # a 401/403: "hold" keeps the batch queued and retries (credentials refreshed first), "drop" drops it
    on_auth_error: str = "hold"


def no_headers() -> Mapping[str, str]:
    return types.MappingProxyType({})


@dataclass(frozen=True)
class DestinationConfig:
    name: str
    url: str
    sigv4: SigV4Config | None = None
    headers: Mapping[str, str] = field(default_factory=no_headers, hash=False, repr=False)  # may hold secrets
    write_relabel_configs: tuple[RelabelConfig, ...] = ()
    prune_labels: tuple[str, ...] = ()
    aggregate: tuple[AggregateConfig, ...] = ()
    limits: LimitsConfig = LimitsConfig()
    queue: QueueConfig = QueueConfig()
    dry_run: bool = False
    send_metadata: bool = True  # forward metric metadata (only of families this destination keeps)


@dataclass(frozen=True)
class Config:
    server: ServerConfig = ServerConfig()
    external_labels: lb.Labels = ()
    global_relabel: tuple[RelabelConfig, ...] = ()
    storage_path: Path = Path("/var/lib/gpu-relay")
    scrape: tuple[ScrapeConfig, ...] = ()
    destinations: tuple[DestinationConfig, ...] = ()
    source: str = "relay.yaml"  # the file name the config was read from, as given
    # "file:line: path: message" for each key accepted but not honoured; logged by run, printed by
    # check-config. Not part of the config's identity.
    warnings: tuple[str, ...] = field(default=(), compare=False)
