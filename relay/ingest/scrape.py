"""Agent mode: scrape Prometheus text endpoints and hand RW1 WriteRequest bytes to the pipeline.

Target labels follow Prometheus with ``honor_labels: false``: ``job`` and ``instance`` always win
and an exposed label they replace is kept as ``exported_<name>`` (``exported_exported_<name>`` when
that is taken too). Every scrape also yields ``up`` (1, or 0 when the fetch or parse failed).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from relay.common.labels import METRIC_NAME, Labels, make
from relay.ingest.wire import encode_write_request

log = logging.getLogger("relay.scrape")

_EXPORTED = "exported_"
_MAX_BODY = 64 << 20
_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


@dataclass(frozen=True)
class ScrapeTarget:
    job: str
    url: str
    interval_s: float
    timeout_s: float


def instance_of(url: str) -> str:
    """The ``instance`` label of a target URL: host:port, without any user:password@ part."""
    return urlsplit(url).netloc.rpartition("@")[2]


def _with_target(exposed: dict[str, str], target: dict[str, str]) -> Labels:
    labels = dict(exposed)
    conflicts = [(name, labels[name]) for name in sorted(target) if labels.get(name)]
    labels.update(target)
    for name, value in sorted(conflicts, key=lambda c: len(c[0])):
        new = name
        while True:
            new = _EXPORTED + new
            if not labels.get(new):
                labels[new] = value
                break
    return make(labels.items())


def _timestamp_ms(ts: object, now_ms: int) -> int:
    if ts is None:
        return now_ms
    if isinstance(ts, int | float):
        return round(ts * 1000)
    sec, nsec = getattr(ts, "sec", 0), getattr(ts, "nsec", 0)
    return int(sec) * 1000 + int(nsec) // 1_000_000


def up_series(job: str, instance: str, now_ms: int, up: float) -> bytes:
    """An RW1 WriteRequest holding only ``up{instance, job}``."""
    labels = make([(METRIC_NAME, "up"), ("instance", instance), ("job", job)])
    return encode_write_request([(labels, [(now_ms, up)])])


def parse_exposition(text: str, job: str, instance: str, now_ms: int) -> bytes:
    """Prometheus text exposition to RW1 WriteRequest bytes, with target labels and an ``up`` series.

    Raises ValueError for text that does not parse.
    """
    target = {"instance": instance, "job": job}
    series: list[tuple[Labels, list[tuple[int, float]]]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            exposed = {**sample.labels, METRIC_NAME: sample.name}
            labels = _with_target(exposed, target)
            series.append((labels, [(_timestamp_ms(sample.timestamp, now_ms), float(sample.value))]))
    return encode_write_request(series) + up_series(job, instance, now_ms, 1.0)


def http_fetch(url: str, timeout_s: float) -> str:
    """GET a text exposition; non-2xx statuses and network errors raise (urllib's errors)."""
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT, "User-Agent": "gpu-relay"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body: bytes = response.read(_MAX_BODY + 1)
    if len(body) > _MAX_BODY:
        raise ValueError(f"scrape body over {_MAX_BODY} bytes")
    return body.decode("utf-8")


class Scraper:
    """One background thread per target: scrape, then ``sink(v1_bytes)``, every ``interval_s``."""

    def __init__(
        self,
        targets: Sequence[ScrapeTarget],
        sink: Callable[[bytes], None],
        fetch: Callable[[str, float], str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._targets = tuple(targets)
        self._sink = sink
        self._fetch = fetch or http_fetch
        self._clock = clock
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def scrape_once(self, target: ScrapeTarget) -> bytes:
        """One scrape's WriteRequest; a failed fetch or parse gives just ``up`` = 0."""
        now_ms = int(self._clock() * 1000)
        instance = instance_of(target.url)
        try:
            return parse_exposition(self._fetch(target.url, target.timeout_s), target.job, instance, now_ms)
        except Exception as exc:  # any failure of the target is reported as up=0, never raised
            log.warning("scrape job=%s instance=%s failed: %s", target.job, instance, type(exc).__name__)
            return up_series(target.job, instance, now_ms, 0.0)

    def start(self) -> None:
        if self._threads:
            raise RuntimeError("scraper already started")
        self._stopping.clear()
        for target in self._targets:
            thread = threading.Thread(
                target=self._loop, args=(target,), name=f"scrape-{target.job}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _loop(self, target: ScrapeTarget) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            payload = self.scrape_once(target)
            try:
                self._sink(payload)
            except Exception:
                log.exception("scrape sink failed for job=%s", target.job)
            self._stopping.wait(max(0.0, target.interval_s - (time.monotonic() - started)))
