"""`gpu-relay run`: load the config, build the runtime, listen, watch the file, stop gracefully.

Start-up failures are one log line naming what failed and what to do (a bad config lists every
error in that one event), never a traceback. The start-up line says where each listener is and,
per destination, the credential method and region it signs with. On SIGTERM/SIGINT the listeners
stop accepting requests first, then open aggregation windows are queued and the senders stop.
What a kill -9 loses: only aggregation windows still open (the samples they summarise were
acknowledged but their outputs were not yet queued); everything acknowledged otherwise is on disk.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from relay import __version__, native
from relay.config.config import Config, ConfigError, load_config
from relay.control import interpreter
from relay.control.configwatch import DEFAULT_INTERVAL_S, ConfigWatcher
from relay.control.destinations import SetupError
from relay.control.service import Runtime
from relay.ingest.server import RelayHTTPServer, parse_listen

log = logging.getLogger("relay.daemon")


def server_options(config: Config, enable_lifecycle: bool) -> dict[str, Any]:
    s = config.server
    return {
        "max_concurrent": s.max_concurrent_requests,
        "read_timeout": s.read_timeout,
        "idle_timeout": s.idle_timeout,
        "enable_lifecycle": enable_lifecycle or s.enable_lifecycle,
    }


def listeners(config: Config, runtime: Runtime, enable_lifecycle: bool) -> list[RelayHTTPServer]:
    """The write listener, and the telemetry one when ``server.telemetry_listen`` is set."""
    options = server_options(config, enable_lifecycle)
    telemetry = config.server.telemetry_listen
    if not telemetry:
        return [RelayHTTPServer(parse_listen(config.server.listen), runtime, **options)]
    write = RelayHTTPServer(parse_listen(config.server.listen), runtime, serve_write=True,
                        serve_telemetry=False, **options)
    try:
        tele = RelayHTTPServer(parse_listen(telemetry), runtime, serve_write=False, serve_telemetry=True, **options)
    except BaseException:
        write.server_close()
        raise
    return [write, tele]


def startup_line(config: Config, runtime: Runtime, servers: list[RelayHTTPServer]) -> str:
    where = f"receiving remote-write on {servers[0].url}/api/v1/write"
    tele = servers[-1].url
    where += f"; telemetry (/metrics, status page /) on {tele}"
    dests = "; ".join(
        f"{d.name} -> {d.url}{' (dry run)' if d.dry_run else ''}, {runtime.destinations[d.name].credentials}"
        for d in config.destinations
    )
    return f"gpu-relay {__version__}: {where}; destinations: {dests}"


def log_config_warnings(config: Config) -> None:
    """Each key the config accepted but cannot honour, one warning line each (Config.warnings)."""
    for warning in config.warnings:
        log.warning("%s", warning)


def run(config_path: str, *, enable_lifecycle: bool = False,
        watch_interval_s: float = DEFAULT_INTERVAL_S) -> int:
    try:
        config = load_config(config_path)
    except ConfigError as e:
        log.error("cannot start, the configuration has errors:\n%s", e)
        return 1
    log_config_warnings(config)
    try:
        runtime = Runtime(config_path, config)
    except SetupError as e:
        log.error("cannot start: %s", e, extra={"destination": e.destination})
        return 1
    try:
        servers = listeners(config, runtime, enable_lifecycle)
    except (OSError, ValueError) as e:
        log.error("cannot listen on %s: %s", config.server.listen, e)
        runtime.stop()
        return 1
    runtime.start()
    for s in servers:
        s.start()
    watcher = None
    if watch_interval_s > 0:
        watcher = ConfigWatcher(config_path, runtime.reload_config, watch_interval_s)
        watcher.start()
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=runtime.reload_config, name="reload", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_hup)
    interpreter.tune()  # after start-up: what it built is frozen out of the collector's walks
    native.warn_if_python()  # once, after a successful start (a refused start stays one line)
    log.info("%s", startup_line(config, runtime, servers))
    # Wait with a timeout: the kernel may deliver SIGHUP/SIGTERM to any of our threads, and Python runs
    # the handler only when the main thread next executes bytecode, which an untimed wait never does.
    while not stop.wait(0.5):
        pass
    log.info("shutting down: flushing open aggregation windows")
    if watcher is not None:
        watcher.stop()
    for s in servers:
        s.stop()
    runtime.stop()
    log.info("stopped")
    return 0

