"""A small read-only Kubernetes API client on http.client: get, paged list, streamed watch,
discovery, and the one write a reader needs (a TokenReview).

No dependency beyond the standard library: the official client is large and its watch helpers
hide the resourceVersion handling a watcher must own. Every request carries the bearer token as
it is now (``TokenSource`` re-reads a rotated file). Errors are ``KubeError`` with the HTTP status
(``None`` when the server could not be reached) and the API's own reason and message; 410 Gone,
from a list, a watch request or an ERROR event inside a watch, is ``Gone`` so that a watcher knows
to relist. A token is never part of an error or a log line.

Read-only by construction: ``post`` refuses any path but TokenReview (and SubjectAccessReview,
another review that writes nothing); there is no put, patch or delete.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from telemetry_common.kubeconfig import ClusterConfig

MAX_EVENT_BYTES = 32 << 20  # one watch event (one object) larger than this ends the watch
REVIEW_PATHS = ("/apis/authentication.k8s.io/v1/tokenreviews",
                "/apis/authorization.k8s.io/v1/subjectaccessreviews")

Obj = dict[str, Any]


class KubeError(Exception):
    """An API request failed. ``status`` is the HTTP status, None when there was no answer."""

    def __init__(self, status: int | None, reason: str, message: str = "") -> None:
        super().__init__(f"{status or 'unreachable'} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class Gone(KubeError):
    """410: the resourceVersion (or continue token) is older than the server keeps."""


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[Any]  # what ``keep`` made of each item (the item itself without one)
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Obj


def _error(status: int, body: bytes) -> KubeError:
    reason, message = http.client.responses.get(status, "Error"), ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            reason = str(doc.get("reason") or reason)
            message = str(doc.get("message") or "")
    except ValueError:
        message = body[:200].decode("utf-8", "replace").strip()
    return (Gone if status == 410 else KubeError)(status, reason, message)


class WatchStream:
    """The events of one watch request, one JSON object a line. ``close()`` from another thread
    ends the iteration (the reading thread then sees the stream end)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self.closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            while not self.closed:
                try:
                    line = self._resp.readline(MAX_EVENT_BYTES + 1)
                except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
                    if self.closed:  # close() from another thread (AttributeError: http.client's fp is gone)
                        return
                    raise KubeError(None, type(exc).__name__, "watch stream broke") from None
                if not line:
                    return  # the server ended the watch (timeoutSeconds): reconnect from the last version
                if len(line) > MAX_EVENT_BYTES:
                    raise KubeError(None, "EventTooLarge", f"a watch event over {MAX_EVENT_BYTES} bytes")
                if not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                    etype, obj = str(ev["type"]), ev["object"]
                except (ValueError, KeyError, TypeError):
                    raise KubeError(None, "BadWatchEvent", "a watch line that is not an event") from None
                if not isinstance(obj, dict):
                    raise KubeError(None, "BadWatchEvent", "a watch event whose object is not an object")
                if etype == "ERROR":
                    code = obj.get("code")
                    cls = Gone if code == 410 else KubeError
                    raise cls(code if isinstance(code, int) else None, str(obj.get("reason") or "Error"),
                              str(obj.get("message") or ""))
                yield WatchEvent(etype, obj)
        finally:
            self.close()

    def close(self) -> None:
        self.closed = True
        try:
            sock = self._conn.sock
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()


class KubeClient:
    """Requests to one API server. Thread-safe: each thread keeps its own keep-alive connection."""

    def __init__(self, config: ClusterConfig, *, timeout: float = 30.0, user_agent: str = "gpu-telemetry") -> None:
        self.config = config
        self.timeout = timeout
        self.user_agent = user_agent
        url = urllib.parse.urlsplit(config.server)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._local = threading.local()

    # -- connections ------------------------------------------------------------------------------

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            return _HTTPS(self._host, self._port, timeout, self.config.ssl_context,
                          self.config.tls_server_name or self._host)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": self.user_agent}
        token = self.config.token.get() if self.config.token is not None else ""
        if token:
            h["Authorization"] = f"Bearer {token}"
        if extra:
            h.update(extra)
        return h

    def url(self, path: str, params: Mapping[str, str | int | bool] | None = None) -> str:
        query = urllib.parse.urlencode(
            {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (params or {}).items()})
        return f"{self._prefix}{path}" + (f"?{query}" if query else "")

    def _request(self, method: str, path: str, params: Mapping[str, str | int | bool] | None = None,
                 body: bytes | None = None) -> Obj:
        target = self.url(path, params)
        extra = {"Content-Type": "application/json"} if body is not None else None
        for attempt in (0, 1):  # one retry on a pooled connection the server closed meanwhile
            conn = getattr(self._local, "conn", None)
            fresh = conn is None
            if conn is None:
                conn = self._local.conn = self._connect(self.timeout)
            try:
                conn.request(method, target, body=body, headers=self._headers(extra))
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if attempt == 0 and not fresh and isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError,
                                                                   ConnectionResetError)):
                    continue
                raise KubeError(None, type(exc).__name__, str(exc)) from None
            if resp.will_close:
                conn.close()
                self._local.conn = None
            if resp.status >= 300:
                raise _error(resp.status, data)
            try:
                doc = json.loads(data)
            except ValueError:
                raise KubeError(resp.status, "BadResponse", "the answer is not JSON") from None
            if not isinstance(doc, dict):
                raise KubeError(resp.status, "BadResponse", "the answer is not a JSON object")
            return doc
        raise AssertionError("unreachable")

    # -- verbs ------------------------------------------------------------------------------------

    def get(self, path: str, params: Mapping[str, str | int | bool] | None = None) -> Obj:
        return self._request("GET", path, params)

    def post(self, path: str, body: Obj) -> Obj:
        """A review (TokenReview, SubjectAccessReview) only: this client writes nothing else."""
        if path not in REVIEW_PATHS:
            raise ValueError(f"KubeClient is read-only: no POST to {path}")
        return self._request("POST", path, body=json.dumps(body).encode())

    def list(self, path: str, params: Mapping[str, str | int | bool] | None = None, *, page_size: int = 500,
             keep: Callable[[Obj], Any] | None = None) -> ListResult:
        """Every item of a collection, ``page_size`` a request (limit/continue). ``keep`` maps each
        item as it arrives to what is kept (None drops it), so a large list is never all in memory.
        An expired continue token restarts the list once from the start."""
        for attempt in (0, 1):
            items: list[Any] = []
            cont = ""
            try:
                while True:
                    q: dict[str, str | int | bool] = dict(params or {})
                    q["limit"] = page_size
                    if cont:
                        q["continue"] = cont
                    page = self.get(path, q)
                    meta = page.get("metadata") or {}
                    for item in page.get("items") or []:
                        if isinstance(item, dict):
                            kept = keep(item) if keep is not None else item
                            if kept is not None:
                                items.append(kept)
                    cont = str(meta.get("continue") or "")
                    if not cont:
                        return ListResult(items, str(meta.get("resourceVersion") or ""))
            except Gone:
                if not cont or attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def watch(self, path: str, *, resource_version: str, timeout_seconds: int = 300, bookmarks: bool = True,
              params: Mapping[str, str | int | bool] | None = None) -> WatchStream:
        """Open a watch from ``resource_version``; iterate the stream for events. Raises Gone (410)
        or KubeError when the request itself is refused."""
        q: dict[str, str | int | bool] = dict(params or {})
        q.update(watch=True, resourceVersion=resource_version, timeoutSeconds=timeout_seconds,
                 allowWatchBookmarks=bookmarks)
        conn = self._connect(timeout_seconds + 30.0)
        try:
            conn.request("GET", self.url(path, q), headers=self._headers())
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise KubeError(None, type(exc).__name__, str(exc)) from None
        if resp.status != 200:
            try:
                data = resp.read(1 << 20)
            except (OSError, http.client.HTTPException):
                data = b""
            conn.close()
            raise _error(resp.status, data)
        return WatchStream(conn, resp)

    def discover(self, group_version: str) -> set[str] | None:
        """The resource names ``/apis/<group_version>`` serves (``v1``: ``/api/v1``), None when the
        group/version is not served (404)."""
        path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        try:
            doc = self.get(path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return {str(r.get("name")) for r in doc.get("resources") or [] if isinstance(r, dict)}

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class _HTTPS(http.client.HTTPSConnection):
    """HTTPS whose SNI and checked name is ``tls-server-name`` when the kubeconfig sets one."""

    def __init__(self, host: str, port: int, timeout: float, context: ssl.SSLContext | None, name: str) -> None:
        super().__init__(host, port, timeout=timeout, context=context or ssl.create_default_context())
        self._name = name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._name)  # type: ignore[attr-defined]
