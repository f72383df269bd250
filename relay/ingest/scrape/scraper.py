"""The scrape threads: one a target, each handing one RW 1.0 WriteRequest a scrape to ``sink``.

Contract: :meth:`Scraper.update` applies a reload as Prometheus 2.42 does: a target that stays
(same job and URL, same settings) keeps its loop and nothing is marked; one whose settings changed
gets a new loop that inherits the old one's state (no markers either); one that left a job that
stays is marked stale (every series of its last scrape and its report series) when the next scrape would have been,
written one interval and a tenth after that, as ``endOfRunStaleness`` does, so that a target that
comes back at once is not marked. The targets of a job removed whole are not marked (Prometheus
cancels the pool, and with it the end-of-run staleness). :meth:`Scraper.stop` (the relay stopping) writes no markers:
the relay presumes it will start again where it was, like Prometheus. A failing sink is logged
(rate-limited) and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from relay.common.ratelog import RateLimitedLog
from relay.ingest.scrape.loop import Fetch, LoopState, TargetLoop
from relay.ingest.scrape.target import ScrapeTarget, http_fetch

log = logging.getLogger("relay.scrape")
_sink_log = RateLimitedLog(log)


class _Runner:
    def __init__(self, loop: TargetLoop) -> None:
        self.loop = loop
        self.stopping = threading.Event()
        self.leaving = False
        self.thread: threading.Thread | None = None


class Scraper:
    """One background thread per target: scrape, then ``sink(v1_bytes)``, every ``interval_s``."""

    def __init__(
        self,
        targets: Sequence[ScrapeTarget],
        sink: Callable[[bytes], None],
        fetch: Fetch | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._targets = list(targets)
        self._sink = sink
        self._fetch: Fetch = fetch or http_fetch
        self._clock = clock
        self._shutdown = threading.Event()
        self._lock = threading.Lock()
        self._runners: dict[tuple[str, str], _Runner] = {}
        self._retired: list[_Runner] = []  # left targets still waiting to write their markers
        self._states: dict[tuple[str, str], LoopState] = {}  # scrape_once's loops (tests, no thread)
        self._started = False

    def scrape_once(self, target: ScrapeTarget) -> bytes:
        """One scrape of ``target`` outside the threads (its state kept from call to call)."""
        state = self._states.setdefault(target.key, LoopState())
        return TargetLoop(target, self._fetch, self._clock, state).scrape_once()

    def start(self) -> None:
        with self._lock:
            if self._started:
                raise RuntimeError("scraper already started")
            self._started = True
            self._shutdown.clear()
            for target in self._targets:
                self._start(TargetLoop(target, self._fetch, self._clock))

    def update(self, targets: Sequence[ScrapeTarget]) -> None:
        """A reload: keep, restart (state carried) or retire each loop; start the new targets."""
        wanted = {t.key: t for t in targets}
        with self._lock:
            self._targets = list(targets)
            if not self._started:
                return
            jobs = {t.job for t in targets}
            for key, runner in list(self._runners.items()):
                target = wanted.get(key)
                if target == runner.loop.target:
                    continue
                del self._runners[key]
                # a target gone from a job that stays is marked; a job removed whole is not (Prometheus
                # cancels the whole pool, and with it the loops' end-of-run staleness)
                runner.leaving = target is None and runner.loop.target.job in jobs
                runner.stopping.set()
                if target is None:
                    self._retired.append(runner)
                    continue
                if runner.thread is not None:
                    runner.thread.join()
                self._start(TargetLoop(target, self._fetch, self._clock, runner.loop.state))
            for key, target in wanted.items():
                if key not in self._runners:
                    self._start(TargetLoop(target, self._fetch, self._clock))
            self._retired = [r for r in self._retired if r.thread is not None and r.thread.is_alive()]

    def stop(self) -> None:
        with self._lock:
            self._shutdown.set()
            runners = [*self._runners.values(), *self._retired]
            for runner in runners:
                runner.stopping.set()
            for runner in runners:
                if runner.thread is not None:
                    runner.thread.join()
            self._runners.clear()
            self._retired.clear()
            self._started = False

    def _start(self, loop: TargetLoop) -> None:
        runner = _Runner(loop)
        runner.thread = threading.Thread(target=self._run, args=(runner,),
                                         name=f"scrape-{loop.target.job}", daemon=True)
        self._runners[loop.target.key] = runner
        runner.thread.start()

    def _run(self, runner: _Runner) -> None:
        loop = runner.loop
        interval = loop.target.interval_s
        next_at = time.monotonic()
        while not runner.stopping.is_set():
            self._deliver(loop, loop.scrape_once())
            next_at += interval
            while next_at <= time.monotonic():
                next_at += interval  # a scrape that overran: skip the ticks it missed
            runner.stopping.wait(next_at - time.monotonic())
        if not runner.leaving or not loop.state.scraped or self._shutdown.is_set():
            return
        # the stale time is when the next scrape would have been; write one tick and a tenth later
        wait_tick = max(0.0, next_at - time.monotonic())
        stale_at = self._clock() + wait_tick
        if not self._shutdown.wait(wait_tick + interval * 1.1):
            self._deliver(loop, loop.end_of_run(int(stale_at * 1000)))

    def _deliver(self, loop: TargetLoop, payload: bytes) -> None:
        try:
            self._sink(payload)
        except Exception as e:
            _sink_log.warning(("sink", loop.target.key, type(e).__name__),
                              "scrape job=%s: could not hand over scraped samples: %s: %s",
                              loop.target.job, type(e).__name__, e, extra={"reason": type(e).__name__})
