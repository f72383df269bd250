"""The opt-in push endpoint: Kubeflow Trainer's status server protocol, so that the unchanged HF
``KubeflowCallback`` (or ``kubeflow.trainer.update_trainjob_status``) reports to gpu-jobwatch on a
cluster without Kubeflow.

``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status`` with
``{"trainerStatus": {...}}``, at most 64 KiB. Answers as upstream: 200 echoes the payload (no
``trainerStatus``: a no-op 200); errors are ``metav1.Status`` JSON. Checked in this order:
404 path unknown (405 another method), 411/413 body length, 401 no bearer token or one the
TokenReview (audience ``--push-audience``) does not authenticate, 403 a token of another
namespace, 404 no workload of that name in the namespace (any kind: a Deployment named so is
the job too), 403 a token whose pod (``authentication.kubernetes.io/pod-name``) is not one of
the job's pods, 422 a body that is not a valid ``UpdateTrainJobStatusRequest``.

Nothing received is written to the API server: the report lives in memory only. TokenReview
answers are cached by the token's SHA-256 (60 s when valid, 10 s when not), so a callback posting
every 5 s costs one review a minute. Requests are not logged above DEBUG; a token never is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jobwatch.health import Health
from telemetry_common.httpfront import Reply
from jobwatch.progress import MAX_PUSH_BYTES, BodyTooLarge, ProgressError, validate_push_body
from jobwatch.state import State
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


def status(code: int, reason: str, message: str) -> Reply:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    return Reply(code, json.dumps(body).encode(), JSON)


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
    if isinstance(auds, list) and auds and audience not in auds:
        return None
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


class PushEndpoint:
    def __init__(self, state: State, reviewer: TokenReviewer, health: Health) -> None:
        self.state = state
        self.reviewer = reviewer
        self.health = health
        self._seen: set[tuple[str, str]] = set()

    def handle(self, method: str, path: str, headers: Mapping[str, str], read_body: Callable[[int], bytes]) -> Reply:
        reply = self._handle(method, path, headers, read_body)
        self.health.push_request(reply.status)
        log.debug("push %s -> %d", path.split("?", 1)[0][:200], reply.status)
        return reply

    def _handle(self, method: str, path: str, headers: Mapping[str, str],
                read_body: Callable[[int], bytes]) -> Reply:
        m = PATH.fullmatch(path.split("?", 1)[0])
        if m is None:
            return status(404, "NotFound", "the server could not find the requested resource")
        if method != "POST":
            return Reply(405, json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "message": f"method {method} not allowed", "reason": "MethodNotAllowed",
                                          "code": 405}).encode(), JSON, {"Allow": "POST"})
        namespace, name = m.group(1), m.group(2)
        if "chunked" in headers.get("Transfer-Encoding", "").lower():
            return status(411, "LengthRequired", "a Content-Length is required")
        try:
            length = int(headers.get("Content-Length", ""))
        except ValueError:
            return status(411, "LengthRequired", "a Content-Length is required")
        if length < 0:
            return status(400, "BadRequest", "bad Content-Length")
        if length > MAX_PUSH_BYTES:
            return status(413, "RequestEntityTooLarge", f"request body over {MAX_PUSH_BYTES} bytes")
        auth = headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return status(401, "Unauthorized", "a bearer token is required")
        try:
            ident = self.reviewer.review(token)
        except ReviewUnavailable:
            return status(503, "ServiceUnavailable", "the token cannot be verified now; retry later")
        if ident is None:
            return status(401, "Unauthorized", "the token is not valid for this endpoint")
        if ident.namespace != namespace:
            return status(403, "Forbidden", f"the token does not belong to namespace {namespace}")
        jobs = self.state.jobs_named(namespace, name)
        if not jobs:
            return status(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
        if ident.pod is None:
            return status(403, "Forbidden", "the token is not bound to a pod")
        own = self.state.pod_workload(namespace, ident.pod)
        if own is None or own not in jobs:
            return status(403, "Forbidden", f"the token's pod does not belong to job {name}")
        body = read_body(length)
        try:
            report = validate_push_body(body)
        except BodyTooLarge as exc:
            return status(413, "RequestEntityTooLarge", str(exc))
        except ProgressError as exc:
            self.health.progress_error("push", str(getattr(exc, "code", "invalid")))
            return status(422, "Invalid", f"invalid status update: {exc}")
        if report is not None:
            self.state.push(own, report)
            if (namespace, name) not in self._seen:
                if len(self._seen) >= 10_000:  # bounded: a job seen long ago may log its first push again
                    self._seen.clear()
                self._seen.add((namespace, name))
                log.info("first progress push for %s %s/%s", own.kind, namespace, name,
                         extra={"namespace": namespace, "job_kind": own.kind, "job_name": name})
        return Reply(200, body, JSON)
