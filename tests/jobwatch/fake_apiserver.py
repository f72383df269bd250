"""A fake Kubernetes API server, a real HTTP(S) server on 127.0.0.1, for gpu-jobwatch's tests and
benchmark.

It serves what a read-only watcher uses, the way kube-apiserver does:
- ``GET /api/v1/{pods,nodes}`` and ``/apis/trainer.kubeflow.org/v1alpha1/trainjobs``: lists with a
  resourceVersion, paged by ``limit``/``continue``;
- ``?watch=true``: a chunked stream of JSON lines from ``resourceVersion``, ``BOOKMARK`` events when
  ``allowWatchBookmarks``, ended after ``timeoutSeconds``; a version older than the oldest event
  kept (``compact()``) is answered 200 + an ERROR event with code 410, as kube-apiserver does (or an
  HTTP 410 with ``gone_as_http``);
- discovery of ``/apis/trainer.kubeflow.org/v1alpha1`` when ``trainer_served`` (404 otherwise, and
  the TrainJob list too);
- ``POST /apis/authentication.k8s.io/v1/tokenreviews`` answered from ``reviews`` (token -> status);
- modes: ``ok``, ``forbidden`` (every request 403, open watches cut) and ``down`` (connections
  dropped without an answer).
Every request needs ``Authorization: Bearer <one of tokens>`` (else 401). Any other write is
answered 405 and recorded in ``writes``: the tests assert it stays empty.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
TRAINER_GV = "trainer.kubeflow.org/v1alpha1"
PATHS = {
    "/api/v1/pods": "pods",
    "/api/v1/nodes": "nodes",
    f"/apis/{TRAINER_GV}/trainjobs": "trainjobs",
}
KINDS = {"pods": ("v1", "PodList"), "nodes": ("v1", "NodeList"), "trainjobs": (TRAINER_GV, "TrainJobList")}
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


def status(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeAPIServer:
    def __init__(self, *, certs: Any = None, token: str = "reader-token", trainer_served: bool = True,
                 keep_events: int = 100_000, bookmark_interval: float = 0.5, max_watch_s: float = 60.0) -> None:
        self.tokens = {token}
        self.token = token
        self.trainer_served = trainer_served
        self.mode = "ok"
        self.gone_as_http = False
        self.keep_events = keep_events
        self.bookmark_interval = bookmark_interval
        self.max_watch_s = max_watch_s
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {r: {} for r in KINDS}
        self.events: dict[str, list[tuple[int, str, Obj]]] = {r: [] for r in KINDS}
        self.oldest: dict[str, int] = dict.fromkeys(KINDS, 0)  # versions <= this are compacted away
        self.rv = 1000
        self.cond = threading.Condition()
        self.reviews: dict[str, Obj] = {}  # token -> TokenReview status
        self.review_requests: list[Obj] = []
        self.writes: list[tuple[str, str]] = []
        self.requests: list[tuple[str, str]] = []
        self.watch_connections = 0
        self._streams: set[socket.socket] = set()
        handler = type("Handler", (_Handler,), {"fake": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        self.certs = certs
        if certs is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.port = self.httpd.server_address[1]
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------------

    def __enter__(self) -> FakeAPIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.cut_watches()
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: Path, *, token: str | None = None, token_file: Path | None = None,
                   ca: bool = True) -> Path:
        cluster: Obj = {"server": self.url}
        if self.certs is not None and ca:
            cluster["certificate-authority-data"] = base64.b64encode(Path(self.certs.ca).read_bytes()).decode()
        user: Obj = {"tokenFile": str(token_file)} if token_file else {"token": token or self.token}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "reader", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "reader"}}],
        }))
        return path

    # -- the store ----------------------------------------------------------------------------------

    def _key(self, obj: Obj) -> tuple[str, str]:
        meta = obj["metadata"]
        return (str(meta.get("namespace", "")), str(meta["name"]))

    def _record(self, resource: str, etype: str, obj: Obj) -> None:
        with self.cond:
            self.rv += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(self.rv)
            if etype == "DELETED":
                self.objects[resource].pop(self._key(obj), None)
            else:
                self.objects[resource][self._key(obj)] = obj
            log = self.events[resource]
            log.append((self.rv, etype, obj))
            if len(log) > self.keep_events:
                drop = len(log) - self.keep_events
                self.oldest[resource] = log[drop - 1][0]
                del log[:drop]
            self.cond.notify_all()

    def apply(self, resource: str, obj: Obj) -> None:
        """Create or update (ADDED or MODIFIED)."""
        with self.cond:
            etype = "MODIFIED" if self._key(obj) in self.objects[resource] else "ADDED"
            self._record(resource, etype, obj)

    def delete(self, resource: str, namespace: str, name: str) -> None:
        with self.cond:
            obj = self.objects[resource].get((namespace, name))
            if obj is not None:
                self._record(resource, "DELETED", obj)

    def compact(self) -> None:
        """Forget every event so far: a watch from an older version gets 410."""
        with self.cond:
            for r in KINDS:
                self.oldest[r] = self.rv
                self.events[r].clear()

    def set_mode(self, mode: str) -> None:
        assert mode in ("ok", "forbidden", "down")
        self.mode = mode
        if mode != "ok":
            self.cut_watches()

    def cut_watches(self) -> None:
        with self.cond:
            for s in list(self._streams):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.cond.notify_all()

    def review(self, token: str, namespace: str, pod: str, sa: str = "default",
               audiences: tuple[str, ...] = ("gpu-telemetry",)) -> None:
        """Make TokenReview accept ``token`` as a pod-bound service-account token."""
        self.reviews[token] = {
            "authenticated": True,
            "user": {"username": f"system:serviceaccount:{namespace}:{sa}", "uid": "u-1",
                     "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                     "extra": {"authentication.kubernetes.io/pod-name": [pod],
                               "authentication.kubernetes.io/pod-uid": ["p-1"]}},
            "audiences": list(audiences),
        }

    def events_since(self, resource: str, rv: int) -> list[tuple[int, str, Obj]] | None:
        """Events after ``rv``; None when ``rv`` is older than what is kept (410)."""
        with self.cond:
            if rv < self.oldest[resource]:
                return None
            log = self.events[resource]
            return log[bisect.bisect_right(log, rv, key=lambda e: e[0]):]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeAPIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, code: int, obj: Obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _gate(self) -> bool:
        fake = self.fake
        fake.requests.append((self.command, self.path))
        if fake.mode == "down":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return False
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in fake.tokens:
            self._json(401, status(401, "Unauthorized", "Unauthorized"))
            return False
        if fake.mode == "forbidden":
            self._json(403, status(403, "Forbidden", "forbidden: User cannot list resource"))
            return False
        return True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if not self._gate():
            return
        path = urllib.parse.urlsplit(self.path).path
        if path != TOKENREVIEWS:
            self.fake.writes.append((self.command, self.path))
            self._json(405, status(405, "MethodNotAllowed", "the fake API server accepts no writes"))
            return
        req = json.loads(body)
        self.fake.review_requests.append(req)
        token = req["spec"]["token"]
        answer = self.fake.reviews.get(token, {"authenticated": False, "error": "invalid bearer token"})
        auds = req["spec"].get("audiences") or []
        if answer.get("authenticated") and auds and not set(auds) & set(answer.get("audiences", [])):
            answer = {"authenticated": False, "error": "token audiences do not match"}
        self._json(201, {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                         "metadata": {}, "spec": req["spec"], "status": answer})

    do_PUT = do_PATCH = do_DELETE = do_POST

    def do_GET(self) -> None:
        if not self._gate():
            return
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        fake = self.fake
        if url.path == f"/apis/{TRAINER_GV}":
            if not fake.trainer_served:
                self._json(404, status(404, "NotFound", "the server could not find the requested resource"))
                return
            self._json(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": TRAINER_GV,
                             "resources": [{"name": "trainjobs", "namespaced": True, "kind": "TrainJob",
                                            "verbs": ["get", "list", "watch"]},
                                           {"name": "trainjobs/status", "namespaced": True, "kind": "TrainJob"}]})
            return
        resource = PATHS.get(url.path)
        if resource is None or (resource == "trainjobs" and not fake.trainer_served):
            self._json(404, status(404, "NotFound", "the server could not find the requested resource"))
            return
        if q.get("watch") == "true":
            self._watch(resource, q)
        else:
            self._list(resource, q)

    def _list(self, resource: str, q: dict[str, str]) -> None:
        fake = self.fake
        with fake.cond:
            if "continue" in q:
                rv_s, off_s = q["continue"].split(":")
                if int(rv_s) < fake.oldest[resource]:
                    self._json(410, status(410, "Expired", "the continue token is too old"))
                    return
                offset = int(off_s)
            else:
                rv_s, offset = str(fake.rv), 0
            items = sorted(fake.objects[resource].items())
        limit = int(q.get("limit", "0")) or len(items) or 1
        page = [o for _, o in items[offset:offset + limit]]
        meta: Obj = {"resourceVersion": rv_s}
        if offset + limit < len(items):
            meta["continue"] = f"{rv_s}:{offset + limit}"
        api, kind = KINDS[resource]
        self._json(200, {"kind": kind, "apiVersion": api, "metadata": meta, "items": page})

    def _chunk(self, obj: Obj) -> None:
        data = json.dumps(obj).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, resource: str, q: dict[str, str]) -> None:
        fake = self.fake
        rv = int(q.get("resourceVersion") or fake.rv)
        if fake.events_since(resource, rv) is None and fake.gone_as_http:
            self._json(410, status(410, "Expired", f"too old resource version: {rv} ({fake.oldest[resource]})"))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        fake.watch_connections += 1
        bookmarks = q.get("allowWatchBookmarks") == "true"
        deadline = time.monotonic() + min(float(q.get("timeoutSeconds", "300")), fake.max_watch_s)
        with fake.cond:
            fake._streams.add(self.connection)
        try:
            for item in self._stream(resource, rv, bookmarks, deadline):
                self._chunk(item)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        finally:
            with fake.cond:
                fake._streams.discard(self.connection)

    def _stream(self, resource: str, rv: int, bookmarks: bool, deadline: float) -> Iterator[Obj]:
        fake = self.fake
        next_bookmark = time.monotonic() + fake.bookmark_interval
        while time.monotonic() < deadline:
            if fake.mode != "ok":
                raise OSError("cut")
            events = fake.events_since(resource, rv)
            if events is None:
                yield {"type": "ERROR", "object": status(410, "Expired", f"too old resource version: {rv}")}
                return
            for erv, etype, obj in events:
                rv = erv
                yield {"type": etype, "object": obj}
            now = time.monotonic()
            if bookmarks and now >= next_bookmark:
                api, kind = KINDS[resource]
                with fake.cond:
                    current = fake.rv
                rv = max(rv, current) if not fake.events_since(resource, rv) else rv
                yield {"type": "BOOKMARK", "object": {"kind": kind[:-4], "apiVersion": api,
                                                      "metadata": {"resourceVersion": str(rv)}}}
                next_bookmark = now + fake.bookmark_interval
            with fake.cond:
                if not fake.events_since(resource, rv) and fake.mode == "ok":
                    fake.cond.wait(min(0.2, max(0.0, deadline - time.monotonic())))


# -- objects as the API serves them ----------------------------------------------------------------


def gpu_pod(name: str, namespace: str = "ml", *, node: str = "gpu-node-1", gpus: int = 8,
            labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            owner: tuple[str, str] | None = None, phase: str = "Running", terminated: bool = False,
            resource: str = "nvidia.com/gpu") -> Obj:
    """A pod requesting ``gpus`` of ``resource`` (gpus=0: a CPU pod); ``owner`` = (kind, name)."""
    res: Obj = {"requests": {"cpu": "4"}, "limits": {}}
    if gpus:
        res["requests"][resource] = str(gpus)
        res["limits"][resource] = str(gpus)
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": dict(labels or {}),
                 "annotations": dict(annotations or {})}
    if owner is not None:
        api = "batch/v1" if owner[0] == "Job" else "apps/v1"
        meta["ownerReferences"] = [{"apiVersion": api, "kind": owner[0], "name": owner[1], "uid": "o-1",
                                    "controller": True}]
    state: Obj = ({"terminated": {"exitCode": 0, "reason": "Completed"}} if terminated
                  else {"running": {"startedAt": "2026-06-12T01:00:00Z"}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "train", "image": "x", "resources": res}]},
            "status": {"phase": phase, "containerStatuses": [{"name": "train", "state": state}]}}


def trainjob_pod(job: str, index: int, namespace: str = "ml", **kw: Any) -> Obj:
    """A trainer pod of a Kubeflow Trainer v2 TrainJob (JobSet labels, owned by the child Job)."""
    labels = {"jobset.sigs.k8s.io/jobset-name": job, "jobset.sigs.k8s.io/replicatedjob-name": "node",
              "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": str(index),
              "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    return gpu_pod(f"{job}-node-0-{index}-x{index}", namespace, labels=labels, owner=("Job", f"{job}-node-0"), **kw)


def node(name: str, *, gpus: int = 8, labels: dict[str, str] | None = None) -> Obj:
    cap = {"cpu": "192", "memory": "2Ti"}
    if gpus:
        cap["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})},
            "status": {"capacity": cap, "allocatable": cap}}


def trainer_status(step: int | None, total: int = 1000, *, at: str = "2026-06-12T03:00:00Z",
                   loss: str | None = "0.25", pct: int | None = None) -> Obj:
    metrics = [{"name": "total_steps", "value": str(total)}]
    if step is not None:
        metrics.append({"name": "current_step", "value": str(step)})
    if loss is not None:
        metrics.append({"name": "loss", "value": loss})
    st: Obj = {"lastUpdatedTime": at, "metrics": metrics}
    pct = pct if pct is not None else (None if step is None else min(100, step * 100 // total))
    if pct is not None:
        st["progressPercentage"] = pct
    return st


def trainjob(name: str, namespace: str = "ml", *, status: Obj | None = None, annotations: dict[str, str] | None = None,
             conditions: dict[str, bool] | None = None) -> Obj:
    st: Obj = {}
    if status is not None:
        st["trainerStatus"] = status
    if conditions:
        st["conditions"] = [{"type": t, "status": "True" if v else "False", "reason": t, "message": "",
                             "lastTransitionTime": "2026-06-12T03:00:00Z"} for t, v in conditions.items()]
    return {"apiVersion": TRAINER_GV, "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
            "spec": {"runtimeRef": {"name": "torch-distributed"}}, "status": st}
