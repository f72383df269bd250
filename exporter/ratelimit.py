"""The web config's ``rate_limit``: exporter-toolkit's token bucket, and Go's duration syntax.

exporter-toolkit (``web/tls_config.go``, ``web/handler.go``) builds one
``rate.NewLimiter(rate.Every(interval), burst)`` for the listener and answers ``429 Too Many
Requests`` to a request that finds no token, before basic auth and on every path. The bucket holds
``burst`` tokens, starts full and refills one token every ``interval``. ``interval: 0`` (or no
``rate_limit``) disables it. Durations are Go's (``time.ParseDuration``): ``1s``, ``100ms``,
``1m30s``, ``1.5h``, units ns, us, µs, ms, s, m, h.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration (``1m30s`` -> 90.0, ``0`` -> 0.0); ValueError says what is wrong."""
    value = text.strip()
    sign = -1.0 if value.startswith("-") else 1.0
    body = value.lstrip("+-") if value[:1] in "+-" else value
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"{text!r} is not a duration (expected e.g. 1s, 100ms, 1m30s)")
    total, pos = 0.0, 0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(body) or pos == 0:
        raise ValueError(f"{text!r} is not a duration (expected e.g. 1s, 100ms, 1m30s; units ns, us, ms, s, m, h)")
    return sign * total


@dataclass(frozen=True)
class RateLimit:
    """``rate_limit`` as parsed: one token every ``interval_s`` seconds, at most ``burst`` saved."""

    interval_s: float
    burst: int


class TokenBucket:
    """golang.org/x/time/rate's Limiter.Allow for ``rate.Every(interval)``, ``burst``; thread-safe."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._tokens = float(limit.burst)
        self._last = clock()
        self._lock = threading.Lock()
        self.refused = 0

    def allow(self) -> bool:
        """Take a token if one is there (True), else count a refusal (False)."""
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._last)
            self._last = now
            self._tokens = min(float(self.limit.burst), self._tokens + elapsed / self.limit.interval_s)
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            self.refused += 1
            return False
