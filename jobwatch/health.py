"""gpu-jobwatch's own health: watch up per resource, events, relists, push requests by code,
TokenReviews, progress errors. Thread-safe counters and gauges, read as one snapshot to render."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HealthSnapshot:
    watch_up: dict[str, bool]
    served: dict[str, bool]
    events: dict[tuple[str, str], int]
    relists: dict[str, int]
    push_requests: dict[str, int]
    token_reviews: dict[str, int]
    progress_errors: dict[tuple[str, str], int]
    render_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class Health:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._up: dict[str, bool] = {}
        self._served: dict[str, bool] = {}
        self._events: Counter[tuple[str, str]] = Counter()
        self._relists: Counter[str] = Counter()
        self._push: Counter[str] = Counter()
        self._reviews: Counter[str] = Counter()
        self._progress: Counter[tuple[str, str]] = Counter()
        self.render_seconds = 0.0
        self.changed = threading.Event()  # set whenever a value here changes the exposition

    def set_watch_up(self, resource: str, up: bool) -> None:
        with self._lock:
            if self._up.get(resource) != up:
                self._up[resource] = up
                self.changed.set()

    def forget_watch(self, resource: str) -> None:
        with self._lock:
            self._up.pop(resource, None)
            self.changed.set()

    def set_served(self, resource: str, served: bool) -> None:
        with self._lock:
            if self._served.get(resource) != served:
                self._served[resource] = served
                self.changed.set()

    def event(self, resource: str, kind: str) -> None:
        with self._lock:
            self._events[(resource, kind)] += 1

    def relisted(self, resource: str) -> None:
        with self._lock:
            self._relists[resource] += 1

    def push_request(self, code: int) -> None:
        with self._lock:
            self._push[str(code)] += 1
            self.changed.set()

    def token_review(self, result: str) -> None:
        with self._lock:
            self._reviews[result] += 1

    def progress_error(self, source: str, reason: str) -> None:
        with self._lock:
            self._progress[(source, reason)] += 1
            self.changed.set()

    def up(self, resource: str) -> bool | None:
        with self._lock:
            return self._up.get(resource)

    def snapshot(self) -> HealthSnapshot:
        with self._lock:
            return HealthSnapshot(dict(self._up), dict(self._served), dict(self._events), dict(self._relists),
                                  dict(self._push), dict(self._reviews), dict(self._progress), self.render_seconds)
