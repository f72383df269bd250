"""The exposition: every series gpu-jobwatch serves, rendered from the state into classic
Prometheus text, and a renderer thread that re-renders on change (at most every ``min_gap``
seconds) or every ``interval`` seconds (thresholds and retention move with time) and keeps the
bytes that every scrape is served.

Labels: ``namespace``, ``job_kind``, ``job_name`` (never ``job``: Prometheus's scrape job),
``pod``, ``rank``, ``Hostname`` (the node name, dcgm-exporter's label) as they apply; a label
without a value is left out. No ``_created`` series: the text is written here, not by a client
library registry.
"""

from __future__ import annotations

import logging
import math
import platform
import threading
import time
from collections.abc import Callable, Iterable

from jobwatch import __version__
from jobwatch.health import Health, HealthSnapshot
from jobwatch.progress import select_metrics, select_nonfinite
from jobwatch.state import CONDITIONS, PodRecord, State
from jobwatch.workload import Workload

log = logging.getLogger("jobwatch.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

FAMILIES: dict[str, tuple[str, str]] = {  # name -> (type, help), in the order they are written
    "gpu_pod_job_info": ("gauge", "1 for each GPU pod, with the workload it belongs to (the join series)."),
    "gpu_pod_gpus_requested": ("gauge", "GPUs the pod holds (MIG instances as their share of a GPU)."),
    "gpu_pod_main_container_terminated": ("gauge", "1 when the pod's GPU container ended while the pod holds on."),
    "gpu_job_exempt": ("gauge", "1 when the workload is annotated gpu-telemetry.io/exempt: \"true\"."),
    "gpu_job_condition": ("gauge", "TrainJob condition (Complete, Failed, Suspended) status, 1 when True."),
    "gpu_job_progress_source_info": ("gauge", "Where the job's progress comes from (trainjob_status, "
                                              "rhoai_annotation, push)."),
    "gpu_job_progress_step": ("gauge", "Current training step."),
    "gpu_job_progress_max_step": ("gauge", "Highest step seen (survives resets)."),
    "gpu_job_progress_total_steps": ("gauge", "Total steps of the run."),
    "gpu_job_progress_ratio": ("gauge", "Progress 0..1 (progressPercentage / 100)."),
    "gpu_job_progress_eta_seconds": ("gauge", "Estimated seconds remaining, as the trainer reports."),
    "gpu_job_progress_epoch": ("gauge", "Current epoch."),
    "gpu_job_progress_finished": ("gauge", "1 when progress is 100 % or RHOAI's summary says complete."),
    "gpu_job_progress_last_report_timestamp_seconds": ("gauge", "Time of the latest progress report "
                                                                "(RHOAI: the controller's poll)."),
    "gpu_job_progress_last_advance_timestamp_seconds": ("gauge", "When the step (or ratio) last increased, or a "
                                                                 "restart began."),
    "gpu_job_step_duration_seconds": ("gauge", "Median seconds per step over recent advances."),
    "gpu_job_longest_recovered_pause_seconds": ("gauge", "Longest pause between advances the job recovered from."),
    "gpu_job_stall_threshold_seconds": ("gauge", "Seconds without an advance after which the job counts as stalled."),
    "gpu_job_progress_resets_total": ("counter", "Times the step went backwards (a restart or resume)."),
    "gpu_job_redone_steps_total": ("counter", "Steps computed again after resets."),
    "gpu_job_progress_resets_without_advance": ("gauge", "Resets since the highest step last moved."),
    "gpu_job_metric": ("gauge", "Allowlisted training metrics (loss, eval_loss, ...), by phase train/eval."),
    "gpu_job_metric_nonfinite": ("gauge", "1 when the metric was last reported NaN, Inf or null."),
    "gpu_node_price_usd_per_gpu_hour": ("gauge", "Price of one GPU-hour on the node, from the prices config."),
    "gpu_jobwatch_build_info": ("gauge", "gpu-jobwatch's version."),
    "gpu_jobwatch_watch_up": ("gauge", "1 while the resource's list/watch works; 0: serving the last known state."),
    "gpu_jobwatch_resource_served": ("gauge", "1 when API discovery serves the optional resource."),
    "gpu_jobwatch_events_total": ("counter", "Watch events received, by resource and type."),
    "gpu_jobwatch_relists_total": ("counter", "Full lists of a resource (start, and after 410 Gone)."),
    "gpu_jobwatch_push_requests_total": ("counter", "Push endpoint requests, by HTTP status code."),
    "gpu_jobwatch_token_reviews_total": ("counter", "TokenReviews sent for the push endpoint, by result."),
    "gpu_jobwatch_progress_errors_total": ("counter", "Malformed progress reports, by source and reason."),
    "gpu_jobwatch_gpu_pods": ("gauge", "GPU pods known."),
    "gpu_jobwatch_jobs": ("gauge", "Jobs with series."),
    "gpu_jobwatch_gpu_nodes_unpriced": ("gauge", "GPU nodes no price entry matches (dollars unknown there)."),
    "gpu_jobwatch_render_duration_seconds": ("gauge", "Seconds the last exposition took to render."),
}


def _escape(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def labels(*pairs: tuple[str, str | None]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs if v)
    return "{" + inner + "}" if inner else ""


def fmt(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _with(base: str, *pairs: tuple[str, str | None]) -> str:
    extra = labels(*pairs)
    if not base:
        return extra
    return base[:-1] + "," + extra[1:] if extra else base


PodCache = dict[tuple[str, str], tuple[PodRecord, Workload, tuple[str, str, str | None]]]


def _pod_lines(p: PodRecord, w: Workload) -> tuple[str, str, str | None]:
    pl = labels(("namespace", p.namespace), ("pod", p.name), ("job_kind", w.kind), ("job_name", w.name),
                ("rank", p.rank), ("Hostname", p.node))
    term = None if p.terminated is None else f"gpu_pod_main_container_terminated{pl} {1 if p.terminated else 0}"
    return f"gpu_pod_job_info{pl} 1", f"gpu_pod_gpus_requested{pl} {fmt(p.gpus)}", term


def render(state: State, health: HealthSnapshot, now: float, cache: PodCache | None = None) -> bytes:
    """The exposition. ``cache`` (kept by the caller between renders) holds each pod's lines, which
    change only when the pod does: it is replaced in place by what this render used."""
    out: dict[str, list[str]] = {name: [] for name in FAMILIES}
    old = cache if cache is not None else {}
    fresh: PodCache = {}
    info, requested, terminated = out["gpu_pod_job_info"], out["gpu_pod_gpus_requested"], \
        out["gpu_pod_main_container_terminated"]

    def put(name: str, lab: str, value: float) -> None:
        out[name].append(f"{name}{lab} {fmt(value)}")

    with state.lock:
        views = list(state.job_views(now))
        n_pods = 0
        for job, pods, tj in views:
            w = job.workload
            jl = labels(("namespace", w.namespace), ("job_kind", w.kind), ("job_name", w.name))
            for p in pods:
                n_pods += 1
                key = (p.namespace, p.name)
                hit = old.get(key)
                same = hit is not None and hit[0] is p and (hit[1] is w or hit[1] == w)
                lines = hit[2] if same and hit is not None else _pod_lines(p, w)
                fresh[key] = (p, w, lines)
                info.append(lines[0])
                requested.append(lines[1])
                if lines[2] is not None:
                    terminated.append(lines[2])
            put("gpu_job_exempt", jl, 1 if (tj is not None and tj.exempt) or any(p.exempt for p in pods) else 0)
            if tj is not None:
                for c in CONDITIONS:
                    put("gpu_job_condition", _with(jl, ("condition", c)), 1 if tj.conditions.get(c) else 0)
            t = job.tracker
            if t is None or job.observed is None:
                continue
            put("gpu_job_progress_source_info", _with(jl, ("source", job.observed.source)), 1)
            for name, value in (("gpu_job_progress_step", t.step), ("gpu_job_progress_max_step", t.highest_step),
                                ("gpu_job_progress_total_steps", t.total_steps), ("gpu_job_progress_ratio", t.ratio),
                                ("gpu_job_progress_eta_seconds", t.eta_seconds), ("gpu_job_progress_epoch", t.epoch),
                                ("gpu_job_progress_last_report_timestamp_seconds", t.last_report),
                                ("gpu_job_progress_last_advance_timestamp_seconds", t.last_advance),
                                ("gpu_job_step_duration_seconds", t.step_duration_seconds)):
                if value is not None:
                    put(name, jl, value)
            put("gpu_job_progress_finished", jl, 1 if job.observed.finished else 0)
            put("gpu_job_longest_recovered_pause_seconds", jl, t.longest_recovered_pause_seconds)
            put("gpu_job_stall_threshold_seconds", jl, t.threshold_seconds(now, state.stall_override(pods, tj)))
            put("gpu_job_progress_resets_total", jl, t.resets_total)
            put("gpu_job_redone_steps_total", jl, t.redone_steps_total)
            put("gpu_job_progress_resets_without_advance", jl, t.resets_without_progress)
            chosen = select_metrics(job.observed, state.allow, state.metric_limit)
            for (mname, phase), value in chosen.items():
                put("gpu_job_metric", _with(jl, ("name", mname), ("phase", phase)), value)
            bad = select_nonfinite(job.observed, state.allow)
            for mname in dict.fromkeys([n for n, _ in chosen] + bad):
                put("gpu_job_metric_nonfinite", _with(jl, ("name", mname)), 1 if mname in bad else 0)
        unpriced = 0
        for node in state.nodes.values():
            if node.price is None:
                unpriced += 1
                continue
            put("gpu_node_price_usd_per_gpu_hour", labels(("Hostname", node.name), *node.labels), node.price)
        n_jobs = len(views)
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    put("gpu_jobwatch_build_info", labels(("version", __version__), ("python", platform.python_version())), 1)
    for res, up in sorted(health.watch_up.items()):
        put("gpu_jobwatch_watch_up", labels(("resource", res)), 1 if up else 0)
    for res, served in sorted(health.served.items()):
        put("gpu_jobwatch_resource_served", labels(("resource", res)), 1 if served else 0)
    for (res, etype), n in sorted(health.events.items()):
        put("gpu_jobwatch_events_total", labels(("resource", res), ("type", etype)), n)
    for res, n in sorted(health.relists.items()):
        put("gpu_jobwatch_relists_total", labels(("resource", res)), n)
    for code, n in sorted(health.push_requests.items()):
        put("gpu_jobwatch_push_requests_total", labels(("code", code)), n)
    for result, n in sorted(health.token_reviews.items()):
        put("gpu_jobwatch_token_reviews_total", labels(("result", result)), n)
    for (source, reason), n in sorted(health.progress_errors.items()):
        put("gpu_jobwatch_progress_errors_total", labels(("source", source), ("reason", reason)), n)
    put("gpu_jobwatch_gpu_pods", "", n_pods)
    put("gpu_jobwatch_jobs", "", n_jobs)
    put("gpu_jobwatch_gpu_nodes_unpriced", "", unpriced)
    put("gpu_jobwatch_render_duration_seconds", "", health.render_seconds)
    return _text(out)


def _text(out: dict[str, list[str]]) -> bytes:
    parts: list[str] = []
    for name, lines in out.items():
        if not lines:
            continue
        kind, text = FAMILIES[name]
        parts.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
        parts.append("\n".join(lines))
        parts.append("\n")
    return "".join(parts).encode()


class Renderer:
    """Keeps the latest exposition. ``run`` re-renders when ``changed`` is set (at most once per
    ``min_gap`` seconds) and at least every ``interval`` seconds."""

    def __init__(self, state: State, health: Health, changed: threading.Event, *, interval: float = 10.0,
                 min_gap: float = 2.0, clock: Callable[[], float] | None = None) -> None:
        self.state = state
        self.health = health
        self.changed = changed
        self.interval = interval
        self.min_gap = min_gap
        self.clock = clock or state.clock
        self.body = b""
        self._pods: PodCache = {}
        self.rendered_at = 0.0  # monotonic
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def render_now(self) -> bytes:
        self.changed.clear()
        start = time.perf_counter()
        body = render(self.state, self.health.snapshot(), self.clock(), self._pods)
        self.health.render_seconds = time.perf_counter() - start
        self.body = body
        self.rendered_at = time.monotonic()
        return body

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="render", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.render_now()
            except Exception:  # never leave the scrape without an answer because of one bad render
                log.exception("rendering the exposition failed; serving the previous one")
            self.changed.wait(self.interval)
            self._stop.wait(self.min_gap)

    def stop(self) -> None:
        self._stop.set()
        self.changed.set()

    def fresh(self, max_age: float) -> bool:
        return self.rendered_at > 0 and time.monotonic() - self.rendered_at < max_age


def families(text: bytes) -> Iterable[str]:
    """The family names in an exposition (for tests and checks)."""
    return [line.split()[2] for line in text.decode().splitlines() if line.startswith("# TYPE ")]
