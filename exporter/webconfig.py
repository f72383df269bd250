"""``--web-config-file``: TLS and basic auth in Prometheus exporter-toolkit's web-config YAML.

The format is exporter-toolkit's ``docs/web-configuration.md`` (what dcgm-exporter 4.8.2's
``--web-config-file`` / ``DCGM_EXPORTER_WEB_CONFIG_FILE`` reads). Every key is either applied or
refused: a key this exporter does not know, or knows but cannot honour, is an error naming the
file, the line and the key, never silently ignored.

Applied: ``tls_server_config`` ``cert_file``/``key_file`` (or inline ``cert``/``key``),
``client_ca_file`` (or inline ``client_ca``), ``client_auth_type`` (``NoClientCert``,
``VerifyClientCertIfGiven``, ``RequireAndVerifyClientCert``), ``min_version``/``max_version``
(``TLS10``..``TLS13``), ``prefer_server_cipher_suites`` (checked; Go ignores it since 1.17),
``cipher_suites``, ``curve_preferences`` (one curve) and ``client_allowed_sans`` (``exporter.webtls``
says how each maps onto OpenSSL); ``http_server_config`` ``headers`` (the five the toolkit allows)
and ``http2`` (accepted: this server speaks HTTP/1.1, which every HTTP/2 client falls back to);
``basic_auth_users`` (bcrypt hashes, checked with the ``bcrypt`` package); ``rate_limit``
``interval``/``burst`` (``exporter.ratelimit``: 429 over it, before auth, as the toolkit does).
Refused, with the reason: the ``RequestClientCert``/``RequireAnyClientCert``/``RequireClientCert``
policies (they accept unverified certificates), a curve list longer than one (Python's ssl cannot
order curves), Go's insecure cipher suites, settings that would refuse every connection or request
(``burst: 0``, an empty SAN list) and settings that would do nothing (a client CA or SAN list
without a client certificate policy).

The file is checked at start (a bad file stops the exporter); later changes are picked up by
``exporter.webreload`` (the toolkit re-reads it per request).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bcrypt
import yaml

from exporter.ratelimit import RateLimit, parse_go_duration
from exporter.webtls import TlsConfig, TlsSettingError, cipher_reason, curve_reason
from exporter.webtls import build_ssl_context as _build_context

__all__ = ["BasicAuth", "RateLimit", "TlsConfig", "WebConfig", "WebConfigError", "build_ssl_context",
           "load_web_config", "parse_web_config"]

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNVERIFIED_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
_HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
            "Strict-Transport-Security")
_TLS_KEYS = ("cert_file", "key_file", "cert", "key", "client_ca_file", "client_ca", "client_auth_type",
             "min_version", "max_version", "prefer_server_cipher_suites", "cipher_suites", "curve_preferences",
             "client_allowed_sans")
_TLS_LISTS = ("cipher_suites", "curve_preferences", "client_allowed_sans")
# A valid hash of a random password: unknown users cost one bcrypt check too (no user probing by timing).
_DUMMY_HASH = b"$2b$10$ydOjzNigIh7793b4TTtFS.pIAPggbS9uvnOMODksTqNnCa.LPZ1QG"
_CACHE_MAX = 1024


class WebConfigError(ValueError):
    """The web config file is invalid: carries the file, the line (0 = whole file) and the key."""

    def __init__(self, path: str, line: int, key: str, reason: str) -> None:
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")
        self.path = path
        self.line = line
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class WebConfig:
    """What a web config asks of the HTTP server. ``WebConfig()`` is plain HTTP, no auth."""

    tls: TlsConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    path: str = ""
    rate_limit: RateLimit | None = None  # None: no limit

    def ssl_context(self) -> ssl.SSLContext | None:
        return None if self.tls is None else build_ssl_context(self.tls, self.path)


class _Doc:
    """Walks a composed YAML tree, remembering lines, so every error names file, line and key."""

    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, node: Any, key: str, reason: str) -> WebConfigError:
        line = node.start_mark.line + 1 if node is not None else 0
        return WebConfigError(self.path, line, key, reason)

    def mapping(self, node: Any, key: str) -> list[tuple[str, Any, Any]]:
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
            return []
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, key, "expected a mapping")
        out = []
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.error(k, key, "keys must be strings")
            out.append((str(k.value), k, v))
        return out

    def string(self, node: Any, key: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag.endswith(":null"):
            raise self.error(node, key, "expected a string")
        return str(node.value)

    def strings(self, node: Any, key: str) -> list[tuple[Any, str]]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, key, "expected a list of strings")
        return [(item, self.string(item, key)) for item in node.value]

    def integer(self, node: Any, key: str) -> int:
        text = self.string(node, key)
        try:
            return int(text, 10)
        except ValueError:
            raise self.error(node, key, f"expected an integer, got {text!r}") from None

    def boolean(self, node: Any, key: str) -> bool:
        text = self.string(node, key).lower()
        if text not in ("true", "false"):
            raise self.error(node, key, f"expected true or false, got {text!r}")
        return text == "true"


def load_web_config(path: str) -> WebConfig:
    """Parse and check a web config file (including that its files exist and TLS loads)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise WebConfigError(path, 0, "", f"cannot read: {exc.strerror}") from exc
    config = parse_web_config(text, path)
    config.ssl_context()  # certificates and keys load now, not at the first scrape
    return config


def parse_web_config(text: str, path: str = "<web-config>") -> WebConfig:
    doc = _Doc(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise WebConfigError(path, mark.line + 1 if mark else 0, "", f"not valid YAML: {exc}") from exc
    tls: TlsConfig | None = None
    users: dict[str, bytes] = {}
    headers: list[tuple[str, str]] = []
    rate: RateLimit | None = None
    for name, knode, vnode in doc.mapping(root, ""):
        if name == "tls_server_config":
            tls = _tls(doc, vnode)
        elif name == "http_server_config":
            headers = _http(doc, vnode)
        elif name == "basic_auth_users":
            users = _users(doc, vnode)
        elif name == "rate_limit":
            rate = _rate_limit(doc, knode, vnode)
        else:
            raise doc.error(knode, name, "unknown key (expected tls_server_config, http_server_config, "
                                         "basic_auth_users, rate_limit)")
    return WebConfig(tls=tls, users=users, headers=tuple(headers), path=path, rate_limit=rate)


def _rate_limit(doc: _Doc, knode: Any, node: Any) -> RateLimit | None:
    """``interval`` (a Go duration; 0 disables) and ``burst`` (requests allowed at once)."""
    interval_s, burst, burst_node = 0.0, 0, knode
    for name, nknode, vnode in doc.mapping(node, "rate_limit"):
        key = f"rate_limit.{name}"
        if name == "interval":
            try:
                interval_s = parse_go_duration(doc.string(vnode, key))
            except ValueError as exc:
                raise doc.error(vnode, key, f"{exc} (the time between two requests the limit allows)") from None
            if interval_s < 0:
                raise doc.error(vnode, key, "is negative (the time between two requests the limit allows)")
        elif name == "burst":
            burst, burst_node = doc.integer(vnode, key), vnode
        else:
            raise doc.error(nknode, key, "unknown key (expected interval, burst)")
    if interval_s == 0:
        return None  # exporter-toolkit: interval 0 (or absent) turns the limiter off
    if burst < 1:
        raise doc.error(burst_node, "rate_limit.burst", f"is {burst}: the token bucket would refuse every "
                        "request with 429; give the number of requests allowed at once (at least 1)")
    return RateLimit(interval_s, burst)


def _tls(doc: _Doc, node: Any) -> TlsConfig:
    seen: dict[str, tuple[Any, str]] = {}
    lists: dict[str, tuple[Any, list[tuple[Any, str]]]] = {}
    for name, knode, vnode in doc.mapping(node, "tls_server_config"):
        key = f"tls_server_config.{name}"
        if name not in _TLS_KEYS:
            raise doc.error(knode, key, "unknown key (expected one of " + ", ".join(_TLS_KEYS) + ")")
        if name == "prefer_server_cipher_suites":
            doc.boolean(vnode, key)
            continue
        if name in _TLS_LISTS:
            lists[name] = (knode, doc.strings(vnode, key))
            continue
        seen[name] = (knode, doc.string(vnode, key))

    def get(name: str) -> str | None:
        return seen[name][1] if name in seen else None

    for file_key, inline_key in (("cert_file", "cert"), ("key_file", "key"), ("client_ca_file", "client_ca")):
        if file_key in seen and inline_key in seen:
            raise doc.error(seen[inline_key][0], f"tls_server_config.{inline_key}",
                            f"give either {file_key} or {inline_key}, not both")
    if get("cert_file") is None and get("cert") is None:
        raise doc.error(node, "tls_server_config.cert_file", "missing (the server certificate)")
    if get("key_file") is None and get("key") is None:
        raise doc.error(node, "tls_server_config.key_file", "missing (the server key)")
    auth_text = get("client_auth_type") or "NoClientCert"
    if auth_text in _UNVERIFIED_AUTH:
        raise doc.error(seen["client_auth_type"][0], "tls_server_config.client_auth_type",
                        f"{auth_text} accepts unverified client certificates and is not supported; "
                        "use RequireAndVerifyClientCert or VerifyClientCertIfGiven")
    if auth_text not in _CLIENT_AUTH:
        raise doc.error(seen["client_auth_type"][0], "tls_server_config.client_auth_type",
                        f"unknown policy {auth_text!r} (expected " + ", ".join(_CLIENT_AUTH) + ")")
    auth = _CLIENT_AUTH[auth_text]
    has_ca = get("client_ca_file") is not None or get("client_ca") is not None
    if auth != ssl.CERT_NONE and not has_ca:
        raise doc.error(seen["client_auth_type"][0], "tls_server_config.client_ca_file",
                        f"missing: {auth_text} needs the CA that signs client certificates")
    if auth == ssl.CERT_NONE and has_ca:
        ca_key = "client_ca_file" if "client_ca_file" in seen else "client_ca"
        raise doc.error(seen[ca_key][0], f"tls_server_config.{ca_key}",
                        "a client CA without client_auth_type would not be used; set client_auth_type: "
                        "RequireAndVerifyClientCert")
    versions = []
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        text = get(name) or default
        if text not in _TLS_VERSIONS:
            raise doc.error(seen[name][0], f"tls_server_config.{name}",
                            f"unknown TLS version {text!r} (expected " + ", ".join(_TLS_VERSIONS) + ")")
        versions.append(_TLS_VERSIONS[text])
    if versions[0] > versions[1]:
        raise doc.error(seen.get("min_version", (node, ""))[0], "tls_server_config.min_version",
                        "is above max_version")
    ciphers, curve, sans = _tls_lists(doc, lists, auth)
    base = os.path.dirname(doc.path)

    def file(name: str) -> str | None:  # relative paths are relative to the config file, as in the toolkit
        value = get(name)
        return None if value is None else os.path.join(base, value)

    return TlsConfig(file("cert_file"), file("key_file"), get("cert"), get("key"), file("client_ca_file"),
                     get("client_ca"), auth, versions[0], versions[1], ciphers, curve, sans)


def _tls_lists(doc: _Doc, lists: dict[str, tuple[Any, list[tuple[Any, str]]]], auth: ssl.VerifyMode
               ) -> tuple[tuple[str, ...], str | None, tuple[str, ...] | None]:
    """cipher_suites, curve_preferences and client_allowed_sans, each checked (exporter.webtls)."""
    ciphers: list[str] = []
    for item, name in lists.get("cipher_suites", (None, []))[1]:
        reason = cipher_reason(name)
        if reason is not None:
            raise doc.error(item, "tls_server_config.cipher_suites", reason)
        ciphers.append(name)
    curve = None
    if "curve_preferences" in lists:
        knode, items = lists["curve_preferences"]
        reason = curve_reason([name for _, name in items])
        if reason is not None:
            bad = next((i for i, n in items if curve_reason([n]) is not None), knode)
            raise doc.error(bad, "tls_server_config.curve_preferences", reason)
        curve = items[0][1] if items else None
    sans = None
    if "client_allowed_sans" in lists:
        knode, items = lists["client_allowed_sans"]
        what = "client_allowed_sans lists the client-certificate SANs (DNS, IP, e-mail, URI) allowed to connect"
        if not items:
            raise doc.error(knode, "tls_server_config.client_allowed_sans", f"is empty: no client could "
                            f"connect ({what}); list at least one SAN or remove the key")
        if auth == ssl.CERT_NONE:
            raise doc.error(knode, "tls_server_config.client_allowed_sans", f"would not be used without client "
                            f"certificates ({what}); set client_auth_type: RequireAndVerifyClientCert")
        sans = tuple(name for _, name in items)
    return tuple(ciphers), curve, sans


def _http(doc: _Doc, node: Any) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for name, knode, vnode in doc.mapping(node, "http_server_config"):
        key = f"http_server_config.{name}"
        if name == "http2":
            doc.boolean(vnode, key)
        elif name == "headers":
            for hname, hknode, hvnode in doc.mapping(vnode, key):
                if hname not in _HEADERS:
                    raise doc.error(hknode, f"{key}.{hname}", "header not allowed (expected one of "
                                    + ", ".join(_HEADERS) + ")")
                value = doc.string(hvnode, f"{key}.{hname}")
                if any(c in value for c in "\r\n"):
                    raise doc.error(hvnode, f"{key}.{hname}", "header values cannot hold line breaks")
                if value:
                    headers.append((hname, value))
        else:
            raise doc.error(knode, key, "unknown key (expected http2, headers)")
    return headers


def _users(doc: _Doc, node: Any) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for name, knode, vnode in doc.mapping(node, "basic_auth_users"):
        key = f"basic_auth_users.{name}"
        hashed = doc.string(vnode, key).encode()
        try:
            bcrypt.checkpw(b"", hashed)  # raises ValueError for anything that is not a bcrypt hash
        except ValueError:
            raise doc.error(vnode, key, "not a bcrypt hash (make one with: htpasswd -nBC 10 \"\" | "
                            "tr -d ':\\n')") from None
        if ":" in name:
            raise doc.error(knode, key, "a user name cannot contain ':'")
        users[name] = hashed
    return users


def build_ssl_context(tls: TlsConfig, path: str = "<web-config>") -> ssl.SSLContext:
    """A server-side context; raises ``WebConfigError`` naming the file and key when it cannot be made."""
    try:
        return _build_context(tls)
    except TlsSettingError as exc:
        raise WebConfigError(path, 0, f"tls_server_config.{exc.key}", exc.reason) from exc


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, caching verdicts."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._cache: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        """True when the header names a user with the right password (always True without users)."""
        if not self._users:
            return True
        if header is None or header[:6].lower() != "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))).digest()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else _DUMMY_HASH)
        ok = ok and hashed is not None
        with self._lock:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = ok
        return ok
