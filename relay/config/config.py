"""The relay's YAML config, parsed once into frozen dataclasses (:mod:`relay.config_model`).

Every problem is reported, not just the first, each naming the file, the 1-based line of the
offending key or value and the field path: ``relay.yaml:12: destinations[0].queue.max_backoff:
invalid duration "5q"``. The YAML is composed into nodes (which carry their line), the values of
``${VAR}`` / ``${VAR:-default}`` are put into its scalars (:mod:`relay.envexpand`: a value is one
YAML value, whatever it holds; never under ``relabel_configs``, ``write_relabel_configs``,
``metric_relabel_configs`` or ``aggregate``, whose ``$`` is Prometheus's), and the nodes are
walked by a schema-aware reader (:class:`relay.yamlnodes.Reader`); relabel rules go to
:mod:`relay.relabel`, aggregate selectors to :mod:`relay.selector`, and the entries of a
Prometheus-style ``remote_write:`` list to :mod:`relay.promremote`; all become :class:`DestinationConfig`.

``probe`` (check-config only) adds warnings about the machine the check runs on: a sigv4 profile
that does not exist there, a ``storage.path`` that cannot be created or written.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from relay.common import labels as lb
from relay.config import parts
from relay.config.envexpand import RULE_KEYS as RULE_KEYS
from relay.config.envexpand import fill_nodes, template
from relay.config.model import AGGREGATE_OUTPUTS as AGGREGATE_OUTPUTS
from relay.config.model import (
    AggregateConfig,
    Config,
    ConfigError,
    DestinationConfig,
    LimitsConfig,
    QueueConfig,
    ScrapeConfig,
    ServerConfig,
    SigV4Config,
)
from relay.config.model import MiB as MiB
from relay.config.parts import Probe, check_sigv4
from relay.config.promremote import parse_remote_write
from relay.config.scrape import SCRAPE_KEYS as SCRAPE_KEYS
from relay.config.scrape import parse_scrape
from relay.config.yamlnodes import ConfigIssue as ConfigIssue
from relay.config.yamlnodes import Reader, check_unique, node_at
from relay.rules.relabel import RelabelConfig
from relay.rules.selector import SelectorError, parse_selector

__all__ = [
    "AggregateConfig", "Config", "ConfigError", "ConfigIssue", "DestinationConfig", "LimitsConfig",
    "Probe", "QueueConfig", "ScrapeConfig", "ServerConfig", "SigV4Config", "load_config", "parse_config",
]  # fmt: skip

ROOT_KEYS = ("server", "external_labels", "global", "storage", "scrape", "remote_write", "destinations")
SERVER_KEYS = ("listen", "max_request_bytes", "telemetry_listen", "max_concurrent_requests", "read_timeout",
               "idle_timeout", "enable_lifecycle", "decision_cache")  # fmt: skip
DESTINATION_KEYS = ("name", "url", "sigv4", "headers", "write_relabel_configs", "prune_labels", "aggregate",
                    "limits", "queue", "dry_run", "send_metadata")  # fmt: skip
SIGV4_KEYS = ("region", "role_arn", "external_id", "profile", "service", "access_key", "secret_key")
LIMITS_KEYS = ("max_series", "max_series_per_metric", "window")
AGGREGATE_KEYS = ("match", "without", "by", "interval", "outputs")
EXTERNAL_RESERVED_OK = ("__replica__",)  # AMP's HA dedup label, beside "cluster"


def load_config(path: str | Path, env: Mapping[str, str] | None = None, probe: Probe | None = None) -> Config:
    """Read and parse one config file; raises :class:`ConfigError`, also when it cannot be read."""
    filename = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError([ConfigIssue(filename, 0, "", f"cannot read the config: {reason}")]) from e
    return parse_config(text, filename, env, probe)


def parse_config(
    text: str, filename: str = "relay.yaml", env: Mapping[str, str] | None = None, probe: Probe | None = None
) -> Config:
    """Parse config text; raises :class:`ConfigError` listing every problem, sorted by line.

    ``env`` (default: ``os.environ``) supplies ``${VAR}``; an unset one is an error on its line."""
    tmpl = template(text, os.environ if env is None else env)
    try:
        root = yaml.compose(tmpl.text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError([ConfigIssue(filename, line, "", f"invalid YAML: {e.problem or e.context}")]) from e
    except yaml.YAMLError as e:
        raise ConfigError([ConfigIssue(filename, 1, "", f"invalid YAML: {e}")]) from e
    if root is not None and (unset := fill_nodes(tmpl, root)):
        raise ConfigError([ConfigIssue(filename, u.line, "", u.message) for u in sorted(unset, key=lambda u: u.line)])
    if root is None:
        raise ConfigError(
            [ConfigIssue(filename, 1, "", "empty config: at least one destination is required")]
        )
    r = Reader(filename)
    config = _parse_root(r, root, probe)
    if r.issues:
        raise ConfigError(sorted(r.issues, key=lambda i: i.line))
    warnings = tuple(str(w) for w in sorted(r.warnings, key=lambda i: i.line))
    return Config(config.server, config.external_labels, config.global_relabel, config.storage_path,
                  config.scrape, config.destinations, config.source, warnings)  # fmt: skip


def _parse_root(r: Reader, root: Node, probe: Probe | None) -> Config:
    m = r.mapping(root, "", ROOT_KEYS)
    if m is None:
        return Config(source=r.filename)
    server = _server(r, m.get("server"))
    external = r.string_entries(m.get("external_labels"), "external_labels")
    for name, value, knode, vnode in external:
        parts.check_label_name(r, knode, f"external_labels.{name}", name, reserved_ok=EXTERNAL_RESERVED_OK)
        if value == "":
            r.error(vnode, f"external_labels.{name}", "empty value (an empty label value means no label)")
    relabel: tuple[RelabelConfig, ...] = ()
    if (g := r.mapping(m.get("global"), "global", ("relabel_configs",))) is not None:
        relabel = parts.relabel(r, g.get("relabel_configs"), "global.relabel_configs")
    storage = Config.storage_path
    if (st := r.mapping(m.get("storage"), "storage", ("path",))) is not None:
        if (text := r.optional_string(st.get("path"), "storage.path")) == "":
            r.error(st["path"], "storage.path", "must not be empty")
        storage = Path(text) if text else storage
    if probe is not None and (problem := probe.storage_problem(storage)):
        at = st["path"] if st is not None and "path" in st else root
        r.warn(at, "storage.path", f"{problem} (on this machine)")
    jobs = [(parse_scrape(r, n, p), n) for n, p in r.sequence(m.get("scrape"), "scrape")]
    check_unique(r, [(s.job_name, n) for s, n in jobs], "scrape", "job_name")
    dests = _all_destinations(r, root, m, probe)
    labels = lb.make((name, value) for name, value, _, _ in external)
    return Config(server, labels, relabel, storage, tuple(s for s, _ in jobs), dests, r.filename)


def _all_destinations(
    r: Reader, root: Node, m: dict[str, Node], probe: Probe | None
) -> tuple[DestinationConfig, ...]:
    """``destinations:`` and ``remote_write:`` in the order the file lists them; names unique across."""
    found: list[tuple[int, DestinationConfig, Node, str]] = []  # (line, destination, name node, path)
    for key in ("destinations", "remote_write"):
        items = r.sequence(m.get(key), key)
        for node, path in items:
            if key == "destinations":
                d = _destination(r, node, path, probe)
            else:
                d = parse_remote_write(r, node, path, probe)
            found.append((node.start_mark.line, d, _name_node(node), path))
    if "destinations" not in m and "remote_write" not in m:
        r.error(root, "destinations", "missing required key (or remote_write)")
    elif not found:  # an empty or null list: the relay would acknowledge writes and send them nowhere
        key = "destinations" if "destinations" in m else "remote_write"
        if all(r.is_absent(m.get(k)) or isinstance(m.get(k), SequenceNode) for k in ("destinations", "remote_write")):
            r.error(m[key], key, "at least one destination is required")
    found.sort(key=lambda f: f[0])
    found = _name_unnamed(found)
    first: dict[str, int] = {}
    for _, d, node, path in found:
        if d.name and d.name in first:
            r.error(node, f"{path}.name", f'duplicate name "{d.name}" (first at line {first[d.name]})')
        first.setdefault(d.name, node.start_mark.line + 1)
    return tuple(d for _, d, _, _ in found)


def _name_unnamed(
    found: list[tuple[int, DestinationConfig, Node, str]],
) -> list[tuple[int, DestinationConfig, Node, str]]:
    """Unnamed remote_write entries to one URL: ``rw-<hash>``, then ``-2``, ``-3``... in file order.

    Prometheus allows several entries to one URL when they differ (it names each by a hash of the
    whole entry); one identical to an earlier entry keeps its name and so stays a duplicate error,
    as Prometheus refuses it. A name some entry sets itself is never taken."""
    explicit = {d.name for _, d, node, _ in found if isinstance(node, ScalarNode) and node.value == d.name}
    seen: list[DestinationConfig] = []
    out: list[tuple[int, DestinationConfig, Node, str]] = []
    for line, d, node, path in found:
        unnamed = path.startswith("remote_write[") and not (isinstance(node, ScalarNode) and node.value == d.name)
        if unnamed and d.name:
            base = d.name
            if not any(dataclasses.replace(s, name=base) == d for s in seen):
                n = 1
                while d.name in explicit or any(s.name == d.name for s in seen):
                    n += 1
                    d = dataclasses.replace(d, name=f"{base}-{n}")
        seen.append(d)
        out.append((line, d, node, path))
    return out


def _name_node(node: Node) -> Node:
    return node_at(node, "name") if isinstance(node, MappingNode) else node


def _server(r: Reader, node: Node | None) -> ServerConfig:
    d = ServerConfig()
    s = r.mapping(node, "server", SERVER_KEYS)
    if s is None:
        return d
    listen = r.string(s.get("listen"), "server.listen", d.listen)
    if "listen" in s and listen:
        parts.check_host_port(r, s["listen"], "server.listen", listen)
    telemetry = r.optional_string(s.get("telemetry_listen"), "server.telemetry_listen")
    tnode = s.get("telemetry_listen")
    tpath = "server.telemetry_listen"
    if telemetry is not None and tnode is not None and parts.check_host_port(r, tnode, tpath, telemetry) and (
        _same_socket(telemetry, listen)
    ):
        r.error(tnode, tpath, "must differ from listen (leave it out to serve telemetry on "
                "the write listener)")  # fmt: skip
    return ServerConfig(
        listen,
        r.size(s.get("max_request_bytes"), "server.max_request_bytes", d.max_request_bytes),
        telemetry,
        r.integer(s.get("max_concurrent_requests"), "server.max_concurrent_requests", d.max_concurrent_requests),
        r.duration(s.get("read_timeout"), "server.read_timeout", d.read_timeout, positive=True),
        r.duration(s.get("idle_timeout"), "server.idle_timeout", d.idle_timeout, positive=True),
        r.boolean(s.get("enable_lifecycle"), "server.enable_lifecycle", d.enable_lifecycle),
        r.size(s.get("decision_cache"), "server.decision_cache", d.decision_cache),
    )


_ANY_HOST = ("", "0.0.0.0", "[::]", "::")


def _same_socket(a: str, b: str) -> bool:
    """Whether two ``host:port`` listeners would bind the same port (a wildcard host takes them all)."""
    (ha, _, pa), (hb, _, pb) = a.rpartition(":"), b.rpartition(":")
    return pa == pb and (ha == hb or ha in _ANY_HOST or hb in _ANY_HOST)


def _destination(r: Reader, node: Node, path: str, probe: Probe | None) -> DestinationConfig:
    m = r.mapping(node, path, DESTINATION_KEYS)
    if m is None:
        return DestinationConfig("", "")
    name = r.required_string(m, node, path, "name")
    if name is not None and not parts.DEST_NAME_RE.fullmatch(name):
        r.error(m["name"], f"{path}.name", f'invalid name "{name}": use letters, digits, "_" and "-" only')
    url = r.required_string(m, node, path, "url")
    if url is not None:
        parts.check_url(r, m["url"], f"{path}.url", url)
    sigv4 = parts.sigv4(r, m.get("sigv4"), f"{path}.sigv4", SIGV4_KEYS)
    check_sigv4(r, url or "", sigv4, m.get("sigv4"), f"{path}.sigv4", probe)
    if url is not None:
        hint = f"sigv4: {{region: {parts.amp_region(url)}}}"
        parts.check_signed(r, m["url"], f"{path}.url", url, sigv4, hint)
    headers = parts.headers(r, m.get("headers"), f"{path}.headers", sigv4=sigv4 is not None)
    write_relabel = parts.relabel(r, m.get("write_relabel_configs"), f"{path}.write_relabel_configs")
    prune = _label_names(r, m.get("prune_labels"), f"{path}.prune_labels", "__name__ cannot be pruned")
    aggregate = tuple(_aggregate(r, n, p) for n, p in r.sequence(m.get("aggregate"), f"{path}.aggregate"))
    limits = LimitsConfig()
    if lm := r.mapping(m.get("limits"), f"{path}.limits", LIMITS_KEYS):
        limits = LimitsConfig(
            r.optional_int(lm.get("max_series"), f"{path}.limits.max_series"),
            r.optional_int(lm.get("max_series_per_metric"), f"{path}.limits.max_series_per_metric"),
            r.duration(lm.get("window"), f"{path}.limits.window", 3600.0, positive=True),
        )
    queue = QueueConfig()
    if (qm := r.mapping(m.get("queue"), f"{path}.queue", parts.QUEUE_KEYS)) is not None:
        queue = parts.queue(r, qm, {k: f"{path}.queue.{k}" for k in parts.QUEUE_KEYS})
    dry_run = r.boolean(m.get("dry_run"), f"{path}.dry_run", False)
    send_metadata = r.boolean(m.get("send_metadata"), f"{path}.send_metadata", True)
    return DestinationConfig(name or "", url or "", sigv4, headers, write_relabel, prune, aggregate, limits,
                             queue, dry_run, send_metadata)  # fmt: skip


def _aggregate(r: Reader, node: Node, path: str) -> AggregateConfig:
    m = r.mapping(node, path, AGGREGATE_KEYS)
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


def _label_names(r: Reader, node: Node | None, path: str, no_metric_name: str | None) -> tuple[str, ...]:
    names = []
    for name, n, p in r.string_items(node, path):
        if no_metric_name is not None and name == lb.METRIC_NAME:
            r.error(n, p, no_metric_name)
        else:
            parts.check_label_name(r, n, p, name, reserved_ok=True)
        names.append(name)
    return tuple(names)
