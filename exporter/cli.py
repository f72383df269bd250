"""``gpu-exporter``: wire settings, counters, backend, collector, XID watcher and HTTP server.

Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 cannot listen, 2 bad flag/env value, bad
collectors CSV, bad web config or a ``-d`` id that does not exist, 3 the backend cannot start (no
NVML with ``--backend nvml``: never a silent fallback to simulated data).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from exporter import devices as device_selection
from exporter import exp_counters
from exporter.backend import BackendError, DeviceInfo, GpuBackend
from exporter.collector import XID_ERRORS, Collector
from exporter.counters_csv import CountersError, default_path, filter_supported, load_counters
from exporter.fields import FIELDS
from exporter.hpc import HpcJobMap
from exporter.render import PodLabels
from exporter.server import Server
from exporter.settings import Settings, SettingsError, load_settings
from exporter.webconfig import WebConfig, WebConfigError, load_web_config
from exporter.xid import XidState, XidWatcher
from telemetry_common import logs

log = logging.getLogger("exporter")

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_BACKEND = 0, 1, 2, 3


def make_backend(settings: Settings) -> GpuBackend:
    """The chosen backend. Raises ``BackendError`` when it cannot start."""
    module = "exporter.simulated" if settings.backend == "simulated" else "exporter.nvml"
    try:
        mod: Any = importlib.import_module(module)
    except ImportError as exc:
        raise BackendError(f"cannot load {module}: {exc}") from exc
    cls = getattr(mod, "SimulatedBackend" if settings.backend == "simulated" else "NvmlBackend", None)
    if cls is None:
        raise BackendError(f"{module} provides no backend class")
    if settings.backend == "simulated":
        return cast(GpuBackend, cls(n_gpus=settings.simulate_gpus, workloads=dict(settings.simulate_workloads)))
    return cast(GpuBackend, cls())


PodsFn = Callable[[], Mapping[str, Sequence[PodLabels]]]


def _probe_answering(backend: GpuBackend, devices: Sequence[DeviceInfo], wanted: list[str]) -> dict[int, set[str]]:
    """Supported fields of every GPU that answers; a GPU down at start (listed with a problem, or
    failing its probe) is left to the collector, which reports it down and probes it later."""
    out: dict[int, set[str]] = {}
    for d in devices:
        if d.problem:
            continue
        try:
            out[d.index] = backend.supported_fields(d.index, wanted)
        except BackendError:
            raise
        except Exception as exc:  # one GPU's fault stays that GPU's (GpuLostError, NVMLError, ...)
            log.warning("GPU %d (%s) failed its probe at start: %s", d.index, d.uuid, exc,
                        extra={"gpu": d.index, "uuid": d.uuid})
    return out


def _pod_source(settings: Settings, backend: GpuBackend) -> tuple[PodsFn, Callable[[], int], Any]:
    """The kubelet source, refreshing on its own thread: the collector's call never waits on it."""
    k8s: Any = importlib.import_module("exporter.kubernetes")
    src = k8s.PodResourcesSource(
        settings.pod_resources_socket,
        timeout=min(10.0, max(0.5, settings.interval_s)),
        resource_names=tuple(dict.fromkeys(k8s.DEFAULT_RESOURCE_NAMES + settings.nvidia_resource_names)),
        devices=backend.devices,
        id_type=settings.kubernetes_gpu_id_type,
        virtual_gpus=settings.kubernetes_virtual_gpus,
        refresh_s=settings.interval_s,
        max_age_s=settings.pod_attribution_max_age_s,
    )
    src.start()
    get: PodsFn = src.get
    if settings.pod_uid or settings.pod_labels:
        get = _with_metadata(settings, src)
    return get, lambda: int(src.errors), src


def _with_metadata(settings: Settings, src: Any) -> PodsFn:
    """Pod UID / labels from the API server on top of the kubelet's answer (exporter.podmeta)."""
    from exporter.podmeta import PodMetadata
    from telemetry_common.kubeapi import KubeClient
    from telemetry_common.kubeconfig import KubeConfigError, resolve

    try:
        client = KubeClient(resolve(None, os.environ), timeout=10.0, user_agent="gpu-exporter")
    except KubeConfigError as exc:
        log.warning("pod UID/labels need the API server, which is not configured (%s): not added", exc)
        return cast(PodsFn, src.get)
    meta = PodMetadata(client, uid=settings.pod_uid, labels=settings.pod_labels)
    meta.start()
    return lambda: meta.enrich(src.get())


def _install_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())


def main(
    argv: Sequence[str] | None = None,
    stop: threading.Event | None = None,
    *,
    backend_factory: Callable[[Settings], GpuBackend] = make_backend,
) -> int:
    """Run until SIGTERM/SIGINT (or until ``stop`` is set, for embedding and tests)."""
    try:
        settings = load_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except SettingsError as exc:
        print(f"gpu-exporter: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_format, settings.log_level, sys.stderr)
    for warning in settings.warnings:
        log.warning(warning)
    collectors = settings.collectors if settings.collectors is not None else default_path()
    try:
        specs = load_counters(collectors)
        web = load_web_config(settings.web_config_file) if settings.web_config_file else WebConfig()
    except (CountersError, WebConfigError) as exc:
        print(f"gpu-exporter: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        backend = backend_factory(settings)
    except BackendError as exc:
        print(f"gpu-exporter: error: {settings.backend} backend: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    try:
        backend = device_selection.apply(backend, settings.devices, settings.devices_source)
    except device_selection.DeviceSelectionError as exc:
        print(f"gpu-exporter: error: {exc}", file=sys.stderr)
        backend.close()
        return EXIT_USAGE
    except BackendError as exc:
        print(f"gpu-exporter: error: {settings.backend} backend: {exc}", file=sys.stderr)
        backend.close()
        return EXIT_BACKEND
    try:
        devices = backend.devices()
        wanted = [s.read_as for s in specs if s.kind != "label"]
        supported = _probe_answering(backend, devices, wanted)
    except BackendError as exc:
        print(f"gpu-exporter: error: {settings.backend} backend: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    for spec in [s for s in specs if s.field in exp_counters.UNAVAILABLE]:
        log.warning("Skipping line %d ('%s'): %s", spec.line, spec.field, exp_counters.UNAVAILABLE[spec.field])
        specs.remove(spec)
    if supported:
        own = {XID_ERRORS} | exp_counters.IMPLEMENTED
        specs = filter_supported(specs, set().union(*supported.values()) | own, log)
    else:  # nothing to probe: keep every row; each GPU is probed when it answers (the collector)
        log.warning("no GPU answered at start: keeping the whole counter set until one does")

    pods: PodsFn | None = None
    kubelet_errors: Callable[[], int] | None = None
    pod_src: Any = None
    if settings.kubernetes:
        pods, kubelet_errors, pod_src = _pod_source(settings, backend)
    xids = XidState()
    try:
        collector = Collector(
            backend, specs, settings.hostname, settings.interval_s, pods,
            xids=xids,
            integer_fields=frozenset(name for name, f in FIELDS.items() if f.integer),
            kubelet_errors=kubelet_errors,
            backend_name=settings.backend,
            supported=supported,
            exp=exp_counters.ExpCounters(
                [s.field for s in specs], xids, xid_window_ms=settings.xid_window_ms,
                clock_events_window_ms=settings.clock_events_window_ms, p2p=getattr(backend, "p2p_status", None),
            ),
            hpc=HpcJobMap(settings.hpc_job_mapping_dir) if settings.hpc_job_mapping_dir else None,
            replace_blanks=settings.replace_blanks,
            hostname_label=settings.hostname_label,
        )
    except BackendError as exc:
        print(f"gpu-exporter: error: {settings.backend} backend: {exc}", file=sys.stderr)
        _close(pod_src, backend)
        return EXIT_BACKEND
    collector.collect_once()  # the first scrape already has data
    try:
        server = Server(settings.listen, collector, web, openmetrics=settings.openmetrics)
    except OSError as exc:
        print(f"gpu-exporter: error: cannot listen on {settings.listen_host}:{settings.listen_port}: {exc}",
              file=sys.stderr)
        _close(pod_src, backend)
        return EXIT_RUNTIME
    watcher = XidWatcher(backend, collector.wake, xids)
    stop = stop if stop is not None else threading.Event()
    _install_signals(stop)
    collector.start()
    watcher.start()
    server.start()
    # a log event like the others, so --log-format json/logfmt output parses line by line
    log.info("serving %s/metrics (%d GPUs, %s backend, every %gs; liveness at %s/health, readiness at %s/ready)",
             server.url, len(devices), settings.backend, settings.interval_s, server.url, server.url,
             extra={"url": f"{server.url}/metrics", "gpus": len(devices), "backend": settings.backend})
    try:
        stop.wait()
    finally:
        log.info("stopping")
        server.stop()
        watcher.stop()
        collector.stop()
        _close(pod_src, backend)
    return EXIT_OK


def _close(pod_src: Any, backend: GpuBackend) -> None:
    if pod_src is not None:
        pod_src.close()
    backend.close()


if __name__ == "__main__":
    sys.exit(main())
