"""Where the Kubernetes API is and how to authenticate to it: in-cluster or a kubeconfig file.

``resolve(kubeconfig, env)`` picks, in order: the ``--kubeconfig`` path, ``KUBECONFIG`` (a
``:``-separated list, merged as kubectl does: the first file naming a context, cluster or user
wins), the in-cluster service account (``KUBERNETES_SERVICE_HOST``/``_PORT`` and
``/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}``), then ``~/.kube/config``.

A kubeconfig gives the current context's server (``http://`` or ``https://``), its
``certificate-authority`` / ``certificate-authority-data`` or ``insecure-skip-tls-verify``, and the
user's bearer ``token`` or ``tokenFile`` (re-read when the file changes: projected tokens rotate),
or ``client-certificate(-data)`` + ``client-key(-data)``. Exec and auth-provider plugins are not
supported (each named in the error). A relative path is relative to the file that names it.

Errors are ``KubeConfigError`` naming the file and the field; a token never appears in one.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class KubeConfigError(ValueError):
    """The API server cannot be configured: names the file (or ``in-cluster``) and the field."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


class TokenSource:
    """A bearer token, fixed or read from a file; the file is re-read when its mtime or size
    changes (kubelet rotates projected tokens by replacing the file)."""

    def __init__(self, token: str | None = None, path: str | None = None) -> None:
        if (token is None) == (path is None):
            raise ValueError("TokenSource takes a token or a path")
        self._token = token.strip() if token is not None else ""
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._lock = threading.Lock()

    def get(self) -> str:
        """The current token ("" when its file cannot be read: the request then gets a 401)."""
        if self.path is None:
            return self._token
        with self._lock:
            try:
                st = os.stat(self.path)
                stamp = (st.st_mtime, st.st_size)
                if stamp != self._stamp:
                    self._token = Path(self.path).read_text().strip()
                    self._stamp = stamp
            except OSError:
                self._stamp = None
                self._token = ""
            return self._token


@dataclass(frozen=True)
class ClusterConfig:
    """One API server: its base URL, TLS context (None for http) and credentials."""

    server: str  # scheme://host[:port][/prefix], no trailing slash
    token: TokenSource | None
    ssl_context: ssl.SSLContext | None
    tls_server_name: str | None = None
    namespace: str | None = None  # the context's or service account's namespace
    where: str = ""  # the file it came from, or "in-cluster"


def in_cluster(env: Mapping[str, str], root: str = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("in-cluster", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set")
    token_path = os.path.join(root, "token")
    if not os.path.exists(token_path):
        raise KubeConfigError("in-cluster", f"no service account token at {token_path}")
    ctx = ssl.create_default_context(cafile=os.path.join(root, "ca.crt"))
    host = f"[{host}]" if ":" in host else host
    ns_file = Path(root, "namespace")
    namespace = ns_file.read_text().strip() if ns_file.exists() else None
    return ClusterConfig(f"https://{host}:{port}", TokenSource(path=token_path), ctx, None, namespace, "in-cluster")


def _named(docs: list[tuple[str, dict[str, Any]]], section: str, name: str) -> tuple[str, dict[str, Any]]:
    for where, doc in docs:
        for entry in doc.get(section) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                body = entry.get(section[:-1])
                if not isinstance(body, dict):
                    raise KubeConfigError(where, f"{section}[{name}]: missing {section[:-1]} mapping")
                return where, body
    raise KubeConfigError(docs[0][0], f"{section}: no entry named {name!r}")


def _load_docs(paths: list[str]) -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for p in paths:
        try:
            with open(p) as f:
                doc = yaml.safe_load(f)
        except OSError as exc:
            raise KubeConfigError(p, f"cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise KubeConfigError(p, f"not YAML: {exc}") from None
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise KubeConfigError(p, "not a kubeconfig mapping")
        docs.append((p, doc))
    if not docs:
        raise KubeConfigError(":".join(paths), "empty kubeconfig")
    return docs


def _rel(where: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.path.dirname(os.path.abspath(where)), path)


def _data(where: str, field: str, value: Any) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise KubeConfigError(where, f"{field}: not base64") from None


def _client_cert(ctx: ssl.SSLContext, where: str, user: dict[str, Any]) -> None:
    cert_file, key_file = user.get("client-certificate"), user.get("client-key")
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if not (cert_file or cert_data):
        return
    if not (key_file or key_data):
        raise KubeConfigError(where, "users[].user: client-certificate without client-key")
    try:
        if cert_file and key_file:
            ctx.load_cert_chain(_rel(where, cert_file), _rel(where, key_file))
            return
        # ssl loads a chain from files only: write them to a private directory, load, remove.
        with tempfile.TemporaryDirectory(prefix="kubeconfig-") as d:
            cpath, kpath = os.path.join(d, "c.pem"), os.path.join(d, "k.pem")
            for path, fdata, ffile, name in ((cpath, cert_data, cert_file, "client-certificate"),
                                             (kpath, key_data, key_file, "client-key")):
                content = _data(where, name + "-data", fdata) if fdata else Path(_rel(where, str(ffile))).read_bytes()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
            ctx.load_cert_chain(cpath, kpath)
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(where, f"users[].user: client certificate: {exc}") from None


def from_kubeconfig(paths: list[str], context: str | None = None) -> ClusterConfig:
    docs = _load_docs(paths)
    first = docs[0][0]
    name = context or next((str(d["current-context"]) for _, d in docs if d.get("current-context")), "")
    if not name:
        raise KubeConfigError(first, "current-context: not set")
    _, ctx_body = _named(docs, "contexts", name)
    cluster_name, user_name = ctx_body.get("cluster"), ctx_body.get("user")
    if not cluster_name:
        raise KubeConfigError(first, f"contexts[{name}].context.cluster: not set")
    cwhere, cluster = _named(docs, "clusters", str(cluster_name))
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise KubeConfigError(cwhere, f"clusters[{cluster_name}].cluster.server: must be an http:// or https:// URL")
    uwhere, user = _named(docs, "users", str(user_name)) if user_name else (cwhere, {})
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeConfigError(uwhere, f"users[{user_name}].user.{plugin}: credential plugins are not supported; "
                                          "use token, tokenFile or a client certificate")
    token: TokenSource | None = None
    if user.get("token"):
        token = TokenSource(token=str(user["token"]))
    elif user.get("tokenFile"):
        token = TokenSource(path=_rel(uwhere, str(user["tokenFile"])))
    ctx: ssl.SSLContext | None = None
    if server.startswith("https://"):
        ctx = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify") is True:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        try:
            if cluster.get("certificate-authority-data"):
                ctx.load_verify_locations(
                    cadata=_data(cwhere, "certificate-authority-data", cluster["certificate-authority-data"]).decode())
            elif cluster.get("certificate-authority"):
                ctx.load_verify_locations(cafile=_rel(cwhere, str(cluster["certificate-authority"])))
        except (OSError, ssl.SSLError, UnicodeDecodeError) as exc:
            raise KubeConfigError(cwhere, f"clusters[{cluster_name}].cluster.certificate-authority: {exc}") from None
        _client_cert(ctx, uwhere, user)
    tls_name = cluster.get("tls-server-name")
    ns = ctx_body.get("namespace")
    return ClusterConfig(server, token, ctx, str(tls_name) if tls_name else None,
                         str(ns) if ns else None, ":".join(paths))


def resolve(kubeconfig: str | None, env: Mapping[str, str], sa_root: str = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    """flag > KUBECONFIG > in-cluster > ~/.kube/config."""
    if kubeconfig:
        return from_kubeconfig([kubeconfig])
    if env.get("KUBECONFIG"):
        return from_kubeconfig([p for p in env["KUBECONFIG"].split(os.pathsep) if p])
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(env, sa_root)
    home = os.path.join(env.get("HOME", os.path.expanduser("~")), ".kube", "config")
    if os.path.exists(home):
        return from_kubeconfig([home])
    raise KubeConfigError("kubeconfig", "no --kubeconfig, no KUBECONFIG, not in a cluster and no ~/.kube/config")
