"""The relay's YAML config, parsed once into frozen dataclasses.

Every problem is reported, not just the first, each naming the file, the 1-based line of the
offending key or value and the field path: ``relay.yaml:12: destinations[0].queue.max_backoff:
invalid duration "5q"``. The YAML is composed into nodes (which carry their line) and walked by a
schema-aware reader (:class:`relay.yamlnodes.Reader`); relabel rules go to :mod:`relay.relabel` and
aggregate selectors to :mod:`relay.selector`, whose errors are mapped back to lines the same way.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from yaml.nodes import Node, SequenceNode

from relay import labels as lb
from relay.relabel import RelabelConfig, RelabelConfigError, parse_relabel_configs
from relay.selector import SelectorError, parse_selector
from relay.yamlnodes import ConfigIssue as ConfigIssue
from relay.yamlnodes import Reader, check_unique, node_at

MiB = 1024**2
AGGREGATE_OUTPUTS = ("sum", "avg", "min", "max", "count_series", "last", "total")
_DEST_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_RESERVED_HEADERS = (
    "content-encoding", "content-length", "content-type", "host", "user-agent",
    "x-prometheus-remote-write-version",
)  # fmt: skip
_SIGV4_HEADERS = ("authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256")


class ConfigError(ValueError):
    """Every problem found in one config; ``str()`` is one ``file:line: path: message`` per line."""

    def __init__(self, errors: list[ConfigIssue]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:9201"
    max_request_bytes: int = 32 * MiB  # after decompression


@dataclass(frozen=True)
class ScrapeConfig:
    job_name: str
    scrape_interval: float = 15.0
    scrape_timeout: float = 10.0  # never above scrape_interval
    targets: tuple[str, ...] = ()  # host:port, from every static_configs entry
    metrics_path: str = "/metrics"
    scheme: str = "http"


@dataclass(frozen=True)
class SigV4Config:
    region: str
    role_arn: str | None = None
    external_id: str | None = None
    profile: str | None = None
    service: str = "aps"


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
    min_backoff: float = 0.03
    max_backoff: float = 5.0
    max_sample_age: float = 3600.0
    max_disk: int = 1024 * MiB
    timeout: float = 30.0  # per HTTP request


def _no_headers() -> Mapping[str, str]:
    return types.MappingProxyType({})


@dataclass(frozen=True)
class DestinationConfig:
    name: str
    url: str
    sigv4: SigV4Config | None = None
    headers: Mapping[str, str] = field(default_factory=_no_headers, hash=False)  # read-only
    write_relabel_configs: tuple[RelabelConfig, ...] = ()
    prune_labels: tuple[str, ...] = ()
    aggregate: tuple[AggregateConfig, ...] = ()
    limits: LimitsConfig = LimitsConfig()
    queue: QueueConfig = QueueConfig()
    dry_run: bool = False


@dataclass(frozen=True)
class Config:
    server: ServerConfig = ServerConfig()
    external_labels: lb.Labels = ()
    global_relabel: tuple[RelabelConfig, ...] = ()
    storage_path: Path = Path("/var/lib/gpu-relay")
    scrape: tuple[ScrapeConfig, ...] = ()
    destinations: tuple[DestinationConfig, ...] = ()
    source: str = "relay.yaml"  # the file name the config was read from, as given


def load_config(path: str | Path) -> Config:
    """Read and parse one config file; raises :class:`ConfigError`, also when it cannot be read."""
    filename = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError([ConfigIssue(filename, 0, "", f"cannot read the config: {reason}")]) from e
    return parse_config(text, filename)


def parse_config(text: str, filename: str = "relay.yaml") -> Config:
    """Parse config text; raises :class:`ConfigError` listing every problem, sorted by line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError([ConfigIssue(filename, line, "", f"invalid YAML: {e.problem or e.context}")]) from e
    except yaml.YAMLError as e:
        raise ConfigError([ConfigIssue(filename, 1, "", f"invalid YAML: {e}")]) from e
    if root is None:
        raise ConfigError(
            [ConfigIssue(filename, 1, "", "empty config: at least one destination is required")]
        )
    r = Reader(filename)
    config = _parse_root(r, root)
    if r.issues:
        raise ConfigError(sorted(r.issues, key=lambda i: i.line))
    return config


def _parse_root(r: Reader, root: Node) -> Config:
    keys = ("server", "external_labels", "global", "storage", "scrape", "destinations")
    m = r.mapping(root, "", keys)
    if m is None:
        return Config(source=r.filename)
    server = ServerConfig()
    if (s := r.mapping(m.get("server"), "server", ("listen", "max_request_bytes"))) is not None:
        listen = r.string(s.get("listen"), "server.listen", ServerConfig.listen)
        if "listen" in s and listen:
            _check_host_port(r, s["listen"], "server.listen", listen)
        size = r.size(s.get("max_request_bytes"), "server.max_request_bytes", ServerConfig.max_request_bytes)
        server = ServerConfig(listen, size)
    external = r.string_entries(m.get("external_labels"), "external_labels")
    for name, value, knode, vnode in external:
        _check_label_name(r, knode, f"external_labels.{name}", name, reserved_ok=False)
        if value == "":
            r.error(vnode, f"external_labels.{name}", "empty value (an empty label value means no label)")
    relabel: tuple[RelabelConfig, ...] = ()
    if (g := r.mapping(m.get("global"), "global", ("relabel_configs",))) is not None:
        relabel = _relabel(r, g.get("relabel_configs"), "global.relabel_configs")
    storage = Config.storage_path
    if (st := r.mapping(m.get("storage"), "storage", ("path",))) is not None:
        if (text := r.optional_string(st.get("path"), "storage.path")) == "":
            r.error(st["path"], "storage.path", "must not be empty")
        storage = Path(text) if text else storage
    jobs = [(_scrape(r, n, p), n) for n, p in r.sequence(m.get("scrape"), "scrape")]
    check_unique(r, [(s.job_name, n) for s, n in jobs], "scrape", "job_name")
    dnode = r.require(m, root, "", "destinations")
    dests = [(_destination(r, n, p), n) for n, p in r.sequence(dnode, "destinations")]
    if isinstance(dnode, SequenceNode) and not dests:
        r.error(dnode, "destinations", "at least one destination is required")
    check_unique(r, [(d.name, n) for d, n in dests], "destinations", "name")
    labels = lb.make((name, value) for name, value, _, _ in external)
    return Config(server, labels, relabel, storage, tuple(s for s, _ in jobs), tuple(d for d, _ in dests),
                  r.filename)  # fmt: skip


def _scrape(r: Reader, node: Node, path: str) -> ScrapeConfig:
    keys = ("job_name", "scrape_interval", "scrape_timeout", "metrics_path", "scheme", "static_configs")
    m = r.mapping(node, path, keys)
    if m is None:
        return ScrapeConfig("")
    job = r.required_string(m, node, path, "job_name")
    if job == "":
        r.error(m["job_name"], f"{path}.job_name", "must not be empty")
    interval = r.duration(m.get("scrape_interval"), f"{path}.scrape_interval", 15.0, positive=True)
    timeout = r.duration(
        m.get("scrape_timeout"), f"{path}.scrape_timeout", min(10.0, interval), positive=True
    )
    if "scrape_timeout" in m and timeout > interval:
        r.error(m["scrape_timeout"], f"{path}.scrape_timeout", "must not be greater than scrape_interval")
    metrics_path = r.string(m.get("metrics_path"), f"{path}.metrics_path", "/metrics")
    if not metrics_path.startswith("/"):
        r.error(m["metrics_path"], f"{path}.metrics_path", 'must start with "/"')
    scheme = r.string(m.get("scheme"), f"{path}.scheme", "http")
    if scheme not in ("http", "https"):
        r.error(m["scheme"], f"{path}.scheme", f'must be "http" or "https", got "{scheme}"')
    targets: list[str] = []
    for sc, sp in r.sequence(m.get("static_configs"), f"{path}.static_configs"):
        if (scm := r.mapping(sc, sp, ("targets",))) is not None:
            for target, tn, tp in r.string_items(r.require(scm, sc, sp, "targets"), f"{sp}.targets"):
                if _check_host_port(r, tn, tp, target):
                    targets.append(target)
    return ScrapeConfig(job or "", interval, timeout, tuple(targets), metrics_path, scheme)


def _destination(r: Reader, node: Node, path: str) -> DestinationConfig:
    keys = ("name", "url", "sigv4", "headers", "write_relabel_configs", "prune_labels", "aggregate", "limits",
            "queue", "dry_run")  # fmt: skip
    m = r.mapping(node, path, keys)
    if m is None:
        return DestinationConfig("", "")
    name = r.required_string(m, node, path, "name")
    if name is not None and not _DEST_NAME_RE.fullmatch(name):
        r.error(m["name"], f"{path}.name", f'invalid name "{name}": use letters, digits, "_" and "-" only')
    url = r.required_string(m, node, path, "url")
    if url is not None:
        _check_url(r, m["url"], f"{path}.url", url)
    sigv4 = _sigv4(r, m.get("sigv4"), f"{path}.sigv4")
    headers: dict[str, str] = {}
    reserved = _RESERVED_HEADERS + (_SIGV4_HEADERS if sigv4 is not None else ())
    for hname, value, knode, vnode in r.string_entries(m.get("headers"), f"{path}.headers"):
        hpath = f"{path}.headers.{hname}"
        if not _HEADER_NAME_RE.fullmatch(hname):
            r.error(knode, hpath, "invalid header name")
        elif hname.lower() in reserved:
            why = " when sigv4 is set" if hname.lower() in _SIGV4_HEADERS else ""
            r.error(knode, hpath, f"reserved header{why}: the relay sets it")
        if "\r" in value or "\n" in value:
            r.error(vnode, hpath, "header values may not contain line breaks")
        headers[hname] = value
    write_relabel = _relabel(r, m.get("write_relabel_configs"), f"{path}.write_relabel_configs")
    prune = _label_names(r, m.get("prune_labels"), f"{path}.prune_labels", "__name__ cannot be pruned")
    aggregate = tuple(_aggregate(r, n, p) for n, p in r.sequence(m.get("aggregate"), f"{path}.aggregate"))
    limits = LimitsConfig()
    if lm := r.mapping(m.get("limits"), f"{path}.limits", ("max_series", "max_series_per_metric", "window")):
        limits = LimitsConfig(
            r.optional_int(lm.get("max_series"), f"{path}.limits.max_series"),
            r.optional_int(lm.get("max_series_per_metric"), f"{path}.limits.max_series_per_metric"),
            r.duration(lm.get("window"), f"{path}.limits.window", 3600.0, positive=True),
        )
    queue = _queue(r, m.get("queue"), f"{path}.queue")
    dry_run = r.boolean(m.get("dry_run"), f"{path}.dry_run", False)
    headers_ro = types.MappingProxyType(headers)
    return DestinationConfig(
        name or "", url or "", sigv4, headers_ro, write_relabel, prune, aggregate, limits, queue, dry_run
    )


def _sigv4(r: Reader, node: Node | None, path: str) -> SigV4Config | None:
    m = r.mapping(node, path, ("region", "role_arn", "external_id", "profile", "service"))
    if m is None or node is None:
        return None
    region = r.required_string(m, node, path, "region")
    if region is not None and not re.fullmatch(r"[a-z0-9-]+", region):
        r.error(m["region"], f"{path}.region", f'invalid region "{region}"')
    role = r.optional_string(m.get("role_arn"), f"{path}.role_arn")
    if role is not None and not (role.startswith("arn:") and ":role/" in role):
        r.error(
            m["role_arn"],
            f"{path}.role_arn",
            'must be an IAM role ARN ("arn:aws:iam::<account>:role/<name>")',
        )
    external_id = r.optional_string(m.get("external_id"), f"{path}.external_id")
    if external_id is not None and role is None:
        r.error(m["external_id"], f"{path}.external_id", "requires role_arn")
    profile = r.optional_string(m.get("profile"), f"{path}.profile")
    service = r.string(m.get("service"), f"{path}.service", "aps")
    return SigV4Config(region or "", role, external_id, profile, service)


def _aggregate(r: Reader, node: Node, path: str) -> AggregateConfig:
    m = r.mapping(node, path, ("match", "without", "by", "interval", "outputs"))
    if m is None:
        return AggregateConfig("")
    match = r.required_string(m, node, path, "match")
    if match is not None:
        try:
            parse_selector(match)
        except SelectorError as e:
            r.error(m["match"], f"{path}.match", f"invalid selector: {e.message} (at position {e.position})")
        except ValueError as e:
            r.error(m["match"], f"{path}.match", f"invalid selector: {e}")
    without = _label_names(r, m.get("without"), f"{path}.without", "the metric name is always kept")
    by = _label_names(r, m.get("by"), f"{path}.by", None)
    if r.is_absent(m.get("without")) == r.is_absent(m.get("by")):
        r.error(node, path, "set exactly one of without or by")
    elif isinstance(m.get("by"), SequenceNode) and not by:
        r.error(m["by"], f"{path}.by", "must list at least one label")
    interval = r.duration(r.require(m, node, path, "interval"), f"{path}.interval", 60.0, positive=True)
    outputs: list[str] = []
    for out, on, op in r.string_items(r.require(m, node, path, "outputs"), f"{path}.outputs"):
        if out not in AGGREGATE_OUTPUTS:
            r.error(on, op, f'unknown output "{out}" (valid: {", ".join(AGGREGATE_OUTPUTS)})')
        elif out in outputs:
            r.error(on, op, f'duplicate output "{out}"')
        else:
            outputs.append(out)
    if isinstance(m.get("outputs"), SequenceNode) and not r.sequence(m["outputs"], ""):
        r.error(m["outputs"], f"{path}.outputs", "must list at least one output")
    return AggregateConfig(match or "", without, by, interval, tuple(outputs))


def _queue(r: Reader, node: Node | None, path: str) -> QueueConfig:
    d = QueueConfig()
    keys = ("max_samples_per_send", "batch_send_deadline", "max_shards", "min_backoff", "max_backoff",
            "max_sample_age", "max_disk", "timeout")  # fmt: skip
    m = r.mapping(node, path, keys)
    if m is None:
        return d
    q = QueueConfig(
        r.integer(m.get("max_samples_per_send"), f"{path}.max_samples_per_send", d.max_samples_per_send),
        r.duration(
            m.get("batch_send_deadline"), f"{path}.batch_send_deadline", d.batch_send_deadline, positive=True
        ),
        r.integer(m.get("max_shards"), f"{path}.max_shards", d.max_shards),
        r.duration(m.get("min_backoff"), f"{path}.min_backoff", d.min_backoff),
        r.duration(m.get("max_backoff"), f"{path}.max_backoff", d.max_backoff),
        r.duration(m.get("max_sample_age"), f"{path}.max_sample_age", d.max_sample_age, positive=True),
        r.size(m.get("max_disk"), f"{path}.max_disk", d.max_disk),
        r.duration(m.get("timeout"), f"{path}.timeout", d.timeout, positive=True),
    )
    if q.min_backoff > q.max_backoff:
        at = m.get("min_backoff") or m["max_backoff"]
        r.error(at, f"{path}.min_backoff", "must not be greater than max_backoff")
    return q


def _relabel(r: Reader, node: Node | None, path: str) -> tuple[RelabelConfig, ...]:
    items = r.sequence(node, path)
    if node is None or not items or any(r.mapping(n, p, None) is None for n, p in items):
        return ()
    try:
        return parse_relabel_configs(r.to_python(node))
    except RelabelConfigError as e:
        r.error(node_at(node, e.field or ""), f"{path}{e.field or ''}", e.message)
        return ()


def _label_names(r: Reader, node: Node | None, path: str, no_metric_name: str | None) -> tuple[str, ...]:
    names = []
    for name, n, p in r.string_items(node, path):
        if no_metric_name is not None and name == lb.METRIC_NAME:
            r.error(n, p, no_metric_name)
        else:
            _check_label_name(r, n, p, name, reserved_ok=True)
        names.append(name)
    return tuple(names)


def _check_label_name(r: Reader, node: Node, path: str, name: str, *, reserved_ok: bool) -> None:
    if not _LABEL_NAME_RE.fullmatch(name):
        r.error(node, path, f'invalid label name "{name}"')
    elif not reserved_ok and name.startswith("__"):
        r.error(node, path, f'label names starting with "__" are reserved: "{name}"')


def _check_host_port(r: Reader, node: Node, path: str, text: str) -> bool:
    host, sep, port = text.rpartition(":")
    ok = bool(sep) and port.isdigit() and int(port) <= 65535 and not any(c in host for c in "/ @")
    if not ok:
        r.error(node, path, f'expected "host:port", got "{text}"')
    return ok


def _check_url(r: Reader, node: Node, path: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError as e:
        r.error(node, path, f"invalid URL: {e}")
        return
    if parts.scheme not in ("http", "https"):
        r.error(node, path, f'URL scheme must be http or https, got "{parts.scheme}"')
    elif not parts.hostname:
        r.error(node, path, "URL has no host")
