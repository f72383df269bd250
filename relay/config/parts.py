"""Config readers shared by the relay's own ``destinations:`` and Prometheus's ``remote_write:``.

Each takes the :class:`relay.yamlnodes.Reader` and the node, records problems on the reader with
the node's line, and returns a value (a default when the input is bad) so that parsing goes on and
every problem of a file is reported at once.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from yaml.nodes import MappingNode, Node, ScalarNode

from relay.config.model import QueueConfig, SigV4Config
from relay.config.yamlnodes import Reader, node_at
from relay.rules.relabel import RelabelConfig, RelabelConfigError, parse_relabel_configs

LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
DEST_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_RESERVED_HEADERS = (
    "content-encoding", "content-length", "content-type", "host", "user-agent",
    "x-prometheus-remote-write-version",
)  # fmt: skip
_SIGV4_HEADERS = ("authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256")
_AMP_HOST_RE = re.compile(r"aps-workspaces(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")
_REGION_RE = re.compile(r"[a-z0-9-]+")
QUEUE_KEYS = ("max_samples_per_send", "batch_send_deadline", "max_shards", "min_shards", "min_backoff",
              "max_backoff", "max_sample_age", "max_disk", "timeout", "on_auth_error")  # fmt: skip
NULL_RULE = "empty or null relabeling rule"  # Prometheus's words


class Probe(Protocol):
    """What check-config can check about the machine it runs on; each returns a problem or None."""

    def profile_problem(self, profile: str) -> str | None: ...

    def storage_problem(self, path: Path) -> str | None: ...


def amp_region(url: str) -> str | None:
    """The region of an Amazon Managed Prometheus URL (``aps-workspaces.<region>.amazonaws.com``)."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None
    m = _AMP_HOST_RE.fullmatch(host)
    return m.group(1) if m else None


def check_url(r: Reader, node: Node, path: str, url: str) -> bool:
    """An http(s) URL with a host and a valid port; a trailing "/" is refused for AMP, else a warning."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError as e:
        r.error(node, path, f"invalid URL: {e}")
        return False
    if parts.scheme not in ("http", "https"):
        r.error(node, path, f'URL scheme must be http or https, got "{parts.scheme}"')
        return False
    if not parts.hostname:
        r.error(node, path, "URL has no host")
        return False
    if url.endswith("/"):
        if amp_region(url) is not None:
            r.error(node, path, 'must not end in "/" (AMP answers 403 "Missing Authentication Token")')
        else:
            r.warn(node, path, 'ends in "/": most receivers answer 404 for it')
    return True


def check_signed(r: Reader, node: Node, path: str, url: str, sigv4: SigV4Config | None, hint: str) -> None:
    """An AMP URL without sigv4 is a warning: every request would be answered 403."""
    if sigv4 is None and amp_region(url) is not None:
        r.warn(node, path, f"an AMP URL without sigv4: AMP answers 403 to unsigned requests (add {hint})")


def check_region(r: Reader, url: str, sigv4: SigV4Config | None, node: Node | None, path: str) -> None:
    """An AMP URL's region must be the one requests are signed for (else AMP answers 403)."""
    region = amp_region(url)
    if region is None or sigv4 is None or node is None or not sigv4.region:
        return
    if sigv4.region != region:
        r.error(node, path, f'"{sigv4.region}" does not match the region of the AMP URL ("{region}")')


def check_label_name(r: Reader, node: Node, path: str, name: str, *, reserved_ok: tuple[str, ...] | bool) -> None:
    """A legacy label name; ``__`` names only when ``reserved_ok`` is True or lists the name."""
    allowed = reserved_ok if isinstance(reserved_ok, tuple) else ()
    if not LABEL_NAME_RE.fullmatch(name):
        r.error(node, path, f'invalid label name "{name}"')
    elif reserved_ok is not True and name.startswith("__") and name not in allowed:
        r.error(node, path, f'label names starting with "__" are reserved: "{name}"')


def check_host_port(r: Reader, node: Node, path: str, text: str) -> bool:
    host, sep, port = text.rpartition(":")
    ok = bool(sep) and port.isdigit() and int(port) <= 65535 and not any(c in host for c in "/ @")
    if ok and host.startswith("[") != host.endswith("]"):
        ok = False
    if not ok:
        r.error(node, path, f'expected "host:port", got "{text}"')
    return ok


def headers(r: Reader, node: Node | None, path: str, *, sigv4: bool) -> Mapping[str, str]:
    """Extra HTTP headers, read-only; the ones the relay sets itself are refused."""
    out: dict[str, str] = {}
    reserved = _RESERVED_HEADERS + (_SIGV4_HEADERS if sigv4 else ())
    for hname, value, knode, vnode in r.string_entries(node, path):
        hpath = f"{path}.{hname}"
        if not _HEADER_NAME_RE.fullmatch(hname):
            r.error(knode, hpath, "invalid header name")
        elif hname.lower() in reserved:
            why = " when sigv4 is set" if hname.lower() in _SIGV4_HEADERS else ""
            r.error(knode, hpath, f"reserved header{why}: the relay sets it")
        if "\r" in value or "\n" in value:
            r.error(vnode, hpath, "header values may not contain line breaks")
        out[hname] = value
    return types.MappingProxyType(out)


def relabel(r: Reader, node: Node | None, path: str) -> tuple[RelabelConfig, ...]:
    """A relabel_config list; a null or empty entry is refused, as Prometheus refuses it."""
    items = r.sequence(node, path)
    bad = False
    for n, p in items:
        if r.is_absent(n):
            r.error(n, p, NULL_RULE)
            bad = True
        elif r.mapping(n, p, None) is None:
            bad = True
    if node is None or not items or bad:
        return ()
    try:
        rules = parse_relabel_configs(r.to_python(node))
    except RelabelConfigError as e:
        r.error(node_at(node, e.field or ""), f"{path}{e.field or ''}", e.message)
        return ()
    for (n, p), rule in zip(items, rules, strict=True):
        warn_env_lookalikes(r, n, p, rule.regex.groupindex)
    return rules


_ENV_LOOKALIKE = re.compile(r"(?<!\$)(?:\$\$)*\$\{([A-Z][A-Z0-9_]*)(:-[^}]*)?\}")


def warn_env_lookalikes(r: Reader, rule: Node, path: str, groups: Mapping[str, int]) -> None:
    """A warning for each field of one relabel rule that holds ``${NAME}`` (upper case, not a group
    of the rule's regex): it reads like an environment variable, which relabel fields never expand."""
    if not isinstance(rule, MappingNode):
        return
    for knode, vnode in rule.value:
        for value in [vnode] if isinstance(vnode, ScalarNode) else getattr(vnode, "value", []):
            if not isinstance(value, ScalarNode) or not isinstance(value.value, str):
                continue
            for m in _ENV_LOOKALIKE.finditer(value.value):
                if m.group(1) in groups and m.group(2) is None:
                    continue
                r.warn(value, f"{path}.{knode.value}",
                       f"{m.group(0)} looks like an environment variable, but relabel rules are never "
                       "expanded (Prometheus's $ is the regexp's: here it is a group the regex does not "
                       "have, so it expands to \"\"); write the value itself, or set it in external_labels")


def sigv4(
    r: Reader,
    node: Node | None,
    path: str,
    keys: tuple[str, ...],
    region_default: str | None = None,
    service_key: str = "service",
) -> SigV4Config | None:
    """A sigv4 block; ``region`` may be left out only when ``region_default`` is known.

    ``service_key``: the key naming the signing service (Prometheus's sigv4 calls it ``service_name``)."""
    m = r.mapping(node, path, keys)
    if m is None or node is None:
        return None
    explicit = "region" in m or region_default is None
    region = r.required_string(m, node, path, "region") if explicit else region_default
    if region is not None and not _REGION_RE.fullmatch(region):
        r.error(m["region"], f"{path}.region", f'invalid region "{region}"')
    role = r.optional_string(m.get("role_arn"), f"{path}.role_arn")
    if role is not None and not (role.startswith("arn:") and ":role/" in role):
        r.error(m["role_arn"], f"{path}.role_arn", 'must be an IAM role ARN ("arn:aws:iam::<account>:role/<name>")')
    external_id = r.optional_string(m.get("external_id"), f"{path}.external_id")
    if external_id is not None and role is None:
        r.error(m["external_id"], f"{path}.external_id", "requires role_arn")
    profile = r.optional_string(m.get("profile"), f"{path}.profile")
    service = r.string(m.get(service_key), f"{path}.{service_key}", "aps") or "aps"
    access_key = r.optional_string(m.get("access_key"), f"{path}.access_key") or None
    secret_key = r.optional_string(m.get("secret_key"), f"{path}.secret_key") or None
    if (access_key is None) != (secret_key is None):
        at = m.get("access_key") or m["secret_key"]
        r.error(at, f"{path}.{'secret_key' if access_key else 'access_key'}",
                "set both access_key and secret_key, or neither")  # fmt: skip
    return SigV4Config(region or "", role, external_id, profile, service, access_key, secret_key)


def queue(r: Reader, m: Mapping[str, Node], paths: Mapping[str, str]) -> QueueConfig:
    """Queue settings from ``m`` keyed by the relay's names (``paths``: each key's field path)."""
    d, n, p = QueueConfig(), m.get, paths.__getitem__
    q = QueueConfig(
        r.integer(n("max_samples_per_send"), p("max_samples_per_send"), d.max_samples_per_send),
        r.duration(n("batch_send_deadline"), p("batch_send_deadline"), d.batch_send_deadline, positive=True),
        r.integer(n("max_shards"), p("max_shards"), d.max_shards),
        r.duration(n("min_backoff"), p("min_backoff"), d.min_backoff, positive=True),
        r.duration(n("max_backoff"), p("max_backoff"), d.max_backoff, positive=True),
        r.duration(n("max_sample_age"), p("max_sample_age"), d.max_sample_age, positive=True),
        r.size(n("max_disk"), p("max_disk"), d.max_disk),
        r.duration(n("timeout"), p("timeout"), d.timeout, positive=True),
        min_shards=r.integer(n("min_shards"), p("min_shards"), d.min_shards),
        on_auth_error=r.string(n("on_auth_error"), p("on_auth_error"), d.on_auth_error),
    )
    if q.on_auth_error not in ("hold", "drop"):
        r.error(n("on_auth_error") or m["on_auth_error"], p("on_auth_error"),
                f'must be "hold" or "drop", not "{q.on_auth_error}"')
    if q.min_shards > q.max_shards:
        if r.is_absent(n("max_shards")):  # only min_shards set, above the default most: it is the most too
            q = dataclasses.replace(q, max_shards=q.min_shards)
        else:
            r.error(n("min_shards") or m["min_shards"], p("min_shards"),
                    f"must not be greater than max_shards ({q.max_shards})")
    if q.min_backoff > q.max_backoff and not (r.is_absent(n("min_backoff")) and r.is_absent(n("max_backoff"))):
        at = n("min_backoff") or m["max_backoff"]
        r.error(at, p("min_backoff"), "must not be greater than max_backoff")
    return q


def check_sigv4(
    r: Reader, url: str, sigv4: SigV4Config | None, node: Node | None, path: str, probe: Probe | None
) -> None:
    """The AMP URL's region agrees with sigv4.region; with a probe, a named profile exists here."""
    if sigv4 is None or node is None:
        return
    m = r.mapping(node, path, None) or {}
    parts_region = m.get("region", node)
    check_region(r, url, sigv4, parts_region, f"{path}.region")
    if probe is not None and sigv4.profile and (problem := probe.profile_problem(sigv4.profile)):
        r.warn(m.get("profile", node), f"{path}.profile", f"{problem} (on this machine)")
