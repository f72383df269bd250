"""``gpu-exporter``: wire settings, counters, backend, collector, XID watcher and HTTP server.

Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 cannot listen, 2 bad flag/env value or bad
collectors CSV, 3 the backend cannot start (no NVML with ``--backend nvml``: never a silent
fallback to simulated data).
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

from exporter.backend import BackendError, GpuBackend
from exporter.collector import XID_ERRORS, Collector
from exporter.counters_csv import CountersError, filter_supported, load_counters
from exporter.fields import FIELDS
from exporter.render import PodLabels
from exporter.server import Server
from exporter.settings import Settings, SettingsError, load_settings
from exporter.xid import XidState, XidWatcher

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
        return cast(GpuBackend, cls(n_gpus=settings.simulate_gpus))
    return cast(GpuBackend, cls())


def _pod_source(settings: Settings) -> tuple[Callable[[], Mapping[str, PodLabels]], Callable[[], int], Any]:
    k8s: Any = importlib.import_module("exporter.kubernetes")
    # A hung kubelet must not hold a collection cycle longer than one interval.
    src = k8s.PodResourcesSource(settings.pod_resources_socket, timeout=min(10.0, max(0.5, settings.interval_s)))
    return src.get, lambda: int(src.errors), src


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
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        specs = load_counters(settings.collectors)
    except CountersError as exc:
        print(f"gpu-exporter: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        backend = backend_factory(settings)
        devices = backend.devices()
        wanted = [s.field for s in specs if s.kind != "label"]
        supported = {d.index: backend.supported_fields(d.index, wanted) for d in devices}
    except BackendError as exc:
        print(f"gpu-exporter: error: {settings.backend} backend: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    union = set().union(*supported.values()) | {XID_ERRORS}
    specs = filter_supported(specs, union, log)

    pods: Callable[[], Mapping[str, PodLabels]] | None = None
    kubelet_errors: Callable[[], int] | None = None
    pod_src: Any = None
    if settings.kubernetes:
        pods, kubelet_errors, pod_src = _pod_source(settings)
    xids = XidState()
    try:
        collector = Collector(
            backend, specs, settings.hostname, settings.interval_s, pods,
            xids=xids,
            integer_fields=frozenset(name for name, f in FIELDS.items() if f.integer),
            kubelet_errors=kubelet_errors,
            backend_name=settings.backend,
            supported=supported,
        )
    except BackendError as exc:
        print(f"gpu-exporter: error: {settings.backend} backend: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    collector.collect_once()  # the first scrape already has data
    try:
        server = Server(settings.listen, collector)
    except OSError as exc:
        print(f"gpu-exporter: error: cannot listen on {settings.listen_host}:{settings.listen_port}: {exc}",
              file=sys.stderr)
        backend.close()
        return EXIT_RUNTIME
    watcher = XidWatcher(backend, collector.wake, xids)
    stop = stop if stop is not None else threading.Event()
    _install_signals(stop)
    collector.start()
    watcher.start()
    server.start()
    print(f"gpu-exporter: serving {server.url}/metrics ({len(devices)} GPUs, {settings.backend} backend, "
          f"every {settings.interval_s:g}s; health at {server.url}/health)", flush=True)
    try:
        stop.wait()
    finally:
        log.info("stopping")
        server.stop()
        watcher.stop()
        collector.stop()
        if pod_src is not None:
            pod_src.close()
        backend.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
