"""What gpu-jobwatch knows: GPU pods, GPU nodes and TrainJobs as the watches last reported them,
joined into workloads, each with its progress tracker.

Only what the series need is kept (a pod is a small :class:`PodRecord`, never the API object),
and only for pods that hold GPUs (Succeeded/Failed pods hold none and are let go), so memory
follows the GPU pods, not the cluster. Progress is taken from, in order, the TrainJob's
``status.trainerStatus``, its RHOAI annotation ``trainer.opendatahub.io/trainerStatus``, and the
push endpoint; the first that has a valid report is fed to the job's tracker, only when it
changed. A malformed report is counted (``gpu_jobwatch_progress_errors_total``) and logged once
per job and source; the last valid one stays (nothing is invented). A ``trainerStatus`` over 64 KiB
is malformed (``too_large``) and never parsed. Of each source's raw text only a SHA-256 digest is
kept (to tell a change), never the text. A step going backwards is counted as a reset
(``gpu_job_progress_resets_total``) every time and logged once per job.

A job ends when no pod of it holds GPUs and (for a TrainJob) it is Complete or Failed, or gone; its
series stay ``retention`` seconds (15 minutes) after that, then go, until it runs again: an
update of the ended TrainJob (a late status, an annotation) does not bring them back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from jobwatch import workload as wl
from jobwatch.health import Health
from jobwatch.prices import PriceTable
from jobwatch.progress import (
    DEFAULT_ALLOW,
    MAX_PUSH_BYTES,
    BodyTooLarge,
    ProgressError,
    Report,
    parse_rhoai_annotation,
    parse_trainer_status,
)
from jobwatch.records import (
    CONDITIONS,
    NODE_LABELS,
    JobRecord,
    Key,
    NodeRecord,
    Obj,
    PodRecord,
    Sink,
    TrainJobRecord,
    is_gpu_node,
    key_of,
    pod_record,
)
from jobwatch.tracker import JobTracker
from jobwatch.workload import Workload

__all__ = ["CONDITIONS", "JobRecord", "NodeRecord", "PodRecord", "State", "TrainJobRecord", "pod_record"]

log = logging.getLogger("jobwatch.state")
RHOAI_ANNOTATION = "trainer.opendatahub.io/trainerStatus"


def _reason(exc: ProgressError) -> str:
    return str(getattr(exc, "code", "invalid"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class State:
    def __init__(self, *, health: Health, prices: PriceTable | None = None, allow: Sequence[str] = DEFAULT_ALLOW,
                 metric_limit: int = 8, retention: float = 900.0, stall_after: float | None = None,
                 clock: Callable[[], float] = time.time, changed: threading.Event | None = None) -> None:
        self.health = health
        self.prices = prices or PriceTable()
        self.allow = tuple(allow)
        self.metric_limit = metric_limit
        self.retention = retention
        self.stall_after = stall_after
        self.clock = clock
        self.changed = changed or threading.Event()
        self.lock = threading.RLock()
        self.pods: dict[Key, PodRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.trainjobs: dict[Key, TrainJobRecord] = {}
        self.pushed: dict[Workload, Report] = {}
        self.jobs: dict[Workload, JobRecord] = {}
        self._expired: set[Workload] = set()
        self._by_name: dict[Key, set[Key]] = {}  # (namespace, workload name) -> pod keys
        self._groups: dict[Workload, dict[Key, PodRecord]] = {}  # workload (from the pod alone) -> its pods
        self._price_warned = False
        self.pods_sink = Sink(pod_record, self._put_pod, self._drop_pod, self._replace_pods).bind(self.lock)
        self.nodes_sink = Sink(self._node_record, self._put_node, self._drop_node, self._replace_nodes).bind(self.lock)
        self.trainjobs_sink = Sink(lambda o: o, self._put_trainjob, self._drop_trainjob,
                                    self._replace_trainjobs).bind(self.lock)

    # -- pods -------------------------------------------------------------------------------------

    def effective(self, rec: PodRecord) -> Workload:
        w = rec.workload
        if w.kind == "JobSet" and (w.namespace, w.name) in self.trainjobs:
            return Workload(w.namespace, "TrainJob", w.name)
        return w

    def _put_pod(self, key: Key, rec: PodRecord | None) -> None:
        old = self.pods.get(key)
        if rec == old:
            return
        if old is not None:
            self._unindex(key, old)
        if rec is None:
            self.pods.pop(key, None)
        else:
            self.pods[key] = rec
            self._by_name.setdefault((rec.namespace, rec.workload.name), set()).add(key)
            self._groups.setdefault(rec.workload, {})[key] = rec
        self.changed.set()

    def _unindex(self, key: Key, rec: PodRecord) -> None:
        group = self._groups.get(rec.workload)
        if group is not None:
            group.pop(key, None)
            if not group:
                del self._groups[rec.workload]
        names = self._by_name.get((rec.namespace, rec.workload.name))
        if names is not None:
            names.discard(key)
            if not names:
                del self._by_name[(rec.namespace, rec.workload.name)]

    def _drop_pod(self, key: Key) -> None:
        self._put_pod(key, None)

    def _replace_pods(self, items: list[Any]) -> None:
        fresh = {(r.namespace, r.name): r for r in items}
        for key in [k for k in self.pods if k not in fresh]:
            self._put_pod(key, None)
        for key, rec in fresh.items():
            self._put_pod(key, rec)

    # -- nodes ------------------------------------------------------------------------------------

    def _node_record(self, obj: Obj) -> NodeRecord | None:
        if not is_gpu_node(obj):
            return None
        name = key_of(obj)[1]
        labels = wl.labels_of(obj)
        price = self.prices.price_for(labels)
        picked = []
        for label, names in NODE_LABELS:
            v = next((labels[n] for n in names if isinstance(labels.get(n), str) and labels[n]), None)
            if v is not None:
                picked.append((label, str(v)))
        if price is None and not self._price_warned:
            self._price_warned = True
            log.warning("no price for GPU node %s (%s): GPU-hours are counted, dollars are not; add a prices: "
                        "entry or default_usd_per_gpu_hour to the config", name,
                        ", ".join(f"{k}={v}" for k, v in picked) or "no instance-type labels",
                        extra={"node": name})
        return NodeRecord(name, price, tuple(picked))

    def _put_node(self, key: Key, rec: NodeRecord | None) -> None:
        if self.nodes.get(key[1]) == rec:
            return
        if rec is None:
            self.nodes.pop(key[1], None)
        else:
            self.nodes[key[1]] = rec
        self.changed.set()

    def _drop_node(self, key: Key) -> None:
        self._put_node(key, None)

    def _replace_nodes(self, items: list[Any]) -> None:
        fresh = {r.name: r for r in items}
        for name in [n for n in self.nodes if n not in fresh]:
            self._put_node(("", name), None)
        for name, rec in fresh.items():
            self._put_node(("", name), rec)

    # -- TrainJobs --------------------------------------------------------------------------------

    def _put_trainjob(self, key: Key, obj: Obj | None) -> None:
        if obj is None:
            self._drop_trainjob(key)
            return
        now = self.clock()
        w = Workload(key[0], "TrainJob", key[1])
        rec = self.trainjobs.get(key)
        if rec is None:
            rec = self.trainjobs[key] = TrainJobRecord(key[0], key[1])
            ghost = self.jobs.get(Workload(key[0], "JobSet", key[1]))  # its pods were read as a JobSet's
            if ghost is not None and ghost.tracker is None:
                del self.jobs[ghost.workload]
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        assert isinstance(status, Mapping)
        conds = {c.get("type"): c.get("status") == "True" for c in status.get("conditions") or []
                 if isinstance(c, Mapping)}
        rec.conditions = {c: bool(conds.get(c)) for c in CONDITIONS}
        rec.exempt, rec.stall_after = wl.exempt(obj), wl.stall_after_override(obj)
        raw = status.get("trainerStatus")
        text = None if raw is None else json.dumps(raw, sort_keys=True)
        status_raw = None if text is None else _digest(text)
        if status_raw != rec.status_raw:
            rec.status_raw = status_raw
            if raw is not None and text is not None:
                try:
                    if len(text) > MAX_PUSH_BYTES:  # the CRD's limits keep a real one far below this
                        raise BodyTooLarge(f"trainerStatus: over {MAX_PUSH_BYTES} bytes")
                    rec.status_report = parse_trainer_status(raw, "trainjob_status")
                except ProgressError as exc:
                    self._bad(w, "trainjob_status", exc)
        ann = wl.annotations_of(obj).get(RHOAI_ANNOTATION)
        ann_raw = None if ann is None else _digest(ann if isinstance(ann, str) else repr(ann))
        if ann_raw != rec.annotation_raw:
            rec.annotation_raw = ann_raw
            if ann is not None:
                try:
                    rec.annotation_report = parse_rhoai_annotation(ann)
                except ProgressError as exc:
                    self._bad(w, "rhoai_annotation", exc)
        self._feed(w, now)
        self.changed.set()

    def _drop_trainjob(self, key: Key) -> None:
        if self.trainjobs.pop(key, None) is not None:
            self._expired.discard(Workload(key[0], "TrainJob", key[1]))
            self.changed.set()

    def _replace_trainjobs(self, items: list[Any]) -> None:
        fresh = {key_of(o): o for o in items}
        for key in [k for k in self.trainjobs if k not in fresh]:
            self._drop_trainjob(key)
        for key, obj in fresh.items():
            self._put_trainjob(key, obj)

    def forget_trainjobs(self) -> None:
        """The TrainJob API went away: so did every TrainJob."""
        with self.lock:
            self._replace_trainjobs([])

    # -- progress ---------------------------------------------------------------------------------

    def _job(self, w: Workload) -> JobRecord:
        job = self.jobs.get(w)
        if job is None:
            job = self.jobs[w] = JobRecord(w)
        return job

    def _bad(self, w: Workload, source: str, exc: ProgressError) -> None:
        self.health.progress_error(source, _reason(exc))
        if w in self._expired:  # counted; an ended job's series do not come back for it
            return
        job = self._job(w)
        if source not in job.bad_logged:
            job.bad_logged.add(source)
            log.warning("malformed progress for %s %s/%s from %s (counted; further ones are not logged): %s",
                        w.kind, w.namespace, w.name, source, exc,
                        extra={"namespace": w.namespace, "job_kind": w.kind, "job_name": w.name, "source": source})

    def _chosen(self, w: Workload) -> Report | None:
        tj = self.trainjobs.get((w.namespace, w.name)) if w.kind == "TrainJob" else None
        if tj is not None and tj.status_report is not None:
            return tj.status_report
        if tj is not None and tj.annotation_report is not None:
            return tj.annotation_report
        return self.pushed.get(w)

    def _feed(self, w: Workload, now: float) -> None:
        report = self._chosen(w)
        if report is None or w in self._expired:
            return
        job = self._job(w)
        if report == job.observed:
            return
        job.observed = report
        if job.tracker is None:
            job.tracker = JobTracker()
        events = job.tracker.observe(report, now)
        where = {"namespace": w.namespace, "job_kind": w.kind, "job_name": w.name, "source": report.source}
        if "reset" in events and not job.reset_logged:
            job.reset_logged = True
            log.info("progress of %s %s/%s went back to step %s (a restart or resume; further resets are counted "
                     "in gpu_job_progress_resets_total, not logged)", w.kind, w.namespace, w.name,
                     job.tracker.step, extra=where)
        if "crash_loop" in events:
            log.warning("%s %s/%s reset %d times without its highest step moving", w.kind, w.namespace, w.name,
                        job.tracker.resets_without_progress, extra=where)
        if "first" in events and job.tracker.resets_total == 0:
            log.info("progress of %s %s/%s from %s", w.kind, w.namespace, w.name, report.source, extra=where)

    def push(self, w: Workload, report: Report) -> None:
        with self.lock:
            self.pushed[w] = report
            self._feed(w, self.clock())
            self.changed.set()

    # -- lookups for the push endpoint ------------------------------------------------------------

    def jobs_named(self, namespace: str, name: str) -> list[Workload]:
        """Every workload jobwatch knows in ``namespace`` named ``name``, whatever its kind."""
        with self.lock:
            found = {self.effective(self.pods[k]) for k in self._by_name.get((namespace, name), ())}
            if (namespace, name) in self.trainjobs:
                found.add(Workload(namespace, "TrainJob", name))
            found |= {w for w in self.jobs if w.namespace == namespace and w.name == name}
            return sorted(found - self._expired, key=lambda w: w.kind)

    def pod_workload(self, namespace: str, pod: str) -> Workload | None:
        with self.lock:
            rec = self.pods.get((namespace, pod))
            return None if rec is None else self.effective(rec)

    # -- the view the metrics are rendered from -----------------------------------------------------

    def sweep(self, now: float) -> dict[Workload, list[PodRecord]]:
        """Update which jobs have ended and drop those past retention; the pods of each workload."""
        with self.lock:
            by_w: dict[Workload, list[PodRecord]] = {}
            for w, group in self._groups.items():
                if w.kind == "JobSet" and (w.namespace, w.name) in self.trainjobs:
                    w = Workload(w.namespace, "TrainJob", w.name)
                by_w.setdefault(w, []).extend(group.values())
            candidates = set(by_w) | set(self.jobs)
            candidates |= {Workload(ns, "TrainJob", n) for ns, n in self.trainjobs}
            for w in candidates:
                tj = self.trainjobs.get((w.namespace, w.name)) if w.kind == "TrainJob" else None
                live = w in by_w or (tj is not None and not (tj.conditions.get("Complete") or
                                                             tj.conditions.get("Failed")))
                if live:
                    if w in self._expired:  # it runs again: its sources count again
                        self._expired.discard(w)
                        self._feed(w, now)
                    job = self._job(w)
                    if job.ended_at is not None:
                        job.ended_at = None
                    continue
                if w in self._expired:
                    if self.jobs.pop(w, None) is not None:  # nothing brings an ended job's series back
                        self.changed.set()
                    continue
                job = self._job(w)
                if job.ended_at is None:
                    job.ended_at = now
                elif now - job.ended_at >= self.retention:
                    del self.jobs[w]
                    self.pushed.pop(w, None)
                    if tj is not None:
                        self._expired.add(w)  # the TrainJob stays in the API: do not bring it back
                    self.changed.set()
            return by_w

    def job_views(self, now: float) -> Iterator[tuple[JobRecord, list[PodRecord], TrainJobRecord | None]]:
        """Each job with series, its pods and TrainJob; call with ``lock`` held, after ``sweep``."""
        by_w = self.sweep(now)
        for w, job in self.jobs.items():
            tj = self.trainjobs.get((w.namespace, w.name)) if w.kind == "TrainJob" else None
            yield job, by_w.get(w, []), tj

    def stall_override(self, pods: list[PodRecord], tj: TrainJobRecord | None) -> float | None:
        if tj is not None and tj.stall_after is not None:
            return tj.stall_after
        return next((p.stall_after for p in pods if p.stall_after is not None), self.stall_after)
