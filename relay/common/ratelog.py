"""Log a recurring failure at most once per interval per key, with a count of what was suppressed.

A destination that fails fails on every request; one line per request would bury everything else
(and cost more than the request). ``RateLimitedLog.warning(key, msg, ...)`` logs the first event
of a key at once, then at most one line per ``interval`` seconds for that key, each carrying
``suppressed`` (events since the last line that were not logged). Thread-safe; clock injected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping

DEFAULT_INTERVAL_S = 60.0
_MAX_KEYS = 1024  # keys are (destination, reason): bounded by config; this is a backstop


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def warning(self, key: Hashable, msg: str, *args: object, extra: Mapping[str, object] | None = None) -> bool:
        """Log ``msg % args`` at WARNING unless ``key`` logged less than ``interval`` ago. True if logged."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            if len(self._last) >= _MAX_KEYS and key not in self._last:
                self._last.pop(next(iter(self._last)))
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        text = msg % args if args else msg
        if suppressed:
            text += f" ({suppressed} more like this in the last {self.interval:.0f}s not logged)"
        self.logger.warning("%s", text, extra={**(extra or {}), "suppressed": suppressed})
        return True
