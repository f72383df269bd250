"""Run gpu-jobwatch in-process against a fake API server, with a clock the test moves, and read
its /metrics the way Prometheus does."""

from __future__ import annotations

import contextlib
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from jobwatch.cli import App
from jobwatch.config import load_settings
from jobwatch.watch import Backoff
from telemetry_common.kubeapi import KubeClient
from telemetry_common.kubeconfig import resolve
from tests.jobwatch.fake_apiserver import FakeAPIServer

FAST = Backoff(initial=0.05, cap=0.3)
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = frozenset[tuple[str, str]]


class Clock:
    def __init__(self, start: float = 1_781_233_200.0) -> None:  # 2026-06-12T03:00:00Z
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def parse(text: str) -> dict[str, dict[Labels, float]]:
    out: dict[str, dict[Labels, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = frozenset(_LABEL.findall(m.group(3) or ""))
        out.setdefault(m.group(1), {})[labels] = float(m.group(4))
    return out


class Running:
    def __init__(self, app: App, fake: FakeAPIServer, clock: Clock) -> None:
        self.app = app
        self.fake = fake
        self.clock = clock

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.app.metrics_port}"

    @property
    def push_url(self) -> str:
        return f"http://127.0.0.1:{self.app.push_port}"

    def scrape_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            assert resp.status == 200
            return str(resp.read().decode())

    def scrape(self, render: bool = True) -> dict[str, dict[Labels, float]]:
        if render:
            self.app.renderer.render_now()
        return parse(self.scrape_text())

    def value(self, metric: str, /, **labels: str) -> float | None:
        """The one sample of ``metric`` whose labels include ``labels`` (None when there is none)."""
        found = [v for ls, v in self.scrape().get(metric, {}).items() if set(labels.items()) <= ls]
        assert len(found) <= 1, f"{metric}{labels}: {len(found)} samples"
        return found[0] if found else None

    def wait_for(self, check: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or check}")

    def wait_value(self, metric: str, want: float | None, /, timeout: float = 20.0, **labels: str) -> None:
        self.wait_for(lambda: self.value(metric, **labels) == want, timeout, f"{metric}{labels} == {want}")


@contextlib.contextmanager
def jobwatch(fake: FakeAPIServer, tmp_path: Path, *args: str, clock: Clock | None = None,
             watch_timeout: int = 30) -> Iterator[Running]:
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")
    settings = load_settings(["--kubeconfig", str(kubeconfig), "--listen", "127.0.0.1:0",
                              "--discovery-interval", "1s", *args], env={})
    clock = clock or Clock()
    client = KubeClient(resolve(settings.kubeconfig, {}), timeout=10)
    app = App(settings, client, clock=clock, backoff=FAST, watch_timeout=watch_timeout, render_interval=0.5,
              render_min_gap=0.05)
    app.start()
    try:
        yield Running(app, fake, clock)
    finally:
        app.stop()
