"""The web config in force, re-read when its file or the files it names change.

exporter-toolkit re-reads the web config on every request, so rotated certificates (cert-manager,
a renewed Secret) apply without a restart. Here the file and its certificate, key and client CA
are checked at most every ``check_s`` seconds, on a new connection or request; a changed set is
re-parsed and, when valid, replaces the old one at once. An invalid change is logged once at
WARNING and the last good config stays in force. Turning TLS on or off needs a restart (the
scheme probes and scrapers use would change under them): such a change is refused the same way.
A changed ``rate_limit`` applies at once with a full bucket (the toolkit keeps the limiter it
started with until a restart); an unchanged one keeps its bucket across reloads.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.ratelimit import TokenBucket
from exporter.webconfig import BasicAuth, WebConfig, WebConfigError, load_web_config

log = logging.getLogger(__name__)

Signature = tuple[tuple[str, int, int] | tuple[str], ...]


@dataclass(frozen=True)
class Active:
    """What a connection uses: the TLS context (None = plain HTTP), basic auth, extra headers, the
    rate limiter (None = none) and the client SANs allowed (None = any)."""

    ssl_context: ssl.SSLContext | None
    auth: BasicAuth
    headers: tuple[tuple[str, str], ...]
    limiter: TokenBucket | None = None
    allowed_sans: tuple[str, ...] | None = None


def _activate(web: WebConfig, previous: Active | None = None) -> Active:
    limiter = None
    if web.rate_limit is not None:
        old = previous.limiter if previous is not None else None
        limiter = old if old is not None and old.limit == web.rate_limit else TokenBucket(web.rate_limit)
    sans = web.tls.client_allowed_sans if web.tls is not None else None
    return Active(web.ssl_context(), BasicAuth(web.users), web.headers, limiter, sans)


def _files(web: WebConfig) -> list[str]:
    files = [web.path] if web.path else []
    if web.tls is not None:
        files += [f for f in (web.tls.cert_file, web.tls.key_file, web.tls.client_ca_file) if f is not None]
    return files


def signature(files: list[str]) -> Signature:
    """(path, mtime_ns, size) per file; (path,) for one that is missing."""
    out: list[tuple[str, int, int] | tuple[str]] = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            out.append((f,))
            continue
        out.append((f, st.st_mtime_ns, st.st_size))
    return tuple(out)


class LiveWebConfig:
    """Holds the active web config; ``current()`` returns it, re-reading changed files first."""

    def __init__(
        self,
        web: WebConfig,
        *,
        check_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        loader: Callable[[str], WebConfig] = load_web_config,
    ) -> None:
        self._web = web
        self._active = _activate(web)
        self._files = _files(web)
        self._signature = signature(self._files)
        self._check_s = check_s
        self._clock = clock
        self._loader = loader
        self._next_check = clock() + check_s
        self._lock = threading.Lock()
        self._refused: str | None = None
        self.reloads = 0

    @property
    def tls(self) -> bool:
        return self._active.ssl_context is not None

    def current(self) -> Active:
        if not self._web.path:
            return self._active
        now = self._clock()
        with self._lock:
            if now < self._next_check:
                return self._active
            self._next_check = now + self._check_s
            sig = signature(self._files)
            if sig != self._signature:
                self._reload(sig)
            return self._active

    def _reload(self, sig: Signature) -> None:
        path = self._web.path
        try:
            web = self._loader(path)
            if (web.tls is None) != (self._web.tls is None):
                raise WebConfigError(path, 0, "tls_server_config", "turning TLS on or off needs a restart")
            active = _activate(web, self._active)
        except WebConfigError as exc:
            # Keep the new signature so one bad edit is logged once, and retried when it changes again.
            self._signature = sig
            if str(exc) != self._refused:
                log.warning("web config change refused, the previous one stays in force: %s", exc,
                            extra={"reason": exc.reason})
                self._refused = str(exc)
            return
        self._web, self._active, self._refused = web, active, None
        self._files = _files(web)
        self._signature = signature(self._files)
        self.reloads += 1
        log.info("web config reloaded from %s", path)
