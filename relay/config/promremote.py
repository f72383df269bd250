"""A Prometheus ``remote_write`` entry, in Prometheus's own syntax, read as a relay destination.

The keys and their meaning are Prometheus's (config/config.go ``RemoteWriteConfig``, ``QueueConfig``,
``MetadataConfig``; prometheus/sigv4 ``SigV4Config``). Each maps onto :class:`DestinationConfig`:

- ``url``, ``headers``, ``write_relabel_configs``: the same;
- ``name``: the same; a missing one becomes ``rw-`` and the first 6 hex digits of the URL's
  SHA-256 (Prometheus hashes the whole entry; this one stays put while the entry is edited, and so
  does the queue on disk that is named after it);
- ``remote_timeout``: ``queue.timeout``;
- ``sigv4``: ``sigv4`` (``region`` defaults to the AMP URL's region; ``service_name`` is ``service``);
- ``queue_config``: ``max_shards``, ``min_shards``, ``max_samples_per_send``, ``batch_send_deadline``,
  ``min_backoff``, ``max_backoff``; ``sample_age_limit`` is ``max_sample_age``;
- ``metadata_config.send``: ``send_metadata``;
- ``basic_auth``, ``authorization``, ``bearer_token``: the ``Authorization`` header (at most one,
  and not with ``sigv4``, as Prometheus requires).

A key of Prometheus's that the relay cannot honour is accepted with a warning naming it (see
:data:`NOT_HONOURED`); a key Prometheus does not know is an error. Keys left out take the relay's
defaults, not Prometheus's (``max_shards`` 8, ``max_samples_per_send`` 1000).
"""

from __future__ import annotations

import base64
import hashlib
import types

from yaml.nodes import Node, ScalarNode

from relay.config import parts
from relay.config.model import DestinationConfig, QueueConfig
from relay.config.yamlnodes import Reader

HONOURED = ("url", "name", "remote_timeout", "headers", "write_relabel_configs", "sigv4", "queue_config",
            "metadata_config", "basic_auth", "authorization", "bearer_token")  # fmt: skip
BASIC_AUTH_KEYS = ("username", "password", "username_file", "password_file", "username_ref", "password_ref")
AUTHORIZATION_KEYS = ("type", "credentials", "credentials_file", "credentials_ref")
_INDIRECT = ("username_file", "password_file", "credentials_file", "username_ref", "password_ref", "credentials_ref")
_NOT_SUPPORTED = "not supported by the relay"
_AUTH = "the relay signs with sigv4 or sends headers only: requests go out without this authentication"
_FORWARDS = "the relay forwards what Prometheus sends it: set this on the Prometheus entry that points at the relay"
# Prometheus keys accepted with a warning, and why; the value is honoured when it equals the second item.
NOT_HONOURED: dict[str, tuple[str, object]] = {
    "send_exemplars": (_FORWARDS, True),
    "send_native_histograms": (_FORWARDS, True),
    "round_robin_dns": (_NOT_SUPPORTED, False),
    "protobuf_message": ("the relay sends remote write 1.0 (prometheus.WriteRequest)", "prometheus.WriteRequest"),
    "oauth2": (_AUTH, None),
    "bearer_token_file": (_AUTH, None),
    "azuread": (_AUTH, None),
    "google_iam": (_AUTH, None),
    "tls_config": ("the relay uses the system's CA bundle and no client certificate", None),
    "proxy_url": (_NOT_SUPPORTED, None),
    "no_proxy": (_NOT_SUPPORTED, None),
    "proxy_from_environment": (_NOT_SUPPORTED, None),
    "proxy_connect_header": (_NOT_SUPPORTED, None),
    "follow_redirects": ("the relay does not follow redirects", False),
    "enable_http2": ("the relay speaks HTTP/1.1", False),
    "http_headers": ("use headers", None),
    "failed_request_logging": ("the relay logs a failing destination at WARNING, at most once a minute", False),
}
QUEUE_HONOURED = {  # Prometheus name -> the relay's
    "max_shards": "max_shards",
    "min_shards": "min_shards",
    "max_samples_per_send": "max_samples_per_send",
    "batch_send_deadline": "batch_send_deadline",
    "min_backoff": "min_backoff",
    "max_backoff": "max_backoff",
    "sample_age_limit": "max_sample_age",
}
QUEUE_NOT_HONOURED: dict[str, tuple[str, object]] = {
    "capacity": ("the relay's queue is on disk, bounded by max_disk (1GiB; to change it, move the entry to "
                 "destinations: and set queue.max_disk, see docs/relay-config.md)", None),
    "retry_on_http_429": ("the relay always retries 429 (Too Many Requests), honouring Retry-After", True),
}
METADATA_NOT_HONOURED: dict[str, tuple[str, object]] = {
    "send_interval": ("the relay forwards metadata when Prometheus sends it", None),
    "max_samples_per_send": ("the relay sends metadata with the samples' batches", None),
}
SIGV4_KEYS = ("region", "access_key", "secret_key", "profile", "role_arn", "external_id", "use_fips_sts_endpoint",
              "service_name")  # fmt: skip
SIGV4_NOT_HONOURED: dict[str, tuple[str, object]] = {
    "use_fips_sts_endpoint": ("the relay uses the regional STS endpoint", False),
}


def default_name(url: str) -> str:
    """The name of an entry without one: ``rw-`` and 6 hex digits of the URL's SHA-256."""
    return "rw-" + hashlib.sha256(url.encode("utf-8")).hexdigest()[:6]


def parse_remote_write(r: Reader, node: Node, path: str, probe: parts.Probe | None) -> DestinationConfig:
    if r.is_absent(node):
        r.error(node, path, "empty or null remote write config section")
        return DestinationConfig("", "")
    m = r.mapping(node, path, HONOURED + tuple(NOT_HONOURED))
    if m is None:
        return DestinationConfig("", "")
    _warn_not_honoured(r, m, path, NOT_HONOURED)
    url = r.required_string(m, node, path, "url")
    if url is not None:
        parts.check_url(r, m["url"], f"{path}.url", url)
    name = r.optional_string(m.get("name"), f"{path}.name")
    if name is not None and not parts.DEST_NAME_RE.fullmatch(name):
        r.error(m["name"], f"{path}.name", f'invalid name "{name}": use letters, digits, "_" and "-" only')
    if not name:
        name = default_name(url or "")
    sigv4_node = m.get("sigv4")
    if (sm := r.mapping(sigv4_node, f"{path}.sigv4", SIGV4_KEYS)) is not None:
        _warn_not_honoured(r, sm, f"{path}.sigv4", SIGV4_NOT_HONOURED)
    region = parts.amp_region(url or "")
    sigv4 = parts.sigv4(r, sigv4_node, f"{path}.sigv4", SIGV4_KEYS, region_default=region, service_key="service_name")
    parts.check_sigv4(r, url or "", sigv4, sigv4_node, f"{path}.sigv4", probe)
    if url is not None:
        parts.check_signed(r, m["url"], f"{path}.url", url, sigv4, "sigv4: {}")
    headers = parts.headers(r, m.get("headers"), f"{path}.headers", sigv4=sigv4 is not None)
    if (auth := _authorization(r, m, path, sigv4 is not None)) is not None:
        headers = types.MappingProxyType({**headers, "Authorization": auth})
    relabel = parts.relabel(r, m.get("write_relabel_configs"), f"{path}.write_relabel_configs")
    queue = _queue(r, m, path)
    send_metadata = True
    qpath = f"{path}.metadata_config"
    if (md := r.mapping(m.get("metadata_config"), qpath, ("send", *METADATA_NOT_HONOURED))) is not None:
        _warn_not_honoured(r, md, qpath, METADATA_NOT_HONOURED)
        send_metadata = r.boolean(md.get("send"), f"{qpath}.send", True)
    return DestinationConfig(name, url or "", sigv4, headers, relabel, queue=queue, send_metadata=send_metadata)


def _authorization(r: Reader, m: dict[str, Node], path: str, sigv4: bool) -> str | None:
    """basic_auth, authorization or bearer_token as the Authorization header (at most one, not with sigv4)."""
    given = [k for k in ("basic_auth", "authorization", "bearer_token") if not r.is_absent(m.get(k))]
    if not given:
        return None
    if len(given) > 1 or sigv4:
        both = ", ".join(given + (["sigv4"] if sigv4 else []))
        r.error(m[given[-1]], f"{path}.{given[-1]}", f"at most one of basic_auth, authorization, bearer_token and "
                f"sigv4 may be set (got {both})")  # fmt: skip
        return None
    key, node = given[0], m[given[0]]
    if key == "bearer_token":
        token = r.optional_string(node, f"{path}.bearer_token")
        return f"Bearer {token}" if token else None
    keys = BASIC_AUTH_KEYS if key == "basic_auth" else AUTHORIZATION_KEYS
    am = r.mapping(node, f"{path}.{key}", keys) or {}
    for file_key in _INDIRECT:
        if file_key in am:
            r.warn(am[file_key], f"{path}.{key}.{file_key}", "not honoured: write the value itself (with ${VAR})")
    if key == "basic_auth":
        user = r.string(am.get("username"), f"{path}.basic_auth.username", "")
        password = r.string(am.get("password"), f"{path}.basic_auth.password", "")
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    kind = r.string(am.get("type"), f"{path}.authorization.type", "Bearer")
    if kind.lower() == "basic":
        r.error(am.get("type", node), f"{path}.authorization.type", 'use basic_auth for "Basic"')
    credentials = r.string(am.get("credentials"), f"{path}.authorization.credentials", "")
    return f"{kind} {credentials}" if credentials else None


def _queue(r: Reader, m: dict[str, Node], path: str) -> QueueConfig:
    qpath = f"{path}.queue_config"
    keys = tuple(QUEUE_HONOURED) + tuple(QUEUE_NOT_HONOURED)
    qm = r.mapping(m.get("queue_config"), qpath, keys) or {}
    _warn_not_honoured(r, qm, qpath, QUEUE_NOT_HONOURED)
    nodes = {relay: qm[prom] for prom, relay in QUEUE_HONOURED.items() if prom in qm}
    paths = {k: f"{qpath}.{k}" for k in parts.QUEUE_KEYS}
    paths.update({relay: f"{qpath}.{prom}" for prom, relay in QUEUE_HONOURED.items()})
    if "remote_timeout" in m:
        nodes["timeout"] = m["remote_timeout"]
        paths["timeout"] = f"{path}.remote_timeout"
    age = nodes.get("max_sample_age")
    if isinstance(age, ScalarNode) and age.value in ("0", "0s"):  # Prometheus: 0 means no limit
        r.warn(age, paths["max_sample_age"], "0 (no limit) is not supported: the relay keeps its default of 1h")
        del nodes["max_sample_age"]
    return parts.queue(r, nodes, paths)


def _warn_not_honoured(r: Reader, m: dict[str, Node], path: str, table: dict[str, tuple[str, object]]) -> None:
    for key, (why, honoured_value) in table.items():
        if key not in m or r.is_absent(m[key]):
            continue
        if honoured_value is not None and _scalar_value(r, m[key]) == honoured_value:
            continue
        r.warn(m[key], f"{path}.{key}", f"not honoured: {why}")


def _scalar_value(r: Reader, node: Node) -> object:
    if not isinstance(node, ScalarNode):
        return None
    value: object = r.to_python(node)
    return value
