"""List-then-watch loops, one thread per resource, and the discovery loop that starts and stops the
TrainJob watch as the API serves ``trainjobs.trainer.kubeflow.org`` or not.

A :class:`ResourceWatch` lists (paged; each item passed through its sink's ``convert`` as it
arrives, so only what is kept stays in memory), hands the whole set to ``replace``, then watches
from the list's resourceVersion, following BOOKMARKs, and reconnects from the last version it
saw when the server ends the watch. 410 Gone (an HTTP answer or an ERROR event) relists at once.
Any other failure (403, 5xx, no answer) leaves the sink's state as it was, sets
``gpu_jobwatch_watch_up{resource}`` to 0 and retries with capped exponential backoff and jitter.
One log line per change of state (up -> failing, one failure reason -> another, failing -> up),
never one per retry. A 410 answered to the list itself (not to a watch) is retried with backoff,
never in a tight loop.

Once :meth:`ResourceWatch.stop` has returned, its thread changes nothing more: every write to the
sink and to ``health`` happens under one gate that ``stop`` takes, and only while not stopped. So
when discovery stops the TrainJob watch and forgets its objects, a list or an event the thread was
still handling cannot bring them (or ``gpu_jobwatch_watch_up``) back.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from jobwatch.health import Health
from telemetry_common.kubeapi import Gone, KubeClient, KubeError, WatchStream

log = logging.getLogger("jobwatch.watch")

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    name: str  # "pods", "nodes", "trainjobs" (the gpu_jobwatch_watch_up label)
    path: str  # the cluster-wide collection
    group_version: str = "v1"


PODS = Resource("pods", "/api/v1/pods")
NODES = Resource("nodes", "/api/v1/nodes")
TRAINJOBS = Resource("trainjobs", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs", "trainer.kubeflow.org/v1alpha1")


class Sink(Protocol):
    """Where a resource's objects go (``jobwatch.state`` provides one per resource)."""

    def convert(self, obj: Obj) -> Any | None:
        """What is kept of a listed object (None: not kept)."""
        ...

    def replace(self, items: list[Any]) -> None:
        """A fresh list: everything else this sink held is gone."""
        ...

    def upsert(self, obj: Obj) -> None: ...

    def delete(self, obj: Obj) -> None: ...


@dataclass(frozen=True)
class Backoff:
    initial: float = 1.0
    cap: float = 60.0

    def delay(self, failures: int) -> float:
        base = min(self.cap, self.initial * 2 ** max(0, failures - 1))
        return float(base * random.uniform(0.8, 1.2))


DEFAULT_BACKOFF = Backoff()


class _Stopped(Exception):
    """The watch was stopped while its thread was about to change something."""


def _describe(exc: KubeError) -> str:
    return f"{exc.status} {exc.reason}" if exc.status is not None else f"unreachable ({exc.reason})"


class ResourceWatch:
    def __init__(self, client: KubeClient, resource: Resource, sink: Sink, health: Health, *,
                 page_size: int = 500, watch_timeout: int = 300, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self.client = client
        self.resource = resource
        self.sink = sink
        self.health = health
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.backoff = backoff
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()
        self._gate = threading.RLock()  # held for every effect on the sink and health, and by stop()
        self._thread: threading.Thread | None = None
        self._failing: str | None = None  # the reason of the current failure, None while up
        self.synced = threading.Event()  # set after the first successful list

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.resource.name}", daemon=True)
        self._thread.start()

    def stop(self, join: float | None = None) -> None:
        with self._gate:  # waits for an effect in progress; none starts after this
            self._stop.set()
        with self._lock:
            if self._stream is not None:
                self._stream.close()
        if join is not None and self._thread is not None:
            self._thread.join(join)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _effect(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` unless the watch is stopped (then raise _Stopped): see the module docstring."""
        with self._gate:
            if self._stop.is_set():
                raise _Stopped
            fn(*args)

    def _up(self) -> None:
        self._effect(self.health.set_watch_up, self.resource.name, True)
        if self._failing is not None:
            log.info("watch of %s is back", self.resource.name, extra={"resource": self.resource.name})
            self._failing = None

    def _down(self, reason: str) -> None:
        self._effect(self.health.set_watch_up, self.resource.name, False)
        if reason != self._failing:
            log.warning("watch of %s failing: %s; serving the last known state and retrying",
                        self.resource.name, reason, extra={"resource": self.resource.name, "reason": reason})
            self._failing = reason

    def run(self) -> None:
        try:
            self._run()
        except _Stopped:
            return

    def _run(self) -> None:
        rv: str | None = None
        failures = 0
        name = self.resource.name
        while not self._stop.is_set():
            listing = False
            try:
                if rv is None:
                    listing = True
                    listed = self.client.list(self.resource.path, page_size=self.page_size, keep=self.sink.convert)
                    self._effect(self.sink.replace, listed.items)
                    self._effect(self.health.relisted, name)
                    rv = listed.resource_version
                    listing = False
                    self._up()
                    self.synced.set()
                stream = self.client.watch(self.resource.path, resource_version=rv,
                                           timeout_seconds=self.watch_timeout)
                with self._lock:
                    if self._stop.is_set():
                        stream.close()
                        return
                    self._stream = stream
                self._up()
                failures = 0
                for ev in stream:
                    meta = ev.object.get("metadata") or {}
                    version = meta.get("resourceVersion")
                    self._effect(self.health.event, name, ev.type)
                    if ev.type in ("ADDED", "MODIFIED"):
                        self._effect(self.sink.upsert, ev.object)
                    elif ev.type == "DELETED":
                        self._effect(self.sink.delete, ev.object)
                    if isinstance(version, str) and version:
                        rv = version
            except Gone as exc:
                if self._stop.is_set():
                    return
                if listing:  # the list itself was refused with 410: an error, retried with backoff
                    failures += 1
                    self._down(_describe(exc))
                    self._stop.wait(self.backoff.delay(failures))
                    continue
                log.info("resourceVersion of %s expired (410): relisting", name, extra={"resource": name})
                rv = None
                failures = 0
                continue
            except KubeError as exc:
                if self._stop.is_set():
                    return
                failures += 1
                self._down(_describe(exc))
                self._stop.wait(self.backoff.delay(failures))
            except _Stopped:
                raise
            except Exception as exc:  # a sink bug must not end the watch: count, back off, relist
                if self._stop.is_set():
                    return
                failures += 1
                self._down(f"internal error {type(exc).__name__}")
                log.exception("watch of %s: internal error", name, extra={"resource": name})
                rv = None
                self._stop.wait(self.backoff.delay(failures))
            finally:
                with self._lock:
                    self._stream = None


class Discovery:
    """Re-checks every ``interval`` seconds whether ``resource``'s group/version serves it, and
    runs its watch only while it does. A CRD that is absent is no error; one that goes away takes
    its watch and its objects (``on_gone``) with it. A discovery request that fails changes nothing."""

    def __init__(self, client: KubeClient, resource: Resource, make_watch: Callable[[], ResourceWatch],
                 on_gone: Callable[[], None], health: Health, interval: float) -> None:
        self.client = client
        self.resource = resource
        self.make_watch = make_watch
        self.on_gone = on_gone
        self.health = health
        self.interval = interval
        self.watch: ResourceWatch | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: str | None = None

    def check(self) -> bool | None:
        """One discovery round; the served state (None when discovery itself failed)."""
        name = self.resource.name
        try:
            served_names = self.client.discover(self.resource.group_version)
        except KubeError as exc:
            reason = _describe(exc)
            if reason != self._failing:
                log.warning("discovery of %s failed: %s", self.resource.group_version, reason,
                            extra={"resource": name, "reason": reason})
                self._failing = reason
            return None
        self._failing = None
        served = served_names is not None and name in served_names
        was = self.watch is not None
        if served and not was:
            log.info("%s.%s is served: watching it", name, self.resource.group_version.split("/")[0],
                     extra={"resource": name})
            self.watch = self.make_watch()
            self.watch.start()
        elif not served and was:
            log.info("%s is no longer served: its watch stops", name, extra={"resource": name})
            assert self.watch is not None
            self.watch.stop()
            self.watch = None
            self.health.forget_watch(name)
            self.on_gone()
        self.health.set_served(name, served)
        return served

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"discovery-{self.resource.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.check()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self.watch is not None:
            self.watch.stop()
