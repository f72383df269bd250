"""The opt-in push endpoint: Kubeflow Trainer's status server protocol, so that the unchanged HF
``KubeflowCallback`` (or ``kubeflow.trainer.update_trainjob_status``) reports to gpu-jobwatch on a
cluster without Kubeflow.

``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status`` with
``{"trainerStatus": {...}}``, at most 64 KiB (Content-Length or chunked). Answers as upstream's
``pkg/statusserver`` does, byte for byte where upstream has the case: errors are its
``metav1.Status`` encoding (``{"metadata":{},"status":"Failure","message":..,"reason":..,"code":..}``
and a newline; no kind/apiVersion), 200 is the request re-encoded as Go encodes
``UpdateTrainJobStatusRequest`` (known fields only, ``lastUpdatedTime`` in RFC 3339 seconds, UTC).
Checked in upstream's order:

1. 404 "Not found": any other path, or any method but POST (upstream's catch-all route);
2. 413 "Payload too large": a Content-Length over 64 KiB (a chunked body: when it passes 64 KiB);
3. the token: 401 none, or one the TokenReview (audience ``--push-audience``, which the answer's
   ``status.audiences`` must contain) does not authenticate; 503 when the review cannot be made;
   403 "Forbidden" a token of another namespace (upstream's own check);
4. 422 "Invalid payload": a body that does not decode (not JSON, trailing data, not an object,
   ``trainerStatus`` not an object); no ``trainerStatus`` is a no-op 200 ``{}``;
5. 404 "Train job not found": no workload of that name in the namespace (any kind: a Deployment
   named so is the job too), before the token's membership;
6. 403 "Forbidden": a token not bound to a pod (``authentication.kubernetes.io/pod-name``) that is
   one of the job's pods (stricter than upstream);
7. 422 with the reason: a ``trainerStatus`` that is not a valid ``TrainerStatus``.

401 and 503 are ours (upstream verifies tokens itself and has neither). Nothing received is written
to the API server: the report lives in memory only. TokenReview answers are cached by the token's
SHA-256 (60 s when valid, 10 s when not), so a callback posting every 5 s costs one review a
minute. A refusal is logged once per job and code (WARNING, with the reason upstream's body leaves
out); requests are not logged above DEBUG; a token never is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from jobwatch.health import Health
from jobwatch.progress import MAX_PUSH_BYTES, BodyTooLarge, ProgressError, Report, parse_trainer_status
from jobwatch.state import State
from telemetry_common.httpfront import Reply
from telemetry_common.kubeapi import KubeClient, KubeError

log = logging.getLogger("jobwatch.push")

PATH = re.compile(r"/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([a-z0-9][-a-z0-9]{0,62})"
                  r"/trainjobs/([a-z0-9][-a-z0-9.]{0,252})/status")
POD_NAME = "authentication.kubernetes.io/pod-name"
SA_PREFIX = "system:serviceaccount:"
JSON = "application/json"


@dataclass(frozen=True)
class Identity:
    username: str
    namespace: str | None  # of a service account token
    pod: str | None  # of a pod-bound token


def _go_json(obj: Any) -> bytes:
    """JSON as Go's ``json.NewEncoder(w).Encode`` writes it: compact, UTF-8, ``<>&`` and U+2028/9
    escaped, a trailing newline."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text.encode() + b"\n"


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def status(code: int, reason: str, message: str) -> Reply:
    """Upstream's ``badRequest``: a ``metav1.Status`` as Go encodes it."""
    body = {"metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
    return Reply(code, _go_json(body), JSON)


def echo(trainer_status: Mapping[str, Any] | None, report: Report | None) -> bytes:
    """The 200 body: the request re-encoded as upstream's ``UpdateTrainJobStatusRequest``."""
    if trainer_status is None or report is None:
        return _go_json({})
    out: dict[str, Any] = {}
    for key in ("progressPercentage", "estimatedRemainingSeconds"):
        if trainer_status.get(key) is not None:
            out[key] = trainer_status[key]
    metrics = [{k: m[k] for k in ("name", "value") if m.get(k)} for m in trainer_status.get("metrics") or []]
    if metrics:
        out["metrics"] = metrics
    assert report.reported_at is not None  # lastUpdatedTime is required
    when = datetime.fromtimestamp(math.floor(report.reported_at), UTC)
    out["lastUpdatedTime"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return _go_json({"trainerStatus": out})


class _Reader(Protocol):
    def read(self, n: int, /) -> bytes: ...

    def readline(self, limit: int, /) -> bytes: ...


def read_chunked(rfile: _Reader, limit: int) -> bytes:
    """A chunked request body, at most ``limit`` bytes (BodyTooLarge past it); OSError when it is malformed."""
    data = bytearray()
    while True:
        line = rfile.readline(1026)
        if not line.endswith(b"\n"):
            raise OSError("bad chunk size line")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise OSError("bad chunk size") from None
        if size < 0:
            raise OSError("bad chunk size")
        if size == 0:
            while rfile.readline(1026) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return bytes(data)
        if len(data) + size > limit:
            raise BodyTooLarge(f"body: over {limit} bytes")
        chunk = rfile.read(size)
        if len(chunk) < size or rfile.readline(3) not in (b"\r\n", b"\n"):
            raise OSError("chunk shorter than its size")
        data += chunk


class ReviewUnavailable(Exception):
    """The TokenReview could not be made (API down, 403 on tokenreviews): answer 503, cache nothing."""


class TokenReviewer:
    def __init__(self, client: KubeClient, audience: str, health: Health, *, ttl: float = 60.0,
                 negative_ttl: float = 10.0, max_entries: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.audience = audience
        self.health = health
        self.ttl, self.negative_ttl, self.max_entries = ttl, negative_ttl, max_entries
        self.clock = clock
        self._cache: OrderedDict[bytes, tuple[float, Identity | None]] = OrderedDict()
        self._lock = threading.Lock()
        self._failing = False

    def review(self, token: str) -> Identity | None:
        """The token's identity, None when it does not authenticate (for our audience)."""
        digest = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None and hit[0] > now:
                self._cache.move_to_end(digest)
                self.health.token_review("cached")
                return hit[1]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]}}
        try:
            answer = self.client.post("/apis/authentication.k8s.io/v1/tokenreviews", body)
        except KubeError as exc:
            self.health.token_review("error")
            if not self._failing:
                self._failing = True
                log.warning("TokenReview failed (%s %s): pushes are answered 503 until it works",
                            exc.status or "unreachable", exc.reason)
            raise ReviewUnavailable(str(exc.status)) from None
        if self._failing:
            self._failing = False
            log.info("TokenReview works again")
        ident = _identity(answer.get("status"), self.audience)
        self.health.token_review("authenticated" if ident is not None else "rejected")
        with self._lock:
            self._cache[digest] = (now + (self.ttl if ident is not None else self.negative_ttl), ident)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return ident


def _identity(st: Any, audience: str) -> Identity | None:
    if not isinstance(st, Mapping) or st.get("authenticated") is not True:
        return None
    auds = st.get("audiences")
    if not isinstance(auds, list) or audience not in auds:  # as kube-apiserver's webhook authenticator:
        return None  # no audiences in the answer (an authenticator that ignored ours) is not ours
    user = st.get("user") if isinstance(st.get("user"), Mapping) else {}
    assert isinstance(user, Mapping)
    username = str(user.get("username") or "")
    ns = None
    if username.startswith(SA_PREFIX):
        parts = username[len(SA_PREFIX):].split(":")
        ns = parts[0] if len(parts) == 2 and parts[0] else None
    extra = user.get("extra") if isinstance(user.get("extra"), Mapping) else {}
    assert isinstance(extra, Mapping)
    pods = extra.get(POD_NAME)
    pod = str(pods[0]) if isinstance(pods, list) and len(pods) == 1 and pods[0] else None
    return Identity(username, ns, pod)


BodyReader = Callable[[int | None], bytes]  # the body: Content-Length bytes, or (None) chunked
LOGGED_MAX = 10_000


class PushEndpoint:
    def __init__(self, state: State, reviewer: TokenReviewer, health: Health) -> None:
        self.state = state
        self.reviewer = reviewer
        self.health = health
        self._seen: set[tuple[str, str]] = set()
        self._refused: set[tuple[str, str, int]] = set()

    def handle(self, method: str, path: str, headers: Mapping[str, str], read_body: BodyReader) -> Reply:
        reply = self._handle(method, path, headers, read_body)
        self.health.push_request(reply.status)
        log.debug("push %s -> %d", path.split("?", 1)[0][:200], reply.status)
        return reply

    def _refuse(self, namespace: str, name: str, code: int, reason: str, message: str, why: str) -> Reply:
        key = (namespace, name, code)
        if key not in self._refused:
            if len(self._refused) >= LOGGED_MAX:  # bounded: an old refusal may be logged again
                self._refused.clear()
            self._refused.add(key)
            log.warning("push for %s/%s answered %d: %s (further ones for this job and code are not logged)",
                        namespace, name, code, why, extra={"namespace": namespace, "job_name": name, "code": code})
        return status(code, reason, message)

    def _handle(self, method: str, path: str, headers: Mapping[str, str], read_body: BodyReader) -> Reply:
        m = PATH.fullmatch(path.split("?", 1)[0])
        if m is None or method != "POST":
            return status(404, "NotFound", "Not found")
        namespace, name = m.group(1), m.group(2)
        length: int | None = None
        if "chunked" not in headers.get("Transfer-Encoding", "").lower():
            try:
                length = int(headers.get("Content-Length", "0") or "0")
            except ValueError:
                length = -1
            if length < 0:
                return status(400, "BadRequest", "bad Content-Length")
            if length > MAX_PUSH_BYTES:
                return status(413, "RequestEntityTooLarge", "Payload too large")
        auth = headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return self._refuse(namespace, name, 401, "Unauthorized", "Unauthorized", "no bearer token")
        try:
            ident = self.reviewer.review(token)
        except ReviewUnavailable:
            return status(503, "ServiceUnavailable", "the token cannot be verified now; retry later")
        if ident is None:
            why = f"the TokenReview does not authenticate the token for audience {self.reviewer.audience}"
            return self._refuse(namespace, name, 401, "Unauthorized", "Unauthorized", why)
        if ident.namespace != namespace:
            return self._refuse(namespace, name, 403, "Forbidden", "Forbidden",
                                f"the token is {ident.username}'s, not a service account of namespace {namespace}")
        try:
            body = read_body(length)
        except BodyTooLarge:
            return status(413, "RequestEntityTooLarge", "Payload too large")
        try:  # Go's decoder: NaN and Infinity are not JSON
            doc = json.loads(body, parse_constant=_not_json)
        except (ValueError, RecursionError):
            doc = ValueError
        raw = doc.get("trainerStatus") if isinstance(doc, dict) else None
        decodes = doc is not ValueError and (doc is None or isinstance(doc, dict))
        if not decodes or not (raw is None or isinstance(raw, dict)):
            self.health.progress_error("push", "not_json" if doc is ValueError else "not_object")
            return self._refuse(namespace, name, 422, "Invalid", "Invalid payload", "the body does not decode as "
                                "an UpdateTrainJobStatusRequest")
        if raw is None:  # upstream answers this before it looks the job up
            return Reply(200, echo(None, None), JSON)
        jobs = self.state.jobs_named(namespace, name)
        if not jobs:
            return self._refuse(namespace, name, 404, "NotFound", "Train job not found",
                                "no GPU workload of that name in the namespace")
        if ident.pod is None:
            return self._refuse(namespace, name, 403, "Forbidden", "Forbidden", "the token is not bound to a pod")
        own = self.state.pod_workload(namespace, ident.pod)
        if own is None or own not in jobs:
            return self._refuse(namespace, name, 403, "Forbidden", "Forbidden",
                                f"the token's pod {ident.pod} is not one of the job's GPU pods")
        try:
            report = parse_trainer_status(raw, "push")
        except ProgressError as exc:
            self.health.progress_error("push", str(getattr(exc, "code", "invalid")))
            return self._refuse(namespace, name, 422, "Invalid", f"invalid status update: {exc}", str(exc))
        self.state.push(own, report)
        if (namespace, name) not in self._seen:
            if len(self._seen) >= LOGGED_MAX:  # bounded: a job seen long ago may log its first push again
                self._seen.clear()
            self._seen.add((namespace, name))
            log.info("first progress push for %s %s/%s", own.kind, namespace, name,
                     extra={"namespace": namespace, "job_kind": own.kind, "job_name": name})
        return Reply(200, echo(raw, report), JSON)
