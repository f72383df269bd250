"""A remote-write receiver on 127.0.0.1 that checks SigV4 signatures the way AWS does.

For each POST it recomputes the signature with botocore (``botocore.auth.SigV4Auth`` over an
``AWSRequest`` holding exactly the request's SignedHeaders, at the request's X-Amz-Date, with the
known test credentials) and answers 403 on any mismatch, an unknown access key, a wrong session
token, or a body whose SHA-256 differs from X-Amz-Content-SHA256. Signed requests then get the next
scripted answer, if any (500, 429 + Retry-After, 400, 403 "expired" ...), else the body is decoded
(snappy + RW1 WriteRequest), its series stored, and 204 returned.

    with SigV4Receiver("AKID", "SECRET", region="us-east-1", service="aps") as rx:
        rx.script([500, Scripted(429, {"Retry-After": "1"})])
        ... send to rx.url ...
        rx.series()      # label sets received, in order: [(("__name__", "up"), ...), ...]
        rx.samples()     # [(labels, ((timestamp_ms, value), ...)), ...]
        rx.requests, rx.accepted, rx.rejected
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import snappy

from relay.proto import remote_v1_pb2

EXPIRED_BODY = b"The security token included in the request is expired"
_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),\s*"
    r"Signature=(?P<sig>[0-9a-f]{64})$"
)

Labels = tuple[tuple[str, str], ...]
Series = tuple[Labels, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class Scripted:
    """One scripted answer to a correctly signed request."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class ReceivedRequest:
    path: str
    headers: Mapping[str, str]  # names lower-cased
    body: bytes  # as received (snappy)
    status: int  # what we answered
    access_key: str | None  # from the Authorization header, when parseable
    reason: str  # "ok", "scripted", or why the signature was rejected


def verify_sigv4(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    credentials: Mapping[str, botocore.credentials.Credentials],
    region: str,
    service: str,
) -> tuple[bool, str, str | None]:
    """(valid, reason, access_key): recompute the request's signature with botocore."""
    m = _AUTH_RE.match(headers.get("authorization", ""))
    if m is None:
        return False, "missing or malformed Authorization", None
    access_key, date, scope_region, scope_service, terminator = (m["cred"].split("/") + [""] * 5)[:5]
    creds = credentials.get(access_key)
    if creds is None:
        return False, "unknown access key", access_key
    amz_date = headers.get("x-amz-date", "")
    if not amz_date.startswith(date) or (scope_region, scope_service, terminator) != (
        region, service, "aws4_request"
    ):
        return False, "credential scope does not match", access_key
    signed = m["signed"].split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        return False, "host and x-amz-date must be signed", access_key
    if creds.token and headers.get("x-amz-security-token") != creds.token:
        return False, "security token missing or wrong", access_key
    body_hash = headers.get("x-amz-content-sha256")
    if body_hash is not None and body_hash != hashlib.sha256(body).hexdigest():
        return False, "body does not match x-amz-content-sha256", access_key
    missing = [h for h in signed if h not in headers]
    if missing:
        return False, f"signed headers missing from the request: {missing}", access_key
    req = botocore.awsrequest.AWSRequest(
        method=method, url=url, data=body, headers={h: headers[h] for h in signed}
    )
    req.context["timestamp"] = amz_date
    signer = botocore.auth.SigV4Auth(creds, service, region)
    if signer.signed_headers(signer.headers_to_sign(req)) != m["signed"]:
        return False, "SignedHeaders not reproducible (unsignable header signed?)", access_key
    expected = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
    if not hmac.compare_digest(expected, m["sig"]):
        return False, "signature does not match", access_key
    return True, "ok", access_key


class SigV4Receiver:
    """Threaded HTTP server on 127.0.0.1 (port 0); use as a context manager."""

    def __init__(
        self,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
        service: str = "aps",
        token: str | None = None,
        path: str = "/api/v1/write",
    ) -> None:
        self.region = region
        self.service = service
        self.path = path
        self._lock = threading.Lock()
        self._credentials: dict[str, botocore.credentials.Credentials] = {}
        self._script: list[Scripted] = []
        self._requests: list[ReceivedRequest] = []
        self._series: list[Series] = []
        self.add_credentials(access_key, secret_key, token)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- control ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.path}"

    def add_credentials(self, access_key: str, secret_key: str, token: str | None = None) -> None:
        with self._lock:
            self._credentials[access_key] = botocore.credentials.Credentials(access_key, secret_key, token)

    def remove_credentials(self, access_key: str) -> None:
        with self._lock:
            self._credentials.pop(access_key, None)

    def script(self, answers: Iterable[Scripted | int]) -> None:
        """Queue answers for the next correctly signed requests (then back to decode + 204)."""
        with self._lock:
            self._script.extend(a if isinstance(a, Scripted) else Scripted(a) for a in answers)

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    def series(self) -> list[Labels]:
        """The label set of every series of every accepted request, in arrival order."""
        with self._lock:
            return [labels for labels, _ in self._series]

    def samples(self) -> list[Series]:
        """(labels, ((timestamp_ms, value), ...)) for every series received, in arrival order."""
        with self._lock:
            return list(self._series)

    @property
    def accepted(self) -> int:
        """Requests answered 2xx."""
        with self._lock:
            return sum(1 for r in self._requests if 200 <= r.status < 300)

    @property
    def rejected(self) -> int:
        """Requests refused because their signature (or credentials) did not verify."""
        with self._lock:
            return sum(1 for r in self._requests if r.reason not in ("ok", "scripted") and r.status == 403)

    def start(self) -> SigV4Receiver:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="sigv4-receiver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> SigV4Receiver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- handling --------------------------------------------------------------------------------
    def handle(self, path: str, headers: Mapping[str, str], body: bytes) -> Scripted:
        host = headers.get("host", "")
        with self._lock:
            creds = dict(self._credentials)
        ok, reason, access_key = verify_sigv4(
            "POST", f"http://{host}{path}", headers, body, creds, self.region, self.service
        )
        if not ok:
            answer = Scripted(403, {}, f"Forbidden: {reason}".encode())
        else:
            with self._lock:
                scripted = self._script.pop(0) if self._script else None
            if scripted is not None:
                answer, reason = scripted, "scripted"
            else:
                answer = self._accept(body)
                reason = "ok" if answer.status < 300 else answer.body.decode()
        with self._lock:
            self._requests.append(
                ReceivedRequest(path, dict(headers), body, answer.status, access_key, reason)
            )
        return answer

    def _accept(self, body: bytes) -> Scripted:
        try:
            wr = remote_v1_pb2.WriteRequest()
            wr.ParseFromString(snappy.uncompress(body))
        except Exception as e:
            return Scripted(400, {}, f"bad request: {e}".encode())
        got: list[Series] = []
        for ts in wr.timeseries:
            labels = tuple((lb.name, lb.value) for lb in ts.labels)
            got.append((labels, tuple((s.timestamp, s.value) for s in ts.samples)))
        with self._lock:
            self._series.extend(got)
        return Scripted(204)


def _handler_for(rx: SigV4Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            answer = rx.handle(self.path, headers, body)
            self.send_response(answer.status)
            for k, v in answer.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
