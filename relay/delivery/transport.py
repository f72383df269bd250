"""The HTTP seam under the sender: a Protocol, a lean keep-alive client (the default) and the
requests-based one it replaced.

The sender only sees ``Response(status, headers, body)``; a network error (or a credential
lookup that failed while signing) is ``status == 0`` with the error text as body (prefixed
``credentials: `` for a botocore error), so the sender can treat it as retryable, and log it under
the right reason, without knowing about requests or botocore. Tests script a fake.

``HttpTransport`` (the relay's default) is ``http.client`` with one persistent connection per
sender thread and host: per request it does what a remote-write POST needs and nothing else
(requests spent more Python time per request than the rest of the send path: it merges the
environment, .netrc, cookies and hooks for every call). What it keeps from the requests client:
TLS verified against the same CA bundle (``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` if set, else
certifi's), the same timeout on connect and on every read, no redirects followed, the
``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``/``NO_PROXY`` environment (read once per URL, not per
request; user:password in the proxy URL becomes Proxy-Authorization), the same signing hook (any
requests ``AuthBase``, e.g. relay.sigv4.SigV4Auth, run on every attempt on a requests
``PreparedRequest``) and the same ``Response`` with the same error classes. Not kept: basic auth
from ``~/.netrc`` (requests added it when no other auth was set; a remote-write endpoint gets its
credentials from the config).
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import select
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import requests
import requests.adapters
import requests.utils

from relay.common.http_head import Response as _HeadResponse

log = logging.getLogger("relay.transport")

NETWORK_ERROR = 0
CREDENTIALS_PREFIX = b"credentials: "  # body of a status-0 answer when signing could not get credentials
_MAX_ERROR_BODY = 4096


@dataclass(frozen=True, slots=True)
class Response:
    status: int  # 0: no HTTP answer (network error); body holds the error text
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""


class Transport(Protocol):
    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response: ...


class RequestsTransport:
    """One ``requests.Session`` per destination with a connection pool sized for its shards.

    ``auth`` is any requests AuthBase, typically ``relay.sigv4.SigV4Auth``; it runs on every
    attempt, so a retried request is signed again with a fresh date and fresh credentials.
    Redirects are not followed: a remote-write endpoint that redirects is misconfigured."""

    def __init__(self, auth: requests.auth.AuthBase | None = None, pool_size: int = 16) -> None:
        self.auth = auth
        self.session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=max(1, pool_size))
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        try:
            r = self.session.post(
                url, data=body, headers=dict(headers), timeout=timeout, auth=self.auth, allow_redirects=False
            )
        except Exception as e:  # connection/timeout, credential resolution inside auth (botocore), ...
            prefix = CREDENTIALS_PREFIX if type(e).__module__.startswith("botocore") else b""
            return Response(NETWORK_ERROR, {}, prefix + _error_text(e))
        body = r.content[:_MAX_ERROR_BODY] if r.status_code >= 300 else b""
        return Response(r.status_code, {k.lower(): v for k, v in r.headers.items()}, body)

    def refresh_credentials(self) -> None:
        """Called by the sender after a 403 'expired token': re-resolve credentials now."""
        refresh = getattr(self.auth, "force_refresh", None)
        if callable(refresh):
            refresh()

    def close(self) -> None:
        self.session.close()


@dataclass(frozen=True, slots=True)
class _Route:
    """Where a URL's requests go: the connection's scheme, host and port (the proxy's when one is
    used), the request target, and the CONNECT tunnel for https through a proxy."""

    scheme: str  # "https": the connection is TLS (to the host, or inside the tunnel to it)
    host: str
    port: int
    target: str  # path?query, or the absolute URL for http through a proxy
    host_header: str
    tunnel: tuple[str, int] | None = None
    proxy_headers: tuple[tuple[str, str], ...] = ()


def _route(url: str) -> _Route:
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    if scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = u.port or (443 if scheme == "https" else 80)
    default = (scheme == "https" and port == 443) or (scheme == "http" and port == 80)
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    host_header = host if default else f"{host}:{port}"
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    proxy = _proxy_for(url)
    if proxy is None:
        return _Route(scheme, u.hostname, port, target, host_header)
    p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"unsupported proxy URL {proxy!r} (http:// or https:// only)")
    headers: tuple[tuple[str, str], ...] = ()
    if p.username is not None:
        cred = f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}"
        headers = (("Proxy-Authorization", "Basic " + base64.b64encode(cred.encode()).decode()),)
    pport = p.port or (443 if p.scheme == "https" else 80)
    if scheme == "http":  # plain http through a proxy: absolute URL to the proxy
        return _Route(p.scheme, p.hostname, pport, f"http://{host_header}{target}", host_header,
                      proxy_headers=headers)
    if p.scheme == "https":
        raise ValueError(f"an https:// proxy ({p.hostname}) for an https URL is not supported; use an http:// "
                         "proxy (the tunnel to the destination is TLS either way)")
    return _Route("https", p.hostname, pport, target, host_header, tunnel=(u.hostname, port),
                  proxy_headers=headers)


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for this URL, by requests' own rules (the scheme's variable,
    else ALL_PROXY; NO_PROXY with hosts, domains and CIDRs bypasses); None: a direct connection."""
    proxy: str | None = requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url))
    return proxy or None


def _ca_bundle() -> str:
    """The CA file requests verified with: REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, else certifi's."""
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        value = os.environ.get(var)
        if value:
            return value
    return str(requests.utils.DEFAULT_CA_BUNDLE_PATH)


class HttpTransport:
    """Keep-alive HTTP/1.1 client: one connection per (thread, route), reused across requests.

    A connection is opened on first use and kept while the server keeps it; one the server closed
    while idle is noticed before the next request (the socket reads EOF) and replaced, so an idle
    timeout at the receiver never costs a retry. Any error closes the connection; the sender's
    retry opens a fresh one. ``auth``: as in RequestsTransport."""

    def __init__(self, auth: requests.auth.AuthBase | None = None, pool_size: int = 16) -> None:
        self.auth = auth
        self.pool_size = pool_size  # kept for RequestsTransport's signature: one connection per thread
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: set[http.client.HTTPConnection] = set()
        self._routes: dict[str, _Route] = {}
        self._tls: ssl.SSLContext | None = None

    def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        conn: http.client.HTTPConnection | None = None
        try:
            route = self._routes.get(url)
            if route is None:
                route = self._routes.setdefault(url, _route(url))
            send = {"Host": route.host_header, "Content-Length": str(len(body)), **headers}
            if self.auth is not None:
                send = self._signed(url, body, send)
            if route.tunnel is None and route.proxy_headers:  # after signing, as requests adds them
                send.update(route.proxy_headers)
            conn = self._connection(route, timeout)
            conn.putrequest("POST", route.target, skip_host=True, skip_accept_encoding=True)
            for name, value in send.items():
                conn.putheader(name, value)
            conn.endheaders(body)
            r = conn.getresponse()
            data = r.read()
            status = r.status
            out = {k.lower(): v for k, v in r.getheaders()}
            if r.will_close:
                self._drop(conn)
        except Exception as e:  # connection/timeout/TLS, credential resolution inside auth (botocore), ...
            if conn is not None:
                self._drop(conn)
            prefix = CREDENTIALS_PREFIX if type(e).__module__.startswith("botocore") else b""
            return Response(NETWORK_ERROR, {}, prefix + _error_text(e))
        return Response(status, out, data[:_MAX_ERROR_BODY] if status >= 300 else b"")

    def _signed(self, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        """Run the requests auth hook (SigV4) on a PreparedRequest of this POST; its headers."""
        assert self.auth is not None
        prep = requests.PreparedRequest()
        prep.prepare(method="POST", url=url, headers=headers, data=body)
        signed = self.auth(prep)
        return dict(signed.headers)

    def _connection(self, route: _Route, timeout: float) -> http.client.HTTPConnection:
        conns: dict[_Route, http.client.HTTPConnection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(route)
        if conn is not None and conn.sock is not None and not _dropped(conn.sock):
            conn.timeout = timeout
            if conn.sock.gettimeout() != timeout:  # a syscall and a GIL hand-off: only when it changes
                conn.sock.settimeout(timeout)
            return conn
        if conn is not None:
            self._drop(conn)
        if route.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context(cafile=_ca_bundle())
            conn = http.client.HTTPSConnection(route.host, route.port, timeout=timeout, context=self._tls)
        else:
            conn = http.client.HTTPConnection(route.host, route.port, timeout=timeout)
        conn.response_class = _HeadResponse  # http.client's, its head read without the email parser
        if route.tunnel is not None:
            conn.set_tunnel(*route.tunnel, headers=dict(route.proxy_headers))
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns[route] = conn
        with self._lock:
            self._all.add(conn)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        conns = getattr(self._local, "conns", None)
        if conns is not None:
            for key in [k for k, c in conns.items() if c is conn]:
                del conns[key]
        with self._lock:
            self._all.discard(conn)

    def refresh_credentials(self) -> None:
        """Called by the sender after a 403 'expired token': re-resolve credentials now."""
        refresh = getattr(self.auth, "force_refresh", None)
        if callable(refresh):
            refresh()

    def close(self) -> None:
        with self._lock:
            conns, self._all = list(self._all), set()
        for c in conns:
            c.close()


def _dropped(sock: socket.socket) -> bool:
    """A kept-alive socket the peer closed (or sent something unasked) reads as ready."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _error_text(e: BaseException) -> bytes:
    return f"{type(e).__name__}: {e}".encode(errors="replace")[:_MAX_ERROR_BODY]
