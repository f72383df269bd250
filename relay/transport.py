"""The HTTP seam under the sender: a Protocol, and the requests-based implementation.

The sender only sees ``Response(status, headers, body)``; a network error (or a credential
lookup that failed while signing) is ``status == 0`` with the error text as body (prefixed
``credentials: `` for a botocore error), so the sender can treat it as retryable, and log it under
the right reason, without knowing about requests or botocore. Tests script a fake.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import requests
import requests.adapters

log = logging.getLogger(__name__)

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


def _error_text(e: BaseException) -> bytes:
    return f"{type(e).__name__}: {e}".encode(errors="replace")[:_MAX_ERROR_BODY]
